"""experiments/benchmarks/learning_curve.py: reading the phases' metrics.jsonl, the
mean ± std over seeds, the printed tables and the figure, on hand-made metrics files
whose figures are computed by hand below; the flag checks; and (slow) one tiny seed end
to end with two advantage modes."""
import json
import os

import pytest

from experiments.benchmarks import learning_curve as lc
from tests import test_curriculum_e2e as e2e


def _write_rows(directory, rows):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'metrics.jsonl'), 'w') as f:
    for row in rows:
      f.write(json.dumps(row) + '\n')


def _phase_rows(r_task, rejected, ops, episodes=4):
  """metrics.jsonl rows of an RL phase: step 0 = θ_start (internal_dev/start/*), step
  n = the dev evaluation after update n (dev/*); m^ans = r^task / 2 throughout."""
  rows = [{'step': 0, 'internal_dev/start/r_task': r_task[0],
           'internal_dev/start/m_ans': r_task[0] / 2,
           'internal_dev/start/rejected_rate': rejected[0],
           'internal_dev/start/r_sup': 0.0,
           'internal_dev/start/num_episodes': float(episodes),
           **{f'internal_dev/start/op_share/{k}': v for k, v in ops[0].items()}}]
  for n in range(1, len(r_task)):
    rows.append({'step': n, 'reward/r_task': 0.9, 'rollout/rejected_share': 0.9,
                 'dev/r_task': r_task[n], 'dev/m_ans': r_task[n] / 2,
                 'dev/invalid_rate': rejected[n], 'dev/score': r_task[n],
                 'dev/episodes': float(episodes),
                 **{f'dev/op_share/{k}': v for k, v in ops[n].items()}})
  rows[-1]['internal_dev/end/r_task'] = 0.123  # not a curve point
  return rows


NULL = {'Null': 1.0}
HALF = {'Null': 0.5, 'Add': 0.5}
# seed -> phase -> (r^task at updates 0, 1, 2; rejected rate; op mix; selected update)
RUNS = {
    42: {'phase_a': ([0.0, 0.5, 0.25], [0.0, 0.25, 0.5], [NULL, HALF, NULL], 1),
         'phase_b': ([0.5, 0.25, 0.75], [0.25, 0.0, 0.0], [HALF, NULL, NULL], 2),
         'phase_c': ([0.75, 1.0, 0.5], [0.0, 0.0, 0.0], [NULL, NULL, NULL], 1),
         'no_verify': ([0.5, 0.25, 0.0], [0.25, 0.5, 0.75], [HALF, HALF, HALF], 1)},
    43: {'phase_a': ([0.25, 0.25, 0.5], [0.0, 0.0, 0.0], [HALF, HALF, HALF], 2),
         'phase_b': ([0.5, 1.0, 0.5], [0.0, 0.0, 0.0], [NULL, NULL, NULL], 1),
         'phase_c': ([1.0, 0.75, 0.75], [0.0, 0.0, 0.0], [NULL, NULL, NULL], 2),
         'no_verify': ([0.5, 0.5, 0.25], [0.0, 0.0, 0.0], [NULL, NULL, NULL], 1)},
}
# θ_SFT and θ_A on Phase C's dev episodes (played after the run)
POSTHOC = {42: {'sft': 0.0, 'phase_a': 0.5}, 43: {'sft': 0.25, 'phase_a': 0.5}}


@pytest.fixture()
def per_seed(tmp_path):
  out = {}
  for seed, runs in RUNS.items():
    seed_dir = tmp_path / f'seed{seed}'
    _write_rows(seed_dir / 'sft', [
        {'step': 10, 'train/loss': 2.0}, {'step': 20, 'train/loss': 1.0 + seed - 42},
        {'step': 20, 'dev/tool_accuracy': 0.5 + (seed - 42) / 4, 'dev/exact_match': 0.25,
         'dev/tool_accuracy/Add': 0.875, 'dev/exact_match/Add': 0.5 + (seed - 42) / 8}])
    res = {'sft': lc.sft_figures(str(seed_dir / 'sft'), 20),
           'sft_loss': lc.sft_loss_curve(str(seed_dir / 'sft')),
           'phases': {}, 'modes': {}, 'wall_s': 60.0 + seed,
           'posthoc': {p: {'r_task': v, 'm_ans': v / 2, 'rejected_rate': 0.0,
                           'episodes': 4.0, 'ops': NULL}
                       for p, v in POSTHOC[seed].items()}}
    for phase, (r_task, rejected, ops, selected) in runs.items():
      _write_rows(seed_dir / phase, _phase_rows(r_task, rejected, ops))
      read = lc.read_phase(str(seed_dir / phase), 4, selected)
      if phase == 'no_verify':
        res['modes']['no_verify'] = read
      else:
        res['phases'][phase] = read
    res['modes']['full'] = res['phases']['phase_b']
    out[seed] = res
  return out


