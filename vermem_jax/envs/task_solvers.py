"""Task solvers π_task: act on (q, C̃_t) after each memory decision (paper Eq. 3, App. A.1).

A solver is batched: `solve(inputs: Sequence[SolverInput]) -> list[SolverOutput]`, one
output per input, so the episode loop can serve many live episodes with one call. Each
output is either a final answer (`kind='answer'`) or a request for more information
(`kind='continue'`), plus the input/output token counts that enter the online-token
metric TN (SPEC §7).

Three solvers:
- `LLMTaskSolver`: prompts a Qwen model with q and the active context (the tokenizer's
  chat template; data text escaped so it holds no special tokens), decodes through `vermem_jax.models.generate` (greedy by default, SPEC
  §7 / paper App. C.3) and parses the reply: a line `Answer: <text>` is a final answer,
  anything else (normally `Continue`) asks for more.
- `OpenAICompatibleTaskSolver`: the same prompt and parsing, sent to a served model
  (vLLM, SGLang, a hosted API) through `vermem_jax.http_chat.ChatClient`.
- `OracleEvidenceReader`: a diagnostic stand-in for CPU runs and for measuring memory
  quality apart from the LLM. It is given each example's reference answer, supporting
  evidence-unit ids and evidence-unit texts *privately* (never part of any policy
  input), plus the episode's known stale texts through `SolverInput.stale_texts`, and
  answers with the reference answer exactly when what it reads faithfully carries every
  supporting unit and holds no stale or conflicting record (rule in the class
  docstring); otherwise it continues. With a tokenizer it reports the token counts the
  LLM solver's prompt and reply would have, so TN stays comparable.
"""

from __future__ import annotations

import abc
import collections.abc
import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import jax
import numpy as np

from vermem_jax import config_util
from vermem_jax import http_chat
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import checks
from vermem_jax.memory import serialization
from vermem_jax.models import batch_chunks
from vermem_jax.models import sampling

ANSWER = "answer"
CONTINUE = "continue"
ACTION = "action"  # an action for an interactive benchmark (envs.interactive)

# The 'openai_compatible' solver endpoint's defaults (keys `solver.base_url`, ... of the
# config, read by train.task_solver_setup.SolverSetup; the section has no backoff key:
# 1 s).
DEFAULT_CHAT = http_chat.ChatBackendConfig(
    api_key_env="VERMEM_SOLVER_API_KEY", timeout_s=60.0, max_concurrency=8,
    max_retries=2, backoff_s=1.0, section="solver")


@dataclasses.dataclass(frozen=True)
class SolverConfig:
  """Task-solver decoding (config section `solver`).

  Attributes:
    max_new_tokens: reply limit in tokens. The paper leaves it to the "configured
      protocol" (App. C.3); decision: 64, enough for `Answer: <short span>`.
    temperature: 0.0 = greedy (paper App. C.3: evaluation decodes deterministically).
    top_p: 1.0 (App. C.3).
  """
  max_new_tokens: int = 64
  temperature: float = 0.0
  top_p: float = 1.0

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "SolverConfig":
    """From config section `solver`, ignoring its other keys (backend, ...)."""
    return config_util.dataclass_from_mapping(cls, section)


@dataclasses.dataclass(frozen=True)
class SolverRecord:
  """One record the solver reads (a C̃_t item or an active LTM entry's current
  version) with its provenance.

  Attributes:
    text: the record's raw text (`SolverInput.context` shows it escaped by
      `memory.serialization.escape_markup`); the oracle reader compares these.
    evidence: evidence-unit ids it is grounded in (transitive, from the executor).
  """
  text: str
  evidence: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class SolverInput:
  """What a task solver sees for one episode at one step.

  The LLM solver reads only `question` and `context`; `source_refs`, `records` and
  `stale_texts` are provenance and private labels for the oracle reader.

  Attributes:
    task_id: the episode's task instance id (HotpotQA question id); the oracle uses it
      to look up its private labels.
    question: q.
    context: the active context C̃_t rendered as text (what an LLM solver reads),
      special-token-like text escaped (`memory.serialization.escape_markup`).
    source_refs: evidence-unit ids the items of C̃_t are grounded in (resolved through
      LTM entries and history events by the environment).
    records: the records behind `context`, one per item/entry, in order (empty for a
      hand-built input that gives provenance only; see OracleEvidenceReader).
    stale_texts: private label of the episode (`EpisodeSpec.stale_texts`): texts of
      the stale / obsolete versions the scenario planted in M_0. Never shown to the
      policy or the LLM solver.
    final: no further information will arrive after this call (the observations
      ran out or the rollout limit is reached): an LLM solver is told to answer now.
  """
  task_id: str
  question: str
  context: str
  source_refs: frozenset[str] = frozenset()
  records: tuple[SolverRecord, ...] = ()
  stale_texts: frozenset[str] = frozenset()
  final: bool = False


