"""Tests for vermem_jax.eval.table2: Table 2 over benchmarks and the macro frontier,
against hand-computed values (two seeds, two policies, four benchmarks present)."""
import json
import math
import os

import pytest

from vermem_jax.eval import table2

BUDGETS = [1000, 2000, 3000]


def _summary(**kw):
  s = {'n': 4, 'success_rate': None, 'progress_rate': None, 'j_judge': None, 'em': None}
  s.update(kw)
  return s


def _results(per_seed, *, backend='llm', budgets=BUDGETS, judge=None):
  return {'per_seed': {str(k): v for k, v in per_seed.items()},
          'aggregate': {p: {} for v in per_seed.values() for p in v},
          'solver': f'{backend} solver label', 'judge': judge,
          'meta': {'budgets': budgets, 'solver_backend': backend,
                   'target_success': 40.0, 'target_budget': 2500.0}}


def _by_bench(j_judge=(None, None), alfworld_backend='llm'):
  alf = _results({
      42: {'base': _summary(success_rate=50.0, frontier_curve=[0, 25, 50]),
           'phase_c': _summary(success_rate=70.0, frontier_curve=[20, 50, 70])},
      43: {'base': _summary(success_rate=30.0, frontier_curve=[10, 20, 30]),
           'phase_c': _summary(success_rate=90.0, frontier_curve=[40, 60, 90])}},
      backend=alfworld_backend)
  babyai = _results({42: {'base': _summary(success_rate=80.0, frontier_curve=[40, 60, 80])},
                     43: {'base': _summary(success_rate=60.0,
                                           frontier_curve=[20, 40, 60])}})
  pddl = _results({42: {'base': _summary(progress_rate=40.0, success_rate=0.0),
                        'phase_c': _summary(progress_rate=80.0, success_rate=50.0)},
                   43: {'base': _summary(progress_rate=60.0, success_rate=0.0),
                        'phase_c': _summary(progress_rate=100.0, success_rate=100.0)}})
  hq = _results({42: {'base': _summary(em=0.5, j_judge=j_judge[0])},
                 43: {'base': _summary(em=0.7, j_judge=j_judge[1])}}, backend='oracle',
                judge='openai_compatible: qwen-max' if j_judge[0] is not None else None)
  return {'alfworld': alf, 'pddl': pddl, 'babyai': babyai, 'hotpotqa': hq}


def _build(by_bench, **kw):
  return table2.build(table2.workdir_rows(by_bench), by_bench, target_success=40.0,
                      target_budget=2500.0, **kw)