def _line(text, start):
  lines = [ln for ln in text.splitlines() if ln.strip().startswith(start)]
  assert len(lines) == 1, (start, lines)
  return lines[0]


def test_phase_curve_reads_start_and_updates(per_seed):
  curve = per_seed[42]['phases']['phase_a']['curve']
  assert sorted(curve) == [0, 1, 2]
  assert curve[0] == {'r_task': 0.0, 'm_ans': 0.0, 'rejected_rate': 0.0, 'episodes': 4.0,
                      'ops': {'Null': 1.0}}
  assert curve[1] == {'r_task': 0.5, 'm_ans': 0.25, 'rejected_rate': 0.25,
                      'episodes': 4.0, 'ops': {'Null': 0.5, 'Add': 0.5}}
  assert per_seed[42]['phases']['phase_a']['last'] == 2
  # a resumed run logs a step again: the last row counts
  rows = _phase_rows([0.0, 0.5], [0.0, 0.0], [NULL, NULL])
  rows.append(dict(rows[1], **{'dev/r_task': 0.75}))
  assert lc.phase_curve(rows)[1]['r_task'] == 0.75


def test_read_phase_refuses_other_episode_counts(tmp_path):
  _write_rows(tmp_path / 'phase_a', _phase_rows([0.0, 0.5], [0.0, 0.0], [NULL, NULL],
                                                episodes=2))
  with pytest.raises(ValueError, match='2 dev episodes, not --dev_episodes 16'):
    lc.read_phase(str(tmp_path / 'phase_a'), 16, 1)
  with pytest.raises(ValueError, match='selected update 5'):
    lc.read_phase(str(tmp_path / 'phase_a'), 2, 5)


def test_aggregate_curves_mean_std_by_hand(per_seed):
  agg = lc.aggregate_curves([per_seed[s]['phases']['phase_a']['curve'] for s in (42, 43)])
  assert agg['update'] == [0, 1, 2]
  # r^task: update 0 (0, .25), 1 (.5, .25), 2 (.25, .5)
  assert agg['r_task'][0] == pytest.approx([0.125, 0.375, 0.375])
  assert agg['r_task'][1] == pytest.approx([0.125, 0.125, 0.125])
  assert agg['m_ans'][0] == pytest.approx([0.0625, 0.1875, 0.1875])
  assert agg['rejected_rate'][0] == pytest.approx([0.0, 0.125, 0.25])
  assert agg['rejected_rate'][1] == pytest.approx([0.0, 0.125, 0.25])
  # ops: seed 42 (Null), (Null .5 Add .5), (Null); seed 43 (Null .5 Add .5) throughout
  assert list(agg['ops']) == ['Add', 'Null']  # ALL_OPS order
  assert agg['ops']['Null'] == pytest.approx([0.75, 0.5, 0.75])
  assert agg['ops']['Add'] == pytest.approx([0.25, 0.5, 0.25])
  # only updates every seed has
  short = dict(per_seed[43]['phases']['phase_a']['curve'])
  del short[2]
  assert lc.aggregate_curves([per_seed[42]['phases']['phase_a']['curve'],
                              short])['update'] == [0, 1]


def test_policy_table_by_hand(per_seed):
  t = lc.policy_table(per_seed[42])
  assert t['sft']['phase_a']['r_task'] == 0.0          # Phase A's θ_start
  assert t['phase_a']['phase_a']['r_task'] == 0.5      # its selected update 1
  assert t['phase_a']['phase_b']['r_task'] == 0.5      # Phase B's θ_start
  assert t['phase_b']['phase_b']['r_task'] == 0.75     # selected update 2
  assert t['phase_c']['phase_c']['r_task'] == 1.0      # selected update 1
  assert t['sft']['phase_c']['r_task'] == 0.0          # post hoc
  assert 'phase_b' not in t['sft']


