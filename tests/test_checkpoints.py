"""Tests for vermem_jax.train.checkpoints (Orbax phase checkpoints, fallback, best)."""
import dataclasses
import glob
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vermem_jax.train import checkpoint_values
from vermem_jax.train import checkpoint_selection
from vermem_jax.train import checkpoints as ck
from vermem_jax.train import optim

# Orbax's failed restores of corrupt files can leave an asyncio callback behind.
pytestmark = pytest.mark.filterwarnings(
    'ignore::pytest.PytestUnraisableExceptionWarning')


def _params(seed=0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  return {'layers_0': {'mlp': {'kernel': jax.random.normal(k1, (4, 6), jnp.float32)}},
          'embed_tokens': {'embedding': jax.random.normal(k2, (10, 4)).astype(jnp.bfloat16)},
          'norm': {'scale': jnp.ones((4,), jnp.float32)}}


def _state(step, seed=None, typed_key=False):
  params = _params(step if seed is None else seed)
  tx = optax.adamw(1e-3)
  opt_state = tx.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  _, opt_state = tx.update(grads, opt_state, params)  # non-trivial moments + count
  rng = jax.random.key(step) if typed_key else jax.random.PRNGKey(step)
  return ck.TrainState(
      step=step, params=params, opt_state=opt_state, rng=rng,
      running_stats={'Add': {'mean': np.float32(0.25 + step), 'var': 0.5, 'count': 7},
                     'Null': {'mean': 0.1, 'var': 0.2, 'count': 3}},
      data_position={'epoch': 1, 'index': 10 * step, 'order_seed': 42},
      metadata={'note': f'step {step}', 'loss': 1.0 / (step + 1)})


def _template(typed_key=False):
  return _state(0, typed_key=typed_key)


def _assert_tree_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _corrupt_arrays(step_dir, item='params'):
  """Truncates every stored array chunk of `item` (what a bad disk/copy leaves)."""
  files = [f for f in glob.glob(os.path.join(step_dir, item, '**', 'd', '*'),
                                recursive=True) if os.path.isfile(f)]
  assert files
  for f in files:
    with open(f, 'r+b') as fh:
      fh.truncate(3)


@pytest.mark.parametrize('typed_key', [False, True])
def test_round_trip_exact(tmp_path, typed_key):
  mgr = ck.PhaseCheckpointManager(tmp_path / 'phase_b', max_to_keep=3)
  saved = _state(5, typed_key=typed_key)
  mgr.save(saved)
  mgr.close()
  mgr = ck.PhaseCheckpointManager(tmp_path / 'phase_b', max_to_keep=3)
  assert mgr.latest_step() == 5
  got = mgr.restore(_template(typed_key))
  assert got.step == 5
  _assert_tree_equal(got.params, saved.params)
  _assert_tree_equal(got.opt_state, saved.opt_state)
  # optax NamedTuple types survive (restored into the template structure).
  assert type(got.opt_state[0]) is type(saved.opt_state[0])  # pylint: disable=unidiomatic-typecheck
  if typed_key:
    assert jax.dtypes.issubdtype(got.rng.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(got.rng),
                                  jax.random.key_data(saved.rng))
    np.testing.assert_array_equal(jax.random.uniform(got.rng, (3,)),
                                  jax.random.uniform(saved.rng, (3,)))
  else:
    np.testing.assert_array_equal(got.rng, saved.rng)
  assert got.running_stats == {'Add': {'mean': 5.25, 'var': 0.5, 'count': 7},
                               'Null': {'mean': 0.1, 'var': 0.2, 'count': 3}}
  assert isinstance(got.running_stats['Add']['mean'], np.float32)  # template's type
  assert got.data_position == {'epoch': 1, 'index': 50, 'order_seed': 42}
  assert got.metadata == {'note': 'step 5', 'loss': 1.0 / 6}


def test_restore_without_template_and_params_only(tmp_path):
  d = tmp_path / 'sft'
  with ck.PhaseCheckpointManager(d) as mgr:
    mgr.save(_state(1))
    mgr.save(_state(2))
  params, step = ck.restore_params_only(str(d))
  assert step == 2
  _assert_tree_equal(params, _params(2))
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _params(0))
  params, step = ck.restore_params_only(str(d), abstract)
  _assert_tree_equal(params, _params(2))
  with ck.PhaseCheckpointManager(d) as mgr:
    got = mgr.restore()
  _assert_tree_equal(got.params, _params(2))
  assert got.running_stats['Add']['count'] == 7


