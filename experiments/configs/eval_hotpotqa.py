"""Held-out HotpotQA evaluation of a workdir's policies (SPEC §7; paper Appendix C).

Usage:
  python experiments/run.py --config=eval_hotpotqa.py --workdir=W
      # Base + every phase with a checkpoint in W, on eval.num_questions questions
  python experiments/run.py --config=eval_hotpotqa.py --workdir=W \\
      --config.eval.policies=base,phase_b --config.eval.num_questions=50
  python experiments/run.py --config=eval_hotpotqa.py:scale=paper --workdir=W \\
      --config.model.hf_checkpoint=/ckpt/Qwen2.5-7B-Instruct   # the full file

Fields are documented in experiments/configs/parts/paper.py (section `eval`); the
evaluation itself in vermem_jax/eval/evaluate.py.
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
  return common.get_config('eval_hotpotqa', arg)