def test_report_tables_by_hand(per_seed):
  text = lc.report(per_seed, dev_episodes=4, note='stand-in note',
                   modes=['full', 'no_verify'])
  assert 'NOTE: stand-in note.' in text
  # 1. SFT: tool accuracy .5, .75; Add exact match .5, .625 (both >= .5), tool .875
  assert _line(text, 'tool_accuracy').split()[1:] == ['0.625', '±', '0.125']
  assert _line(text, 'Add').split() == ['Add', '0.875', '±', '0.000', '0.562', '±',
                                        '0.062', 'yes']
  # 2. θ_SFT on Phase A's dev (0, .25); θ_A on A (.5, .5), on B (.5, .5); θ_B on B
  # (.75, 1); θ_B on C = C's start (.75, 1); θ_C on C (1, .75); θ_SFT on C (0, .25)
  block = text.split('   r^task\n')[1].split('   m^ans\n')[0]
  assert _line(block, 'θ_SFT').split() == ['θ_SFT', '0.125', '±', '0.125', '·', '0.125',
                                           '±', '0.125']
  assert _line(block, 'θ_A').split() == ['θ_A'] + ['0.500', '±', '0.000'] * 3
  assert _line(block, 'θ_B').split() == ['θ_B', '·', '0.875', '±', '0.125', '0.875', '±',
                                         '0.125']
  assert _line(block, 'θ_C').split() == ['θ_C', '·', '·', '0.875', '±', '0.125']
  assert _line(text, 'θ_SFT  on phase_a dev').endswith('∅ 75%, Add 25%')
  # 3. Δ r^task (selected): A .5, .25; B .25, .5; C .25, -.25; A's last update .25, .25
  assert _line(text, 'θ_A − θ_SFT r^task  ').split()[-6:] == [
      '+0.500', '+0.250', '+0.375', '±', '0.125', 'met']
  assert _line(text, 'θ_B − θ_A r^task  ').split()[-6:] == [
      '+0.250', '+0.500', '+0.375', '±', '0.125', 'met']
  assert _line(text, 'θ_C − θ_B r^task  ').split()[-6:] == [
      '+0.250', '-0.250', '+0.000', '±', '0.250', 'MISSED']
  assert _line(text, 'θ_A − θ_SFT r^task (last').split()[-5:] == [
      '+0.250', '+0.250', '+0.250', '±', '0.000']
  # rejected rate: A .25, 0 (rises); B -.25, 0
  assert _line(text, 'θ_A − θ_SFT rejected').split()[-2:] == ['0.125', 'rises']
  assert _line(text, 'θ_B − θ_A rejected').split()[-4:] == ['±', '0.125', 'no', 'rise']
  # θ_C − θ_SFT m^ans on C: (.5 - 0, .375 - .125) = (.5, .25)
  assert _line(text, 'θ_C − θ_SFT m^ans (C dev)').split()[-9:] == [
      '+0.500', '+0.250', '+0.375', '±', '0.125', 'met', '(θ_C', 'above', 'θ_SFT)']
  # 4. Table 4: full = Phase B (.75, 1); no_verify selected update 1 (.25, .5)
  assert _line(text, 'full  ').split()[:4] == ['full', '0.875', '±', '0.125']
  assert _line(text, 'no_verify ').split()[:4] == ['no_verify', '0.375', '±', '0.125']
  assert _line(text, 'no_verify ').split()[-3:] == ['0.250', '±', '0.250']  # rejected
  assert _line(text, 'full − no_verify r^task').endswith(
      'per seed +0.500, +0.500; +0.500 ± 0.000 (goal full above: met)')
  assert 'wall seconds per seed: 42: 102, 43: 103' in text


def test_plot_writes_png(per_seed, tmp_path):
  path = tmp_path / 'lc.png'
  lc.plot(per_seed, str(path), 'stand-in note')
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_stand_in_note_follows_the_config():
  cfg = lc.phase_config('phase_c', 42, [])
  note = lc.stand_in_note(cfg)
  assert 'oracle-evidence reader' in note and 'heuristic verifier' in note
  assert lc.stand_in_note(lc.phase_config(
      'phase_c', 42, [('solver.backend', 'openai_compatible'),
                    ('verifier.backend', 'openai_compatible')])) == ''


