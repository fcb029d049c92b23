"""End-of-phase summary blocks: what a phase learned, in a few printed lines.

`phase_summary(phase, result, phase_dir)` formats the block `experiments/run.py` prints
after each phase (and `experiments/benchmarks/learning_curve.py` reuses):

- SFT (`sft_summary`): the dev set's tool accuracy (chance = 1/8), executable rate (also
  over the non-∅ predictions only: a policy answering ∅ everywhere is fully
  "executable"), exact match, and tool accuracy / exact match per target class, for the
  last evaluation and the checkpoint Phase A starts from.
- RL (`rl_summary`): r^task, r^global, m^ans, the rejected rate (with the part of it
  that was unparseable text and the part that called a tool outside the phase's set;
  the rest failed T_m's other checks), the rejection-
  preference diagnostics (mean A^hier of rejected and of executable decisions, and the
  share of executable decisions below the rejected ones' mean: 0 means the update never
  preferred a rejected command; rl/advantages.py) and the operation mix of the first
  and last updates (means over a window of up to `window` updates, from
  `metrics.jsonl`; an update where a diagnostic is undefined, e.g. no rejected
  decision, is left out of its mean), then the greedy internal-dev figures at the
  phase's start (θ_prev)
  and end (`internal_dev/start/*`, `internal_dev/end/*` of the phase result,
  train/internal_dev.py), and where the logs are.

Both blocks end with the XLA programs the phase compiled, those read from the
persistent cache, and those requested after its first step (train/compilation.py).

Figures produced by CPU stand-ins (the heuristic verifier, the oracle-evidence reader)
are labelled as such (`internal_dev.STAND_IN_NOTE`).
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from vermem_jax.memory import commands as mcommands
from vermem_jax.train import compilation
from vermem_jax.train import internal_dev
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import sft_eval

NOTEBOOK = os.path.join('experiments', 'notebooks', 'advantage_statistics.ipynb')
# (label, metrics.jsonl key) of the RL rows compared first vs last.
RL_ROWS = (('r^task', 'reward/r_task'), ('r^global', 'reward/r_global'),
           ('m^ans', 'reward/m_ans'), ('rejected rate', 'rollout/rejected_rate'),
           ('  unparseable', 'rollout/unparseable_rate'),
           ("  outside the phase's tools", 'rollout/not_allowed_rate'),
           ('A^hier, rejected (mean)', 'advantage/a_hier_rejected_mean'),
           ('A^hier, executable (mean)', 'advantage/a_hier_executable_mean'),
           ('executable below rejected', 'advantage/rejection_preference_share'))
# (label, internal_dev key) of the internal-dev rows.
DEV_ROWS = (('r^task', 'r_task'), ('m^ans', 'm_ans'), ('supporting-fact recall', 'r_sup'),
            ('rejected rate', 'rejected_rate'),
            ('  unparseable', 'unparseable_rate'),
            ("  outside the phase's tools", 'not_allowed_rate'))


def _fmt(value: Any, digits: int = 3) -> str:
  if value is None:
    return '-'
  value = float(value)
  return 'n/a' if math.isnan(value) else f'{value:.{digits}f}'


def _instead(result: Mapping[str, Any], op: str) -> str:
  """The wrong prediction most frequent for target `op` and its share ('' if none),
  from `sft_eval.dev_metrics`' 'predicted/<op>/<pred op>' figures; a tie goes to the
  op first in the operation mixes' order (`internal_dev.op_order`)."""
  prefix = f'predicted/{op}/'
  wrong = [(k[len(prefix):], v) for k, v in result.items()
           if k.startswith(prefix) and k[len(prefix):] != op and v > 0]
  if not wrong:
    return ''
  pred, share = min(wrong, key=lambda kv: (-kv[1], internal_dev.op_order(kv[0])))
  return f'{internal_dev.op_label(pred)} {share:.2f}'


