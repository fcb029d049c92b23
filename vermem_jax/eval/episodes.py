"""Held-out HotpotQA evaluation episodes (paper Appendix C.1-C.4; SPEC §7).

One validation (distractor) question is one episode, run through the same memory
environment and batched episode loop as training (`envs.environment.run_episodes`):

  s_0: M_0 empty; C_0 = the (protected) task instruction and the first passage (the
       initial input); q, the question, is part of the state and shown to policy and
       solver at every step (SPEC §1, §7). The first passage enters like every later
       one (`memory.interaction.observe`): recorded in H_0, and in C_0 when T_e's
       admission rule lets it in, so SelectEpisode can always restore it.
  z_1, z_2, ...: the remaining passages, one per step, in the file's order.
  Passages enter as the training documents do (`envs.documents`, SPEC §7): one longer
  than `ExecutorConfig.chunk_tokens` (the tiny scale: 80 tokens) is revealed in
  sentence chunks, one observation per step, and T_e keeps that much of C free, so a
  chunk held only in H can be restored as in Phase B's recovery states.
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
that fit the budget (`EpisodeSpec.evict_oldest_observations`; no restore room is kept).

Tool set (`build_episode(phase=...)`): θ_C, SFT and outside checkpoints are evaluated
with all seven tools (the paper's protocol, op space 'C'); an earlier phase's policy
with the op space it was trained on (Phase A's LTM tools, Phase B's STM tools), and
the results table says so.

Benchmarks other than HotpotQA plug in by building their own EpisodeSpecs (initial
state from the benchmark's first observation) and a per-episode success flag; the
loop, the records (`eval.metrics`) and the frontier (`eval.frontier`) are shared.
"""

from __future__ import annotations

import html
from typing import Any, Callable, Optional, Sequence

import numpy as np

from vermem_jax.envs import documents
from vermem_jax.envs import environment
from vermem_jax.envs import episode_types
from vermem_jax.envs import hotpotqa
from vermem_jax.envs.scenarios import initial_state as scenario_states
from vermem_jax.envs import task_solvers
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import interaction
from vermem_jax.memory import state as mstate

# Task-state texts shown in x_t (our wording, the same family as the training ones).
TASK_STATE_START = 'reading passages; the question is open'
TASK_STATE_PROGRESS = 'passage {k} of {n} revealed'
TASK_STATE_PART = 'passage {k} of {n} revealed (part {j} of {m})'

BASE = 'base'


def _passage_parts(paragraph):
  """(display title, stripped non-empty sentences, their unit ids)."""
  title = html.unescape(paragraph.title).strip() or paragraph.title
  kept = [(s.strip(), hotpotqa.unit_id(paragraph.title, i))
          for i, s in enumerate(paragraph.sentences) if s.strip()]
  return title, [s for s, _ in kept], tuple(u for _, u in kept)


def passages(example: hotpotqa.Example) -> list[tuple[str, tuple[str, ...]]]:
  """(text, evidence-unit ids) of each passage, in the file's order.

  A repeated title is skipped (its ids belong to the first paragraph, as in
  `hotpotqa.evidence_units`), and so is a paragraph without text.
  """
  return [(documents.chunk_text(title, sentences), refs)
          for title, sentences, refs in _distinct_passages(example)]


def _distinct_passages(example):
  out, seen = [], set()
  for para in example.context:
    if para.title in seen:
      continue
    seen.add(para.title)
    title, sentences, refs = _passage_parts(para)
    if sentences:
      out.append((title, sentences, refs))
  return out


