"""SFT -> Phase A -> Phase B -> Phase C at tiny scale on the real HotpotQA samples.

Runs `experiments/run.py`'s `run(config, workdir)` in-process once (the Phase C command
runs the missing phases first) and checks every phase's checkpoint directory, the metric
files of the RL phases, and that each RL phase's reference policy — and its initial
parameters — are exactly the previous phase's parameters.

`curriculum_workdir()` is shared with tests/test_rl_phase.py and tests/test_notebook.py
(same pytest process): the curriculum runs once per session.
"""
import functools
import glob
import json
import os
import shutil

import filelock
import numpy as np
import pytest

import session_dir

from experiments import run as run_lib
from experiments.configs import common
from experiments.configs.parts import curriculum
from vermem_jax.train import checkpoints
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import rl_phase
from vermem_jax.train import rl_resume

# Shrunk sizes so the whole curriculum runs in about two minutes on a
# 2-core CPU: short policy inputs, 16-token commands, 2 tasks x 2 rollouts, <= 2
# decisions per rollout, 2 SFT steps, one update per RL phase.
TINY_OVERRIDES = {
    'memory.context_budget': 384,
    'memory.policy_input_limit': 768,
    'sampling.max_command_tokens': 16,
    'batching.length_buckets': (848,),
    'batching.command_buckets': (16,),
    'sft.train_per_target': 1,
    'sft.dev_per_target': 1,
    'sft.batch_size': 1,
    'sft.max_steps': 2,
    'rl.num_updates': 1,
    'rl.tasks_per_update': 2,
    'rl.rollouts_per_task': 2,
    'episodes.rollout_limit': 2,
    'episodes.num_train': 4,
    'episodes.num_dev': 2,
    'advantage.running_stats_init_count': 2,
    'rl.internal_dev_episodes': 0,     # tests/test_rl_phase.py runs the dev figures
    'metrics.progress_bar': False,
}


def tiny_config(phase, **extra):
  """The tiny config of `phase` with TINY_OVERRIDES and `extra` ('a.b' -> value)."""
  config = common.get_config(phase)
  for path, value in {**TINY_OVERRIDES, **extra}.items():
    section, field = path.split('.')
    config[section][field] = value
  return config


def override_flags(**extra):
  """The same overrides as `--config.a.b=value` flags for experiments/run.py."""
  out = []
  for path, value in {**TINY_OVERRIDES, **extra}.items():
    out.append(f'--config.{path}={value!r}' if isinstance(value, tuple)
               else f'--config.{path}={value}')
  return out


@functools.lru_cache(maxsize=None)
def curriculum_workdir():
  """A workdir holding the whole tiny curriculum, with the CPU default's tokenizer and
  model (4k SentencePiece, tiny-sp4k). It is built once per test session: pytest-xdist
  workers find it in the session folder (tests/session_dir.py), and a file lock makes the
  others wait for the first. Its users only read it."""
  root = session_dir.ensure()
  workdir = os.path.join(root, 'curriculum')
  done = os.path.join(root, 'curriculum.done')
  with filelock.FileLock(os.path.join(root, 'curriculum.lock')):
    if not os.path.exists(done):
      shutil.rmtree(workdir, ignore_errors=True)  # a worker that failed mid-build
      plan = run_lib.run(tiny_config('phase_c'), workdir)
      assert plan == ['sft', 'phase_a', 'phase_b', 'phase_c']
      open(done, 'w').close()
  return workdir


# The Qwen2.5 tokenizer with the Qwen-vocabulary `tiny` preset: the paper-scale
# tokenizer through every tokenizer-dependent path of SFT and an RL phase (token counts
# for g(s) and budgets, chat template, stop tokens, SFT tokenization, vocab check).
QWEN_OVERRIDES = {'tokenizer.name': 'qwen2.5', 'model.preset': 'tiny',
                  'model.hf_checkpoint': None,  # random init of the preset
                  'model.dtype': 'float32', 'rl.internal_dev_episodes': 2}


