"""RL phase trainer (vermem_jax/train/rl_phase.py): named config errors, SIGKILL
resume, corrupt-checkpoint fallback and the θ = θ_old = θ_ref identity through the
pipeline (the learner math is in tests/test_rl_learner.py).

The Phase B runs start from the SFT and Phase A checkpoints of the tiny curriculum of
tests/test_curriculum_e2e.py (run once per pytest process).
"""
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float_tolerance  # tests/ helper  # pylint: disable=g-bad-import-order
from test_curriculum_e2e import curriculum_workdir  # pylint: disable=g-bad-import-order
from test_curriculum_e2e import override_flags
from test_curriculum_e2e import tiny_config
from vermem_jax.rl import loss_step
from vermem_jax.train import checkpoint_values
from vermem_jax.train import checkpoints
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import rl_learner
from vermem_jax.train import rl_phase
from vermem_jax.train import rl_resume

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_UPDATES = 2
SUBPROCESS_TIMEOUT_S = 600


# ----------------------------------------------------------------------------- units
def test_bad_configs_are_named(tmp_path):
  with pytest.raises(ValueError, match='config.phase'):
    rl_phase.run_rl_phase(tiny_config('sft'), str(tmp_path))
  config = tiny_config('phase_b')
  config.rl.entropy_coef = 0.01
  with pytest.raises(ValueError, match='entropy_coef'):
    rl_phase.run_rl_phase(config, str(tmp_path))
  # No Phase A checkpoint in this workdir: π_ref cannot be loaded.
  with pytest.raises(checkpoint_values.CheckpointError, match='phase_a'):
    rl_phase.run_rl_phase(tiny_config('phase_b'), str(tmp_path))


def test_dev_batch_is_the_rollout_batch_or_fewer():
  run = types.SimpleNamespace(rl=types.SimpleNamespace(
      rollout=types.SimpleNamespace(num_rollouts=64)))
  # 800 dev episodes (paper): chunks of 64; 8 (tiny): one call of 8 rows, not 64.
  assert rl_phase.dev_batch(run, 800) == 64
  assert rl_phase.dev_batch(run, 8) == 8


# ----------------------------------------------------------------------------- runs
def _copy_prerequisites(dest):
  src = curriculum_workdir()
  for phase in ('sft', 'phase_a'):
    shutil.copytree(os.path.join(src, phase), os.path.join(dest, phase))
  return str(dest)


# Every update's checkpoint is kept (the tiny default keeps the newest one and the best):
# the resume tests compare both steps with the uninterrupted run's.
B_OVERRIDES = {'rl.num_updates': NUM_UPDATES, 'checkpoint.max_to_keep': NUM_UPDATES}


def _b_config():
  return tiny_config('phase_b', **B_OVERRIDES)


def _committed(phase_dir, step):
  return os.path.exists(os.path.join(phase_dir, str(step), '_CHECKPOINT_METADATA'))


def _leaves(phase_dir, step):
  with checkpoints.PhaseCheckpointManager(phase_dir) as mgr:
    state = mgr.restore(step=step)
  return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def _strip_times(rows):
  """Rows without wall-clock fields and compile counts (which depend on what the
  process compiled before: train/compilation.py)."""
  return [{k: v for k, v in r.items()
           if k != 'time' and not k.startswith(('time/', 'compile/'))} for r in rows]


@pytest.fixture(scope='module')
def clean_run(tmp_path_factory):
  """An uninterrupted 2-update Phase B run (in-process)."""
  workdir = _copy_prerequisites(tmp_path_factory.mktemp('clean'))
  out = rl_phase.run_rl_phase(_b_config(), workdir)
  return workdir, out


