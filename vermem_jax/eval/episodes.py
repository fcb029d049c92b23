"""Held-out HotpotQA evaluation episodes (paper Appendix C.1-C.4; SPEC §7).

One validation (distractor) question is one episode, run through the same memory
environment and batched episode loop as training (`envs.environment.run_episodes`):

  s_0: M_0 and H_0 empty; C_0 = the (protected) task instruction and the first
       passage (the initial input); q, the question, is part of the state and shown to
       policy and solver at every step (SPEC §1, §7). The first passage is therefore
       in C only: the later ones enter H as observations through T_e, so SelectEpisode
       can restore them, but not the first one once it has been filtered out.
  z_1, z_2, ...: the remaining passages, one per step, in the file's order.
  After each observation the policy takes one memory decision and the task solver
  acts on (q, C̃_t). The episode ends when the solver answers, when the passages have
  run out (the solver's last call is marked `final`: it must answer), or when the
  hard online-token budget is exhausted (unsuccessful).

Decoding is greedy for policy and solver (the caller builds them so; `check_greedy`),
the verifiers are not part of the loop, and no label (answer, supporting facts)
enters any state text: the environment holds no reference here, so the executor's
leakage check (`MemoryState.forbidden`) is off — the labels live only in
`EpisodeSpec.example` for scoring and for the oracle reader, the one labelled
diagnostic exception.

Base (paper C.4): the same backbone, solver and context budget, with no memory policy
and no LTM. `base_policy` answers every decision with ∅ at zero tokens (no policy
model is called), M stays empty, and the episode's T_e keeps the newest observations
that fit the budget (`EpisodeSpec.evict_oldest_observations`).

Benchmarks other than HotpotQA plug in by building their own EpisodeSpecs (initial
state from the benchmark's first observation) and a per-episode success flag; the
loop, the records (`eval.metrics`) and the frontier (`eval.frontier`) are shared.
"""

from __future__ import annotations

import html
from typing import Callable, Optional, Sequence

import numpy as np

from vermem_jax.envs import environment
from vermem_jax.envs import hotpotqa
from vermem_jax.envs.scenarios import initial_state as scenario_states
from vermem_jax.envs import task_solvers
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import state as mstate

# The training instruction (scenarios): the policy sees the same framing at test time.
INSTRUCTION_TEXT = scenario_states.INSTRUCTION_TEXT
# Task-state texts shown in x_t (our wording, the same family as the training ones).
TASK_STATE_START = 'reading passages; the question is open'
TASK_STATE_PROGRESS = 'passage {k} of {n} revealed'

BASE = 'base'


def passage_text(paragraph: hotpotqa.Paragraph) -> str:
  """'Title: sentence sentence ...' (HTML entities of the title unescaped, empty
  sentences dropped); '' when no sentence has text."""
  sentences = [s.strip() for s in paragraph.sentences if s.strip()]
  if not sentences:
    return ''
  title = html.unescape(paragraph.title).strip() or paragraph.title
  return f'{title}: ' + ' '.join(sentences)


def passages(example: hotpotqa.Example) -> list[tuple[str, tuple[str, ...]]]:
  """(text, evidence-unit ids) of each passage, in the file's order.

  A repeated title is skipped (its ids belong to the first paragraph, as in
  `hotpotqa.evidence_units`), and so is a paragraph without text.
  """
  out, seen = [], set()
  for para in example.context:
    if para.title in seen:
      continue
    seen.add(para.title)
    text = passage_text(para)
    if text:
      refs = tuple(hotpotqa.unit_id(para.title, i)
                   for i, s in enumerate(para.sentences) if s.strip())
      out.append((text, refs))
  return out