def passage_observations(example: hotpotqa.Example, *, count_tokens: Callable[[str], int],
                         chunk_tokens: int) -> list[episode_types.Observation]:
  """The observations that reveal `example`'s passages, in order (`envs.documents`):
  a passage of at most `chunk_tokens` tokens is one observation, a longer one its
  sentence chunks; each names its evidence units and says which passage (and part)
  it is in its task state.

  Raises:
    ValueError: the example has no passage with text.
  """
  docs = _distinct_passages(example)
  if not docs:
    raise ValueError(f'HotpotQA example {example.id!r} has no passage with text')
  n = len(docs)
  out = []
  for k, (title, sentences, refs) in enumerate(docs, 1):
    groups = documents.sentence_chunks(title, sentences, chunk_tokens, count_tokens)
    for j, g in enumerate(groups, 1):
      state = (TASK_STATE_PROGRESS.format(k=k, n=n) if len(groups) == 1 else
               TASK_STATE_PART.format(k=k, n=n, j=j, m=len(groups)))
      out.append(episode_types.Observation(
          text=documents.chunk_text(title, [sentences[i] for i in g]),
          source_refs=tuple(refs[i] for i in g), task_state=state))
  return out


def build_episode(example: hotpotqa.Example, *, count_tokens: Callable[[str], int],
                  executor_config: mconfig.ExecutorConfig, base: bool = False,
                  token_budget: Optional[int] = None, phase: str = 'C',
                  episode_id: Optional[str] = None) -> episode_types.EpisodeSpec:
  """The evaluation episode of one validation question (module docstring).

  Args:
    example: a HotpotQA validation example.
    count_tokens: backbone `str -> int` token counter.
    executor_config: the run's memory settings: context_budget (C_t's budget) and
      chunk_tokens (how passages are revealed and how much of C T_e keeps free).
    base: the Base baseline's context rule (newest observations that fit).
    token_budget: hard online-token budget of the episode (None: unlimited).
    phase: the op space the policy acts in: 'C' (all tools; the paper's protocol),
      'A' or 'B' for a policy of that phase (module docstring).
    episode_id: defaults to the question id.

  Returns:
    An EpisodeSpec over `phase`'s command space, max_decisions = number of
    observations (the first included), answer_from = 0 (the question is posed from
    the start).

  Raises:
    ValueError: the example has no passage with text; an unknown phase.
  """
  if phase not in ('A', 'B', 'C'):
    raise ValueError(f"phase must be 'A', 'B' or 'C', got {phase!r}")
  obs = passage_observations(example, count_tokens=count_tokens,
                             chunk_tokens=executor_config.chunk_tokens)
  state = mstate.new_state(example.id, example.question, count_tokens,
                           instruction=scenario_states.INSTRUCTION_TEXT,
                           task_state=TASK_STATE_START)
  first = obs[0]
  state, _ = interaction.observe(state, first.text, count_tokens, executor_config,
                                 observation_refs=first.source_refs, step=0,
                                 evict_oldest=base)
  state = mstate.set_task_state(state, first.task_state)
  return episode_types.EpisodeSpec(
      episode_id=episode_id or example.id, example=example, initial_state=state,
      observations=tuple(obs[1:]), phase=phase, max_decisions=len(obs),
      token_budget=token_budget, family='hotpotqa_validation', answer_from=0,
      answer_context=episode_types.SOLVER_READS_CONTEXT,
      evict_oldest_observations=bool(base))


def base_policy(inputs: Sequence[str]) -> list[episode_types.PolicyOutput]:
  """Base (paper C.4): no memory policy. Every decision is ∅ and no model is called,
  so it costs no tokens; x_t is still rendered by the loop but never read."""
  return [episode_types.PolicyOutput(mcommands.NULL_SYMBOL, 0, 0) for _ in inputs]


def chunks(items: Sequence[Any], batch_size: int) -> list[Sequence[Any]]:
  """`items` in consecutive chunks of `batch_size` (0 = one chunk of all)."""
  step = int(batch_size) or max(len(items), 1)
  return [items[i:i + step] for i in range(0, len(items), step)]


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


def run(specs: Sequence[episode_types.EpisodeSpec], policy: episode_types.Policy,
        solver: task_solvers.TaskSolver, *, count_tokens: Callable[[str], int],
        executor_config: mconfig.ExecutorConfig) -> list[episode_types.EpisodeResult]:
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
      env_config=episode_types.EnvConfig(rollout_limit=max(
          [s.max_decisions or 1 for s in specs] + [1]), token_budget=None))