def test_sigkill_mid_update_then_resume_is_bit_identical(tmp_path, clean_run):
  clean_dir, clean_out = clean_run
  workdir = _copy_prerequisites(tmp_path / 'killed')
  phase_dir = os.path.join(workdir, 'phase_b')
  cmd = ([sys.executable, os.path.join(REPO, 'experiments', 'run.py'),
          '--config=phase_b.py', f'--workdir={workdir}']
         + override_flags(**B_OVERRIDES))
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  log_path = tmp_path / 'killed.log'
  with open(log_path, 'w') as log:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + SUBPROCESS_TIMEOUT_S
    try:
      while not _committed(phase_dir, 1):
        if proc.poll() is not None:
          pytest.fail(f'run.py exited ({proc.returncode}) before its first checkpoint:\n'
                      + log_path.read_text()[-3000:])
        if time.time() > deadline:
          pytest.fail('no Phase B checkpoint within the timeout')
        time.sleep(0.05)
      # Update 2 takes seconds; kill while it is being collected.
      time.sleep(0.5)
      proc.send_signal(signal.SIGKILL)
      proc.wait(timeout=60)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  assert proc.returncode == -signal.SIGKILL
  assert not _committed(phase_dir, 2), 'the run finished before it was killed'
  assert not os.path.exists(os.path.join(phase_dir, checkpoints.COMPLETE_MARKER))

  out = rl_phase.run_rl_phase(_b_config(), workdir)
  assert out['resumed_from'] == 1 and out['step'] == NUM_UPDATES and out['complete']
  assert out['params_sha256'] == clean_out['params_sha256']
  clean_phase = os.path.join(clean_dir, 'phase_b')
  for step in (1, NUM_UPDATES):
    resumed, clean = _leaves(phase_dir, step), _leaves(clean_phase, step)
    assert len(resumed) == len(clean)
    for a, b in zip(resumed, clean):
      assert a.dtype == b.dtype and a.shape == b.shape
      assert a.tobytes() == b.tobytes()
  # The logs match the uninterrupted run row for row (except wall-clock fields and
  # compile counts).
  for name in (metrics_lib.METRICS_FILE, metrics_lib.ADVANTAGES_FILE):
    got = metrics_lib.read_jsonl(os.path.join(phase_dir, name))
    want = metrics_lib.read_jsonl(os.path.join(clean_phase, name))
    assert _strip_times(got) == _strip_times(want), name


