"""Pretraining of the tiny CPU base, the stand-in for a pretrained Qwen (issue 22).

Usage: `python experiments/run.py --config=pretrain.py --workdir=runs/base` writes
`runs/base/pretrain/base/`, a Hugging Face folder for `--config.model.hf_checkpoint`;
the packaged base (`vermem_jax/assets/tiny_base`) was made this way. Tiny scale only;
fields in parts/pretrain.py and `vermem_jax.train.pretrain.PretrainConfig`.
"""

import pathlib
import sys

try:
  from experiments.configs import common
except ImportError:  # loaded by file path (config_flags) without the repo root on sys.path
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from experiments.configs import common


def get_config(arg=None):
  """Returns the pretrain config; `arg` is the scale argument (only tiny is allowed)."""
  return common.get_config('pretrain', arg)