def test_keeps_newest_n_and_best(tmp_path):
  d = tmp_path / 'sft'
  acc = {1: 0.2, 2: 0.7, 3: 0.5, 4: 0.7, 5: 0.3, 6: 0.4}
  inv = {1: 0.0, 2: 0.1, 3: 0.0, 4: 0.3, 5: 0.0, 6: 0.0}
  with ck.PhaseCheckpointManager(d, max_to_keep=2) as mgr:
    for s in range(1, 7):
      mgr.save(_state(s), selection_metrics={'tool_accuracy': acc[s], 'invalid_rate': inv[s]})
    # Step 2 and 4 tie on accuracy; 2 has the lower invalid rate (SPEC §4).
    assert mgr.best_step() == 2
    assert mgr.all_steps() == [2, 5, 6]
  # Step 2 is kept as the best step, for its parameters: its optimizer state is gone.
  assert [os.path.isdir(d / str(s) / 'train') for s in (2, 5, 6)] == [False, True, True]
  with ck.PhaseCheckpointManager(d, max_to_keep=2) as mgr:  # reopened: best re-read
    assert mgr.best_step() == 2
    assert mgr.restore(_template()).step == 6
    with pytest.raises(checkpoint_values.CheckpointError, match='parameters only'):
      mgr.restore(_template(), step=2)
    no_opt = dataclasses.replace(_template(), opt_state=None, rng=None)
    with pytest.raises(checkpoint_values.CheckpointError, match='parameters only'):
      mgr.restore(no_opt, step=2)  # its meta still says it had them
  params, step = ck.restore_params_only(str(d))
  assert step == 2
  _assert_tree_equal(params, _params(2))
  params, step = ck.restore_params_only(str(d), prefer_best=False)
  assert step == 6


def test_full_tie_goes_to_the_later_step(tmp_path):
  """Equal tool accuracy and invalid rate: the later (longer trained) step is best, also
  when the manager is reopened and re-reads the steps."""
  d = tmp_path / 'sft'
  with ck.PhaseCheckpointManager(d, max_to_keep=1) as mgr:
    for s in (1, 2, 3):
      mgr.save(_state(s), selection_metrics={'tool_accuracy': 0.5 if s < 3 else 0.25,
                                             'invalid_rate': 0.2})
    assert mgr.best_step() == 2
    assert mgr.all_steps() == [2, 3]
  with ck.PhaseCheckpointManager(d, max_to_keep=1) as mgr:
    assert mgr.best_step() == 2


def test_selection_key():
  assert checkpoint_selection.sft_selection_key({'tool_accuracy': 0.5, 'invalid_rate': 0.1}) > \
      checkpoint_selection.sft_selection_key({'tool_accuracy': 0.5, 'invalid_rate': 0.2})
  assert checkpoint_selection.sft_selection_key({'tool_accuracy': 0.6, 'invalid_rate': 0.9}) > \
      checkpoint_selection.sft_selection_key({'tool_accuracy': 0.5, 'invalid_rate': 0.0})
  with pytest.raises(KeyError, match='invalid_rate'):
    checkpoint_selection.sft_selection_key({'tool_accuracy': 0.5})


def _files(d):
  return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d)
                for f in fs)


