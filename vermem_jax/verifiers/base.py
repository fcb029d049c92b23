"""Verifier interfaces, input scopes, scores, config and counters.

The local verifier scores one executed memory decision (paper Appendix F.2, SPEC §5):
relevance, grounding, local progress and information fidelity, each an integer 0..4,
divided by 4 and averaged into r^local_{t,k}. The global verifier scores a finished
trajectory (Appendix F.3): evidence coherence v^coh and terminal-memory consistency
v^state, each an integer 0..4 divided by 4. Everything else in the reward (task score,
supporting-fact recall, online cost) is programmatic and lives in `vermem_jax.rl`.

Input scopes are data, not memory objects, so the verifier core runs standalone:
  * `LocalVerifierInput` holds what the decision could see (q, x_t, u_t, C_t, active M_t,
    visible evidence) and the realized transition as added/removed/changed items. It has
    no field for later states, the final answer or the reference answer.
  * `GlobalVerifierInput` holds q, the evidence observed during the trajectory, the
    ordered memory decisions with outcomes, terminal active M and C, the terminal
    history H within a token budget, and the solver's final answer.
    Its subclass `LabeledGlobalVerifierInput` adds the training-time labels the paper's
    global verifier reads (Appendix F.1/F.3): the reference answer and the annotated
    supporting facts. Labels never reach the local verifier or the policy.
`vermem_jax.verifiers.adapters` builds both from `vermem_jax.memory` objects.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from typing import Any, ClassVar, Mapping, Sequence

from vermem_jax import config_util
from vermem_jax import http_chat

# Operation names shared by records, advantages and metrics (team contract; mirrors
# vermem_jax.memory.ALL_OPS, checked in tests/test_verifier_adapters.py).
LTM_OPS = ("Add", "Update", "Delete")
STM_OPS = ("Retrieve", "Filter", "SelectEpisode", "Summarize")
NULL_OP = "Null"
ALL_OPS = LTM_OPS + STM_OPS + (NULL_OP,)

# Output line keys, in the order the verifier must print them (Appendix F.2, F.3).
LOCAL_DIMENSIONS = ("relevance", "grounding", "local_progress", "information_fidelity")
GLOBAL_DIMENSIONS = ("evidence_coherence", "terminal_memory_consistency")
# Integer scale of every dimension (Appendix F.1: {0,...,4}, divided by 4).
SCORE_MIN = 0
SCORE_MAX = 4

BACKENDS = ("heuristic", "local_model", "openai_compatible")
# What to return for an input whose verifier output stays malformed (or whose request
# keeps failing) after `max_retries` retries. Appendix F.1 leaves this to the protocol;
# SPEC §5 decides 'skip' (no score), the default; the others make up a score.
FALLBACKS = ("zero", "midpoint", "heuristic", "skip")


# Smallest valid value of the numeric VerifierConfig fields besides the endpoint's
# (http_chat.ChatBackendConfig checks those).
_LOWER_BOUNDS = {"max_new_tokens": 1, "batch_size": 1, "temperature": 0,
                 "max_section_chars": 100, "global_history_tokens": 0}

# The HTTP endpoint's defaults (keys `verifier.base_url`, ... of the config).
DEFAULT_CHAT = http_chat.ChatBackendConfig(
    api_key_env="VERMEM_VERIFIER_API_KEY", timeout_s=60.0, max_concurrency=8,
    max_retries=2, backoff_s=1.0, section="verifier")


@dataclasses.dataclass(frozen=True)
class VerifierConfig:
  """Verifier settings: the keys of `config.verifier` (`from_config`), the endpoint's
  flat keys gathered in `chat`.

  Attributes:
    backend: 'heuristic' (CPU default, deterministic stand-in for the paper's frozen
      LLM verifiers), 'local_model' (Flax Qwen via our sampler) or 'openai_compatible'
      (HTTP chat completions).
    chat: keys `verifier.base_url`, `model`, `api_key_env`, `timeout_s`,
      `max_concurrency`, `max_retries`, `backoff_s` (http_chat.ChatBackendConfig).
      HTTP backend: the request goes to f'{base_url}/chat/completions'; the API key is
      never stored, logged or put in errors; `max_retries` extra attempts per input
      after a malformed output or a retryable transport failure (timeout, HTTP
      429/5xx, connection error), sleeping backoff_s * 2**r seconds before retry round
      r (r = 0, 1, ...) when that round retries a transport failure. local_model:
      `chat.model` is a preset name of `QwenConfig.preset` used with random weights
      when `checkpoint_path` is empty.
    fallback: result after the retries are spent: 'skip' (None, the default and SPEC
      §5's decision: an unscored decision gets A^local = 0 and is left out of the
      running statistics, an unscored trajectory's v^coh and v^state are left out of
      r^global; rl.rewards.group_rewards), 'zero' (all dimensions 0), 'midpoint' (all
      2) or 'heuristic' (the heuristic backend's score). The last three make up a score
      that enters the normalizations of A^local and A^global. Every fallback is
      counted (`fallback_<kind>`, logged per update as verifier/fallback_<kind>).
    checkpoint_path: local_model: HF checkpoint folder for `load_hf_checkpoint`.
    tokenizer_path: local_model: tokenizer folder ('' = `paths.tokenizer_dir()`).
    max_new_tokens: local_model: generation limit in tokens (4 short lines need ~25).
    batch_size: local_model: prompts per `generate` call.
    temperature: decoding temperature; 0 = greedy (frozen verifier, Appendix F.1).
    max_section_chars: each free-text section of a prompt (x_t, evidence lists) is cut
      to this many characters; the paper leaves verifier-input truncation to the
      protocol (Appendix F.1), this is our decision.
    seed: local_model: PRNG seed for random weights and the (unused when greedy)
      sampling key.
    global_history_tokens: token budget (backbone tokenizer, the counts H events
      carry) of the terminal history in the global verifier's input; the newest events
      that fit are kept, the oldest dropped first and counted (decision: the paper's
      global verifier reads the terminal H and gives no bound; 4,096 tokens holds a
      HotpotQA episode's history).
  """
  backend: str = "heuristic"
  chat: http_chat.ChatBackendConfig = DEFAULT_CHAT
  fallback: str = "skip"  # SPEC §5 decision (docstring).
  checkpoint_path: str = ""
  tokenizer_path: str = ""
  max_new_tokens: int = 48
  batch_size: int = 16
  temperature: float = 0.0
  max_section_chars: int = 12000
  seed: int = 0
  global_history_tokens: int = 4096

  def __post_init__(self):
    if self.backend not in BACKENDS:
      raise ValueError(f"verifier.backend={self.backend!r}; expected one of {BACKENDS}")
    if self.fallback not in FALLBACKS:
      raise ValueError(
          f"verifier.fallback={self.fallback!r}; expected one of {FALLBACKS}")
    for name, low in _LOWER_BOUNDS.items():
      if getattr(self, name) < low:
        raise ValueError(f"verifier.{name} must be >= {low}, got {getattr(self, name)}")
    if self.backend == "openai_compatible":
      self.chat.check_endpoint()

  @classmethod
  def from_config(cls, section: Mapping[str, Any], *,
                  strict: bool = False) -> "VerifierConfig":
    """From config section `verifier` (dict or ConfigDict; flat keys).

    Raises:
      ValueError: a bad value, named; with `strict`, a key that is not a setting.
    """
    chat, rest = http_chat.ChatBackendConfig.split(section, defaults=DEFAULT_CHAT)
    return config_util.dataclass_from_mapping(cls, rest, strict=strict, what="verifier",
                                              overrides={"chat": chat})


@dataclasses.dataclass(frozen=True)
class ItemView:
  """One item of C, M or H described as plain data.

  Attributes:
    ref: its id (`"{title}#{sent_id}"` for evidence units, memory/context ids else).
    text: its content as the policy sees it.
    source_refs: evidence ids it is derived from (empty for raw observations).
    kind: free label, e.g. 'instruction', 'observation', 'retrieved', 'restored',
      'summary', 'ltm', 'history'.
  """
  ref: str
  text: str
  source_refs: tuple[str, ...] = ()
  kind: str = ""


@dataclasses.dataclass(frozen=True)
class ItemUpdate:
  """An LTM entry before and after an Update (versions are kept, Appendix A.2)."""
  before: ItemView
  after: ItemView


@dataclasses.dataclass(frozen=True)
class TransitionDelta:
  """The realized memory transition s_t -> s~_t = T_m(s_t, u_t) (Eq. 2) as data.

  Attributes:
    ltm_added: new active M entries (Add).
    ltm_updated: (before, after) versions of revised entries (Update).
    ltm_deleted: entries that became soft-deleted (Delete).
    context_added: items inserted into C (Retrieve, SelectEpisode, Summarize output).
    context_removed: items that left C (Filter, Summarize inputs).
    context_tokens_before: |C_t| in tokens, or None when unknown.
    context_tokens_after: |C~_t| in tokens, or None when unknown.
  """
  ltm_added: tuple[ItemView, ...] = ()
  ltm_updated: tuple[ItemUpdate, ...] = ()
  ltm_deleted: tuple[ItemView, ...] = ()
  context_added: tuple[ItemView, ...] = ()
  context_removed: tuple[ItemView, ...] = ()
  context_tokens_before: int | None = None
  context_tokens_after: int | None = None

  @property
  def is_identity(self) -> bool:
    return not (self.ltm_added or self.ltm_updated or self.ltm_deleted
                or self.context_added or self.context_removed)


@dataclasses.dataclass(frozen=True)
class LocalVerifierInput:
  """What the local verifier may see for decision t (Appendix F.1, SPEC §5).

  Attributes:
    question: the task q.
    policy_input: x_t = g(s_t), the bounded serialization the policy acted on.
    command: u_t as generated (its surface text).
    op: operation name, one of `ALL_OPS` ('Null' for ∅) when accepted.
    accepted: False for commands rejected by the executor; these are not scored.
    transition: the realized transition.
    context_before: items of C_t (before the command).
    memory_before: active entries of M_t (before the command).
    visible_evidence: source evidence visible at this decision (observations and
      history fragments shown in x_t), used to judge grounding.
    arguments: parsed command arguments (e.g. 'query', 'reason'), if known.
    allowed_ops: operations enabled in this phase (PHASE_OPS); the null rubric asks
      whether an enabled operation had useful work to do.
  """
  question: str
  policy_input: str
  command: str
  op: str
  transition: TransitionDelta = TransitionDelta()
  accepted: bool = True
  context_before: tuple[ItemView, ...] = ()
  memory_before: tuple[ItemView, ...] = ()
  visible_evidence: tuple[ItemView, ...] = ()
  arguments: Mapping[str, object] = dataclasses.field(default_factory=dict)
  allowed_ops: tuple[str, ...] = ALL_OPS

  def __post_init__(self):
    # A rejected command may name no known tool (memory's 'Invalid'); it is never scored.
    if self.accepted and self.op not in ALL_OPS:
      raise ValueError(f"LocalVerifierInput.op={self.op!r}; expected one of {ALL_OPS}")


@dataclasses.dataclass(frozen=True)
class GlobalVerifierInput:
  """What the global verifier may see after termination (Appendix F.3).

  This base scope carries no labels: v^coh then judges whether the solver's own answer
  follows from the kept evidence chain. The paper's global verifier also reads the
  reference answer and the annotated supporting facts (Appendix F.1/F.3); training
  passes them through `LabeledGlobalVerifierInput`. Answer correctness and
  supporting-fact recall themselves stay programmatic (rl.rewards).

  Attributes:
    question: the task q.
    final_answer: the task solver's final answer text, None if it gave none.
    observed_evidence: evidence units observed during the trajectory (from H).
    memory_commands: the ordered memory decisions, each with its realized outcome,
      one line per decision, ∅ included when the caller passes the episode's
      decisions (e.g. 'Add(...) -> created m3', '∅ -> no change',
      'Delete(...) -> rejected: missing_id: ...').
    terminal_ltm: active M entries at termination.
    terminal_context: C items at termination.
    deleted_ltm: soft-deleted M entries at termination (status explicit).
    terminal_history: the terminal H in order (observations, task actions, tool
      outputs, conclusions; the policy's own decision records are `memory_commands`),
      the newest events within the history token budget: oldest dropped first.
    history_omitted: how many of those H events the budget left out (the oldest).
  """
  question: str
  final_answer: str | None
  observed_evidence: tuple[ItemView, ...] = ()
  memory_commands: tuple[str, ...] = ()
  terminal_ltm: tuple[ItemView, ...] = ()
  terminal_context: tuple[ItemView, ...] = ()
  deleted_ltm: tuple[ItemView, ...] = ()
  terminal_history: tuple[ItemView, ...] = ()
  history_omitted: int = 0


@dataclasses.dataclass(frozen=True)
class LabeledGlobalVerifierInput(GlobalVerifierInput):
  """`GlobalVerifierInput` plus the training-time labels (paper Appendix F.1, F.3).

  The paper's global verifier input contains the reference answer and the annotated
  supporting facts beside the trajectory. They let the verifier judge whether the kept
  evidence is the chain the question needs; they must not be used to rescore answer
  correctness or supporting-fact recall, which are programmatic (rl.rewards). Only
  training builds this input; the local verifier and the policy never see labels.
  (A subclass rather than new base fields keeps label-free call sites unchanged.)

  Attributes:
    reference_answer: the gold answer text, or None when unknown.
    supporting_facts: the annotated supporting evidence units: `ref` is the unit id
      "{title}#{sent_id}" (SPEC §4), `text` its sentence ('' when unknown).
  """
  reference_answer: str | None = None
  supporting_facts: tuple[ItemView, ...] = ()

  def __post_init__(self):
    for f in self.supporting_facts:
      if not isinstance(f, ItemView):
        raise TypeError("LabeledGlobalVerifierInput.supporting_facts must hold "
                        f"ItemView values, got {type(f).__name__}")


def global_labels(inp: GlobalVerifierInput) -> tuple[str | None, tuple[ItemView, ...]]:
  """(reference_answer, supporting_facts) of `inp`; (None, ()) for an unlabeled input."""
  if isinstance(inp, LabeledGlobalVerifierInput):
    return inp.reference_answer, inp.supporting_facts
  return None, ()


def _check_score(name: str, value: int):
  if isinstance(value, bool) or not isinstance(value, int):
    raise TypeError(f"{name} must be an int in [{SCORE_MIN}, {SCORE_MAX}], got {value!r}")
  if not SCORE_MIN <= value <= SCORE_MAX:
    raise ValueError(f"{name} must be in [{SCORE_MIN}, {SCORE_MAX}], got {value}")


class _Scores:
  """Checks and lists the integer score fields named by `DIMENSIONS` (0..4)."""
  DIMENSIONS: ClassVar[tuple[str, ...]] = ()

  def __post_init__(self):
    for name in self.DIMENSIONS:
      _check_score(name, getattr(self, name))

  def as_dict(self) -> dict[str, int]:
    return {name: getattr(self, name) for name in self.DIMENSIONS}


@dataclasses.dataclass(frozen=True)
class LocalScores(_Scores):
  """Local verifier scores for one executed decision (integers 0..4).

  `fallback` names the fallback that produced the scores ('zero', 'midpoint',
  'heuristic') or is None when the verifier itself answered.
  """
  DIMENSIONS: ClassVar[tuple[str, ...]] = LOCAL_DIMENSIONS
  relevance: int
  grounding: int
  local_progress: int
  information_fidelity: int
  fallback: str | None = None

  @property
  def r_local(self) -> float:
    """r^local_{t,k} = mean over the 4 dimensions of score/4, in [0, 1] (App. F.2)."""
    return sum(self.as_dict().values()) / (SCORE_MAX * len(LOCAL_DIMENSIONS))


@dataclasses.dataclass(frozen=True)
class GlobalScores(_Scores):
  """Global verifier scores for one trajectory (integers 0..4, Appendix F.3)."""
  DIMENSIONS: ClassVar[tuple[str, ...]] = GLOBAL_DIMENSIONS
  evidence_coherence: int
  terminal_memory_consistency: int
  fallback: str | None = None

  @property
  def v_coh(self) -> float:
    """v^coh_k = evidence_coherence / 4 in [0, 1] (Eq. 14)."""
    return self.evidence_coherence / SCORE_MAX

  @property
  def v_state(self) -> float:
    """v^state_k = terminal_memory_consistency / 4 in [0, 1] (Eq. 14)."""
    return self.terminal_memory_consistency / SCORE_MAX


class VerifierCounters:
  """Thread-safe event counts the trainer reads (`snapshot`) and resets per update.

  Keys: local_requests / global_requests (inputs asked to be scored), rejected_skipped
  (rejected commands, never scored), attempts (verifier generations or HTTP requests),
  retries, malformed (outputs failing strict parsing), transport_errors (timeouts,
  HTTP errors, connection failures), fallback_<kind> (inputs resolved by a fallback).
  """
  KEYS = ("local_requests", "global_requests", "rejected_skipped", "attempts",
          "retries", "malformed", "transport_errors") + tuple(
              f"fallback_{f}" for f in FALLBACKS)

  def __init__(self):
    self._lock = threading.Lock()
    self._counts = dict.fromkeys(self.KEYS, 0)

  def add(self, key: str, n: int = 1):
    if key not in self._counts:
      raise KeyError(f"unknown verifier counter {key!r}; known: {self.KEYS}")
    with self._lock:
      self._counts[key] += n

  def snapshot(self) -> dict[str, int]:
    with self._lock:
      return dict(self._counts)

  def reset(self):
    with self._lock:
      self._counts = dict.fromkeys(self.KEYS, 0)

  def __getitem__(self, key: str) -> int:
    with self._lock:
      return self._counts[key]


class Verifier(abc.ABC):
  """Batched local and global scoring behind one interface.

  `score_local(inputs)` returns, per input in order, `LocalScores` or None (rejected
  command, or fallback 'skip'); `score_global(inputs)` likewise `GlobalScores` or None.
  """

  def __init__(self, config: VerifierConfig):
    self.config = config
    self.counters = VerifierCounters()

  def score_local(
      self, inputs: Sequence[LocalVerifierInput]) -> list[LocalScores | None]:
    """Scores executed decisions; rejected ones (accepted=False) give None."""
    inputs = list(inputs)
    self.counters.add("local_requests", len(inputs))
    out: list[LocalScores | None] = [None] * len(inputs)
    todo = [i for i, x in enumerate(inputs) if x.accepted]
    self.counters.add("rejected_skipped", len(inputs) - len(todo))
    if todo:
      scored = self._score_local([inputs[i] for i in todo])
      for i, s in zip(todo, scored):
        out[i] = s
    return out

  def score_global(
      self, inputs: Sequence[GlobalVerifierInput]) -> list[GlobalScores | None]:
    """Scores finished trajectories (v^coh, v^state)."""
    inputs = list(inputs)
    self.counters.add("global_requests", len(inputs))
    return self._score_global(inputs) if inputs else []

  @abc.abstractmethod
  def _score_local(
      self, inputs: list[LocalVerifierInput]) -> list[LocalScores | None]:
    """Scores accepted decisions (non-empty list)."""

  @abc.abstractmethod
  def _score_global(
      self, inputs: list[GlobalVerifierInput]) -> list[GlobalScores | None]:
    """Scores trajectories (non-empty list)."""

  def close(self):
    """Releases backend resources (threads, model memory); idempotent."""