@dataclasses.dataclass(frozen=True)
class SolverOutput:
  """One task action b_t.

  Attributes:
    kind: 'answer' | 'continue' (HotpotQA), or 'action' (an interactive benchmark:
      `action` is what the environment plays).
    answer: the final answer text when kind == 'answer', else None.
    text: the raw reply (what T_e records in H as the task action).
    input_tokens: prompt tokens of this call (counted every call).
    output_tokens: generated tokens of this call, the end-of-turn token included.
    token_ids: generated ids [output_tokens] (LLM solver only; None otherwise).
    action: the environment action when kind == 'action', else None.
  """
  kind: str
  answer: str | None
  text: str
  input_tokens: int = 0
  output_tokens: int = 0
  token_ids: tuple[int, ...] | None = None
  action: str | None = None


class TaskSolver(abc.ABC):
  """Batched task-solver interface."""

  @abc.abstractmethod
  def solve(self, inputs: Sequence[SolverInput]) -> list[SolverOutput]:
    """One task action per input, in input order."""


class _ChatTokenizer(Protocol):
  eos_token_id: int
  stop_token_ids: tuple[int, ...]

  def encode(self, text: str) -> list[int]: ...
  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str: ...
  def count_tokens(self, text: str) -> int: ...
  def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str: ...


# Our own wording of the solver instruction (the paper gives none).
SOLVER_SYSTEM_PROMPT = (
    "You answer a multi-hop question using only the notes in your working context. "
    "When the notes are enough to answer, reply with a single line "
    "'Answer: <answer>' where <answer> is a short span or yes/no. When they are not "
    "enough yet, reply with the single word 'Continue' and more information will "
    "arrive.")


# Last line of the user turn when `SolverInput.final` (our wording).
FINAL_CUE = ("No more information will arrive. Reply with 'Answer: ...' giving your "
             "best answer from these notes.")


def solver_messages(inp: SolverInput) -> list[dict[str, str]]:
  """Chat messages of the solver prompt for one input.

  q and the context are data (HotpotQA text, observations, memory records): both pass
  through `memory.serialization.escape_markup`, so text such as "<|im_end|>" or
  "<tool_call>" in them can never end the user turn or open a new one — the prompt's
  special tokens are exactly those of the chat template. The escape is idempotent,
  so a context the environment already escaped is unchanged, and a hand-built
  SolverInput is safe as well.
  """
  question = serialization.escape_markup(inp.question)
  context = serialization.escape_markup(inp.context) if inp.context.strip() else (
      "(empty)")
  cue = (FINAL_CUE if inp.final else "Reply with 'Answer: ...' or 'Continue'.")
  user = f"Question: {question}\n\nWorking context:\n{context}\n\n{cue}"
  return [{"role": "system", "content": SOLVER_SYSTEM_PROMPT},
          {"role": "user", "content": user}]


def render_solver_prompt(tokenizer: _ChatTokenizer, inp: SolverInput) -> str:
  """The full prompt string (chat template with the generation prompt)."""
  return tokenizer.apply_chat_template(solver_messages(inp), add_generation_prompt=True)


_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_ANSWER_LINE = re.compile(r"^\s*(?:final\s+)?answer\s*[:：]\s*(.*?)\s*$", re.IGNORECASE)
_CONTINUE_LINE = re.compile(r"^\s*continue\b", re.IGNORECASE)


def parse_solver_reply(text: str) -> tuple[str, str | None]:
  """(kind, answer) of a solver reply.

  The first line that is `Answer: <text>` (also `Final answer:`, any case) with a
  non-empty <text> makes a final answer; a first deciding line `Continue`, an empty
  answer or a reply with neither is 'continue' (no answer was committed). Qwen3
  `<think>...</think>` blocks are ignored. Surrounding quotes/backticks and a trailing
  period on the answer are stripped.
  """
  body = _THINK.sub("", text)
  for line in body.splitlines():
    m = _ANSWER_LINE.match(line)
    if m:
      answer = m.group(1).strip().strip("`'\"").strip()
      if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1].rstrip()
      return (ANSWER, answer) if answer else (CONTINUE, None)
    if _CONTINUE_LINE.match(line):
      return CONTINUE, None
  return CONTINUE, None


