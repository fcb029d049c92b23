"""Metric files of a phase: TensorBoard events, a JSONL log, the advantage table, a bar.

Files under the phase directory `workdir/<phase>/`:

- `metrics.jsonl` — one JSON object per logged step: `{"step": int, "time": float (Unix
  seconds), <name>: float, ...}`.
- `events.out.tfevents.*` — the same scalars as TensorBoard events (tensorboardX).
- `advantages.jsonl` — one row per memory decision (`ADVANTAGE_COLUMNS`), for analysing
  advantage statistics (experiments/notebooks/advantage_statistics.ipynb).

Every write is flushed, so a killed run loses at most the row being written.

Resume rule (both JSONL files): a checkpoint's step s means s completed updates (RL) or
optimizer steps (SFT); a row belongs to the step/update that produced it (`step` in
metrics.jsonl, `update` in advantages.jsonl, both counted from 1). Opening a writer with
`resume_step=s` rewrites the file atomically without rows whose step/update is > s (they
came from work the restored run will redo) and without a torn last line; a fresh start is
`resume_step=0`. TensorBoard gets `purge_step=s + 1`, so TensorBoard hides the stale
events of steps > s. After a resume the files therefore match an uninterrupted run, row
for row, except for the `time` field.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import tqdm

METRICS_FILE = 'metrics.jsonl'
ADVANTAGES_FILE = 'advantages.jsonl'

# Columns of advantages.jsonl, one row per memory decision u_{t,k}:
#   phase          'sft' | 'phase_a' | 'phase_b' | 'phase_c'
#   update         1-based GRPO update index (= checkpoint step after that update)
#   task           index of the task q within the update (0 .. tasks_per_update-1)
#   rollout        index k of the rollout within the task's group (0 .. K-1)
#   step           decision index t within the rollout (0-based)
#   operation      'Add' | 'Update' | 'Delete' | 'Retrieve' | 'Filter' |
#                  'SelectEpisode' | 'Summarize' | 'Null' (unparseable text: 'Invalid')
#   accepted       bool, the executor's checks passed
#   violations     list of violation kinds (SPEC §3), [] when none
#   cost           constraint cost c_{t,k} in [0, 1] (SPEC §3)
#   r_local        r^local_{t,k} in [0, 1], null for rejected (unscored) commands (§5)
#   A_local        A^local_{t,k} after clipping (0 for rejected commands) (§6)
#   A_global       A^global_k after clipping (§6)
#   A_hier         the advantage.mode's A^hier, λ_l A^local + λ_g A^global − λ_c c in
#                  'full' (§6), after advantage.rejection_floor (rl/advantages.py)
#   command_tokens number of generated command tokens L_{t,k}
ADVANTAGE_COLUMNS = ('phase', 'update', 'task', 'rollout', 'step', 'operation',
                     'accepted', 'violations', 'cost', 'r_local', 'A_local', 'A_global',
                     'A_hier', 'command_tokens')
_INT_COLUMNS = ('update', 'task', 'rollout', 'step', 'command_tokens')
_FLOAT_COLUMNS = ('cost', 'A_local', 'A_global', 'A_hier')


def _py(value: Any) -> Any:
  """NumPy/JAX scalars -> Python values for JSON."""
  if isinstance(value, np.generic):
    return value.item()
  if hasattr(value, 'shape') and getattr(value, 'shape', None) == ():
    return np.asarray(value).item()
  return value


def read_jsonl(path: str | os.PathLike) -> list[dict]:
  """Rows of a JSONL file; a torn (unterminated, unparsable) last line is skipped.

  Raises:
    ValueError: a complete line that is not valid JSON (names the file and line).
  """
  if not os.path.exists(path):
    return []
  with open(path, 'rb') as f:
    data = f.read()
  lines = data.split(b'\n')
  rows = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError as e:
      if i == len(lines) - 1:  # no trailing newline: a write cut short by a kill
        break
      raise ValueError(f'{path}:{i + 1}: not valid JSON ({e}); fix or delete that '
                       'line (the file was left as it is)') from e
  return rows


def _row_key(path: str, i: int, row: Any, key: str) -> int:
  """row[key] as an int step; raises ValueError naming the file and row if it is not."""
  if not isinstance(row, dict):
    raise ValueError(f'{path}: row {i + 1} ({json.dumps(row)[:80]}) is not a JSON '
                     'object; fix or delete that line (the file was left as it is)')
  value = row.get(key, 0)
  if isinstance(value, bool) or not isinstance(value, int):
    raise ValueError(f'{path}: row {i + 1} ({json.dumps(row)[:80]}) has {key}={value!r}, '
                     'not an integer; fix or delete that line (the file was left as '
                     'it is)')
  return value


def _truncate_jsonl(path: str, key: str, keep_up_to: int) -> int:
  """Atomically rewrites `path` keeping rows with row[key] <= keep_up_to; returns kept.

  Every row is checked before anything is written, so a corrupt file raises ValueError
  and stays byte-for-byte as it was.
  """
  rows = [r for i, r in enumerate(read_jsonl(path))
          if _row_key(path, i, r, key) <= keep_up_to]
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    for r in rows:
      f.write(json.dumps(r) + '\n')
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return len(rows)


class MetricsWriter:
  """Scalars per step to `<phase_dir>/metrics.jsonl` and TensorBoard events.

  Args:
    phase_dir: `workdir/<phase>` (created if missing).
    resume_step: the restored checkpoint step (0 for a fresh start); rows with step >
      resume_step are dropped. None keeps the files as they are and appends.
    tensorboard: also write TensorBoard event files (config `metrics.tensorboard`).
    enabled: False checks rows but touches no file (the processes other than 0 of a
      multi-host run, train/distributed.py).
  """

  def __init__(self, phase_dir: str | os.PathLike, *, resume_step: int | None = None,
               tensorboard: bool = True, enabled: bool = True):
    self.phase_dir = str(phase_dir)
    self.path = os.path.join(self.phase_dir, METRICS_FILE)
    self._file = None
    self._tb = None
    if not enabled:
      return
    os.makedirs(self.phase_dir, exist_ok=True)
    if resume_step is not None and os.path.exists(self.path):
      _truncate_jsonl(self.path, 'step', resume_step)
    self._file = open(self.path, 'a')
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      purge = None if resume_step is None else resume_step + 1
      # tensorboardX names files by the second; a unique suffix keeps a writer reopened
      # within the same second (a quick resume) from overwriting the previous file.
      self._tb = SummaryWriter(logdir=self.phase_dir, purge_step=purge, flush_secs=10,
                               filename_suffix=f'.{time.time_ns()}')

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Logs `scalars` (name -> number) at `step`; flushed before returning.

    Raises:
      ValueError: a value that is not a real number (names it), or a reserved name.
    """
    row = {'step': int(step), 'time': time.time()}
    for name, value in scalars.items():
      if name in row:
        raise ValueError(f'metric name {name!r} is reserved')
      value = _py(value)
      if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f'metric {name!r} at step {step} is not a number: {value!r}')
      row[name] = value
    if self._file is None:
      return
    self._file.write(json.dumps(row) + '\n')
    self._file.flush()
    if self._tb is not None:
      for name, value in row.items():
        if name not in ('step', 'time') and math.isfinite(value):
          self._tb.add_scalar(name, value, global_step=int(step))
      self._tb.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self) -> 'MetricsWriter':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class AdvantageTable:
  """Appends one row per memory decision to `<phase_dir>/advantages.jsonl`.

  Args:
    phase_dir: `workdir/<phase>` (created if missing).
    phase: the phase name stored in each row.
    resume_update: the restored checkpoint step (0 for a fresh start); rows with update
      > resume_update are dropped first. None appends to the file as it is.
    enabled: False checks rows but touches no file (processes other than 0).
  """

  def __init__(self, phase_dir: str | os.PathLike, phase: str, *,
               resume_update: int | None = None, enabled: bool = True):
    self.phase = phase
    self.path = os.path.join(str(phase_dir), ADVANTAGES_FILE)
    self._file = None
    if not enabled:
      return
    os.makedirs(phase_dir, exist_ok=True)
    if resume_update is not None and os.path.exists(self.path):
      _truncate_jsonl(self.path, 'update', resume_update)
    self._file = open(self.path, 'a')

  def add_rows(self, rows: Iterable[Mapping[str, Any]]) -> int:
    """Validates and appends rows (keys = ADVANTAGE_COLUMNS; 'phase' may be omitted).

    Returns:
      The number of rows written.
    Raises:
      ValueError: a missing or unknown column, or a value of the wrong type (named).
    """
    lines = []
    for i, row in enumerate(rows):
      row = {k: _py(v) for k, v in row.items()}
      row.setdefault('phase', self.phase)
      missing = [c for c in ADVANTAGE_COLUMNS if c not in row]
      extra = sorted(set(row) - set(ADVANTAGE_COLUMNS))
      if missing or extra:
        raise ValueError(f'advantage row {i}: missing columns {missing}, unknown {extra}')
      for c in _INT_COLUMNS:
        if isinstance(row[c], bool) or not isinstance(row[c], int):
          raise ValueError(f'advantage row {i}: {c}={row[c]!r} is not an int')
      for c in _FLOAT_COLUMNS:
        if isinstance(row[c], bool) or not isinstance(row[c], (int, float)):
          raise ValueError(f'advantage row {i}: {c}={row[c]!r} is not a number')
        row[c] = float(row[c])
      if row['r_local'] is not None:
        row['r_local'] = float(row['r_local'])
      row['accepted'] = bool(row['accepted'])
      row['violations'] = [str(v) for v in row['violations']]
      lines.append(json.dumps({c: row[c] for c in ADVANTAGE_COLUMNS}) + '\n')
    if self._file is not None:
      self._file.write(''.join(lines))
      self._file.flush()
    return len(lines)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()

  def __enter__(self) -> 'AdvantageTable':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _BarSafeStream:
  """A text stream that writes whole lines through `tqdm.write`, which clears the
  progress bars, prints the line and redraws them, so a log line never lands on the
  bar's line."""

  def __init__(self, stream):
    self.stream = stream
    self._pending = ''

  def write(self, text: str) -> int:
    self._pending += text
    *lines, self._pending = self._pending.split('\n')
    for line in lines:
      tqdm.tqdm.write(line, file=self.stream)
    return len(text)

  def flush(self) -> None:
    if self._pending:
      tqdm.tqdm.write(self._pending, file=self.stream)
      self._pending = ''
    self.stream.flush()


