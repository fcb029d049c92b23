"""Tests of the SFT trainer (vermem_jax/train/sft.py) end to end on the real HotpotQA
samples and the Qwen2.5 tokenizer, with the tiny random Qwen and one learner shape (few
compiles): resume, checkpoint selection and refusal of other settings. The examples,
step and dev metrics have their own test files (test_sft_examples.py, test_sft_step.py,
test_sft_eval.py)."""

import json
import os

import jax
import numpy as np
import pytest

from experiments.configs import common
from experiments.configs.parts import validation
from vermem_jax.train import checkpoints
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import run_setup
from vermem_jax.train import sft
from vermem_jax.train import sft_eval

# Learner shape of run_sft (each one is a compilation): B=4, T=608 (x_i limited to 512
# tokens + chat template), L=32.


def tiny_config():
  c = common.get_config('sft')
  # The Qwen2.5 tokenizer with the Qwen-vocabulary tiny preset (the CPU default is the
  # 4k SentencePiece model; tests/test_tiny_sp_preset.py trains that one).
  c.tokenizer.name = 'qwen2.5'
  c.model.preset = 'tiny'
  c.model.hf_checkpoint = None  # random init of the preset
  c.model.dtype = 'float32'
  c.memory.context_budget = 256
  c.memory.policy_input_limit = 512
  c.sampling.max_command_tokens = 32   # longer targets are dropped (counted)
  c.batching.micro_batch_size = 4
  c.batching.length_buckets = (608,)
  c.batching.command_buckets = (32,)
  c.sft.train_per_target = 1
  c.sft.dev_per_target = 1
  c.sft.batch_size = 4
  c.sft.num_epochs = 2
  c.sft.eval_every = 100               # dev evaluation at the epoch ends only
  c.sft.eval_each_epoch = True
  c.sft.lr_schedule = 'linear'
  c.checkpoint.save_every = 1
  c.checkpoint.max_to_keep = 3
  c.metrics.progress_bar = False
  c.metrics.tensorboard = False
  validation.validate_config(c)
  return c


# ----------------------------------------------------------------------------- end to end
def _params_of(directory, step):
  with checkpoints.PhaseCheckpointManager(directory) as mgr:
    return mgr.restore(step=step)


