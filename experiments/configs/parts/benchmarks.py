"""Section `benchmark` of the interactive-benchmark evaluation configs (SPEC §7).

`eval_alfworld`, `eval_scienceworld`, `eval_pddl` and `eval_babyai` carry a `benchmark`
section whose keys are the fields of the adapter's config dataclass
(`third_party/vermem_benchmarks/<name>/env.py`, `Benchmark.config_class`), so
`--config.benchmark.<field>=...` reaches the adapter unchanged. The values are written
out here, not read from the adapters: a config must build (and `--dry_run` print)
without the optional packages installed.

Paper scale: the official test splits (paper C.1, every instance); tiny: a handful of
short instances and the gold-plan stand-in solver, so a table is printed on a CPU in
minutes.
"""

from __future__ import annotations

import ml_collections

from experiments.configs.parts import curriculum

# BabyAI levels of the instance list (decision: single- and two-room levels covering
# go-to, pick-up, open, put-next and unlock missions, all within the macro set).
BABYAI_LEVELS = (
    'BabyAI-GoToRedBallGrey-v0', 'BabyAI-GoToRedBall-v0', 'BabyAI-GoToObj-v0',
    'BabyAI-GoToLocal-v0', 'BabyAI-PickupLoc-v0', 'BabyAI-OpenDoor-v0',
    'BabyAI-PutNextLocal-v0', 'BabyAI-UnlockLocal-v0')


def _scienceworld(c: ml_collections.ConfigDict) -> dict:
  # decision: a live ScienceWorld episode holds one JVM: 16 advance together, and as
  # many idle JVMs are kept for the next chunk.
  c.eval.batch_size = 16
  return {
      'tasks': (),                     # () = all 30 tasks of the simulator
      'split': 'test',                 # SPEC §7: the official test variations (1,819)
      'variations_per_task': ml_collections.FieldReference(None, field_type=int),
      'simplification': 'easy',        # decision: teleport, open doors, no electricity
      'max_steps': 100,                # decision: actions per episode
      'pool_size': c.eval.get_ref('batch_size'),
  }


def _babyai(c: ml_collections.ConfigDict) -> dict:
  del c
  return {
      'levels': BABYAI_LEVELS,
      'episodes_per_level': 14,        # decision: 8 levels x 14 = 112 episodes
      'seed_start': 1_000_000_000,     # BabyAI's held-out test seeds start at 10**9
      'max_steps': 50,                 # decision: text actions (a macro counts once)
  }


def _pddl(c: ml_collections.ConfigDict) -> dict:
  del c
  return {
      'domains': ('blocks', 'gripper'),  # what pddlgym ships (AgentBoard's need pddl_dir)
      'problems': (),                  # () = every problem of the test folders (15)
      'pddl_dir': '',                  # '' = pddlgym's bundled files
      'problem_dir': '{domain}_test',  # pddlgym's held-out problems
      'max_steps': 50,                 # decision: actions per episode
      'count_initial_state': False,    # AgentBoard's progress rate
      'observation': 'full',
      'plan_search_expansions': 20000,  # gold-plan stand-in only
  }


def _alfworld(c: ml_collections.ConfigDict) -> dict:
  del c
  return {
      'data_dir': '',                  # '' = $ALFWORLD_DATA (alfworld-download's folder)
      'split': 'valid_unseen',         # SPEC §7: the out-of-distribution test split (134)
      'task_types': (1, 2, 3, 4, 5, 6),
      'max_games': ml_collections.FieldReference(None, field_type=int),  # None = all
      'max_steps': 50,                 # decision: the limit ALFWorld LLM agents use
  }


_PAPER = {'scienceworld': _scienceworld, 'babyai': _babyai, 'pddl': _pddl,
          'alfworld': _alfworld}

# Tiny reductions: short instances whose gold plans fit the step limits.
_TINY = {
    'scienceworld': {'tasks': ('find-living-thing', 'find-plant'),
                     'variations_per_task': 2, 'max_steps': 30},
    'babyai': {'levels': ('BabyAI-GoToObj-v0', 'BabyAI-PickupLoc-v0',
                          'BabyAI-GoToLocal-v0', 'BabyAI-OpenDoor-v0'),
               'episodes_per_level': 1, 'max_steps': 20},
    'pddl': {'problems': ('blocks/problem2', 'blocks/problem6', 'blocks/problem4',
                          'gripper/prob02'), 'max_steps': 30},
    'alfworld': {'max_games': 4, 'max_steps': 20},
}


def benchmark_section(c: ml_collections.ConfigDict) -> None:
  """Adds `c.benchmark` for a benchmark evaluation config (nothing otherwise)."""
  name = curriculum.BENCHMARK_CONFIGS.get(c.phase)
  if name is None:
    return
  c.benchmark = ml_collections.ConfigDict(_PAPER[name](c))


def apply_tiny(c: ml_collections.ConfigDict) -> None:
  """The tiny scale of a benchmark evaluation config: a few short instances, the
  gold-plan stand-in solver, four episodes advancing together."""
  name = curriculum.BENCHMARK_CONFIGS.get(c.phase)
  if name is None:
    return
  c.solver.backend = 'gold_plan'       # stand-in: replays gold plans; tables say so
  c.eval.batch_size = 4
  for key, value in _TINY[name].items():
    c.benchmark[key] = value