def sft_summary(result: Mapping[str, Any], phase_dir: str) -> str:
  """The SFT block from `train.sft.run_sft`'s result (its last dev evaluation)."""
  r = result
  lines = [f'SFT summary: {r.get("step")} of {r.get("total_steps")} steps, '
           f'{r.get("num_train")} train / {r.get("num_dev")} dev records, greedy dev '
           'decoding (chance tool accuracy 0.125)']
  best = r.get('best_step')
  if best is not None:
    lines.append(f'  checkpoint for Phase A: step {best} (best dev tool accuracy '
                 f'{_fmt(r.get("best_tool_accuracy"))}; ties go to the later step)')
  lines += [
      f'  dev tool accuracy       {_fmt(r.get("tool_accuracy"))}',
      f'  executable rate         {_fmt(r.get("executable_rate"))}   (all predictions)',
      f'  non-∅ executable rate   {_fmt(r.get("executable_rate_non_null"))}   '
      '(the predictions that are not ∅)',
      f'  exact match             {_fmt(r.get("exact_match"))}',
      f'  dev loss                {_fmt(r.get("dev_loss"))}',
      f'  {"class":<14s} {"tool acc":>8s} {"exact":>7s}   most often predicted instead']
  for op in mcommands.ALL_OPS:
    acc = r.get(f'tool_accuracy/{op}')
    if acc is None:
      continue
    lines.append(f'  {internal_dev.op_label(op):<14s} {_fmt(acc, 2):>8s} '
                 f'{_fmt(r.get(f"exact_match/{op}"), 2):>7s}   {_instead(r, op)}'.rstrip())
  lines.append(f'  logs: {os.path.join(phase_dir, metrics_lib.METRICS_FILE)}, '
               f'TensorBoard events in {phase_dir}; the dev predictions in '
               f'{os.path.join(phase_dir, sft_eval.PREDICTIONS_FILE)}')
  return '\n'.join(lines)