def test_run_sft_end_to_end_and_exact_resume(tmp_path):
  config = tiny_config()
  full_dir = str(tmp_path / 'full')
  result = sft.run_sft(config, full_dir)
  # 8 train / 8 dev records; those with commands over 32 tokens are dropped.
  assert result['num_train'] + result['num_dropped_train'] == 8
  assert result['num_dev'] + result['num_dropped_dev'] == 8
  assert 5 <= result['num_train'] <= 8 and result['num_dev'] >= 4
  assert result['step'] == result['total_steps'] == 4 and result['complete']
  for key in ('tool_accuracy', 'invalid_rate', 'executable_rate', 'exact_match',
              'dev_loss', 'train_loss'):
    assert np.isfinite(result[key]), key
  assert result['executable_rate'] == pytest.approx(1 - result['invalid_rate'])
  d = os.path.join(full_dir, 'sft')
  assert os.path.isfile(os.path.join(d, sft.COUNTS_FILE))
  # The last evaluation's predictions, one line per dev record, agree with its figures.
  with open(os.path.join(d, sft_eval.PREDICTIONS_FILE)) as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == result['num_dev'] and {r['step'] for r in rows} == {4}
  assert np.mean([r['predicted_op'] == r['op'] for r in rows]) == pytest.approx(
      result['tool_accuracy'])
  with checkpoints.PhaseCheckpointManager(d) as mgr:
    assert mgr.latest_step() == 4
    assert mgr.best_step() in (2, 4) and mgr.best_step() == result['best_step']
    meta = mgr.read_meta(4)
  assert set(meta['selection_metrics']) == {'tool_accuracy', 'invalid_rate'}
  assert meta['data_position'] == {'epoch': 2, 'batch': 0, 'shuffle_seed': 42,
                                   'steps_per_epoch': 2,
                                   'num_train': result['num_train']}
  rows = metrics_lib.read_jsonl(os.path.join(d, metrics_lib.METRICS_FILE))
  assert [r['step'] for r in rows if 'train/loss' in r] == [1, 2, 3, 4]
  assert [r['step'] for r in rows if 'dev/tool_accuracy' in r] == [2, 4]
  lrs = [r['train/lr'] for r in rows if 'train/lr' in r]
  # One warmup step at the peak (never lr 0, issue 9), then the linear decay.
  np.testing.assert_allclose(lrs, [1e-3, 1e-3, 1e-3 * 2 / 3, 1e-3 / 3], rtol=1e-6)

  # Running the complete phase again does nothing.
  again = sft.run_sft(config, full_dir)
  assert again['step'] == 4 and again['best_step'] == result['best_step']
  with checkpoints.PhaseCheckpointManager(d) as mgr:
    assert mgr.all_steps()[-1] == 4

  # Killed after step 3 with checkpoints every 2 steps: resumes from step 2 (epoch 1,
  # batch 0), redoes step 3, and ends bit-identical to the uninterrupted run.
  config.checkpoint.save_every = 2
  part_dir = str(tmp_path / 'killed')
  part = sft.run_sft(config, part_dir, stop_after_step=3)
  assert part['step'] == 3 and not part['complete']
  pd = os.path.join(part_dir, 'sft')
  with checkpoints.PhaseCheckpointManager(pd) as mgr:
    assert mgr.latest_step() == 2
    assert mgr.read_meta(2)['data_position']['epoch'] == 1
    assert mgr.read_meta(2)['data_position']['batch'] == 0
  resumed = sft.run_sft(config, part_dir)
  assert resumed['step'] == 4 and resumed['complete']
  rows = metrics_lib.read_jsonl(os.path.join(pd, metrics_lib.METRICS_FILE))
  assert [r['step'] for r in rows if 'train/loss' in r] == [1, 2, 3, 4]
  a, b = _params_of(d, 4), _params_of(pd, 4)
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for x, y in zip(jax.tree.leaves(a.opt_state), jax.tree.leaves(b.opt_state)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert resumed['train_loss'] == result['train_loss']
  assert resumed['tool_accuracy'] == result['tool_accuracy']


def test_resume_refuses_other_settings(tmp_path):
  config = tiny_config()
  fingerprint = sft.trajectory_fingerprint(run_setup.RunSetup.from_config(config))
  d = checkpoints.phase_dir(str(tmp_path), 'sft')
  with checkpoints.PhaseCheckpointManager(d) as mgr:
    mgr.save(checkpoints.TrainState(
        step=1, params={'w': np.zeros(2, np.float32)},
        metadata={'fingerprint': dict(fingerprint, seed=7)}))
  with pytest.raises(ValueError, match='seed: 7 -> 42'):
    sft.run_sft(config, str(tmp_path))
  json.dumps(fingerprint)  # stored as JSON metadata


def test_nan_gradient_skips_one_step_and_the_run_continues(tmp_path, monkeypatch):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import sft_step  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  config.checkpoint.max_to_keep = 8
  real_step, real_acc = sft_step.train_step, sft_step.accumulate_micro_batch
  calls = []

  def step(*args, **kwargs):
    calls.append(1)
    return real_step(*args, **kwargs)

  def accumulate(*args, **kwargs):  # a NaN in one gradient entry of step 2
    acc = real_acc(*args, **kwargs)
    if len(calls) == 2:
      acc = dict(acc, grads=jax.tree.map(lambda g: g.at[(0,) * g.ndim].set(jnp.nan),
                                         acc['grads']))
    return acc

  monkeypatch.setattr(sft_step, 'train_step', step)
  monkeypatch.setattr(sft_step, 'accumulate_micro_batch', accumulate)
  result = sft.run_sft(config, str(tmp_path))
  assert result['complete'] and result['step'] == 4
  d = os.path.join(str(tmp_path), 'sft')
  rows = [r for r in metrics_lib.read_jsonl(os.path.join(d, metrics_lib.METRICS_FILE))
          if 'train/loss' in r]
  assert [r['train/skipped'] for r in rows] == [0.0, 1.0, 0.0, 0.0]
  assert rows[-1]['train/skipped_total'] == 1.0
  # The schedule counts applied steps only: step 3 gets the rate step 2 would have.
  np.testing.assert_allclose([r['train/lr'] for r in rows],
                             [1e-3, 1e-3, 1e-3, 1e-3 * 2 / 3], rtol=1e-6)
  s1, s2, s3 = (_params_of(d, k) for k in (1, 2, 3))
  for x, y in zip(jax.tree.leaves((s1.params, s1.opt_state)),
                  jax.tree.leaves((s2.params, s2.opt_state))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # step 2 not applied
  assert any(not np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(s2.params), jax.tree.leaves(s3.params)))
  for x in jax.tree.leaves(s3.params):
    assert np.all(np.isfinite(np.asarray(x)))
  with checkpoints.PhaseCheckpointManager(d) as mgr:
    assert mgr.read_meta(4)['metadata']['skipped_steps'] == 1
