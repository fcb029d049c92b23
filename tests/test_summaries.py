"""End-of-phase summary blocks (vermem_jax/train/summaries.py) and the internal-dev
episode figures (vermem_jax/train/internal_dev.py) on hand-made inputs."""

import math
import os
import re

import pytest

from vermem_jax.train import internal_dev
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import summaries


def _rl_rows(n):
  rows = []
  for step in range(1, n + 1):
    rows.append({'step': step, 'reward/r_task': step / n, 'reward/r_global': 0.5,
                 'reward/m_ans': step / (2 * n), 'rollout/rejected_rate': 1 - step / n,
                 'rollout/op_share_Add': step / n, 'rollout/op_share_Unparseable': 1 - step / n})
  return rows


def test_window_means_first_and_last():
  rows = [{'step': 0, 'internal_dev/start/r_task': 0.3}] + _rl_rows(10)
  (f0, f1, first), (l0, l1, last) = summaries.window_means(rows, 3)
  assert (f0, f1, l0, l1) == (1, 3, 8, 10)
  assert first['reward/r_task'] == pytest.approx((0.1 + 0.2 + 0.3) / 3)
  assert last['rollout/rejected_rate'] == pytest.approx((0.2 + 0.1 + 0.0) / 3)
  # Two updates: windows of one update each; one update: the same row twice.
  (f0, f1, _), (l0, l1, _) = summaries.window_means(_rl_rows(2), 3)
  assert (f0, f1, l0, l1) == (1, 1, 2, 2)
  (f0, _, a), (l0, _, b) = summaries.window_means(_rl_rows(1), 3)
  assert f0 == l0 == 1 and a == b
  # An op missing from some updates averages as a share of 0 there.
  rows = _rl_rows(4)
  rows[0]['rollout/op_share_Delete'] = 0.5
  (_, _, first), _ = summaries.window_means(rows, 2)
  assert first['rollout/op_share_Delete'] == pytest.approx(0.25)
  with pytest.raises(ValueError):
    summaries.window_means([{'step': 0}], 3)


def test_op_mix_orders_by_share_and_names_null():
  mix = internal_dev.op_mix({'op_share/Null': 0.25, 'op_share/Add': 0.5,
                             'op_share/Unparseable': 0.25, 'op_share/Delete': 0.0, 'x': 1})
  assert mix == 'Add 50%, ∅ 25%, Unparseable 25%'
  assert internal_dev.op_mix({}) == '-'


def _write_rows(phase_dir, rows):
  with metrics_lib.MetricsWriter(str(phase_dir), tensorboard=False) as w:
    for row in rows:
      w.write(row.pop('step'), row)