def test_scores_average_and_frontier_by_hand():
  t = _build(_by_bench())
  agg = t['aggregate']
  assert list(agg) == ['base', 'phase_c']
  assert agg['base']['alfworld']['mean'] == 40.0
  assert agg['base']['alfworld']['std'] == pytest.approx(math.sqrt(200.0))
  assert agg['phase_c']['pddl']['mean'] == 90.0  # PR from progress, not SR
  assert agg['base']['hotpotqa']['mean'] is None  # no judge: absent
  assert agg['base']['hotpotqa_em']['mean'] == pytest.approx(60.0)
  # Average per seed over the scores present: (50+40+80)/3 and (30+60+60)/3.
  assert t['average_over'] == {'base': ['alfworld', 'pddl', 'babyai'],
                               'phase_c': ['alfworld', 'pddl']}
  assert agg['base']['average']['values'] == pytest.approx([170 / 3, 50.0])
  assert agg['base']['average']['std'] == pytest.approx((170 / 3 - 50) / math.sqrt(2))
  assert agg['phase_c']['average']['mean'] == pytest.approx(85.0)
  # Macro SR over ALFWorld and BabyAI (SciWorld absent): per seed, then the mean curve
  # [17.5, 36.25, 55]; TN@40 = 2000 + 3.75/18.75 * 1000; SR@2500 = 45.625.
  assert t['frontier_benchmarks'] == ['alfworld', 'babyai']
  fr = agg['base']['frontier']
  assert fr['mean'] == pytest.approx([17.5, 36.25, 55.0])
  assert agg['base']['tn_at_target']['mean'] == pytest.approx(2200.0)
  assert agg['base']['sr_at_budget']['mean'] == pytest.approx(45.625)
  assert agg['phase_c']['frontier'] is None  # BabyAI not evaluated for it
  md = table2.markdown(t)
  assert ('| base | 40.0 ± 14.1 | absent | 50.0 ± 14.1 | 70.0 ± 14.1 | absent | '
          '53.33 ± 4.71 (3 of 5: ALFWorld, PDDL, BabyAI) | 60.0 ± 14.1† |') in md
  assert ('| phase_c | 80.0 ± 14.1 | absent | 90.0 ± 14.1 | absent | absent | '
          '85.00 ± 14.14 (2 of 5: ALFWorld, PDDL) | absent |') in md
  assert 'HotpotQA judge: none — 100·J_judge is absent' in md
  assert 'Not evaluated (absent): SciWorld' in md
  # Per-seed TN@S*: 1888.9 and 2666.7 -> std 550 (the mean is the mean curve's).
  assert '| base | 45.6 ± 11.5 | 2200 ± 550 | 18 / 36 / 55 |' in md
  assert 'macro SR over ALFWorld, BabyAI (SciWorld not evaluated)' in md


def test_judge_scores_enter_the_average_and_stand_ins_are_marked():
  t = _build(_by_bench(j_judge=(0.5, 0.7), alfworld_backend='gold_plan'))
  agg = t['aggregate']
  assert agg['base']['hotpotqa']['mean'] == pytest.approx(60.0)
  assert t['average_over']['base'] == ['alfworld', 'pddl', 'babyai', 'hotpotqa']
  assert agg['base']['average']['values'] == pytest.approx([55.0, 55.0])  # (50+40+80+50)/4, (30+60+60+70)/4
  md = table2.markdown(t)
  assert '| base | 40.0 ± 14.1† |' in md and '† a stand-in task solver' in md
  assert '| base | 45.6 ± 11.5† | 2200 ± 550† |' in md  # the frontier includes ALFWorld's stand-in
  assert 'HotpotQA judge: openai_compatible: qwen-max' in md


def test_frontier_needs_one_budget_grid():
  by_bench = _by_bench()
  by_bench['babyai']['meta']['budgets'] = [1000, 2000]
  with pytest.raises(ValueError, match='same eval.budgets'):
    _build(by_bench)
  t = _build(by_bench, frontier_benchmarks=('alfworld',))
  assert t['frontier_benchmarks'] == ['alfworld']
  t = _build({'pddl': _by_bench()['pddl']})
  assert t['budgets'] is None and 'Not computed' in table2.markdown(t)
  with pytest.raises(ValueError, match='no evaluated policy'):
    table2.build([], {}, target_success=40.0, target_budget=2500.0)


def test_write_and_collect(tmp_path):
  by_bench = _by_bench()
  for b, res in by_bench.items():
    os.makedirs(tmp_path / f'eval_{b}')
    with open(tmp_path / f'eval_{b}' / 'results.json', 'w') as f:
      json.dump(res, f)
  found = table2.collect_workdir(str(tmp_path))
  assert list(found) == ['alfworld', 'pddl', 'babyai', 'hotpotqa']  # Table 2 order
  paths = table2.write(str(tmp_path / 'out'), _build(found))
  for key in ('md', 'csv', 'json', 'frontier'):
    assert os.path.getsize(paths[key]) > 0
  rows = open(paths['csv']).read().splitlines()
  assert rows[0].startswith('policy,alfworld_mean,alfworld_std,')
  assert rows[1].startswith('base,40.0,14.14')
  data = json.load(open(paths['json']))
  assert data['aggregate']['base']['tn_at_target']['mean'] == pytest.approx(2200.0)
