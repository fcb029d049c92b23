"""Evaluation of a workdir's policies on the interactive benchmark 'pddl' (SPEC §7; paper
Appendix C.1-C.2): memory episodes through the same loop as HotpotQA evaluation.

Usage:
  python experiments/run.py --config=eval_pddl.py --workdir=W
      # Base + every phase with a checkpoint in W; tiny: a few instances, gold-plan solver
  python experiments/run.py --config=eval_pddl.py:scale=paper --workdir=W \\
      --config.model.hf_checkpoint=/ckpt/Qwen2.5-7B-Instruct   # the official test split

Section `benchmark` holds the adapter's settings (experiments/configs/parts/
benchmarks.py; third_party/vermem_benchmarks/pddl/README.md); `eval.num_questions`
subsamples instances per seed; the evaluation is vermem_jax/eval/benchmark_suite.py.
"""

import pathlib
import sys

try:
  from experiments.configs import common
except ImportError:  # loaded by file path (config_flags) without the repo root on sys.path
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from experiments.configs import common


def get_config(arg=None):
  """Returns the evaluation config; `arg` is the scale ('scale=tiny' | 'scale=paper')."""
  return common.get_config('eval_pddl', arg)
