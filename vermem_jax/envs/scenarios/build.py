"""Phase episodes from HotpotQA examples: build_episode and build_episodes.

SPEC §4, paper Appendix D.4. `build_episode` runs one phase generator on one example,
trims the schedule to the rollout limit, appends the delayed query and checks the
reference command with the executor; `build_episodes` draws a family per episode
uniformly (seeded) and walks a seeded permutation of the pool until the family
applies. Everything is deterministic under `ScenarioConfig.seed` (see the package
docstring, `vermem_jax.envs.scenarios`).
"""

from __future__ import annotations

import dataclasses
import random

from vermem_jax.envs.scenarios import phase_a
from vermem_jax.envs.scenarios import phase_b
from vermem_jax.envs.scenarios import phase_c
from vermem_jax.envs.scenarios.generator_parts import Skip, query_obs
from vermem_jax.envs.scenarios.initial_state import TASK_STATES
from vermem_jax.envs.episode_types import SOLVER_READS_LTM
from vermem_jax.envs.scenarios.spec import (FAMILIES, PHASES, DelayedQuery,
                                            ScenarioConfig, ScenarioSpec)
from vermem_jax.envs.scenarios.views import build_view
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import state as mstate
from vermem_jax.memory.config import ExecutorConfig


_GENERATORS = {'A': phase_a.generate, 'B': phase_b.generate, 'C': phase_c.generate}


def _trim_schedule(schedule, view, max_len):
  """Drops observations (distractors first, from the end) to `max_len` entries, so
  the delayed query still arrives within the rollout limit."""
  fact_units = {f.unit_id for f in view.facts}
  while len(schedule) > max(max_len, 0):
    for k in range(len(schedule) - 1, -1, -1):
      if not set(schedule[k].source_refs) & fact_units:
        del schedule[k]
        break
    else:
      del schedule[-1]
  return schedule


def build_episode(example, phase, family, *, count_tokens, config=ScenarioConfig(),
                  rng=None, split='train', episode_id=None, view=None):
  """One ScenarioSpec of `phase` and `family` from `example`.

  Args:
    example: a HotpotQA train Example (construction pool for split 'train',
      internal-dev pool for 'dev').
    phase: 'A' | 'B' | 'C'.
    family: one of FAMILIES[phase].
    count_tokens: `str -> int` backbone token counter (tokens).
    config: ScenarioConfig.
    rng: random.Random (default: seeded from config.seed, phase, family, example id).
    split: 'train' | 'dev' (recorded on the spec).
    episode_id: default f'{phase}:{split}:{example.id}:{family}'.
    view: a prebuilt ExampleView (speed).

  Returns:
    ScenarioSpec, or None when the family does not apply to this example (no number to
    correct, too few documents, nothing fits the budget).

  Raises:
    ValueError: unknown phase/family; RuntimeError if a constructed reference command
      is rejected by the executor (a bug, never expected).
  """
  if phase not in PHASES:
    raise ValueError(f'unknown phase {phase!r}; expected one of {PHASES}')
  if family not in FAMILIES[phase]:
    raise ValueError(f'unknown Phase {phase} family {family!r}; expected one of '
                     f'{FAMILIES[phase]}')
  if rng is None:
    rng = random.Random(f'{config.seed}:{phase}:{family}:{example.id}')
  if view is None:
    view = build_view(example, count_tokens, max_doc_sentences=config.max_doc_sentences,
                      max_doc_tokens=config.max_doc_tokens)
  if not view.facts:
    return None
  try:
    b, schedule, ref, recovery, source = _GENERATORS[phase](
        view, family, rng, count_tokens, config)
  except Skip:
    return None
  schedule = _trim_schedule(list(schedule), view, config.rollout_limit - 2)
  n_docs = len(schedule)
  observations = []
  for k, ob in enumerate(schedule):
    observations.append(dataclasses.replace(
        ob, task_state=TASK_STATES['progress'].format(k=k + 1, n=n_docs)))
  observations.append(query_obs(example))
  state = b.finish()
  exec_config = ExecutorConfig(phase=phase, context_budget=config.context_budget)
  tr = mexec.execute(state, ref, exec_config, count_tokens)
  if not tr.accepted and all(v.kind == 'context_overflow' for v in tr.violations):
    return None  # the reference would not fit this budget: family does not apply
  if tr.accepted and ref.op == cmds.RETRIEVE:
    facts = {f.unit_id for f in view.facts}
    got = set().union(*(it.evidence for it in tr.state_after.C
                        if it.kind == mstate.RETRIEVED))
    if not got & facts:
      return None  # BM25 finds no stored fact for q: not a usable Retrieve case
  if not tr.accepted:
    raise RuntimeError(f'episode {phase}/{family} of {example.id}: reference command '
                       f'{cmds.format_command(ref)[:200]} rejected: {tr.message}')
  query = DelayedQuery(text=example.question, context_source=source,
                       observation_index=len(observations) - 1)
  # Phase A poses the query last and the solver reads LTM from then on; in B and C the
  # solver works on C_t from the first decision (the last observation re-poses q).
  answer_from = len(observations) if source == SOLVER_READS_LTM else 0
  return ScenarioSpec(
      episode_id=episode_id or f'{phase}:{split}:{example.id}:{family}',
      example=example, initial_state=state, observations=tuple(observations),
      phase=phase, allowed_ops=None,
      max_decisions=min(len(observations) + 1, config.rollout_limit),
      token_budget=config.token_budget, family=family, split=split,
      delayed_query=query, reference_command=cmds.format_command(ref),
      is_recovery=recovery, context_budget=config.context_budget,
      answer_from=answer_from, answer_context=source,
      stale_texts=tuple(b.stale_texts))