@pytest.mark.parametrize('how', ['truncated_arrays', 'garbage_meta', 'missing_item'])
def test_corrupt_latest_falls_back(tmp_path, caplog, how):
  d = tmp_path / 'phase_a'
  with ck.PhaseCheckpointManager(d, max_to_keep=5) as mgr:
    for s in (1, 2, 3):
      mgr.save(_state(s))
  step_dir = os.path.join(d, '3')
  if how == 'truncated_arrays':
    _corrupt_arrays(step_dir)
  elif how == 'garbage_meta':
    with open(os.path.join(step_dir, 'meta', 'metadata'), 'w') as f:
      f.write('{not json')
  else:
    shutil.rmtree(os.path.join(step_dir, 'train'))
  before = _files(d)
  caplog.set_level(logging.WARNING)
  mgr = ck.PhaseCheckpointManager(d, max_to_keep=5)
  got = mgr.restore(_template())
  assert got.step == 2
  _assert_tree_equal(got.params, _params(2))
  msgs = ' '.join(r.getMessage() for r in caplog.records)
  assert 'step 3' in msgs and 'unrestorable' in msgs
  assert _files(d) == before  # restoring deletes nothing
  with pytest.raises(checkpoint_values.CheckpointError, match='step 3'):
    mgr.restore(_template(), step=3)
  # Continuing from step 2 and saving step 3 moves the bad step aside (not deleted).
  mgr.save(_state(3, seed=33))
  moved = glob.glob(os.path.join(d, ck.UNRESTORABLE_DIR, '3-*'))
  assert len(moved) == 1 and os.path.isdir(os.path.join(moved[0], 'params'))
  got = mgr.restore(_template())
  assert got.step == 3
  _assert_tree_equal(got.params, _params(33))
  assert mgr.all_steps() == [1, 2, 3]
  mgr.close()


def test_no_restorable_checkpoint_raises(tmp_path):
  d = tmp_path / 'phase_c'
  with ck.PhaseCheckpointManager(d) as mgr:
    assert mgr.restore(_template()) is None  # fresh directory: nothing to resume
    mgr.save(_state(1))
    mgr.save(_state(2))
  for s in (1, 2):
    _corrupt_arrays(os.path.join(d, str(s)))
  with ck.PhaseCheckpointManager(d) as mgr:
    with pytest.raises(checkpoint_values.CheckpointError, match=r'no restorable checkpoint[\s\S]*step 2'
                       r'[\s\S]*step 1'):
      mgr.restore(_template())
  with pytest.raises(checkpoint_values.CheckpointError, match='no restorable checkpoint'):
    ck.restore_params_only(str(d))
  with pytest.raises(checkpoint_values.CheckpointError, match='no checkpoint directory'):
    ck.restore_params_only(str(tmp_path / 'missing'))


def test_partially_written_step_is_ignored(tmp_path):
  d = tmp_path / 'phase_b'
  with ck.PhaseCheckpointManager(d) as mgr:
    mgr.save(_state(1))
    mgr.save(_state(2))
  # What a save killed before its final rename leaves: a temporary step directory.
  shutil.copytree(os.path.join(d, '2'), os.path.join(d, '3.orbax-checkpoint-tmp-1700000000'))
  # A step directory whose items were never written.
  os.makedirs(os.path.join(d, '4', 'params'))
  with ck.PhaseCheckpointManager(d) as mgr:
    assert 3 not in mgr.all_steps()
    got = mgr.restore(_template())
    assert got.step == 2
    mgr.save(_state(3))  # continues past the partial save
    assert mgr.restore(_template()).step == 3
  assert ck.has_checkpoint(str(d))


def test_save_refuses_old_step_and_bad_json(tmp_path):
  with ck.PhaseCheckpointManager(tmp_path / 'x') as mgr:
    mgr.save(_state(4))
    with pytest.raises(checkpoint_values.CheckpointError, match='step 4 already exists'):
      mgr.save(_state(3))
    bad = _state(5)
    bad.running_stats = {'Add': object()}
    with pytest.raises(checkpoint_values.CheckpointError, match='running_stats.Add'):
      mgr.save(bad)
    assert mgr.all_steps() == [4]