class LLMTaskSolver(TaskSolver):
  """A Qwen model as task solver, decoded with `vermem_jax.models.generate`.

  Args:
    tokenizer: `vermem_jax.tokenization.Tokenizer` (chat template, encode/decode, stop
      ids).
    model_config: `vermem_jax.models.QwenConfig`.
    params: the model parameter pytree.
    config: SolverConfig (greedy, 64 new tokens by default).
    rng: a `jax.random` key, split once per call (used only when temperature > 0).
    generate_fn: defaults to `vermem_jax.models.generate`; same signature.
    messages_fn: SolverInput -> chat messages (default `solver_messages`, the
      HotpotQA prompt; interactive benchmarks pass
      `envs.action_solvers.ActionPrompt(...).messages`).
    parse_fn: reply text -> (kind, payload) (default `parse_solver_reply`); the
      payload is the answer for kind 'answer' and the action for kind 'action'.
    batch_buckets: allowed batch sizes of one generate call (None: powers of two);
      the trainers pass the rollout batch, so every call has one batch shape.
    prompt_buckets: padded prompt lengths in tokens (the policy's
      `sampling.prompt_buckets`; None, or a call with a longer prompt: the sampler's
      powers of two).

  `solve` prompts all inputs through `models.batch_chunks.generate_in_chunks` (the
  policy's path): calls of [B, P] prompts, B a batch bucket (a short last chunk is
  padded), P a prompt bucket; replies [n, N<=max_new_tokens] int32.
  input_tokens = prompt length; output_tokens = generated length including the stop
  token when one was produced.
  """

  def __init__(self, tokenizer: _ChatTokenizer, model_config: Any, params: Any, *,
               config: SolverConfig = SolverConfig(), rng: Any = None,
               generate_fn: Callable[..., Any] | None = None,
               messages_fn: Callable[[SolverInput], list[dict[str, str]]] | None = None,
               parse_fn: Callable[[str], tuple[str, str | None]] | None = None,
               batch_buckets: Sequence[int] | None = None,
               prompt_buckets: Sequence[int] | None = None):
    self.tokenizer = tokenizer
    self.model_config = model_config
    self.params = params
    self.config = config
    self._rng = rng if rng is not None else jax.random.PRNGKey(0)
    self._generate = generate_fn or sampling.generate
    self._stop_ids = tuple(tokenizer.stop_token_ids)
    self._messages = messages_fn or solver_messages
    self._parse = parse_fn or parse_solver_reply
    self.batch_buckets = batch_chunks.check_batch_buckets(batch_buckets)
    self.prompt_buckets = sampling.check_prompt_buckets(prompt_buckets)

  def solve(self, inputs: Sequence[SolverInput]) -> list[SolverOutput]:
    if not inputs:
      return []
    prompts = [self.tokenizer.encode(self.tokenizer.apply_chat_template(
        self._messages(inp), add_generation_prompt=True)) for inp in inputs]
    self._rng, key = jax.random.split(self._rng)
    # Passed only when set (a generate_fn predating prompt buckets still works) and when
    # they hold every prompt: a solver prompt beyond the policy's longest (a long
    # benchmark action prompt) takes the sampler's power-of-two buckets instead.
    extra = ({} if self.prompt_buckets is None
             or max(map(len, prompts)) > self.prompt_buckets[-1]
             else {'prompt_buckets': self.prompt_buckets})
    out = batch_chunks.generate_in_chunks(
        self._generate, self.model_config, self.params, prompts, rng=key,
        batch_buckets=self.batch_buckets, max_new_tokens=self.config.max_new_tokens,
        temperature=self.config.temperature, top_p=self.config.top_p,
        stop_token_ids=self._stop_ids, pad_token_id=self.tokenizer.pad_token_id,
        **extra)
    tokens, lengths = out.tokens, out.lengths
    results = []
    for i, prompt in enumerate(prompts):
      ids = [int(t) for t in tokens[i, :int(lengths[i])]]
      text_ids = ids[:-1] if ids and ids[-1] in self._stop_ids else ids
      text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
      kind, payload = self._parse(text)
      results.append(SolverOutput(
          kind, payload if kind == ANSWER else None, text, len(prompt), len(ids),
          tuple(ids), action=payload if kind == ACTION else None))
    return results


@dataclasses.dataclass(frozen=True)
class OracleLabels:
  """Private labels of one task for the oracle reader (never shown to the policy).

  Attributes:
    answer: the reference answer.
    supporting_unit_ids: ids of the supporting evidence units.
    unit_texts: evidence-unit id -> (title, sentence) of every unit of the example
      (for the content checks). Empty: content checks are skipped (provenance only).
  """
  answer: str
  supporting_unit_ids: frozenset[str]
  unit_texts: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


