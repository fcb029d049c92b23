"""RL phase trainer (vermem_jax/train/rl_phase.py): learner math, SIGKILL resume,
corrupt-checkpoint fallback and the θ = θ_old = θ_ref identity through the pipeline.

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

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_curriculum_e2e import curriculum_workdir  # pylint: disable=g-bad-import-order
from test_curriculum_e2e import override_flags
from test_curriculum_e2e import tiny_config
from vermem_jax.models import qwen
from vermem_jax.rl import batching
from vermem_jax.train import checkpoints
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import rl_phase

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_UPDATES = 2
SUBPROCESS_TIMEOUT_S = 600


# ----------------------------------------------------------------------------- units
def _tiny_model():
  config = qwen.QwenConfig()
  return config, qwen.init_params(config, jax.random.PRNGKey(0))


def _decisions(rng, n, advantages, command_lengths):
  out = []
  for i in range(n):
    p = int(rng.integers(12, 40))
    c = int(command_lengths[i])
    out.append(batching.DecisionTokens(
        prompt_tokens=tuple(int(x) for x in rng.integers(0, 151000, p)),
        command_tokens=tuple(int(x) for x in rng.integers(0, 151000, c)),
        # Arbitrary sampler numbers: the learner recomputes θ_old's (module docstring).
        old_logprobs=tuple(float(x) for x in rng.uniform(-12, -1, c)),
        advantage=float(advantages[i])))
  return out


def test_learner_update_loss_is_minus_mean_advantage_at_theta_ref():
  """θ = θ_old = θ_ref: ρ = 1 and KL = 0, so loss = −(1/N) Σ_d A_d exactly per decision
  (commands of different lengths weigh the same, SPEC §6)."""
  mc, params = _tiny_model()
  rng = np.random.default_rng(0)
  adv = np.array([1.5, -0.5, 2.0, -3.0, 0.25])
  lengths = [1, 7, 3, 8, 2]
  decisions = _decisions(rng, 5, adv, lengths)
  bcfg = batching.BatchingConfig(micro_batch_size=2, length_buckets=(64,),
                                 command_buckets=(8,))
  opt = rl_phase.RLOptimizerConfig(learning_rate=1e-3)
  new_params, _, m = rl_phase.learner_update(
      params, params, rl_phase.make_optimizer(opt).init(params), decisions,
      model_config=mc, batching_config=bcfg, loss=rl_phase.LossConfig(), opt=opt,
      pad_id=0)
  assert m['train/loss'] == pytest.approx(-adv.mean(), abs=1e-5)
  # A per-token mean would give −Σ L_d A_d / Σ L_d instead.
  assert abs(-(adv * lengths).sum() / sum(lengths) - (-adv.mean())) > 0.1
  assert abs(m['train/kl']) < 1e-6
  assert m['train/ratio'] == pytest.approx(1.0, abs=1e-5)
  assert m['train/clip_fraction'] == 0.0
  assert m['train/num_decisions'] == 5 and m['train/num_micro_batches'] == 3
  assert m['train/grad_norm'] > 0
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                     jax.tree.leaves(new_params))]
  assert any(moved)


def test_sampler_logprobs_mode_uses_the_recorded_numbers():
  """rl.old_logprobs='sampler': ρ = π_θ / exp(recorded); recorded = learner log-prob +
  log 0.95 (a top-p renormalization) gives ρ = 1/0.95 on every token."""
  mc, params = _tiny_model()
  rng = np.random.default_rng(2)
  base = _decisions(rng, 3, [1.0, -2.0, 0.5], [2, 4, 3])
  bcfg = batching.BatchingConfig(micro_batch_size=4, length_buckets=(64,),
                                 command_buckets=(8,))
  batch = batching.to_step_batch(batching.micro_batches(base, bcfg)[0])
  from vermem_jax.rl import grpo  # pylint: disable=g-import-not-at-top
  lp = np.asarray(grpo.policy_logprobs(params, batch, model_config=mc, temperature=0.7))
  shifted = []
  for i, d in enumerate(base):
    row = int(np.flatnonzero(batch['command_ids'][:, 0] == i + 1)[0])
    recorded = lp[row, :len(d.command_tokens)] + np.log(0.95)
    shifted.append(batching.DecisionTokens(d.prompt_tokens, d.command_tokens,
                                           tuple(float(x) for x in recorded),
                                           d.advantage))
  opt = rl_phase.RLOptimizerConfig()
  _, _, m = rl_phase.learner_update(
      params, params, rl_phase.make_optimizer(opt).init(params), shifted,
      model_config=mc, batching_config=bcfg,
      loss=rl_phase.LossConfig(old_logprobs='sampler'), opt=opt, pad_id=0)
  assert m['train/ratio'] == pytest.approx(1 / 0.95, rel=1e-4)
  assert m['train/sampler_logprob_gap'] == pytest.approx(-np.log(0.95), abs=1e-4)
  # min(ρA, clip(ρ)A) with ρ = 1/0.95 < 1 + ε: the loss is −mean(ρ A).
  assert m['train/loss'] == pytest.approx(-np.mean([1.0, -2.0, 0.5]) / 0.95, rel=1e-4)
  with pytest.raises(ValueError, match='old_logprobs'):
    rl_phase.LossConfig(old_logprobs='bogus')


def test_learner_update_is_independent_of_the_micro_batch_split():
  """Sums over micro-batches divided once by N: 1 x 5 rows == 3 batches of <= 2."""
  mc, params = _tiny_model()
  ref = jax.tree.map(lambda x: x + 0.01 * jnp.sign(x), params)  # θ_ref != θ: KL > 0
  rng = np.random.default_rng(1)
  decisions = _decisions(rng, 5, rng.normal(size=5), [2, 5, 1, 6, 3])
  opt = rl_phase.RLOptimizerConfig(learning_rate=1e-3)
  outs = []
  for mb in (8, 2):
    bcfg = batching.BatchingConfig(micro_batch_size=mb, length_buckets=(64,),
                                   command_buckets=(8,))
    outs.append(rl_phase.learner_update(
        params, ref, rl_phase.make_optimizer(opt).init(params), decisions,
        model_config=mc, batching_config=bcfg, loss=rl_phase.LossConfig(), opt=opt,
        pad_id=0))
  (p1, _, m1), (p2, _, m2) = outs
  assert m1['train/kl'] > 1e-6
  assert m1['train/loss'] == pytest.approx(m2['train/loss'], rel=1e-5)
  assert m1['train/grad_norm'] == pytest.approx(m2['train/grad_norm'], rel=1e-4)
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_params_fingerprint_detects_one_changed_bit():
  tree = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 'b': {'c': np.ones(4)}}
  same = jax.tree.map(np.copy, tree)
  assert rl_phase.params_fingerprint(tree) == rl_phase.params_fingerprint(same)
  flipped = jax.tree.map(np.copy, tree)
  flipped['a'].view(np.uint32)[1, 2] ^= 1
  assert rl_phase.params_fingerprint(tree) != rl_phase.params_fingerprint(flipped)
  reshaped = {'a': tree['a'].reshape(3, 2), 'b': tree['b']}
  assert rl_phase.params_fingerprint(tree) != rl_phase.params_fingerprint(reshaped)


def test_learner_buckets_cover_the_longest_row():
  bcfg = batching.BatchingConfig(length_buckets=(256, 512), command_buckets=(16,))
  out = rl_phase.learner_batching_config(bcfg, policy_input_limit=512,
                                         prompt_overhead=30, max_command_tokens=16)
  assert out.length_buckets == (256, 512, 558)
  same = rl_phase.learner_batching_config(out, policy_input_limit=512,
                                          prompt_overhead=30, max_command_tokens=16)
  assert same is out


def test_bad_configs_are_named(tmp_path):
  with pytest.raises(ValueError, match='config.phase'):
    rl_phase.run_rl_phase(tiny_config('sft'), str(tmp_path))
  config = tiny_config('phase_b')
  config.rl.entropy_coef = 0.01
  with pytest.raises(ValueError, match='entropy_coef'):
    rl_phase.run_rl_phase(config, str(tmp_path))
  # No Phase A checkpoint in this workdir: π_ref cannot be loaded.
  with pytest.raises(checkpoints.CheckpointError, match='phase_a'):
    rl_phase.run_rl_phase(tiny_config('phase_b'), str(tmp_path))


# ----------------------------------------------------------------------------- runs
def _copy_prerequisites(dest):
  src = curriculum_workdir()
  for phase in ('sft', 'phase_a'):
    shutil.copytree(os.path.join(src, phase), os.path.join(dest, phase))
  return str(dest)


def _b_config():
  return tiny_config('phase_b', **{'rl.num_updates': NUM_UPDATES})


def _committed(phase_dir, step):
  return os.path.exists(os.path.join(phase_dir, str(step), '_CHECKPOINT_METADATA'))


def _leaves(phase_dir, step):
  with checkpoints.PhaseCheckpointManager(phase_dir) as mgr:
    state = mgr.restore(step=step)
  return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def _strip_times(rows):
  return [{k: v for k, v in r.items() if k != 'time' and not k.startswith('time/')}
          for r in rows]


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
         + override_flags(**{'rl.num_updates': NUM_UPDATES}))
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
  # The logs match the uninterrupted run row for row (except wall-clock fields).
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
  assert abs(first['train/kl']) < 1e-6
  assert first['train/ratio'] == pytest.approx(1.0, abs=1e-5)
  assert first['train/loss'] == pytest.approx(-np.mean(adv), abs=1e-5)
  ref = json.load(open(os.path.join(phase_dir, rl_phase.REFERENCE_FILE)))
  assert ref['params_sha256'] == ref['initial_params_sha256']
