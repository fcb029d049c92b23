"""Tests for vermem_jax.eval.aggregate and eval.plots: seed means ± std, tables, PNGs."""
import csv
import json
import os

import pytest

from vermem_jax.eval import aggregate
from vermem_jax.eval import plots

BUDGETS = [1000, 2000, 3000]


def _summary(em, tn, curve, j=None):
  return {'n': 4, 'em': em, 'em_se': 0.25, 'f1': em, 'j_judge': j, 'mq': None, 'tn': tn,
          'tc': 1.0,
          'success_rate': 100 * em, 'rejected_calls': 0.25, 'unparseable': 0.5,
          'op_mix': {'Null': 1.0},
          'frontier_curve': curve}


PER_SEED = {
    42: {'base': _summary(0.25, 1000, [0.0, 25.0, 25.0]),
         'phase_b': _summary(0.5, 2000, [20.0, 40.0, 60.0])},
    43: {'base': _summary(0.75, 3000, [50.0, 75.0, 75.0]),
         'phase_b': _summary(0.5, 2000, [40.0, 60.0, 60.0])},
}


def _agg():
  return aggregate.aggregate(PER_SEED, budgets=BUDGETS, target_success=40.0,
                             target_budget=2000)


def test_mean_and_sample_std_over_seeds():
  agg = _agg()
  base = agg['base']
  assert base['em']['mean'] == 0.5 and base['em']['std'] == pytest.approx(0.3535533906)
  assert base['tn']['mean'] == 2000 and base['em']['n'] == 2
  assert agg['phase_b']['em']['std'] == 0.0
  # Absent judge stays absent.
  assert base['j_judge']['mean'] is None and base['mq']['n'] == 0
  # Frontier: pointwise mean curve; TN@S* and SR@B* of the mean curve (paper C.7).
  fr = agg['phase_b']['frontier']
  assert fr['mean'] == [30.0, 50.0, 60.0]
  assert fr['tn_at_target'] == pytest.approx(1500.0)
  assert fr['sr_at_budget'] == 50.0
  assert agg['phase_b']['tn_at_target']['mean'] == pytest.approx(1500.0)
  # per-seed values: seed 42 reaches 40 at exactly 2000, seed 43 at the first point.
  assert agg['phase_b']['tn_at_target']['values'] == [2000.0, 1000.0]
  # Base's mean curve is [25, 50, 50]: 40 lies 15/25 of the way from 1000 to 2000.
  assert agg['base']['frontier']['tn_at_target'] == pytest.approx(1000 + 15 / 25 * 1000)


def test_single_seed_has_no_std():
  agg = aggregate.aggregate({42: PER_SEED[42]}, budgets=BUDGETS, target_success=40.0,
                            target_budget=2000)
  assert agg['base']['em']['std'] is None
  text = aggregate.markdown_table(agg, solver_label='x', judge_label=None,
                                  num_questions={'42': 4}, seeds=[42])
  table = text.split('\n- ')[0]  # the rows, before the column notes
  assert '25.0 (SE 25.0) |' in table and '±' not in table


def test_tables_and_json_written(tmp_path):
  agg = _agg()
  label = 'oracle-evidence reader (DIAGNOSTIC)'
  paths = aggregate.write_results(
      str(tmp_path), agg, per_seed=PER_SEED, meta={'cmd': 'x'}, solver_label=label,
      judge_label=None, num_questions={'42': 4, '43': 4}, seeds=[42, 43])
  md = open(paths['md']).read()
  assert label in md and 'J_judge and MQ are absent' in md
  # EM: mean ± std over the two seeds, then the question standard error (0.25).
  assert '| base | — | — | 50.0 ± 35.4 (SE 25.0) |' in md
  assert md.count('(SE s): s is the standard error over the tasks') == 1
  assert 'Operation mix' in md
  # Each counted column says what it counts, once, under the table.
  for text in ('TN: online tokens', 'TC: executed non-null memory-tool calls',
               'rejected calls: tool calls', 'unparseable: decisions'):
    assert md.count(text) == 1
  custom = aggregate.markdown_table(agg, solver_label='x', judge_label=None,
                                    num_questions={'42': 4}, seeds=[42],
                                    metrics=[m for m in aggregate.TABLE_METRICS
                                             if m[0] == 'em'])
  assert 'TC:' not in custom and 'TN:' not in custom
  rows = list(csv.DictReader(open(paths['csv'])))
  assert [r['policy'] for r in rows] == ['base', 'phase_b']
  assert rows[0]['solver'] == label and float(rows[0]['em_mean']) == 0.5
  assert float(rows[0]['em_se']) == 0.25
  assert rows[0]['j_judge_mean'] == ''
  data = json.load(open(paths['json']))
  assert data['solver'] == label and data['judge'] is None
  assert data['aggregate']['phase_b']['frontier']['mean'] == [30.0, 50.0, 60.0]
  assert data['per_seed']['43']['base']['em'] == 0.75


def test_plots_written(tmp_path):
  agg = _agg()
  path = plots.plot_frontier(agg, str(tmp_path / 'frontier.png'), target_success=40.0,
                             target_budget=2000)
  bars = plots.plot_bars(agg, str(tmp_path))
  assert path and os.path.getsize(path) > 1000
  names = sorted(os.path.basename(p) for p in bars)
  assert 'bars_em.png' in names and 'bars_tn.png' in names
  assert 'bars_j_judge.png' not in names  # absent metric: no chart
  assert plots.plot_frontier({'x': {'frontier': None}}, str(tmp_path / 'f.png'),
                             target_success=40.0, target_budget=2000) is None


def test_bar_errors_are_seed_std_or_one_seed_task_se():
  # Two seeds: base em 0.25, 0.75 -> mean 50 %, sample std sqrt(0.125) = 35.355 %.
  names, means, errs, spread = plots.bar_values(_agg(), 'em', 100.0)
  assert names == ['base', 'phase_b'] and means == [50.0, 50.0]
  assert errs == pytest.approx([35.35533906, 0.0]) and spread == '±1 std over seeds'
  # One seed: no std; the bar shows that seed's task SE (em_se 0.25 -> 25 %).
  one = aggregate.aggregate({42: PER_SEED[42]}, budgets=BUDGETS, target_success=40.0,
                            target_budget=2000)
  names, means, errs, spread = plots.bar_values(one, 'em', 100.0)
  assert means == [25.0, 50.0] and errs == [25.0, 25.0]
  assert spread == '±1 SE over tasks (one seed)'
  # One seed, no SE recorded (tn): no error bars.
  _, means, errs, spread = plots.bar_values(one, 'tn', 1.0)
  assert means == [1000.0, 2000.0] and errs is None and spread == ''
  assert plots.bar_values(one, 'j_judge', 1.0)[0] == []  # absent metric: no bars