def build_episodes(examples, phase, *, count_tokens, config=ScenarioConfig(),
                   split='train', num=None):
  """`num` Phase-`phase` episodes from `examples` (deterministic under config.seed).

  Episode i draws its family uniformly from FAMILIES[phase] and its example from a
  seeded permutation of `examples` (cycled); when the family does not apply to that
  example, the next example of the permutation is tried with the same family (so
  families stay uniform).

  Args:
    examples: the pool (construction pool for 'train', internal-dev for 'dev').
    phase: 'A' | 'B' | 'C'.
    count_tokens: `str -> int` (tokens).
    config: ScenarioConfig (num_train / num_dev when `num` is None).
    split: 'train' | 'dev'.
    num: number of episodes (default config.num_train or config.num_dev).

  Returns:
    list of ScenarioSpec of length `num`.

  Raises:
    ValueError: empty pool, unknown phase/split, or no example of the pool supports a
      drawn family.
  """
  if split not in ('train', 'dev'):
    raise ValueError(f"split must be 'train' or 'dev', got {split!r}")
  if phase not in PHASES:
    raise ValueError(f'unknown phase {phase!r}; expected one of {PHASES}')
  if num is None:
    num = config.num_train if split == 'train' else config.num_dev
  if num and not examples:
    raise ValueError(f'Phase {phase} {split}: the example pool is empty')
  order = list(range(len(examples)))
  random.Random(f'{config.seed}:{phase}:{split}:order').shuffle(order)
  views = {}
  specs = []
  cursor = 0
  for i in range(num):
    rng = random.Random(f'{config.seed}:{phase}:{split}:{i}')
    family = rng.choice(FAMILIES[phase])
    spec = None
    for _ in range(len(order)):
      ex = examples[order[cursor % len(order)]]
      cursor += 1
      view = views.get(ex.id)
      if view is None:
        view = views[ex.id] = build_view(
            ex, count_tokens, max_doc_sentences=config.max_doc_sentences,
            max_doc_tokens=config.max_doc_tokens)
      spec = build_episode(ex, phase, family, count_tokens=count_tokens,
                           config=config, rng=rng, split=split, view=view,
                           episode_id=f'{phase}:{split}:{i}:{ex.id}:{family}')
      if spec is not None:
        break
    if spec is None:
      raise ValueError(f'Phase {phase} {split}: no example supports family {family!r}')
    specs.append(spec)
  return specs