def test_seeds_space_or_comma_separated():
  assert lc.parse_args(['--seeds', '42', '43']).seeds == [42, 43]
  assert lc.parse_args(['--seeds=42,43,44']).seeds == [42, 43, 44]
  assert lc.parse_args([]).seeds == list(lc.SEEDS)


@pytest.mark.parametrize('argv,message', [
    (['--modes=full,bogus'], "unknown advantage mode 'bogus'"),
    (['--modes=full,full'], 'repeats a mode'),
    (['--dev_episodes', '0'], '--dev_episodes must be >= 1'),
    (['--seeds', '42', '42'], 'repeats a seed'),
    (['--seeds=42,42'], 'repeats a seed'),
    (['--seeds=42,x'], '--seeds: expected integers'),
    (['--seeds=-1'], '--seeds must be >= 0'),
    (['--override', 'rl.nope=1'], 'rl.nope: no such config field'),
    (['--override', 'episodes.num_dev=2'], 'set by this script'),
    (['--override', 'rl.learning_rate=abc'], 'rl.learning_rate'),
    (['--override', 'norate'], 'section.field=value'),
])
def test_bad_flags_exit_2(capsys, argv, message):
  with pytest.raises(SystemExit) as e:
    lc.parse_args(argv)
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_dev_overrides_keep_a_larger_num_dev():
  got = dict(lc.dev_overrides(2, 42, []))
  default = lc.phase_config('phase_c', 42, []).episodes.num_dev
  assert got == {'episodes.num_dev': max(2, default), 'rl.eval_every': 1,
                 'rl.eval_episodes': 2, 'rl.internal_dev_episodes': 2}


@pytest.mark.slow
def test_one_tiny_seed_end_to_end_with_two_modes(tmp_path, capsys):
  """One seed, tiny sizes (tests/test_curriculum_e2e.py), 2 dev episodes, one update a
  phase, Phase B in modes full and no_verify."""
  overrides = [f'{k}={v!r}' for k, v in e2e.TINY_OVERRIDES.items()
               if k not in lc.DEV_FIELDS]
  workdir = tmp_path / 'lc'
  assert lc.main(['--seeds', '42', '--workdir', str(workdir), '--dev_episodes', '2',
                  '--modes=full,no_verify', '--override', *overrides]) == 0
  out = capsys.readouterr().out
  assert '4. Table 4 at this scale' in out and 'oracle-evidence reader' in out
  result = json.loads((workdir / 'learning_curve.json').read_text())['seeds']['42']
  for phase in ('phase_a', 'phase_b', 'phase_c'):
    curve = result['phases'][phase]['curve']
    assert sorted(curve, key=int) == ['0', '1']
    assert all(p['episodes'] == 2.0 for p in curve.values())
  mode_dir = workdir / 'seed42' / 'modes' / 'no_verify'
  assert os.readlink(mode_dir / 'phase_a') == os.path.join('..', '..', 'phase_a')
  # both modes' Phase B start from the same θ_A, and full is the curriculum's own
  refs = [json.loads((d / 'phase_b' / 'reference.json').read_text())
          for d in (workdir / 'seed42', mode_dir)]
  assert refs[0]['params_sha256'] == refs[1]['params_sha256']
  assert result['modes']['no_verify']['curve']['0'] == result['phases']['phase_b']['curve']['0']
  assert result['modes']['full'] == result['phases']['phase_b']
  # internal_dev/end (internal_dev.py) and dev/* (rl_selection.py) score the same θ on
  # the same episodes at the last update: the two paths of the curve agree
  rows = [json.loads(ln) for ln in
          (workdir / 'seed42' / 'phase_a' / 'metrics.jsonl').read_text().splitlines()]
  last = rows[-1]
  assert last['internal_dev/end/r_task'] == last['dev/r_task']
  assert last['internal_dev/end/m_ans'] == last['dev/m_ans']
  assert last['internal_dev/end/rejected_rate'] == last['dev/invalid_rate']
  assert (workdir / 'learning_curve.png').stat().st_size > 0