class _LazyUnitTexts(collections.abc.Mapping):
  """unit id -> (title, sentence) of one example, built on first use (the full train
  pool has ~90k examples; only the tasks an oracle is asked about pay for it)."""

  def __init__(self, example: Any):
    self._example = example
    self._texts: dict[str, tuple[str, str]] | None = None

  def _get(self) -> dict[str, tuple[str, str]]:
    if self._texts is None:
      self._texts = {u.id: (u.title, u.text)
                     for u in hotpotqa.evidence_units(self._example)}
    return self._texts

  def __getitem__(self, key: str) -> tuple[str, str]:
    return self._get()[key]

  def __iter__(self):
    return iter(self._get())

  def __len__(self) -> int:
    return len(self._get())


# Why the oracle continues (OracleEvidenceReader.judge); '' = it answers.
MISSING_EVIDENCE = "missing_evidence"
STALE_RECORD = "stale_record"
CONFLICTING_RECORD = "conflicting_record"


class OracleEvidenceReader(TaskSolver):
  """Diagnostic task solver: answers exactly when the memory faithfully holds all
  supporting evidence and nothing that contradicts it.

  For CPU runs and for measuring memory quality apart from any LLM: r^task of an
  episode is 1 iff the memory policy left what the solver reads (C̃_t, or the active
  LTM entries for Phase A's delayed query) answerable. The labels it holds are private
  to the solver and must never reach the memory policy's input.

  Rule (`judge`), over `SolverInput.records` (fact tokens = numbers, dates, times,
  month/weekday names, `memory.checks.fact_tokens`):
    1. stale_record: some record's text is (`checks.same_text`) one of the episode's
       known stale texts (`SolverInput.stale_texts`, planted in M_0 by the scenario):
       the memory still holds the outdated version, so the reader refuses — whether
       or not a correct version sits beside it (a conflict). Exact duplicates of a
       correct entry are not stale: they are redundant, not contradictory (decision).
    2. conflicting_record: a record citing a supporting unit states a fact token none
       of its cited units' titles or sentences support (e.g. a perturbed year written
       with the true source cited).
    3. missing_evidence: some supporting unit u has no *carrier*: a record whose
       evidence includes u and whose text holds every fact token of u's sentence.
       Otherwise it answers.
  Provenance alone (the old rule) would let an entry that cites the right unit but
  states an outdated number count as evidence, and let a stale entry stay active
  beside the corrected one: correcting memory and doing nothing would earn the same
  r^task. Without `records` (a hand-built input) only the provenance rule applies:
  every supporting unit in `source_refs`. Without `unit_texts` rules 2 and 3's text
  checks are skipped (evidence ids only).

  Args:
    labels: task_id -> OracleLabels.
    tokenizer: optional; when given, input/output token counts are those of the LLM
      solver's prompt (`render_solver_prompt`) and of the reply text plus one
      end-of-turn token; when None they are 0.

  Raises (from solve / judge):
    KeyError: a task_id without labels.
  """

  def __init__(self, labels: Mapping[str, OracleLabels], *,
               tokenizer: _ChatTokenizer | None = None):
    self.labels = dict(labels)
    self.tokenizer = tokenizer

  @classmethod
  def from_examples(cls, examples: Iterable[Any], *,
                    tokenizer: _ChatTokenizer | None = None) -> "OracleEvidenceReader":
    """Labels from `hotpotqa.Example`s (reference answer, supporting unit ids, unit
    texts). The episode's stale texts arrive with each SolverInput."""
    labels = {ex.id: OracleLabels(ex.answer, frozenset(hotpotqa.supporting_unit_ids(ex)),
                                  _LazyUnitTexts(ex))
              for ex in examples}
    return cls(labels, tokenizer=tokenizer)

  def judge(self, inp: SolverInput) -> str:
    """'' when the oracle answers `inp`, else why not: MISSING_EVIDENCE,
    STALE_RECORD or CONFLICTING_RECORD (rule in the class docstring)."""
    if inp.task_id not in self.labels:
      raise KeyError(f"OracleEvidenceReader has no labels for task {inp.task_id!r}")
    lab = self.labels[inp.task_id]
    sup = lab.supporting_unit_ids
    if not sup:
      return MISSING_EVIDENCE
    if not inp.records:
      return "" if sup <= inp.source_refs else MISSING_EVIDENCE
    carried = set()
    for rec in inp.records:
      if any(checks.same_text(rec.text, t) for t in inp.stale_texts):
        return STALE_RECORD
      cited = rec.evidence & sup
      if not cited:
        continue
      if not lab.unit_texts:
        carried |= cited
        continue
      grounding = [part for u in rec.evidence if u in lab.unit_texts
                   for part in lab.unit_texts[u]]
      if checks.unsupported_facts(rec.text, grounding):
        return CONFLICTING_RECORD
      for u in cited:
        if u in lab.unit_texts and not checks.unsupported_facts(
            lab.unit_texts[u][1], [rec.text]):
          carried.add(u)
    return "" if sup <= carried else MISSING_EVIDENCE

  def solve(self, inputs: Sequence[SolverInput]) -> list[SolverOutput]:
    results = []
    for inp in inputs:
      if not self.judge(inp):
        answer = self.labels[inp.task_id].answer
        kind, text = ANSWER, f"Answer: {answer}"
      else:
        kind, answer, text = CONTINUE, None, "Continue"
      n_in, n_out = (call_token_counts(self.tokenizer, inp, text)
                     if self.tokenizer is not None else (0, 0))
      results.append(SolverOutput(kind, answer, text, n_in, n_out))
    return results


