"""Seed aggregation and result tables (paper C.8; SPEC §7).

Each seed is evaluated separately; `aggregate` turns {seed: {policy: summary}} (the
`eval.metrics.summarize` dicts, plus each seed's frontier curve) into mean ± std per
policy and metric (sample std, ddof=1; none for a single seed), and the writers
produce:

  results.md    a Markdown table (one row per policy) headed by the task solver's
                label — the oracle-evidence reader is marked as a diagnostic there —
                and whether a judge ran (J_judge / MQ are "absent" without one);
  results.csv   the same numbers, one row per policy, mean and std columns;
  results.json  every figure: per-seed summaries, means, stds, frontier curves.

Units in the tables: J_judge and MQ in [0, 1] (as paper Table 5; Table 2 prints
100·J_judge), EM, F1, SF recall, success rate, invalid rate and SR@B* in percent,
TN and TN@S* in tokens, TC (executed calls), rejected calls and unparseable decisions
per episode.
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from vermem_jax.eval import frontier

# (summary key, column header, scale applied before printing, decimals).
TABLE_METRICS = (
    ('j_judge', 'J_judge', 1.0, 3),
    ('mq', 'MQ', 1.0, 3),
    ('em', 'EM %', 100.0, 1),
    ('f1', 'F1 %', 100.0, 1),
    ('sf_recall', 'SF recall %', 100.0, 1),
    ('success_rate', 'SR %', 1.0, 1),
    ('tn', 'TN', 1.0, 0),
    ('tc', 'TC', 1.0, 2),
    ('rejected_calls', 'rejected calls', 1.0, 2),
    ('unparseable', 'unparseable', 1.0, 2),
    ('sr_at_budget', 'SR@B* %', 1.0, 1),
    ('tn_at_target', 'TN@S*', 1.0, 0),
)
ABSENT = 'absent'
# What a column counts, printed under the table for the columns it has (per episode,
# mean over tasks, then mean ± std over seeds).
COLUMN_NOTES = (
    ('success_rate', 'mean ± std over seeds (SE s): s is the standard error over '
                     'the tasks of a seed (sample std / √n; mean over seeds) — '
                     'differences well inside it are noise'),
    ('tn', 'TN: online tokens per episode, input + output of every policy and solver '
           'call'),
    ('tc', 'TC: executed non-null memory-tool calls per episode (the paper\'s TC); '
           '∅, rejected calls and unparseable text are not counted'),
    ('rejected_calls', 'rejected calls: tool calls per episode that T_m rejected (a '
                       "tool outside the policy's set, or a failed id, argument or "
                       'budget check)'),
    ('unparseable', 'unparseable: decisions per episode whose text is not a command'),
    ('sr_at_budget', 'SR@B* %: success rate at the token budget B* (eval.target_budget) '
                     'on the success-vs-TN frontier (frontier.png)'),
    ('tn_at_target', 'TN@S*: online tokens at which the frontier reaches the success '
                     'rate S* (eval.target_success); — when it never does'),
)


def _stats(values: Sequence[Optional[float]]) -> dict[str, Any]:
  vals = [float(v) for v in values if v is not None]
  if not vals:
    return {'mean': None, 'std': None, 'n': 0, 'values': list(values)}
  arr = np.asarray(vals, np.float64)
  std = float(arr.std(ddof=1)) if len(vals) > 1 else None
  return {'mean': float(arr.mean()), 'std': std, 'n': len(vals), 'values': list(values)}


def aggregate(per_seed: Mapping[int, Mapping[str, Mapping[str, Any]]], *,
              budgets: Sequence[int], target_success: float, target_budget: float
              ) -> dict[str, dict[str, Any]]:
  """Mean ± std over seeds per policy.

  Args:
    per_seed: seed -> policy -> summary (`metrics.summarize`), each summary holding
      'frontier_curve' (success rate in percent at each budget) when a frontier was
      computed.
    budgets: the evaluated budgets of the curves.
    target_success, target_budget: S* and B*.

  Returns:
    policy -> {metric: {'mean', 'std', 'n', 'values'} for every numeric summary key,
    'op_mix': {op: stats}, 'frontier': {'budgets', 'mean', 'std', 'tn_at_target',
    'sr_at_budget'} (on the mean curve, paper C.7) or None}. TN@S* / SR@B* of the mean
    curve are also given as the metrics 'tn_at_target' / 'sr_at_budget' (std over the
    per-seed curves' values).
  """
  policies: list[str] = []
  for by_policy in per_seed.values():
    for p in by_policy:
      if p not in policies:
        policies.append(p)
  out: dict[str, dict[str, Any]] = {}
  seeds = sorted(per_seed)
  for p in policies:
    rows = [per_seed[s][p] for s in seeds if p in per_seed[s]]
    keys = sorted({k for r in rows for k, v in r.items()
                   if isinstance(v, (int, float)) or v is None} - {'seed'})
    entry: dict[str, Any] = {k: _stats([r.get(k) for r in rows]) for k in keys}
    ops = sorted({op for r in rows for op in (r.get('op_mix') or {})})
    entry['op_mix'] = {op: _stats([(r.get('op_mix') or {}).get(op, 0.0) for r in rows])
                       for op in ops}
    curves = [r['frontier_curve'] for r in rows if r.get('frontier_curve') is not None]
    entry['frontier'] = None
    if curves:
      mean, std = frontier.mean_std(curves)
      entry['frontier'] = dict(frontier.summarize_curve(
          budgets, mean, target_success=target_success, target_budget=target_budget),
                               mean=mean, std=std)
      per = [frontier.summarize_curve(budgets, c, target_success=target_success,
                                      target_budget=target_budget) for c in curves]
      for key in ('tn_at_target', 'sr_at_budget'):
        st = _stats([x[key] for x in per])
        st['mean'] = entry['frontier'][key]  # of the mean curve (paper C.7)
        entry[key] = st
    out[p] = entry
  return out


def _fmt(stats: Optional[Mapping[str, Any]], scale: float, decimals: int,
         se: Optional[Mapping[str, Any]] = None) -> str:
  """'mean ± std over seeds (SE s)': s is the standard error over a seed's
  questions (mean over seeds), when the summary has one."""
  if not stats or stats.get('mean') is None:
    return '—'
  mean = stats['mean'] * scale
  text = f'{mean:.{decimals}f}'
  if stats.get('std') is not None:
    text += f' ± {stats["std"] * scale:.{decimals}f}'
  if se and se.get('mean') is not None:
    text += f' (SE {se["mean"] * scale:.{decimals}f})'
  return text


def _total(entry: Mapping[str, Any], key: str) -> int:
  return int(sum(v for v in (entry.get(key) or {}).get('values', []) if v is not None))


def judge_counts(agg: Mapping[str, Mapping[str, Any]]) -> list[str]:
  """Markdown lines: per policy, episodes (all seeds together) the judge scored
  and those that got the fallback, for J_judge and MQ. MQ not judged (Base: no
  long-term memory) reads —."""
  lines = ['Judged episodes (all seeds): J_judge judged / no answer (0, no call) / '
           'fallback; MQ judged / fallback:', '',
           '| policy | J judged | J no answer | J fallback | MQ judged | MQ fallback |',
           '|---|---|---|---|---|---|']
  for p, entry in agg.items():
    mq_asked = _total(entry, 'mq_judged') + _total(entry, 'mq_fallbacks')
    mq = ([str(_total(entry, 'mq_judged')), str(_total(entry, 'mq_fallbacks'))]
          if mq_asked else ['—', '—'])
    lines.append('| ' + ' | '.join(
        [p, str(_total(entry, 'j_judge_judged')), str(_total(entry, 'j_judge_no_answer')),
         str(_total(entry, 'judge_fallbacks')), *mq]) + ' |')
  return lines


RECOVERY_COLUMNS = (('states', 'decision states'),
                    ('h_only', 'evidence in H only'),
                    ('h_only_shown', '… visible in x_t'),
                    ('select_accepted', 'SelectEpisode would be accepted'),
                    ('gold_h_only', 'gold in H only'),
                    ('gold_select_accepted', 'gold SelectEpisode accepted'))


def recovery_table(agg: Mapping[str, Mapping[str, Any]]) -> list[str]:
  """Markdown lines: per policy, the `eval.recovery` counts over all seeds (how
  often a visited state held an observation only in H, and how often restoring the
  newest one would have been accepted)."""
  lines = ['Recovery states (all seeds; eval/recovery.py): decision states whose '
           'newest observation held only in H could be restored by SelectEpisode:', '',
           '| policy | ' + ' | '.join(h for _, h in RECOVERY_COLUMNS) + ' |',
           '|' + '|'.join(['---'] * (len(RECOVERY_COLUMNS) + 1)) + '|']
  for p, entry in agg.items():
    lines.append('| ' + ' | '.join(
        [p] + [str(_total(entry, 'recovery_' + k)) for k, _ in RECOVERY_COLUMNS]) + ' |')
  return lines


def markdown_table(agg: Mapping[str, Mapping[str, Any]], *, solver_label: str,
                   judge_label: Optional[str], num_questions: Mapping[str, Any],
                   seeds: Sequence[int], title: str = 'HotpotQA validation',
                   metrics: Sequence[tuple] = TABLE_METRICS,
                   judge_text: Optional[str] = None,
                   notes: Sequence[str] = ()) -> str:
  """The results table in Markdown (module docstring for units).

  `metrics`: the columns, (summary key, header, scale, decimals) each (default
  TABLE_METRICS, HotpotQA's); `judge_text` replaces the judge line (a benchmark
  without a judge says why); `notes`: lines printed under the seeds line (e.g. that
  the seeds share one set of checkpoints)."""
  lines = [f'### {title}', '',
           f'Task solver: {solver_label}',
           judge_text or ('Judge: ' + (judge_label
                                       or f'none — J_judge and MQ are {ABSENT}')),
           f'Seeds: {", ".join(str(s) for s in seeds)}; tasks per seed: '
           + ', '.join(f'{v} (seed {k})' for k, v in num_questions.items()),
           *notes, '']
  head = ['policy'] + [h for _, h, _, _ in metrics]
  lines.append('| ' + ' | '.join(head) + ' |')
  lines.append('|' + '|'.join(['---'] * len(head)) + '|')
  for p, entry in agg.items():
    cells = [p]
    for key, _, scale, dec in metrics:
      cells.append(_fmt(entry.get(key), scale, dec, entry.get(key + '_se')))
    lines.append('| ' + ' | '.join(cells) + ' |')
  if judge_label:
    lines += ['', *judge_counts(agg)]
  if any(e.get('recovery_states') for e in agg.values()):
    lines += ['', *recovery_table(agg)]
  keys = {key for key, _, _, _ in metrics}
  notes = [text for key, text in COLUMN_NOTES if key in keys]
  if notes:
    lines += [''] + [f'- {text}' for text in notes]
  ops = sorted({op for e in agg.values() for op in e.get('op_mix', {})})
  if ops:
    lines += ['', 'Operation mix (% of decisions: tool calls under their tool, executed '
              'or rejected; Null = ∅; Unparseable = text that is not a command):',
              '',
              '| policy | ' + ' | '.join(ops) + ' |',
              '|' + '|'.join(['---'] * (len(ops) + 1)) + '|']
    for p, entry in agg.items():
      mix = entry.get('op_mix', {})
      lines.append('| ' + p + ' | ' + ' | '.join(
          _fmt(mix.get(op), 100.0, 1) for op in ops) + ' |')
  return '\n'.join(lines) + '\n'


def csv_rows(agg: Mapping[str, Mapping[str, Any]], *, solver_label: str,
             metrics: Sequence[tuple] = TABLE_METRICS) -> list[dict[str, Any]]:
  """One row per policy: mean, std over seeds and standard error over questions (mean
  over seeds) of every table metric (unscaled), n seeds."""
  rows = []
  for p, entry in agg.items():
    row: dict[str, Any] = {'policy': p, 'solver': solver_label}
    for key, _, _, _ in metrics:
      st = entry.get(key) or {}
      row[f'{key}_mean'] = st.get('mean')
      row[f'{key}_std'] = st.get('std')
      row[f'{key}_se'] = (entry.get(key + '_se') or {}).get('mean')
    row['seeds'] = max((st.get('n', 0) for k, st in entry.items()
                        if isinstance(st, dict) and 'n' in st), default=0)
    rows.append(row)
  return rows


def json_safe(value: Any) -> Any:
  """`value` with NumPy scalars as Python numbers and non-finite floats as None."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {str(k): json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_safe(v) for v in value]
  if isinstance(value, (np.floating, np.integer)):
    return json_safe(value.item())
  return value


def write_results(out_dir: str, agg: Mapping[str, Mapping[str, Any]], *,
                  per_seed: Mapping[int, Mapping[str, Any]], meta: Mapping[str, Any],
                  solver_label: str, judge_label: Optional[str],
                  num_questions: Mapping[str, Any], seeds: Sequence[int],
                  title: str = 'HotpotQA validation',
                  metrics: Sequence[tuple] = TABLE_METRICS,
                  judge_text: Optional[str] = None,
                  notes: Sequence[str] = ()) -> dict[str, str]:
  """Writes results.md, results.csv and results.json; returns {kind: path}
  (`metrics`, `judge_text`, `notes` as `markdown_table`)."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {k: os.path.join(out_dir, f'results.{k}') for k in ('md', 'csv', 'json')}
  table = markdown_table(agg, solver_label=solver_label, judge_label=judge_label,
                         num_questions=num_questions, seeds=seeds, title=title,
                         metrics=metrics, judge_text=judge_text, notes=notes)
  with open(paths['md'], 'w') as f:
    f.write(table)
  rows = csv_rows(agg, solver_label=solver_label, metrics=metrics)
  with open(paths['csv'], 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ['policy'])
    writer.writeheader()
    writer.writerows(rows)
  with open(paths['json'], 'w') as f:
    json.dump(json_safe({'meta': dict(meta), 'solver': solver_label,
                          'judge': judge_label, 'seeds': list(seeds),
                          'per_seed': {str(s): v for s, v in per_seed.items()},
                          'aggregate': agg}), f, indent=1, sort_keys=True)
  return paths