def test_rl_summary_block(tmp_path):
  phase_dir = tmp_path / 'phase_a'
  _write_rows(phase_dir, _rl_rows(6))
  result = {'step': 6, 'reference_phase': 'sft',
            'internal_dev/start/num_episodes': 8.0, 'internal_dev/start/r_task': 0.25,
            'internal_dev/start/m_ans': 0.125, 'internal_dev/start/r_sup': 0.5,
            'internal_dev/start/rejected_rate': 0.5, 'internal_dev/start/op_share/Add': 1.0,
            'internal_dev/end/num_episodes': 8.0, 'internal_dev/end/r_task': 0.5,
            'internal_dev/end/m_ans': 0.375, 'internal_dev/end/r_sup': 0.75,
            'internal_dev/end/rejected_rate': 0.25, 'internal_dev/end/op_share/Null': 1.0,
            'internal_dev/start/unparseable_rate': 0.375,
            'internal_dev/start/not_allowed_rate': 0.125,
            'internal_dev/end/unparseable_rate': 0.0,
            'internal_dev/end/not_allowed_rate': 0.25}
  text = summaries.phase_summary('phase_a', result, str(phase_dir), workdir=str(tmp_path))
  lines = text.splitlines()
  assert lines[0].startswith('phase_a summary: 6 updates (CPU stand-ins')
  assert 'updates 1-3' in text and 'updates 4-6' in text
  r_task = next(l for l in lines if l.strip().startswith('r^task') and '0.333' in l)
  assert r_task.split()[-2:] == ['0.333', '0.833']  # (1+2+3)/18, (4+5+6)/18
  # Each mix is labelled with the window it averages: shares 1/6-3/6 and 4/6-6/6 of Add.
  assert [l.strip() for l in lines if l.strip().startswith('operation mix')] == [
      'operation mix, updates 1-3    Unparseable 67%, Add 33%',
      'operation mix, updates 4-6    Add 83%, Unparseable 17%']
  assert 'internal dev (8 ep., greedy)' in text and 'start (θ sft)' in text
  dev_r = next(l for l in lines if l.strip().startswith('r^task') and '0.250' in l)
  assert dev_r.split()[-2:] == ['0.250', '0.500']
  assert re.search(r'dev operation mix, end +∅ 100%', text)
  # The rejected rate's two parts, indented under it, and what they are shares of.
  assert 'shares of all decisions' in text
  i = next(i for i, l in enumerate(lines) if l.strip().startswith('rejected rate')
           and '0.500' in l)
  assert lines[i + 1].split() == ['unparseable', '0.375', '0.000']
  assert lines[i + 2].split() == ['outside', "the", "phase's", 'tools', '0.125', '0.250']
  # Header and rows line up (right-aligned columns end at the same place), also when
  # the previous phase's name is longer than the column.
  for prev in ('sft', 'phase_a'):
    text = summaries.phase_summary('phase_a', dict(result, reference_phase=prev),
                                   str(phase_dir), workdir=str(tmp_path))
    lines = text.splitlines()
    head = next(l for l in lines if l.strip().startswith('internal dev'))
    rows = [l for l in lines[lines.index(head) + 1:] if l.strip()[:1] in 'rmsuo']
    assert f'start (θ {prev})' in head
    for row in rows[:6]:
      assert len(row) == len(head), (head, row)
    roll = next(l for l in lines if 'rollouts (sampled)' in l)
    assert len(roll) == len(lines[lines.index(roll) + 1])
  assert os.path.join(str(phase_dir), 'advantages.jsonl') in text
  assert f'VERMEM_WORKDIR={tmp_path} jupyter nbconvert' in text


def test_rl_summary_end_column_names_the_selected_update(tmp_path):
  phase_dir = tmp_path / 'phase_b'
  _write_rows(phase_dir, _rl_rows(3))
  result = {'step': 3, 'reference_phase': 'phase_a',
            'internal_dev/start/num_episodes': 8.0, 'internal_dev/start/r_task': 0.375,
            'internal_dev/start/rejected_rate': 0.25,
            'internal_dev/end/num_episodes': 8.0, 'internal_dev/end/r_task': 0.5,
            'internal_dev/end/rejected_rate': 0.125, 'internal_dev/end/step': 2.0}
  lines = summaries.phase_summary('phase_b', result, str(phase_dir)).splitlines()
  head = next(l for l in lines if l.strip().startswith('internal dev'))
  assert head.rstrip().endswith('start (θ phase_a)  update 2 (selected)')
  rejected = next(l for l in lines if l.strip().startswith('rejected rate')
                  and '0.250' in l)
  assert rejected.split()[-2:] == ['0.250', '0.125'] and len(rejected) == len(head)
  assert any(l.strip().startswith('dev operation mix, selected') for l in lines)
  # Logs from before the step was recorded: a plain 'end' column.
  del result['internal_dev/end/step']
  lines = summaries.phase_summary('phase_b', result, str(phase_dir)).splitlines()
  assert next(l for l in lines if l.strip().startswith('internal dev')).rstrip().endswith(' end')