class _Bar(tqdm.tqdm):
  """tqdm bar that routes absl log lines through `_BarSafeStream` while it is open."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._handler = None
    if self.disable:
      return
    from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
    handler = absl_logging.get_absl_handler().python_handler
    stream = getattr(handler, 'stream', None)
    if stream is not None and not isinstance(stream, _BarSafeStream):
      self._handler, self._stream = handler, stream
      handler.setStream(_BarSafeStream(stream))

  def set_postfix(self, ordered_dict=None, refresh=False, **kwargs):
    # Shown at the next time-gated redraw: a forced redraw per step floods log files.
    super().set_postfix(ordered_dict, refresh=False, **kwargs)

  def close(self) -> None:
    if getattr(self, '_handler', None) is not None:
      self._handler.stream.flush()
      self._handler.setStream(self._stream)
      self._handler = None
    super().close()


def progress_bar(total: int, *, initial: int = 0, desc: str = '',
                 disable: bool = False, unit: str = 'update') -> tqdm.tqdm:
  """A tqdm bar with elapsed time, ETA and rate; `initial` continues a resumed run.

  While the bar is open, absl log lines are printed through `tqdm.write` (each on a
  line of its own above the bar); `close()` restores the handler's stream.

  Args:
    total: number of updates (RL) or steps (SFT) in the phase.
    initial: steps already done (the restored checkpoint step).
    desc: label, e.g. the phase name.
    disable: turn the bar off (config `metrics.progress_bar = False`).
    unit: what one tick is.
  """
  # Redrawn every 30 s instead of every 0.1 s when stderr is a log file, not a terminal
  # (each redraw is a line there: ~800 of them in a default run's log).
  return _Bar(total=total, initial=initial, desc=desc, disable=disable, unit=unit,
              dynamic_ncols=True, mininterval=0.1 if sys.stderr.isatty() else 30.0,
              bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt} '
                         '[{elapsed}<{remaining} ETA, {rate_fmt}{postfix}]')


def summarize_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
  """Per-operation summary of advantage rows: count, rejected share, mean A's.

  Returns:
    {operation: {'count', 'rejected_share', 'A_local_mean', 'A_global_mean',
    'A_hier_mean'}} with means in advantage units.
  """
  by_op: dict[str, list] = {}
  for r in rows:
    by_op.setdefault(r['operation'], []).append(r)
  out = {}
  for op, rs in sorted(by_op.items()):
    out[op] = {
        'count': float(len(rs)),
        'rejected_share': float(np.mean([not r['accepted'] for r in rs])),
        'A_local_mean': float(np.mean([r['A_local'] for r in rs])),
        'A_global_mean': float(np.mean([r['A_global'] for r in rs])),
        'A_hier_mean': float(np.mean([r['A_hier'] for r in rs])),
    }
  return out