@pytest.mark.slow  # SFT and RL phases end to end (~30-45 s)
def test_qwen_tokenizer_sft_then_phase_a(tmp_path):
  config = tiny_config('phase_a', **QWEN_OVERRIDES)
  assert config.tokenizer.path.endswith(os.path.join('tokenizers', 'qwen2.5'))
  workdir = str(tmp_path)
  assert run_lib.run(config, workdir) == ['sft', 'phase_a']
  from vermem_jax.train import setup  # pylint: disable=g-import-not-at-top
  assert setup.load_tokenizer_for(config).vocab_size == 151665
  for phase in ('sft', 'phase_a'):
    assert checkpoints.phase_complete_step(os.path.join(workdir, phase)) is not None
  with checkpoints.PhaseCheckpointManager(os.path.join(workdir, 'sft')) as mgr:
    params = mgr.restore().params
  assert params['embed_tokens']['embedding'].shape == (151936, 64)
  rows = metrics_lib.read_jsonl(os.path.join(workdir, 'phase_a', metrics_lib.METRICS_FILE))
  assert [r['step'] for r in rows] == [0, 1]
  assert rows[0]['internal_dev/start/num_episodes'] == 2.0
  assert rows[1]['internal_dev/end/num_episodes'] == 2.0
  assert rows[1]['train/num_decisions'] >= 4


@pytest.fixture(scope='module')
def workdir():
  return curriculum_workdir()


@pytest.mark.slow  # SFT and RL phases end to end (~30-45 s)
def test_every_phase_has_a_restorable_checkpoint_and_marker(workdir):
  for phase in curriculum.PHASE_ORDER:
    d = os.path.join(workdir, phase)
    assert os.path.isdir(d), phase
    marker = checkpoints.phase_complete_step(d)
    assert marker is not None, f'{phase}: no phase_complete marker'
    with checkpoints.PhaseCheckpointManager(d) as mgr:
      assert mgr.latest_step() == marker
      state = mgr.restore()
    assert state is not None and state.step == marker
    assert 'embed_tokens' in state.params
  # RL phases: one update each (TINY_OVERRIDES), step = completed updates.
  for phase in ('phase_a', 'phase_b', 'phase_c'):
    assert checkpoints.phase_complete_step(os.path.join(workdir, phase)) == 1


@pytest.mark.slow  # SFT and RL phases end to end (~30-45 s)
def test_rl_phase_metric_files(workdir):
  for phase in ('phase_a', 'phase_b', 'phase_c'):
    d = os.path.join(workdir, phase)
    assert glob.glob(os.path.join(d, 'events.out.tfevents.*')), phase
    rows = metrics_lib.read_jsonl(os.path.join(d, metrics_lib.METRICS_FILE))
    assert [r['step'] for r in rows] == [1]
    row = rows[0]
    for key in ('train/loss', 'train/kl', 'train/clip_fraction', 'train/ratio',
                'train/entropy', 'train/grad_norm', 'reward/r_global', 'reward/r_task',
                'monitor/m_all', 'monitor/m_ans', 'rollout/rejected_share',
                'rollout/tool_calls_mean', 'tokens/online_mean', 'time/sampling_s',
                'time/learner_s', 'time/verifier_local_s', 'time/environment_s'):
      assert key in row, (phase, key)
    adv_rows = metrics_lib.read_jsonl(os.path.join(d, metrics_lib.ADVANTAGES_FILE))
    assert len(adv_rows) == row['train/num_decisions'] >= 4  # 2 tasks x 2 rollouts
    assert {r['phase'] for r in adv_rows} == {phase}
    assert {r['update'] for r in adv_rows} == {1}
    assert all(set(r) == set(metrics_lib.ADVANTAGE_COLUMNS) for r in adv_rows)
    # Each (task, rollout) group has rollouts 0..K-1 and decisions t = 0, 1, ...
    assert {(r['task'], r['rollout']) for r in adv_rows} == {(0, 0), (0, 1), (1, 0),
                                                             (1, 1)}
    assert row['monitor/point'] == 0.0  # the batch collected before the first update
    # The tiny config floors rejections below the executable commands (tiny.py): the
    # logged rejection-preference share is 0 wherever it is defined.
    rejected = [r['A_hier'] for r in adv_rows if not r['accepted']]
    executable = [r['A_hier'] for r in adv_rows if r['accepted']]
    assert 'advantage/num_rejections_floored' in row
    assert ('advantage/rejection_preference_share' in row) == bool(rejected and executable)
    if rejected and executable:
      assert row['advantage/rejection_preference_share'] == 0.0
      assert max(rejected) < min(executable)
      assert row['advantage/a_hier_rejected_mean'] == pytest.approx(
          sum(rejected) / len(rejected))


