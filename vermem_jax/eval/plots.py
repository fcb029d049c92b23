"""Figures of an evaluation: the budget frontier and one bar chart per metric.

  frontier.png        success rate (percent) against the hard online-token budget,
                      one line per policy (mean over seeds) with a ±1 std band, the
                      dotted lines S* and B* (paper Figure 2 layout);
  bars_<metric>.png   the metric's seed mean per policy with error bars: ±1 std over
                      seeds, or with one seed ±1 standard error over its tasks.

matplotlib with the Agg backend (files only, no display). Absent metrics (J_judge / MQ
without a judge) get no chart.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

# (summary key, axis label, scale) of the bar charts.
BAR_METRICS = (
    ('j_judge', 'J_judge', 1.0),
    ('mq', 'MQ', 1.0),
    ('em', 'EM (%)', 100.0),
    ('f1', 'F1 (%)', 100.0),
    ('sf_recall', 'supporting-fact recall (%)', 100.0),
    ('success_rate', 'success rate (%)', 1.0),
    ('progress_rate', 'progress rate (%)', 1.0),
    ('tn', 'TN (online tokens / episode)', 1.0),
    ('tc', 'TC (executed tool calls / episode)', 1.0),
    ('rejected_calls', 'rejected tool calls / episode', 1.0),
    ('unparseable', 'unparseable decisions / episode', 1.0),
)
# Marker and dash pattern of the i-th frontier curve (cycled).
_MARKERS = ('o', 's', 'D', '^', 'v', 'P', 'X')
_DASHES = ('-', '--', '-.', ':', (0, (5, 1, 1, 1)))


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def plot_frontier(agg: Mapping[str, Mapping[str, Any]], path: str, *,
                  target_success: float, target_budget: float,
                  title: str = '') -> Optional[str]:
  """Writes the frontier figure; returns its path (None when no policy has a curve)."""
  curves = {p: e['frontier'] for p, e in agg.items() if e.get('frontier')}
  if not curves:
    return None
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for i, (p, fr) in enumerate(curves.items()):
    b = fr['budgets']
    mean = fr['mean']
    std = fr['std']
    # Policies often tie (a flat frontier at one success rate): a marker and a dash
    # pattern of their own keep a curve visible under another.
    (line,) = ax.plot(b, mean, marker=_MARKERS[i % len(_MARKERS)], ms=4 + i % 3,
                      ls=_DASHES[i % len(_DASHES)], label=p)
    ax.fill_between(b, [m - s for m, s in zip(mean, std)],
                    [m + s for m, s in zip(mean, std)], color=line.get_color(),
                    alpha=0.2, linewidth=0)
  ax.axhline(target_success, ls=':', color='gray', lw=1,
             label=f'S* = {target_success:g}% (TN@S*)')
  ax.axvline(target_budget, ls='--', color='gray', lw=1,
             label=f'B* = {target_budget:g} tokens (SR@B*)')
  ax.set_xlabel('online-token budget per episode')
  ax.set_ylabel('success rate (%)')
  ax.set_ylim(-2, 102)
  if title:
    ax.set_title(title)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def bar_values(agg: Mapping[str, Mapping[str, Any]], key: str, scale: float
               ) -> tuple[list[str], list[float], Optional[list[float]], str]:
  """One bar chart's values: (policies, means, error half-widths, what they are).

  Over several seeds the error bar is the sample std over seeds (what the table prints
  after '±'); with one seed it is the standard error over that seed's tasks, the
  summary's '<key>_se' (the table's 'SE'), so a one-seed run still shows its noise.
  Values are `scale` times the summary's; policies without `key` are left out.
  Errors are None, and the description '', when neither spread exists.
  """
  names, means, stds, ses = [], [], [], []
  for p, e in agg.items():
    st = e.get(key)
    if st and st.get('mean') is not None:
      names.append(p)
      means.append(st['mean'] * scale)
      stds.append(None if st.get('std') is None else st['std'] * scale)
      se = (e.get(key + '_se') or {}).get('mean')
      ses.append(None if se is None else se * scale)
  if any(s is not None for s in stds):
    return names, means, [s or 0.0 for s in stds], '±1 std over seeds'
  if any(s is not None for s in ses):
    return names, means, [s or 0.0 for s in ses], '±1 SE over tasks (one seed)'
  return names, means, None, ''


def plot_bars(agg: Mapping[str, Mapping[str, Any]], out_dir: str, *,
              metrics: Sequence[tuple[str, str, float]] = BAR_METRICS,
              title: str = '') -> list[str]:
  """Writes bars_<metric>.png for each metric some policy has; returns the paths.

  Error bars as `bar_values`; the x-axis label says which spread they show.
  """
  plt = _pyplot()
  written = []
  for key, label, scale in metrics:
    names, means, errs, spread = bar_values(agg, key, scale)
    if not names:
      continue
    fig, ax = plt.subplots(figsize=(max(3.2, 1.1 * len(names) + 1.5), 3.4))
    ax.bar(range(len(names)), means, yerr=errs, capsize=4 if errs else 0,
           color='tab:blue', alpha=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha='right', fontsize=8)
    ax.set_ylabel(label)
    if spread:
      ax.set_xlabel(f'error bars: {spread}', fontsize=7, color='dimgray')
    if title:
      ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, f'bars_{key}.png')
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
  return written
