"""Table 2 and the efficiency frontier from a workdir's finished evaluations (SPEC §7;
paper Table 2, Table 3, Figure 2).

Usage:
  python experiments/run.py --config=table2.py --workdir=W
      # reads W/eval_{alfworld,scienceworld,pddl,babyai,hotpotqa}/results.json

Trains and evaluates nothing: run the eval_* configs first. Fields read:
eval.target_success (S*), eval.target_budget (B*), eval.frontier_benchmarks,
eval.output_dir ('' = <workdir>/table2); the aggregation is vermem_jax/eval/table2.py.
"""

import pathlib
import sys

try:
  from experiments.configs import common
except ImportError:  # loaded by file path (config_flags) without the repo root on sys.path
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from experiments.configs import common


def get_config(arg=None):
  """Returns the aggregation config; `arg` is the scale (only the defaults differ)."""
  return common.get_config('table2', arg)