def test_rl_summary_shows_the_rejection_preference(tmp_path):
  phase_dir = tmp_path / 'phase_b'
  rows = _rl_rows(4)
  # Update 1 has no rejected decision (keys absent), 2 prefers rejections, 3-4 do not.
  for row, share, rej, exe in ((rows[1], 0.75, -0.5, -1.25), (rows[2], 0.0, -3.0, 0.5),
                               (rows[3], 0.0, -2.0, 0.25)):
    row.update({'advantage/rejection_preference_share': share,
                'advantage/a_hier_rejected_mean': rej,
                'advantage/a_hier_executable_mean': exe})
  rows[0]['advantage/a_hier_executable_mean'] = 0.0
  _write_rows(phase_dir, rows)
  lines = summaries.phase_summary('phase_b', {'step': 4}, str(phase_dir)).splitlines()

  def row(label):
    return next(l for l in lines if l.strip().startswith(label)).split()[-2:]
  # Windows of 2 updates: the first window's share is update 2's alone (update 1 has
  # none), its executable mean (0 + -1.25) / 2.
  assert row('executable below rejected') == ['0.750', '0.000']
  assert row('A^hier, rejected (mean)') == ['-0.500', '-2.500']
  assert row('A^hier, executable (mean)') == ['-0.625', '0.375']
  assert any("below the rejected ones' mean" in l for l in lines)
  # A run that never logged them (older logs) shows '-'.
  other = tmp_path / 'phase_a'
  _write_rows(other, _rl_rows(2))
  lines = summaries.phase_summary('phase_a', {'step': 2}, str(other)).splitlines()
  assert row('executable below rejected') == ['-', '-']


def test_sft_summary_block(tmp_path):
  result = {'step': 120, 'total_steps': 120, 'num_train': 768, 'num_dev': 64,
            'best_step': 120, 'best_tool_accuracy': 0.5, 'tool_accuracy': 0.5,
            'executable_rate': 0.75, 'executable_rate_non_null': math.nan,
            'exact_match': 0.25, 'dev_loss': 1.5,
            'tool_accuracy/Add': 0.625, 'exact_match/Add': 0.125,
            'tool_accuracy/Null': 1.0, 'exact_match/Null': 1.0,
            'predicted/Add/Add': 0.625, 'predicted/Add/Null': 0.25,
            'predicted/Add/Unparseable': 0.125, 'predicted/Null/Null': 1.0,
            'tool_accuracy/Update': 0.0, 'exact_match/Update': 0.0,
            # A run written before SFT said 'Unparseable' has 'Invalid': printed the same.
            'predicted/Update/Invalid': 0.75, 'predicted/Update/Null': 0.25,
            # A tie between two wrong predictions: the mixes' order (∅ first) decides.
            'tool_accuracy/Filter': 0.75, 'exact_match/Filter': 0.75,
            'predicted/Filter/Filter': 0.75, 'predicted/Filter/Unparseable': 0.125,
            'predicted/Filter/Null': 0.125}
  text = summaries.phase_summary('sft', result, str(tmp_path / 'sft'))
  assert 'SFT summary: 120 of 120 steps, 768 train / 64 dev records' in text
  assert re.search(r'\n  dev tool accuracy +0\.500\n', text)
  assert re.search(r'\n  executable rate +0\.750 ', text)
  assert re.search(r'\n  non-∅ executable rate +n/a ', text)
  # The most frequent wrong prediction of a class and its share; none for ∅.
  assert any(l.split() == ['Add', '0.62', '0.12', '∅', '0.25'] for l in text.splitlines())
  assert any(l.split() == ['∅', '1.00', '1.00'] for l in text.splitlines())
  # Unparseable text is named as the operation mixes name it.
  assert any(l.split() == ['Update', '0.00', '0.00', 'Unparseable', '0.75']
             for l in text.splitlines())
  assert any(l.split() == ['Filter', '0.75', '0.75', '∅', '0.12'] for l in text.splitlines())
  assert 'Delete' not in text  # classes without a figure are left out