@pytest.mark.slow  # SFT and RL phases end to end (~30-45 s)
def test_reference_policy_is_previous_phase_params(workdir):
  previous = {'phase_a': 'sft', 'phase_b': 'phase_a', 'phase_c': 'phase_b'}
  digests = {}
  for phase, prev in previous.items():
    ref = rl_resume.read_reference(os.path.join(workdir, phase))
    assert ref is not None
    prev_params, prev_step = checkpoints.restore_params_only(
        os.path.join(workdir, prev), prefer_best=True)
    digest = rl_resume.params_fingerprint(prev_params)
    assert ref['reference_phase'] == prev
    assert ref['reference_step'] == prev_step
    assert ref['params_sha256'] == digest
    # θ_0 = θ_prev: the phase started from the previous phase's parameters.
    assert ref['initial_params_sha256'] == digest
    digests[phase] = digest
    # At update 1, θ = θ_ref, so the exact KL to π_ref is zero.
    rows = metrics_lib.read_jsonl(os.path.join(workdir, phase, metrics_lib.METRICS_FILE))
    # bf16 compute, two programs (the learner's forward and π_ref's): each logit carries
    # bf16 rounding (2^-8 relative), so the exact KL of one set of parameters with itself
    # is ~½·Var of that noise: measured 1.0e-4 here with the sdpa kernel (2.5e-6 to
    # 1.3e-5 in the default's phases). A wrong
    # reference or a moved θ reads 4.5e-3 and more (tiny phases' KL after one update).
    assert abs(rows[0]["train/kl"]) < 1e-3
  # The previous RL phase's final params are what the next phase got, and they differ
  # from that phase's own reference (it trained), so the equality is not vacuous.
  assert digests['phase_b'] != digests['phase_a']
  assert digests['phase_c'] != digests['phase_b']
  with checkpoints.PhaseCheckpointManager(os.path.join(workdir, 'phase_b')) as mgr:
    final_b = mgr.restore()
  assert rl_resume.params_fingerprint(final_b.params) == digests['phase_c']
  # An independent comparison of the arrays themselves (phase_c's π_ref vs phase_b's
  # last checkpoint, restored without the fingerprint helper).
  ref_c, _ = checkpoints.restore_params_only(os.path.join(workdir, 'phase_b'))
  flat_a = jax_leaves(ref_c)
  flat_b = jax_leaves(final_b.params)
  assert len(flat_a) == len(flat_b)
  for x, y in zip(flat_a, flat_b):
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


def jax_leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow  # SFT and RL phases end to end (~30-45 s)
def test_rerunning_a_complete_phase_is_a_no_op(workdir):
  d = os.path.join(workdir, 'phase_b')
  before = sorted(os.listdir(d))
  rows_before = open(os.path.join(d, metrics_lib.METRICS_FILE)).read()
  out = rl_phase.run_rl_phase(tiny_config('phase_b'), workdir)
  assert out['step'] == 1 and out['complete']
  assert out['reference_phase'] == 'phase_a'
  assert json.loads(json.dumps(out)) == out
  assert sorted(os.listdir(d)) == before
  assert open(os.path.join(d, metrics_lib.METRICS_FILE)).read() == rows_before