def test_save_refuses_non_finite_params(tmp_path):
  with ck.PhaseCheckpointManager(tmp_path / 'x') as mgr:
    mgr.save(_state(1))
    for bad_value in (jnp.nan, jnp.inf):
      bad = _state(2)
      kernel = bad.params['layers_0']['mlp']['kernel']
      bad.params['layers_0']['mlp']['kernel'] = kernel.at[1, 2].set(bad_value)
      with pytest.raises(checkpoint_values.CheckpointError, match='NaN or Inf'):
        mgr.save(bad)
    assert mgr.all_steps() == [1]
    _assert_tree_equal(mgr.restore(_template()).params, _state(1).params)


def test_template_mismatch_is_an_error_not_a_silent_reshape(tmp_path):
  with ck.PhaseCheckpointManager(tmp_path / 'x') as mgr:
    mgr.save(_state(1))
    t = _template()
    t.params = {'other': jnp.zeros((2,))}
    with pytest.raises(checkpoint_values.CheckpointError):
      mgr.restore(t, step=1)


def test_phase_complete_marker(tmp_path):
  d = str(tmp_path / 'sft')
  os.makedirs(d)
  assert ck.phase_complete_step(d) is None
  ck.mark_phase_complete(d, 24, {'phase': 'sft'})
  assert ck.phase_complete_step(d) == 24
  with open(os.path.join(d, ck.COMPLETE_MARKER), 'w') as f:
    f.write('garbage')
  assert ck.phase_complete_step(d) is None
  assert not ck.has_checkpoint(d)


_KILL_SCRIPT = textwrap.dedent('''
    import os, sys
    os.environ['JAX_PLATFORMS'] = 'cpu'
    import numpy as np
    from vermem_jax.train import checkpoints as ck
    d = sys.argv[1]
    mgr = ck.PhaseCheckpointManager(d)
    big = lambda v: {'w': np.full((4096, 2048), v, np.float32)}  # 32 MiB
    mgr.save(ck.TrainState(step=1, params=big(1.0)))
    mgr.wait_until_finished()  # step 1 committed; later saves run in the background
    print('saved 1', flush=True)
    for s in range(2, 1000):
      mgr.save(ck.TrainState(step=s, params=big(float(s))))
''')