# Orbax's reader coroutines of the truncated file are garbage-collected with their error.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_corrupt_latest_checkpoint_falls_back_and_loses_nothing(tmp_path, clean_run,
                                                                 caplog):
  clean_dir, clean_out = clean_run
  workdir = str(tmp_path / 'corrupt')
  shutil.copytree(clean_dir, workdir)
  phase_dir = os.path.join(workdir, 'phase_b')
  step1_before = _leaves(phase_dir, 1)
  # Truncate the largest array file of the newest step.
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(phase_dir,
                                                                    str(NUM_UPDATES),
                                                                    'params'))
           for f in fs]
  victim = max(files, key=os.path.getsize)
  size = os.path.getsize(victim)
  with open(victim, 'r+b') as f:
    f.truncate(size // 2)

  caplog.set_level(logging.WARNING)
  out = rl_phase.run_rl_phase(_b_config(), workdir)
  messages = '\n'.join(r.getMessage() for r in caplog.records)
  assert f'newest checkpoint (step {NUM_UPDATES}) cannot be restored' in messages
  assert 'resuming from step 1' in messages
  assert out['resumed_from'] == 1 and out['step'] == NUM_UPDATES
  # Redoing update 2 from step 1 reproduces the lost checkpoint exactly.
  assert out['params_sha256'] == clean_out['params_sha256']
  # Nothing saved is lost: step 1 is intact, the corrupt step was moved aside (with
  # its truncated file), and a new step 2 exists.
  for a, b in zip(_leaves(phase_dir, 1), step1_before):
    assert a.tobytes() == b.tobytes()
  moved = os.listdir(os.path.join(phase_dir, checkpoints.UNRESTORABLE_DIR))
  assert len(moved) == 1 and moved[0].startswith(f'{NUM_UPDATES}-')
  moved_files = [os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(
      os.path.join(phase_dir, checkpoints.UNRESTORABLE_DIR, moved[0])) for f in fs]
  assert size // 2 in moved_files
  assert _committed(phase_dir, NUM_UPDATES)
  rows = metrics_lib.read_jsonl(os.path.join(phase_dir, metrics_lib.METRICS_FILE))
  assert [r['step'] for r in rows] == [1, 2]
  gc.collect()  # collect the failed reads here, under the filter above


def test_first_update_at_theta_ref_reports_zero_kl_and_minus_mean_advantage(clean_run):
  """Through the real pipeline: update 1 starts at θ = θ_old = θ_ref (= θ_A)."""
  clean_dir, _ = clean_run
  phase_dir = os.path.join(clean_dir, 'phase_b')
  rows = metrics_lib.read_jsonl(os.path.join(phase_dir, metrics_lib.METRICS_FILE))
  adv = [r['A_hier'] for r in metrics_lib.read_jsonl(
      os.path.join(phase_dir, metrics_lib.ADVANTAGES_FILE)) if r['update'] == 1]
  first = rows[0]
  assert first['step'] == 1
  assert len(adv) == first['train/num_decisions'] > 0
  # bf16 compute (tiny default): the policy and reference forwards of the same
  # parameters differ by bf16 rounding only: measured 2.5e-6 to 1.3e-5 in the default's
  # phases (learning_curve.py, seed 42) and 1.0e-4 in this shrunk config; a wrong
  # reference or a moved θ reads 4.5e-3 and more.
  assert abs(first['train/kl']) < 1e-3
  assert first['train/ratio'] == pytest.approx(1.0, abs=1e-5)
  # Loss = −mean A + β_KL·KL at ratio 1 (β_KL·KL is ~1e-5 of bf16 noise here). Each
  # decision's term is its tokens' mean of ρ_t A_d, so bf16's |ρ_t − 1| moves it by at
  # most that times |A_d|, plus float32 sums over the decisions' command tokens.
  config = tiny_config('phase_b')
  mean_abs_adv = float(np.mean(np.abs(adv)))
  rho_dev = max(first['train/ratio_max'] - 1, 1 - first['train/ratio_min'])
  assert rho_dev < 1e-3  # a wrong reference or a moved θ reads far more
  n_terms = first['train/num_decisions'] * config.sampling.max_command_tokens
  tol = rho_dev * mean_abs_adv + float_tolerance.reassociation_atol(n_terms, mean_abs_adv)
  assert first['train/loss'] == pytest.approx(
      -np.mean(adv) + config.rl.kl_beta * first['train/kl'], abs=tol)
  ref = json.load(open(os.path.join(phase_dir, rl_resume.REFERENCE_FILE)))
  assert ref['params_sha256'] == ref['initial_params_sha256']


def test_nan_gradient_skips_one_update_and_the_run_continues(tmp_path, monkeypatch):
  workdir = _copy_prerequisites(tmp_path)
  real_update, real_step = rl_learner.learner_update, loss_step.grpo_loss_and_grads
  updates = []

  def learner_update(*args, **kwargs):
    updates.append(kwargs['label'])
    return real_update(*args, **kwargs)

  def grpo_step(*args, **kwargs):  # NaN in one gradient entry during update 1
    out, grads = real_step(*args, **kwargs)
    if len(updates) == 1:
      grads = jax.tree.map(lambda g: g.at[(0,) * g.ndim].set(jnp.nan), grads)
    return out, grads

  monkeypatch.setattr(rl_learner, 'learner_update', learner_update)
  monkeypatch.setattr(loss_step, 'grpo_loss_and_grads', grpo_step)
  out = rl_phase.run_rl_phase(_b_config(), workdir)
  assert out['complete'] and out['step'] == 2
  assert updates == ['phase_b update 1', 'phase_b update 2']
  phase_dir = os.path.join(workdir, 'phase_b')
  rows = metrics_lib.read_jsonl(os.path.join(phase_dir, metrics_lib.METRICS_FILE))
  assert [r['train/skipped_steps'] for r in rows] == [1.0, 0.0]
  assert [r['train/skipped_steps_total'] for r in rows] == [1.0, 1.0]
  # Update 1 not applied: its checkpoint holds θ_0 = θ_A exactly; update 2 was applied.
  ref = rl_resume.read_reference(phase_dir)
  with checkpoints.PhaseCheckpointManager(phase_dir) as mgr:
    p1, p2 = mgr.restore(step=1).params, mgr.restore(step=2).params
    assert mgr.read_meta(2)['metadata']['skipped_steps'] == 1
  assert rl_resume.params_fingerprint(p1) == ref['initial_params_sha256']
  assert rl_resume.params_fingerprint(p2) != ref['initial_params_sha256']
  assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(p2))


