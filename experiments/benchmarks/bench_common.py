"""Helpers shared by the data-layer benchmark scripts (bench_envs, bench_episodes).

The scripts run as `python experiments/benchmarks/<name>.py`, so this folder is on
sys.path and they import this module as `bench_common`.
"""

import argparse
import logging
import time


def timed(fn):
  """(fn(), wall seconds it took)."""
  t = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t


def episodes_parser(default_episodes):
  """ArgumentParser with `--episodes` (episodes per phase); scripts add their flags."""
  parser = argparse.ArgumentParser()
  parser.add_argument('--episodes', type=int, default=default_episodes)
  return parser


def quiet_bm25s():
  # bm25s logs every index build at INFO, and importing TFDS lowers the root level,
  # which would bury the figures.
  logging.getLogger('bm25s').setLevel(logging.WARNING)
