"""Helpers shared by the benchmark scripts (timing, flags, the --out JSON file).

The scripts run as `python experiments/benchmarks/<name>.py`, so this folder is on
sys.path and they import this module as `bench_common`.
"""

import argparse
import logging
import os
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


def out_path(text):
  """The `--out` value, checked before any work: a file path in an existing, writable
  folder (argparse reports the ArgumentTypeError and exits with status 2)."""
  folder = os.path.dirname(os.path.abspath(text))
  if not text or os.path.isdir(text):
    raise argparse.ArgumentTypeError(f'{text!r} is not a file path')
  if not os.path.isdir(folder):
    raise argparse.ArgumentTypeError(f'folder {folder} does not exist')
  if not os.access(folder, os.W_OK):
    raise argparse.ArgumentTypeError(f'folder {folder} is not writable')
  return text


def add_out_flag(parser):
  """Adds `--out=FILE.json` (every benchmark writes its figures there when given; a
  path that cannot be written is refused when the flags are parsed)."""
  parser.add_argument('--out', default=None, type=out_path,
                      help='write the figures as JSON to this file')
  return parser


def write_figures(path, figures):
  """Writes `figures` (JSON values) to `path` with the time, command line and load
  average, so runs can be compared over time; no-op when path is None."""
  if not path:
    return
  import json  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  record = {'figures': figures, 'argv': sys.argv,
            'unix_time': time.time(), 'load_average': os.getloadavg()}
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(record, f, indent=2, default=float)
  print(f'figures written to {path}')


def time_median(fn, repeats, cpu=False):
  """(seconds of a first, warm-up call, median wall seconds of `repeats` more calls)
  of a blocking callable; with cpu=True also the median CPU seconds of this process
  per call (all its threads: the work done, which a machine shared with other jobs
  inflates much less than wall time)."""
  import statistics  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  fn()
  first = time.perf_counter() - t0
  walls, cpus = [], []
  for _ in range(max(1, repeats)):
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
  if cpu:
    return first, statistics.median(walls), statistics.median(cpus)
  return first, statistics.median(walls)


# CPU flags that decide bf16 matmul speed (Linux /proc/cpuinfo names): avx512f alone
# converts bf16 in software, avx512_bf16 has bf16 dot products, amx_bf16 tile matmuls.
BF16_FLAGS = ('avx512f', 'avx512_bf16', 'amx_bf16')


def cpu_description(cpuinfo=None):
  """'<model name> (avx512f yes, avx512_bf16 no, amx_bf16 no)' of this machine's first
  CPU, from the text of /proc/cpuinfo (read when `cpuinfo` is None). A framework's bf16
  speed depends on these flags (torch uses AMX / AVX512-BF16 kernels when present), so
  speed ratios are printed with it. Unknown parts (no /proc/cpuinfo, other OS) read
  'unknown'."""
  if cpuinfo is None:
    try:
      with open('/proc/cpuinfo', encoding='utf-8') as f:
        cpuinfo = f.read()
    except OSError:
      cpuinfo = ''
  fields = {}
  for line in cpuinfo.splitlines():
    key, sep, value = line.partition(':')
    if sep and key.strip() not in fields:
      fields[key.strip()] = value.strip()
  model = fields.get('model name', 'unknown CPU')
  if 'flags' not in fields:
    return f'{model} (bf16 flags unknown)'
  flags = set(fields['flags'].split())
  return f'{model} (' + ', '.join(
      f'{name} {"yes" if name in flags else "no"}' for name in BF16_FLAGS) + ')'