def test_dev_scores_are_logged_and_select_a_checkpoint(clean_run):
  """Every update of the tiny run is scored greedily on internal dev (rl.eval_every=1
  at the tiny scale); the selection is a scored step."""
  clean_dir, out = clean_run
  rows = metrics_lib.read_jsonl(os.path.join(clean_dir, 'phase_b',
                                             metrics_lib.METRICS_FILE))
  assert all('dev/score' in r and r['dev/score'] == r['dev/r_task'] for r in rows)
  assert all(0.0 <= r['dev/score'] <= 1.0 and r['dev/episodes'] > 0 for r in rows)
  best = max(rows, key=lambda r: (r['dev/score'], r['step']))
  assert out['selected_step'] == best['step']


def test_selection_picks_best_dev_score_ties_to_later(tmp_path, monkeypatch):
  """Scripted dev scores 0.9, 0.9, 0.2: the selected checkpoint is step 2 (best, ties
  to the later step), not the newest; the next phase's π_ref loads it. A run stopped
  after update 2 and resumed selects, and summarizes, the same update."""
  from vermem_jax.train import rl_selection
  # The uninterrupted run's three updates, then the stopped run's two and its resume's one.
  scores = iter([0.9, 0.9, 0.2, 0.9, 0.9, 0.2])

  def fake_selection_figures(records, metric):
    assert metric == 'r_task'
    return {'dev/score': next(scores), 'dev/invalid_rate': 0.25,
            'dev/episodes': float(len(records))}

  workdir = _copy_prerequisites(tmp_path / 'select')  # may run the curriculum: first
  monkeypatch.setattr(rl_selection, 'selection_figures', fake_selection_figures)
  config = tiny_config('phase_b', **{'rl.num_updates': 3, 'rl.eval_every': 1,
                                     'rl.internal_dev_episodes': 2})
  out = rl_phase.run_rl_phase(config, workdir)
  assert out['selected_step'] == 2 and out['step'] == 3
  # The summary's end column is the selected update's, read from the records its
  # selection scored (same dev episodes), not the last update's.
  assert out['internal_dev/end/step'] == 2
  phase_dir = os.path.join(workdir, 'phase_b')
  with checkpoints.PhaseCheckpointManager(phase_dir) as mgr:
    assert mgr.best_step() == 2 and 2 in mgr.all_steps()
  _, step = checkpoints.restore_params_only(phase_dir, prefer_best=True)
  assert step == 2  # what Phase C starts from and regularizes towards
  again = rl_phase.run_rl_phase(config, workdir)
  assert again['selected_step'] == 2  # a finished phase reports its selection

  stopped = _copy_prerequisites(tmp_path / 'stopped')
  rl_phase.run_rl_phase(config, stopped, stop_after_update=2)
  resumed = rl_phase.run_rl_phase(config, stopped)
  assert resumed['resumed_from'] == 2 and resumed['selected_step'] == 2
  # Update 2 was scored before the restart: its parameters are read back and the
  # summary's dev episodes rerun, giving the uninterrupted run's figures.
  end = {k: v for k, v in out.items() if k.startswith('internal_dev/end/')}
  assert end['internal_dev/end/step'] == 2 and len(end) > 5
  assert {k: resumed[k] for k in end} == end