def build_episode(example: hotpotqa.Example, *, count_tokens: Callable[[str], int],
                  context_budget: int, base: bool = False,
                  token_budget: Optional[int] = None,
                  episode_id: Optional[str] = None) -> environment.EpisodeSpec:
  """The evaluation episode of one validation question (module docstring).

  Args:
    example: a HotpotQA validation example.
    count_tokens: backbone `str -> int` token counter.
    context_budget: C_t budget in tokens (memory.context_budget); the first passage
      enters C_0 only if it fits beside the instruction.
    base: the Base baseline's context rule (newest observations that fit).
    token_budget: hard online-token budget of the episode (None: unlimited).
    episode_id: defaults to the question id.

  Returns:
    An EpisodeSpec over the full command space ('C'), max_decisions = number of
    passages, answer_from = 0 (the question is posed from the start).

  Raises:
    ValueError: the example has no passage with text.
  """
  docs = passages(example)
  if not docs:
    raise ValueError(f'HotpotQA example {example.id!r} has no passage with text')
  n = len(docs)
  state = mstate.new_state(example.id, example.question, count_tokens,
                           instruction=INSTRUCTION_TEXT, task_state=TASK_STATE_START)
  text, refs = docs[0]
  if state.context_tokens() + count_tokens(text) <= context_budget:
    state, item_id = mstate.add_context(state, mstate.OBSERVATION, text, count_tokens,
                                        source_refs=refs)
    state = state.evolve(env_item_id=item_id)
  state = mstate.set_task_state(state, TASK_STATE_PROGRESS.format(k=1, n=n))
  observations = tuple(
      environment.Observation(text=t, source_refs=r,
                              task_state=TASK_STATE_PROGRESS.format(k=i + 2, n=n))
      for i, (t, r) in enumerate(docs[1:]))
  return environment.EpisodeSpec(
      episode_id=episode_id or example.id, example=example, initial_state=state,
      observations=observations, phase='C', max_decisions=n, token_budget=token_budget,
      family='hotpotqa_validation', answer_from=0,
      answer_context=environment.SOLVER_READS_CONTEXT,
      evict_oldest_observations=bool(base))


def base_policy(inputs: Sequence[str]) -> list[environment.PolicyOutput]:
  """Base (paper C.4): no memory policy. Every decision is ∅ and no model is called,
  so it costs no tokens; x_t is still rendered by the loop but never read."""
  return [environment.PolicyOutput(mcommands.NULL_SYMBOL, 0, 0) for _ in inputs]


def select_questions(examples: Sequence[hotpotqa.Example], num_questions: Optional[int],
                     seed: int) -> list[hotpotqa.Example]:
  """The evaluated questions of one seed, in their fixed order.

  Args:
    examples: the validation examples in file order.
    num_questions: how many; None or 0 (or >= len) = all of them, in file order.
    seed: subsample seed (NumPy PCG64): the subset and its order depend on it only.

  Raises:
    ValueError: num_questions < 0.
  """
  n = len(examples)
  if num_questions is not None and num_questions < 0:
    raise ValueError(f'num_questions must be >= 0, got {num_questions}')
  if not num_questions or num_questions >= n:
    return list(examples)
  order = np.random.default_rng(int(seed)).permutation(n)[:int(num_questions)]
  return [examples[int(i)] for i in order]


def check_greedy(temperature: float, top_p: float, what: str) -> None:
  """Raises ValueError unless decoding is greedy (paper C.3: temperature 0, top-p 1)."""
  if float(temperature) != 0.0 or float(top_p) != 1.0:
    raise ValueError(f'{what}: evaluation decodes greedily (temperature 0, top-p 1), '
                     f'got temperature={temperature}, top_p={top_p}')


def run(specs: Sequence[environment.EpisodeSpec], policy: environment.Policy,
        solver: task_solvers.TaskSolver, *, count_tokens: Callable[[str], int],
        executor_config: mexec.ExecutorConfig) -> list[environment.EpisodeResult]:
  """Runs evaluation episodes together: one batched policy call and one batched solver
  call per step across the live episodes (`environment.run_episodes`).

  Args:
    specs: from `build_episode` (their own max_decisions and token_budget apply).
    policy: batched `x_t list -> PolicyOutput list` (a greedy sampler bound to a key,
      or `base_policy`).
    solver: the task solver.
    count_tokens: backbone token counter.
    executor_config: the run's memory settings (context budget, g(s) limit, costs).

  Returns:
    One EpisodeResult per spec, in order.
  """
  return environment.run_episodes(
      specs, policy, solver, count_tokens=count_tokens, executor_config=executor_config,
      env_config=environment.EnvConfig(rollout_limit=max(
          [s.max_decisions or 1 for s in specs] + [1]), token_budget=None))
