"""Tests for vermem_jax.train.metrics (JSONL log, TensorBoard events, advantage table)."""
import glob
import os
import struct

import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from vermem_jax.train import metrics as mt


def _read_events(path):
  """Independent TFRecord reader: [u64 len][u32 crc][data][u32 crc] records -> Events."""
  out = []
  with open(path, 'rb') as f:
    data = f.read()
  i = 0
  while i < len(data):
    (n,) = struct.unpack('<Q', data[i:i + 8])
    ev = event_pb2.Event()
    ev.ParseFromString(data[i + 12:i + 12 + n])
    out.append(ev)
    i += 12 + n + 4
  return out


def _scalars(d, tag):
  """(step, value) of `tag` over all event files, applying TensorBoard's purge rule:
  a SessionLog START at step s discards earlier-written events with step >= s."""
  seen = []
  for path in sorted(glob.glob(os.path.join(d, 'events.out.tfevents.*'))):
    for ev in _read_events(path):
      if ev.HasField('session_log') and ev.session_log.status == ev.session_log.START:
        seen = [(s, v) for s, v in seen if s < ev.step]
      for v in ev.summary.value:
        if v.tag == tag:
          seen.append((ev.step, v.simple_value))
  return seen


def _row(update, task=0, rollout=0, step=0, op='Add', accepted=True, a_hier=0.5):
  return dict(update=update, task=task, rollout=rollout, step=step, operation=op,
              accepted=accepted, violations=[] if accepted else ['missing_id'],
              cost=0.0 if accepted else 0.5, r_local=0.75 if accepted else None,
              A_local=np.float32(0.25) if accepted else 0.0, A_global=-0.5,
              A_hier=a_hier, command_tokens=np.int64(12))


def test_jsonl_and_tensorboard(tmp_path):
  d = tmp_path / 'phase_b'
  with mt.MetricsWriter(d) as w:
    w.write(1, {'loss': 0.5, 'kl': np.float32(0.125)})
    # Flushed at once: readable while the writer is open.
    assert [r['loss'] for r in mt.read_jsonl(d / mt.METRICS_FILE)] == [0.5]
    w.write(2, {'loss': 0.25, 'kl': 0.0625})
  rows = mt.read_jsonl(d / mt.METRICS_FILE)
  assert [(r['step'], r['loss'], r['kl']) for r in rows] == [(1, 0.5, 0.125),
                                                             (2, 0.25, 0.0625)]
  assert _scalars(d, 'loss') == [(1, 0.5), (2, 0.25)]
  assert _scalars(d, 'kl') == [(1, 0.125), (2, 0.0625)]


def test_write_rejects_non_numbers(tmp_path):
  with mt.MetricsWriter(tmp_path, tensorboard=False) as w:
    with pytest.raises(ValueError, match="metric 'op'"):
      w.write(1, {'op': 'Add'})
    with pytest.raises(ValueError, match='reserved'):
      w.write(1, {'step': 3})


