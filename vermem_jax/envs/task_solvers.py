"""Task solvers π_task: act on (q, C̃_t) after each memory decision (paper Eq. 3, App. A.1).

A solver is batched: `solve(inputs: Sequence[SolverInput]) -> list[SolverOutput]`, one
output per input, so the episode loop can serve many live episodes with one call. Each
output is either a final answer (`kind='answer'`) or a request for more information
(`kind='continue'`), plus the input/output token counts that enter the online-token
metric TN (SPEC §7).

Two solvers:
- `LLMTaskSolver`: prompts a Qwen model with q and the active context (the tokenizer's
  chat template), decodes through `vermem_jax.models.generate` (greedy by default, SPEC
  §7 / paper App. C.3) and parses the reply: a line `Answer: <text>` is a final answer,
  anything else (normally `Continue`) asks for more.
- `OracleEvidenceReader`: a diagnostic stand-in for CPU runs and for measuring memory
  quality apart from the LLM. It is given each example's reference answer and supporting
  evidence-unit ids *privately* (never part of any policy input) and answers with the
  reference answer exactly when every supporting unit is among the source refs of the
  active context's items; otherwise it continues. With a tokenizer it reports the token
  counts the LLM solver's prompt and reply would have, so TN stays comparable.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

ANSWER = "answer"
CONTINUE = "continue"


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
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: section[k] for k in section if k in names})


@dataclasses.dataclass(frozen=True)
class SolverInput:
  """What a task solver sees for one episode at one step.

  Attributes:
    task_id: the episode's task instance id (HotpotQA question id); the oracle uses it
      to look up its private labels.
    question: q.
    context: the active context C̃_t rendered as text (what an LLM solver reads).
    source_refs: evidence-unit ids the items of C̃_t are grounded in (resolved through
      LTM entries and history events by the environment).
  """
  task_id: str
  question: str
  context: str
  source_refs: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class SolverOutput:
  """One task action b_t.

  Attributes:
    kind: 'answer' | 'continue'.
    answer: the final answer text when kind == 'answer', else None.
    text: the raw reply (what T_e records in H as the task action).
    input_tokens: prompt tokens of this call (counted every call).
    output_tokens: generated tokens of this call, the end-of-turn token included.
    token_ids: generated ids [output_tokens] (LLM solver only; None otherwise).
  """
  kind: str
  answer: str | None
  text: str
  input_tokens: int = 0
  output_tokens: int = 0
  token_ids: tuple[int, ...] | None = None


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


def solver_messages(inp: SolverInput) -> list[dict[str, str]]:
  """Chat messages of the solver prompt for one input."""
  context = inp.context if inp.context.strip() else "(empty)"
  user = (f"Question: {inp.question}\n\nWorking context:\n{context}\n\n"
          "Reply with 'Answer: ...' or 'Continue'.")
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

  `solve` prompts all inputs in one `generate` call: prompts [B, T_b] (left-padded
  into length buckets by the sampler), replies [B, N<=max_new_tokens] int32.
  input_tokens = prompt length; output_tokens = generated length including the stop
  token when one was produced.
  """

  def __init__(self, tokenizer: _ChatTokenizer, model_config: Any, params: Any, *,
               config: SolverConfig = SolverConfig(), rng: Any = None,
               generate_fn: Callable[..., Any] | None = None):
    import jax  # pylint: disable=import-outside-toplevel
    if generate_fn is None:
      from vermem_jax.models import generate as generate_fn  # pylint: disable=import-outside-toplevel
    self.tokenizer = tokenizer
    self.model_config = model_config
    self.params = params
    self.config = config
    self._rng = rng if rng is not None else jax.random.PRNGKey(0)
    self._generate = generate_fn
    self._stop_ids = tuple(tokenizer.stop_token_ids)

  def solve(self, inputs: Sequence[SolverInput]) -> list[SolverOutput]:
    if not inputs:
      return []
    import jax  # pylint: disable=import-outside-toplevel
    prompts = [self.tokenizer.encode(render_solver_prompt(self.tokenizer, inp))
               for inp in inputs]
    self._rng, key = jax.random.split(self._rng)
    out = self._generate(
        self.model_config, self.params, prompts, rng=key,
        max_new_tokens=self.config.max_new_tokens,
        temperature=self.config.temperature, top_p=self.config.top_p,
        stop_token_ids=self._stop_ids, pad_token_id=self.tokenizer.pad_token_id)
    tokens = np.asarray(out.tokens)
    lengths = np.asarray(out.lengths)
    results = []
    for i, prompt in enumerate(prompts):
      ids = [int(t) for t in tokens[i, :int(lengths[i])]]
      text_ids = ids[:-1] if ids and ids[-1] in self._stop_ids else ids
      text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
      kind, answer = parse_solver_reply(text)
      results.append(SolverOutput(kind, answer, text, len(prompt), len(ids), tuple(ids)))
    return results


@dataclasses.dataclass(frozen=True)
class OracleLabels:
  """Private labels of one task for the oracle reader (never shown to the policy)."""
  answer: str
  supporting_unit_ids: frozenset[str]


class OracleEvidenceReader(TaskSolver):
  """Diagnostic task solver: answers exactly when all supporting evidence is in C̃_t.

  For CPU runs and for measuring memory quality apart from any LLM: r^task of an
  episode is 1 iff the memory policy put every supporting evidence unit into the active
  context before the episode ended. The labels it holds are private to the solver and
  must never reach the memory policy's input.

  Args:
    labels: task_id -> OracleLabels.
    tokenizer: optional; when given, input/output token counts are those of the LLM
      solver's prompt (`render_solver_prompt`) and of the reply text plus one
      end-of-turn token; when None they are 0.

  Raises (from solve):
    KeyError: a task_id without labels.
  """

  def __init__(self, labels: Mapping[str, OracleLabels], *,
               tokenizer: _ChatTokenizer | None = None):
    self.labels = dict(labels)
    self.tokenizer = tokenizer

  @classmethod
  def from_examples(cls, examples: Iterable[Any], *,
                    tokenizer: _ChatTokenizer | None = None) -> "OracleEvidenceReader":
    """Labels from `hotpotqa.Example`s (reference answer + supporting unit ids)."""
    from vermem_jax.envs import hotpotqa  # pylint: disable=import-outside-toplevel
    labels = {ex.id: OracleLabels(ex.answer, frozenset(hotpotqa.supporting_unit_ids(ex)))
              for ex in examples}
    return cls(labels, tokenizer=tokenizer)

  def solve(self, inputs: Sequence[SolverInput]) -> list[SolverOutput]:
    results = []
    for inp in inputs:
      if inp.task_id not in self.labels:
        raise KeyError(f"OracleEvidenceReader has no labels for task {inp.task_id!r}")
      lab = self.labels[inp.task_id]
      if lab.supporting_unit_ids and lab.supporting_unit_ids <= inp.source_refs:
        kind, answer, text = ANSWER, lab.answer, f"Answer: {lab.answer}"
      else:
        kind, answer, text = CONTINUE, None, "Continue"
      n_in = n_out = 0
      if self.tokenizer is not None:
        n_in = self.tokenizer.count_tokens(render_solver_prompt(self.tokenizer, inp))
        n_out = self.tokenizer.count_tokens(text) + 1  # + end-of-turn token
      results.append(SolverOutput(kind, answer, text, n_in, n_out))
    return results
