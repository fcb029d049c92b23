"""Phase B: GRPO on STM operations {Retrieve, Filter, SelectEpisode, Summarize, ∅}; π_ref = θ_A (SPEC §4).

Usage: `python experiments/run.py --config=phase_b.py` (tiny CPU scale) or
`--config=phase_b.py:scale=paper`; fields are documented in parts/paper.py.
"""

import pathlib
import sys

try:
  from experiments.configs import common
except ImportError:  # loaded by file path (config_flags) without the repo root on sys.path
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from experiments.configs import common


def get_config(arg=None):
  """Returns the phase_b config; `arg` is the scale argument ('scale=tiny' | 'scale=paper')."""
  return common.get_config('phase_b', arg)