def test_sigkill_mid_save_keeps_previous_step(tmp_path):
  d = str(tmp_path / 'phase_b')
  proc = subprocess.Popen([sys.executable, '-c', _KILL_SCRIPT, d], stdout=subprocess.PIPE,
                          env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert proc.stdout.readline().strip() == b'saved 1'
  deadline = time.time() + 60
  while time.time() < deadline:  # kill while a later step is being written
    if glob.glob(os.path.join(d, '*.orbax-checkpoint-tmp*', '*')):
      break
    time.sleep(0.002)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  with ck.PhaseCheckpointManager(d) as mgr:
    steps = mgr.all_steps()
    got = mgr.restore(ck.TrainState(step=0, params={'w': np.zeros((4096, 2048),
                                                                  np.float32)}))
    assert got is not None and got.step == steps[-1]
    np.testing.assert_array_equal(np.asarray(got.params['w']),
                                  np.full((4096, 2048), float(got.step), np.float32))
    mgr.save(ck.TrainState(step=got.step + 1, params={'w': np.zeros((2, 2), np.float32)}))


def test_other_model_gives_mismatch_hint_and_stray_entries_are_ignored(tmp_path):
  """A phase restored into a different model (changed preset) says so; stray user
  folders/files in the phase directory are neither steps nor touched."""
  d = tmp_path / 'sft'
  with ck.PhaseCheckpointManager(d) as mgr:
    mgr.save(ck.TrainState(step=1, params={'w': jnp.ones((3,))}))
    mgr.save(ck.TrainState(step=2, params={'w': jnp.ones((3,))}))
  os.makedirs(d / 'backup_old' / 'params')
  (d / 'notes.txt').write_text('lr sweep')
  with ck.PhaseCheckpointManager(d) as mgr:
    assert mgr.all_steps() == [1, 2]
  for other in ({'w': jnp.zeros((4,))}, {'v': jnp.zeros((3,))}):
    with pytest.raises(checkpoint_values.CheckpointError, match=r'(?s)step 2: .*step 1: .*written for '
                       r'another model .*Nothing was deleted'):
      ck.restore_params_only(str(d), other)
    with ck.PhaseCheckpointManager(d) as mgr:
      with pytest.raises(checkpoint_values.CheckpointError, match='written for another model'):
        mgr.restore(ck.TrainState(step=0, params=other))
  assert sorted(os.listdir(d)) == ['1', '2', 'backup_old', 'notes.txt']
  params, step = ck.restore_params_only(str(d), {'w': jnp.zeros((3,))})
  assert step == 2 and np.asarray(params['w']).tolist() == [1.0, 1.0, 1.0]
  # A genuinely corrupt step is not described as a model mismatch.
  _corrupt_arrays(os.path.join(d, '2'))
  _corrupt_arrays(os.path.join(d, '1'))
  with pytest.raises(checkpoint_values.CheckpointError) as err:
    ck.restore_params_only(str(d), {'w': jnp.zeros((3,))})
  assert 'another model' not in str(err.value)


def test_async_save_returns_before_commit_and_reads_wait(tmp_path):
  """Saving in the background: queries and restores wait for the commit."""
  state = ck.TrainState(step=1, params={'w': np.arange(6.0).reshape(2, 3)},
                                 running_stats={'Add': {'mean': 0.5}})
  with ck.PhaseCheckpointManager(tmp_path / 'p', async_save=True) as mgr:
    mgr.save(state)
    assert mgr._pending == 1  # pylint: disable=protected-access
    assert mgr.latest_step() == 1  # waited for it
    assert mgr._pending is None  # pylint: disable=protected-access
    mgr.save(dataclasses.replace(state, step=2, params={'w': np.ones((2, 3))}))
    restored = mgr.restore()
  assert restored.step == 2
  np.testing.assert_array_equal(restored.params['w'], np.ones((2, 3)))
  assert restored.running_stats == {'Add': {'mean': 0.5}}
  with ck.PhaseCheckpointManager(tmp_path / 'p', async_save=False) as mgr:
    assert mgr.all_steps() == [1, 2]
    mgr.save(dataclasses.replace(state, step=3))
    assert mgr._pending is None  # pylint: disable=protected-access


def test_rl_selection_prefers_score_then_later_step(tmp_path):
  """RL phases select on the internal-dev score, then the lower invalid rate, ties to
  the later step (paper C.8; the invalid-rate tie-break is ours);
  restore_params_only(prefer_best=True) returns that step for the next phase."""
  key = checkpoint_selection.rl_selection_key
  assert key({'dev_score': 0.5, 'step': 4}) > key({'dev_score': 0.5, 'step': 2})
  # Equal scores: 1 of 12 rejected beats 11 of 12 whatever the step; a higher score
  # beats a lower invalid rate; a checkpoint saved without the rate reads as 0.
  assert key({'dev_score': 0.5, 'dev_invalid_rate': 1 / 12, 'step': 2}) > key(
      {'dev_score': 0.5, 'dev_invalid_rate': 11 / 12, 'step': 3})
  assert key({'dev_score': 0.625, 'dev_invalid_rate': 0.5, 'step': 1}) > key(
      {'dev_score': 0.5, 'dev_invalid_rate': 0.0, 'step': 2})
  assert key({'dev_score': 0.5, 'step': 2}) == (0.5, 0.0, 2)
  assert checkpoint_selection.selection_key({'dev_score': 0.6, 'step': 1}) > checkpoint_selection.selection_key(
      {'dev_score': 0.5, 'step': 9})
  with pytest.raises(KeyError, match='step'):
    checkpoint_selection.rl_selection_key({'dev_score': 0.5})
  d = tmp_path / 'phase_a'
  params = lambda v: {'w': np.full((2,), v, np.float32)}  # noqa: E731
  scores = {1: 0.25, 2: 0.75, 3: 0.5, 4: 0.75, 5: 0.0}
  with ck.PhaseCheckpointManager(d, max_to_keep=1) as mgr:
    for step, score in scores.items():
      mgr.save(ck.TrainState(step=step, params=params(step)),
               selection_metrics={'dev_score': score, 'step': step})
    assert mgr.best_step() == 4 and mgr.latest_step() == 5
    assert mgr.all_steps() == [4, 5]  # the best is kept beside the newest
  with ck.PhaseCheckpointManager(tmp_path / 'phase_b', max_to_keep=1) as mgr:
    for step, invalid in {1: 0.25, 2: 0.0, 3: 0.5}.items():
      mgr.save(ck.TrainState(step=step, params=params(step)),
               selection_metrics={'dev_score': 0.5, 'dev_invalid_rate': invalid,
                                  'step': step})
    assert mgr.best_step() == 2
  restored, step = ck.restore_params_only(str(d), prefer_best=True)
  assert step == 4 and float(restored['w'][0]) == 4.0
  assert ck.PhaseCheckpointManager(d).best_step() == 4  # found again after a restart


def test_optimizer_state_mismatch_names_the_optimizer_not_the_model(tmp_path):
  """An SFT checkpoint written before SFT and RL shared optim.make_optimizer, with a
  constant rate and no warmup, holds a schedule counter the optimizer no longer keeps:
  restoring it fails naming that cause (not 'another model'); the default SFT schedule
  (warmup) restores as before."""
  params = _params()
  old_opt = dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)
  # What SFT built then: the constant rate wrapped in a schedule.
  old_state = optim.clipped_adamw(optax.constant_schedule(1e-3), **old_opt).init(params)
  d = tmp_path / 'sft'
  with ck.PhaseCheckpointManager(d, async_save=False) as mgr:
    mgr.save(ck.TrainState(step=1, params=params, opt_state=old_state,
                           rng=jax.random.PRNGKey(0)))
  edge = optim.OptimizerConfig(learning_rate=1e-3, total_steps=10, warmup_ratio=0.0,
                               lr_schedule='constant', section='sft')
  template = ck.TrainState(step=0, params=params, rng=jax.random.PRNGKey(0),
                           opt_state=optim.make_optimizer(edge).init(params))
  with ck.PhaseCheckpointManager(d) as mgr:
    with pytest.raises(checkpoint_values.CheckpointError) as err:
      mgr.restore(template)
  msg = str(err.value)
  assert checkpoint_values.OPT_STATE_MISMATCH in msg
  assert "sft.lr_schedule='constant'" in msg and 'sft.warmup_ratio=0' in msg
  assert 'another model' not in msg
  assert sorted(os.listdir(d)) == ['1']  # nothing deleted
  # The default SFT setting (a warmup): the state main wrote restores exactly.
  default = optim.OptimizerConfig(learning_rate=1e-3, total_steps=10,
                                  warmup_ratio=0.03, lr_schedule='linear',
                                  section='sft')
  written = optim.clipped_adamw(
      optim.lr_schedule('linear', 1e-3, 10, 0.03), **old_opt).init(params)
  d2 = tmp_path / 'sft2'
  with ck.PhaseCheckpointManager(d2, async_save=False) as mgr:
    mgr.save(ck.TrainState(step=1, params=params, opt_state=written))
  with ck.PhaseCheckpointManager(d2) as mgr:
    got = mgr.restore(ck.TrainState(step=0, params=params,
                                    opt_state=optim.make_optimizer(default).init(params)))
  _assert_tree_equal(got.opt_state, written)