def call_token_counts(tokenizer: _ChatTokenizer, inp: SolverInput, reply: str, *,
                      messages_fn: Callable[[SolverInput], list[dict[str, str]]]
                      | None = None) -> tuple[int, int]:
  """(input, output) tokens of one solver call as the in-process LLM solver would
  count them: the chat-templated prompt of `inp` (`messages_fn`, default
  `solver_messages`), and the reply plus one end-of-turn token (TN, SPEC §7)."""
  prompt = tokenizer.apply_chat_template((messages_fn or solver_messages)(inp),
                                         add_generation_prompt=True)
  return tokenizer.count_tokens(prompt), tokenizer.count_tokens(reply) + 1


class OpenAICompatibleTaskSolver(TaskSolver):
  """A served model (vLLM, SGLang, a hosted API) as task solver over HTTP.

  Sends `solver_messages(inp)` (q and C̃_t only; nothing private) to an
  OpenAI-compatible chat-completions endpoint through `http_chat.ChatClient`, at most
  `client.max_concurrency` requests at a time, and parses each reply like the
  in-process solver (`parse_solver_reply`). Token counts (TN) are those of the
  backbone tokenizer on the chat-templated prompt and the reply plus one end-of-turn
  token (`call_token_counts`), so TN matches the in-process solver's accounting.

  Args:
    client: an `http_chat.ChatClient` (its `max_retries` re-sends failed requests).
    tokenizer: the backbone tokenizer (chat template, count_tokens).
    config: SolverConfig (max_new_tokens, temperature; greedy by default).
    messages_fn, parse_fn: the prompt and reply parser, as for `LLMTaskSolver`
      (defaults: the HotpotQA `solver_messages` / `parse_solver_reply`).

  Raises (from solve):
    http_chat.ChatError: a request still failing after the client's retries (the
      message names the URL); evaluation stops rather than score a dead server's
      episodes as unanswered.
  """

  def __init__(self, client: Any, tokenizer: _ChatTokenizer, *,
               config: SolverConfig = SolverConfig(),
               messages_fn: Callable[[SolverInput], list[dict[str, str]]] | None = None,
               parse_fn: Callable[[str], tuple[str, str | None]] | None = None,
               batch_buckets: Sequence[int] | None = None,
               prompt_buckets: Sequence[int] | None = None):
    self.client = client
    self.tokenizer = tokenizer
    self.config = config
    self._messages = messages_fn or solver_messages
    self._parse = parse_fn or parse_solver_reply
    self.batch_buckets = batch_chunks.check_batch_buckets(batch_buckets)
    self.prompt_buckets = sampling.check_prompt_buckets(prompt_buckets)

  def solve(self, inputs: Sequence[SolverInput]) -> list[SolverOutput]:
    if not inputs:
      return []
    replies = self.client.complete_many(
        [self._messages(inp) for inp in inputs],
        max_tokens=self.config.max_new_tokens, temperature=self.config.temperature)
    results = []
    for inp, reply in zip(inputs, replies):
      if isinstance(reply, http_chat.ChatError):
        raise reply
      kind, payload = self._parse(reply)
      n_in, n_out = call_token_counts(self.tokenizer, inp, reply,
                                      messages_fn=self._messages)
      results.append(SolverOutput(kind, payload if kind == ANSWER else None, reply, n_in,
                                  n_out, action=payload if kind == ACTION else None))
    return results