def test_resume_drops_rows_after_restored_step(tmp_path):
  d = tmp_path / 'phase_a'
  with mt.MetricsWriter(d, tensorboard=False) as w:
    for s in range(1, 6):
      w.write(s, {'loss': float(s)})
  # Killed mid-write: a torn last line.
  with open(d / mt.METRICS_FILE, 'a') as f:
    f.write('{"step": 6, "lo')
  with mt.MetricsWriter(d, resume_step=3, tensorboard=False) as w:
    w.write(4, {'loss': 40.0})
  rows = mt.read_jsonl(d / mt.METRICS_FILE)
  assert [(r['step'], r['loss']) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
  # resume_step=None appends as is.
  with mt.MetricsWriter(d, tensorboard=False) as w:
    w.write(5, {'loss': 50.0})
  assert [r['step'] for r in mt.read_jsonl(d / mt.METRICS_FILE)] == [1, 2, 3, 4, 5]


def test_tensorboard_purges_stale_steps_on_resume(tmp_path):
  d = tmp_path / 'phase_c'
  with mt.MetricsWriter(d) as w:
    for s in range(1, 5):
      w.write(s, {'loss': float(s)})
  with mt.MetricsWriter(d, resume_step=2) as w:
    w.write(3, {'loss': 30.0})
  assert _scalars(d, 'loss') == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_advantage_table_rows_and_resume(tmp_path):
  d = tmp_path / 'phase_b'
  with mt.AdvantageTable(d, 'phase_b') as t:
    assert t.add_rows([_row(1, step=0), _row(1, step=1, op='Delete', accepted=False)]) == 2
    t.add_rows([_row(2), _row(3, a_hier=-1.0)])
  rows = mt.read_jsonl(d / mt.ADVANTAGES_FILE)
  assert [tuple(r) for r in rows] == [mt.ADVANTAGE_COLUMNS] * 4
  assert rows[1] == {'phase': 'phase_b', 'update': 1, 'task': 0, 'rollout': 0, 'step': 1,
                     'operation': 'Delete', 'accepted': False,
                     'violations': ['missing_id'], 'cost': 0.5, 'r_local': None,
                     'A_local': 0.0, 'A_global': -0.5, 'A_hier': 0.5,
                     'command_tokens': 12}
  assert rows[0]['A_local'] == 0.25 and rows[0]['r_local'] == 0.75
  # The run is restored at checkpoint step 2: update 3 will be redone, so its rows go.
  with mt.AdvantageTable(d, 'phase_b', resume_update=2) as t:
    t.add_rows([_row(3, a_hier=2.0)])
  rows = mt.read_jsonl(d / mt.ADVANTAGES_FILE)
  assert [(r['update'], r['A_hier']) for r in rows] == [(1, 0.5), (1, 0.5), (2, 0.5),
                                                        (3, 2.0)]
  # Fresh start (no checkpoint): every earlier row is dropped.
  with mt.AdvantageTable(d, 'phase_b', resume_update=0):
    pass
  assert mt.read_jsonl(d / mt.ADVANTAGES_FILE) == []


def test_advantage_table_validates(tmp_path):
  with mt.AdvantageTable(tmp_path, 'phase_a') as t:
    bad = _row(1)
    del bad['A_global']
    with pytest.raises(ValueError, match=r"missing columns \['A_global'\]"):
      t.add_rows([bad])
    with pytest.raises(ValueError, match=r"unknown \['extra'\]"):
      t.add_rows([{**_row(1), 'extra': 1}])
    with pytest.raises(ValueError, match='update'):
      t.add_rows([{**_row(1), 'update': 1.5}])
    with pytest.raises(ValueError, match='A_hier'):
      t.add_rows([{**_row(1), 'A_hier': 'x'}])
  assert mt.read_jsonl(os.path.join(tmp_path, mt.ADVANTAGES_FILE)) == []


def test_read_jsonl_rejects_corrupt_middle_line(tmp_path):
  p = tmp_path / 'x.jsonl'
  p.write_text('{"a": 1}\n{oops\n{"a": 2}\n')
  with pytest.raises(ValueError, match=r'x.jsonl:2'):
    mt.read_jsonl(p)


def test_summarize_rows():
  rows = [_row(1, op='Add', a_hier=1.0), _row(1, op='Add', accepted=False, a_hier=-1.0),
          _row(1, op='Null', a_hier=0.0)]
  for r in rows:
    r['A_local'] = float(r['A_local'])
  s = mt.summarize_rows(rows)
  assert s['Add'] == {'count': 2.0, 'rejected_share': 0.5, 'A_local_mean': 0.125,
                      'A_global_mean': -0.5, 'A_hier_mean': 0.0}
  assert s['Null']['count'] == 1.0


def test_progress_bar_resumes_with_eta():
  bar = mt.progress_bar(10, initial=4, desc='phase_b', disable=False)
  try:
    bar.update(1)
    assert bar.n == 5 and bar.total == 10
    assert 'ETA' in bar.bar_format
  finally:
    bar.close()


def _fake_phase(phase_dir, total_updates, *, kill_after=None):
  """A deterministic stand-in for an RL phase loop using checkpoints + metric files.

  Saves a checkpoint every 2 updates; `kill_after=u` stops right after update u's rows
  were written (before any later checkpoint), like a SIGKILL.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import checkpoints as ck  # pylint: disable=g-import-not-at-top
  mgr = ck.PhaseCheckpointManager(phase_dir, max_to_keep=2)
  template = ck.TrainState(step=0, params={'w': jnp.zeros((3,), jnp.float32)},
                           data_position={'next_task': 0})
  state = mgr.restore(template) or template
  start = state.step
  with mt.MetricsWriter(phase_dir, resume_step=start) as log, \
       mt.AdvantageTable(phase_dir, 'phase_b', resume_update=start) as table:
    params = state.params
    for update in range(start + 1, total_updates + 1):
      params = {'w': params['w'] + update}
      log.write(update, {'loss': float(params['w'][0])})
      table.add_rows([_row(update, rollout=k, a_hier=float(update * k)) for k in range(2)])
      if update % 2 == 0:
        mgr.save(ck.TrainState(step=update, params=params,
                               data_position={'next_task': 2 * update}))
      if update == kill_after:
        mgr.close()
        return
  mgr.close()


def test_resumed_run_files_match_uninterrupted_run(tmp_path):
  _fake_phase(str(tmp_path / 'straight'), 6)
  _fake_phase(str(tmp_path / 'resumed'), 6, kill_after=5)  # last checkpoint: update 4
  assert max(r['update'] for r in mt.read_jsonl(
      tmp_path / 'resumed' / mt.ADVANTAGES_FILE)) == 5
  _fake_phase(str(tmp_path / 'resumed'), 6)
  for name in (mt.METRICS_FILE, mt.ADVANTAGES_FILE):
    a = mt.read_jsonl(tmp_path / 'straight' / name)
    b = mt.read_jsonl(tmp_path / 'resumed' / name)
    for r in a + b:
      r.pop('time', None)
    assert a == b, name
  assert _scalars(tmp_path / 'resumed', 'loss') == _scalars(tmp_path / 'straight', 'loss')


@pytest.mark.parametrize('bad_line, match', [
    ('{oops', r'metrics.jsonl:2: not valid JSON .*fix or delete that line'),
    ('[1, 2]', r'row 2 \(\[1, 2\]\) is not a JSON object'),
    ('{"step": "3", "loss": 1.0}', r"row 2 .* has step='3', not an integer"),
])
def test_resume_with_corrupt_metrics_line_raises_and_keeps_file(tmp_path, bad_line, match):
  """A hand-edited / corrupted metrics.jsonl: resuming names the line and rewrites
  nothing (the atomic rewrite happens only after every row checked out)."""
  path = tmp_path / mt.METRICS_FILE
  content = f'{{"step": 1, "time": 0.0, "loss": 2.0}}\n{bad_line}\n' \
            '{"step": 2, "time": 0.0, "loss": 1.5}\n'
  path.write_text(content)
  with pytest.raises(ValueError, match=match):
    mt.MetricsWriter(tmp_path, resume_step=1, tensorboard=False)
  assert path.read_text() == content
  assert not os.path.exists(str(path) + '.tmp')
  adv = tmp_path / mt.ADVANTAGES_FILE
  adv.write_text('{"update": 1}\n' + bad_line.replace('step', 'update') + '\n')
  before = adv.read_text()
  with pytest.raises(ValueError, match='advantages.jsonl'):
    mt.AdvantageTable(tmp_path, 'phase_a', resume_update=1)
  assert adv.read_text() == before