def window_means(rows: Sequence[Mapping[str, Any]], window: int
                 ) -> tuple[tuple[int, int, dict], tuple[int, int, dict]]:
  """Means of the first and last `w` update rows, w = max(1, min(window, n // 2)).

  Args:
    rows: metrics.jsonl rows of an RL phase (with 'step'); rows without reward keys
      are skipped.
  Returns:
    ((first step, last step, {key: mean}) of the first window, the same of the last).
  Raises:
    ValueError: no update rows.
  """
  rows = [r for r in rows if 'reward/r_task' in r]
  if not rows:
    raise ValueError('no RL update rows')
  w = max(1, min(int(window), len(rows) // 2))

  def mean(part):
    keys = {k for r in part for k in r}
    out = {}
    for k in keys:
      vals = [float(r[k]) for r in part if isinstance(r.get(k), (int, float))]
      vals = [v for v in vals if math.isfinite(v)]
      if vals:
        out[k] = float(np.mean(vals))
    # An op absent from an update has share 0 there, not "missing".
    for k in keys:
      if k.startswith('rollout/op_share_'):
        out[k] = float(np.mean([float(r.get(k, 0.0)) for r in part]))
    return part[0]['step'], part[-1]['step'], out
  return mean(rows[:w]), mean(rows[-w:])


# Wide enough for every RL row label, 'internal dev (64 ep., greedy)' included.
_RL_LABEL_W = 29


def rl_summary(phase: str, result: Mapping[str, Any], phase_dir: str, *,
               window: int = 3, workdir: str | None = None) -> str:
  """The RL block (module docstring) from the phase result and its metrics.jsonl."""
  rows = metrics_lib.read_jsonl(os.path.join(phase_dir, metrics_lib.METRICS_FILE))
  lines = [f'{phase} summary: {result.get("step")} updates ({internal_dev.STAND_IN_NOTE})']
  try:
    (f0, f1, first), (l0, l1, last) = window_means(rows, window)
  except ValueError:
    lines.append('  no update rows in metrics.jsonl')
  else:
    head_a = f'updates {f0}-{f1}' if f1 != f0 else f'update {f0}'
    head_b = f'updates {l0}-{l1}' if l1 != l0 else f'update {l0}'
    lines.append(f'  {"rollouts (sampled)":<{_RL_LABEL_W}s} {head_a:>14s} {head_b:>14s}')
    for label, key in RL_ROWS:
      lines.append(f'  {label:<{_RL_LABEL_W}s} {_fmt(first.get(key)):>14s} '
                   f'{_fmt(last.get(key)):>14s}')
    lines.append(f'  {"":<{_RL_LABEL_W}s} (share of executable decisions whose A^hier '
                 "is below the rejected ones' mean; '-': no update had both)")
    lines.append(f'  {"":<{_RL_LABEL_W}s} (the rejected rate\'s two parts, here and on '
                 'internal dev, are shares of all decisions: unparseable = text that is '
                 'not a command or names no tool;')
    lines.append(f'  {"":<{_RL_LABEL_W}s}  outside = a parsed call to a tool the phase '
                 "does not allow; the rest of the rate failed T_m's id, argument or "
                 'budget checks.')
    lines.append(f'  {"":<{_RL_LABEL_W}s}  The operation mix lists the first as '
                 'Unparseable and the second under its tool)')
    lines.append(f'  {"operation mix, " + head_a:<{_RL_LABEL_W}s} '
                 f'{internal_dev.op_mix(first, "rollout/op_share_")}')
    lines.append(f'  {"operation mix, " + head_b:<{_RL_LABEL_W}s} '
                 f'{internal_dev.op_mix(last, "rollout/op_share_")}')
  start = _prefixed(result, 'internal_dev/start/')
  end = _prefixed(result, 'internal_dev/end/')
  if start or end:
    n = int(end.get('num_episodes') or start.get('num_episodes') or 0)
    prev = result.get('reference_phase', 'previous')
    head = f'start (θ {prev})'
    w = max(14, len(head))  # a long phase name widens the column, not the row
    # The end column is the selected update's, the one the next phase starts from
    # (rl_phase._RLPhase.evaluate; best r^task, then fewest rejected); logs written
    # before it was recorded have no step and hold the last update's.
    tail = (f'update {int(end["step"])} (selected)' if end.get('step') is not None
            else 'end')
    lines.append(f'  {f"internal dev ({n} ep., greedy)":<{_RL_LABEL_W}s} '
                 f'{head:>{w}s} {tail:>20s}')
    for label, key in DEV_ROWS:
      lines.append(f'  {label:<{_RL_LABEL_W}s} {_fmt(start.get(key)):>{w}s} '
                   f'{_fmt(end.get(key)):>20s}')
    last = 'selected' if end.get('step') is not None else 'end'
    for label, values in (('dev operation mix, start', start),
                          (f'dev operation mix, {last}', end)):
      lines.append(f'  {label:<{_RL_LABEL_W}s} {internal_dev.op_mix(values)}')
  workdir = workdir or os.path.dirname(os.path.abspath(phase_dir))
  lines += [
      f'  logs: {os.path.join(phase_dir, metrics_lib.METRICS_FILE)}',
      f'        {os.path.join(phase_dir, metrics_lib.ADVANTAGES_FILE)}',
      f'        TensorBoard: tensorboard --logdir {phase_dir}',
      f'        notebook: VERMEM_WORKDIR={workdir} jupyter nbconvert --to notebook '
      f'--execute {NOTEBOOK} --output-dir {os.path.join(workdir, "notebook")}']
  return '\n'.join(lines)


def _prefixed(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
  return {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}


def phase_summary(phase: str, result: Mapping[str, Any], phase_dir: str, *,
                  workdir: str | None = None) -> str:
  """`sft_summary` for 'sft', else `rl_summary`; then the compile line
  (`compilation.summary_line`) when the result has compile figures."""
  if phase == 'sft':
    block, unit = sft_summary(result, phase_dir), 'step'
  else:
    block, unit = rl_summary(phase, result, phase_dir, workdir=workdir), 'update'
  line = compilation.summary_line(result, unit)
  return block if line is None else f'{block}\n  {line}'
