"""Tests for experiments/run.py: config name resolution, overrides, phase plan, dispatch.

The phase trainers are replaced by fake runners (monkeypatched PHASE_RUNNERS) that save
a small real checkpoint, so the CLI's dependency logic is tested on its own.
"""
import json
import logging
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import run as run_cli
from experiments.cli import config_argv
from experiments.cli import overrides
from experiments.cli import phase_plan
from experiments.cli import workdir_lock
from experiments.cli import preflight
from experiments.configs import common
from experiments.configs.parts import curriculum
from experiments.configs.parts import derived
from experiments.configs.parts import paper
from vermem_jax.models import qwen
from vermem_jax.train import checkpoints as ck
from vermem_jax.train import run_setup
from vermem_jax.train import sft

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = REPO / 'experiments' / 'configs'


def test_resolve_config_path_forms(tmp_path):
  assert config_argv.resolve_config_path('phase_b') == str(CONFIGS / 'phase_b.py')
  assert config_argv.resolve_config_path('phase_b.py') == str(CONFIGS / 'phase_b.py')
  assert config_argv.resolve_config_path('phase_b.py:scale=paper') == \
      str(CONFIGS / 'phase_b.py') + ':scale=paper'
  own = tmp_path / 'mine.py'
  own.write_text('def get_config(arg=None):\n  return None\n')
  assert config_argv.resolve_config_path(f'{own}:x') == f'{own}:x'
  with pytest.raises(ValueError, match=r"'phase_d.py' is not in .*known configs: "
                     r'eval_alfworld, eval_babyai, eval_hotpotqa, eval_pddl, '
                     r'eval_scienceworld, phase_a, phase_b, phase_c, pretrain, sft, table2'):
    config_argv.resolve_config_path('phase_d')


def test_resolve_config_argv_leaves_overrides():
  argv = ['run.py', '--config=phase_a', '--config.rl.learning_rate=3e-6', '--workdir=w']
  assert config_argv.resolve_config_argv(argv) == [
      'run.py', f'--config={CONFIGS / "phase_a.py"}', '--config.rl.learning_rate=3e-6',
      '--workdir=w']
  argv = ['run.py', '--config', 'sft.py:scale=paper', '--dry_run']
  assert config_argv.resolve_config_argv(argv) == [
      'run.py', '--config', f'{CONFIGS / "sft.py"}:scale=paper', '--dry_run']


def _fake_runners(monkeypatch, calls, *, save=True):
  """Runners that record their call and write a one-step checkpoint like a trainer."""
  def make(name):
    def runner(config, workdir):
      calls.append((name, config.phase, config.scale, config.rl.learning_rate,
                    config.seed))
      if save:
        with ck.PhaseCheckpointManager(ck.phase_dir(workdir, name)) as mgr:
          mgr.save(ck.TrainState(step=3, params={'w': np.full((2,), len(calls),
                                                               np.float32)}))
    return runner
  monkeypatch.setattr(run_cli, 'PHASE_RUNNERS',
                      {p: make(p) for p in curriculum.PHASE_ORDER})


def test_tiny_scale_runs_missing_phases_first(tmp_path, monkeypatch, caplog):
  calls = []
  _fake_runners(monkeypatch, calls)
  workdir = str(tmp_path / 'wd')
  config = common.get_config('phase_b')
  config.rl.learning_rate = 3e-6   # a command-line override
  config.seed = 43
  caplog.set_level(logging.INFO)
  assert run_cli.run(config, workdir) == ['sft', 'phase_a', 'phase_b']
  assert [c[:2] for c in calls] == [('sft', 'sft'), ('phase_a', 'phase_a'),
                                    ('phase_b', 'phase_b')]
  # Overrides apply to every phase the command runs.
  assert all(c[3] == 3e-6 and c[4] == 43 and c[2] == 'tiny' for c in calls)
  msgs = ' '.join(r.getMessage() for r in caplog.records)
  assert 'phase_b needs phase_a' in msgs and 'running sft, phase_a first' in msgs
  for phase in ('sft', 'phase_a', 'phase_b'):
    assert ck.phase_complete_step(os.path.join(workdir, phase)) == 3
  # phase_b done: phase_c needs nothing else.
  calls.clear()
  assert run_cli.run(common.get_config('phase_c'), workdir) == ['phase_c']
  assert [c[0] for c in calls] == ['phase_c']
  # π_ref for phase_c is loadable from phase_b's directory.
  params, step = ck.restore_params_only(os.path.join(workdir, 'phase_b'))
  assert step == 3 and float(params['w'][0]) == 3.0


def test_incomplete_previous_phase_is_rerun(tmp_path, monkeypatch):
  calls = []
  _fake_runners(monkeypatch, calls)
  workdir = str(tmp_path)
  # sft complete; phase_a has a checkpoint but never finished (killed run).
  for phase in ('sft', 'phase_a'):
    with ck.PhaseCheckpointManager(ck.phase_dir(workdir, phase)) as mgr:
      mgr.save(ck.TrainState(step=1, params={'w': np.zeros((2,), np.float32)}))
  ck.mark_phase_complete(os.path.join(workdir, 'sft'), 1)
  assert phase_plan.plan_phases('phase_b', workdir, 'tiny') == ['phase_a', 'phase_b']
  assert phase_plan.plan_phases('sft', workdir, 'tiny') == ['sft']
  assert phase_plan.plan_phases('phase_a', workdir, 'tiny') == ['phase_a']
  # The small scale (SmolLM2, issue 37) runs missing phases like tiny; paper stops.
  assert phase_plan.plan_phases('phase_c', workdir, 'small') == [
      'phase_a', 'phase_b', 'phase_c']
  with pytest.raises(phase_plan.MissingPrerequisiteError, match=':scale=paper'):
    phase_plan.plan_phases('phase_c', workdir, 'paper')


def test_paper_scale_stops_with_command(tmp_path, monkeypatch, qwen25_tokenizer_dir):
  calls = []
  _fake_runners(monkeypatch, calls)
  workdir = str(tmp_path / 'runs')
  config = common.get_config('phase_b', 'scale=paper')
  config.model.hf_checkpoint = str(tmp_path)
  config.tokenizer.path = qwen25_tokenizer_dir
  config.verifier.backend = 'heuristic'  # no verifier server in tests
  config.model.mesh_fsdp = 1  # the paper's 8-way FSDP needs 8 devices (checked first)
  (tmp_path / 'config.json').write_text(json.dumps({  # a minimal HF Qwen2 config
      'model_type': 'qwen2', 'vocab_size': 151936, 'hidden_size': 64,
      'intermediate_size': 128, 'num_hidden_layers': 2, 'num_attention_heads': 4,
      'num_key_value_heads': 2, 'rope_theta': 1e4, 'rms_norm_eps': 1e-6,
      'tie_word_embeddings': True, 'max_position_embeddings': 4096}))
  full_data = tmp_path / 'hotpotqa_full'  # stands in for the official files
  full_data.mkdir()
  (full_data / paper.PAPER_TRAIN_FILE).write_text('[]')
  config.data.hotpotqa_dir = str(full_data)
  with pytest.raises(phase_plan.MissingPrerequisiteError) as e:
    run_cli.run(config, workdir)
  msg = str(e.value)
  assert os.path.join(workdir, 'phase_a') in msg
  assert (f'python experiments/run.py --config=phase_a.py:scale=paper '
          f'--workdir={workdir}') in msg
  assert calls == []
  # With phase_a complete, paper scale runs only the requested phase.
  with ck.PhaseCheckpointManager(ck.phase_dir(workdir, 'phase_a')) as mgr:
    mgr.save(ck.TrainState(step=1000, params={'w': np.zeros((2,), np.float32)}))
  ck.mark_phase_complete(os.path.join(workdir, 'phase_a'), 1000)
  assert run_cli.run(config, workdir) == ['phase_b']
  assert [c[:3] for c in calls] == [('phase_b', 'phase_b', 'paper')]


def test_runner_without_checkpoint_is_an_error(tmp_path, monkeypatch):
  _fake_runners(monkeypatch, [], save=False)
  with pytest.raises(RuntimeError, match='sft finished without a checkpoint'):
    run_cli.run(common.get_config('sft'), str(tmp_path))


def test_bad_config_is_rejected_before_running(tmp_path, monkeypatch):
  calls = []
  _fake_runners(monkeypatch, calls)
  config = common.get_config('phase_a')
  config.rl.rollouts_per_task = 1
  with pytest.raises(ValueError, match='config.rl.rollouts_per_task'):
    run_cli.run(config, str(tmp_path))
  assert calls == []


def test_dry_run_refuses_a_resume_the_real_run_refuses(tmp_path):
  """A workdir whose SFT checkpoint was trained with another learning rate: the dry run
  names the differing setting and exits as the real run does; with the stored
  settings it plans the phase. It writes nothing."""
  config = common.get_config('sft')
  run = run_setup.RunSetup.from_config(config)
  params = qwen.init_params(run.model.config, jax.random.PRNGKey(0))
  with ck.PhaseCheckpointManager(tmp_path / 'sft') as mgr:
    mgr.save(ck.TrainState(step=3, params=params, metadata={
        'fingerprint': sft.trajectory_fingerprint(run)}))
  before = sorted(os.listdir(tmp_path / 'sft'))
  assert run_cli.run(common.get_config('sft'), str(tmp_path), dry_run=True) == ['sft']
  changed = common.get_config('sft')
  changed.sft.learning_rate = 2 * config.sft.learning_rate
  with pytest.raises(ValueError, match=(
      r'holds an SFT run with different settings \(learning_rate: .*\(a real run '
      'stops here\)')):
    run_cli.run(changed, str(tmp_path), dry_run=True)
  assert sorted(os.listdir(tmp_path / 'sft')) == before


def test_default_runner_registry():
  assert set(run_cli.PHASE_RUNNERS) == set(curriculum.PHASE_ORDER)
  # All RL phases share one trainer entry point (vermem_jax.train.rl_phase.run_rl_phase).
  assert run_cli.PHASE_RUNNERS['phase_a'] is run_cli.PHASE_RUNNERS['phase_c']
  assert run_cli.PHASE_RUNNERS['sft'] is not run_cli.PHASE_RUNNERS['phase_a']


def _cli(*args, cwd=REPO):
  return subprocess.run([sys.executable, str(REPO / 'experiments' / 'run.py'), *args],
                        cwd=cwd, capture_output=True, text=True, timeout=120,
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu'})


def test_cli_dry_run_bare_name_and_override(tmp_path):
  res = _cli('--config=phase_b', '--config.rl.learning_rate=3e-6',
             '--config.batching.command_buckets=(16, 64, 192)',
             '--config.memory.cost_parse=0.75',
             f'--workdir={tmp_path}', '--dry_run', cwd=tmp_path)
  assert res.returncode == 0, res.stderr
  assert 'config.rl.learning_rate = 3e-06' in res.stdout
  assert 'config.batching.command_buckets = (16, 64, 192)' in res.stdout
  assert 'config.memory.cost_parse = 0.75' in res.stdout
  assert "config.phase = 'phase_b'" in res.stdout
  assert "config.scale = 'tiny'" in res.stdout
  assert 'plan: sft -> phase_a -> phase_b' in res.stdout
  assert not os.listdir(tmp_path)  # a dry run writes nothing
  # Pretraining's dry run lists its overrides too (it printed {} before).
  res = _cli('--config=pretrain', '--config.pretrain.steps=4400', f'--workdir={tmp_path}',
             '--dry_run', cwd=tmp_path)
  assert res.returncode == 0, res.stderr
  assert "overrides: {'pretrain.steps': 4400}" in res.stdout
  assert 'plan: pretrain' in res.stdout and not os.listdir(tmp_path)


def test_cli_paper_scale_path_form_and_errors(tmp_path):
  res = _cli('--config', f'{CONFIGS / "phase_c.py"}:scale=paper',
             f'--config.model.hf_checkpoint={tmp_path}', f'--workdir={tmp_path}',
             '--dry_run')
  assert res.returncode == 2
  assert 'phase_c starts from the phase_b parameters' in res.stderr
  assert '--config=phase_b.py:scale=paper' in res.stderr
  res = _cli('--config=phase_x.py', '--dry_run')
  assert res.returncode == 2 and 'known configs' in res.stderr
  res = _cli('--config=sft.py', '--config.rl.no_such_field=1', '--dry_run')
  assert res.returncode != 0 and 'no_such_field' in res.stderr


def test_check_config_argv_names_bad_fields_and_scale():
  """Misspelled overrides / scales: one clear line (was an absl traceback from inside
  ml_collections: AttributeError: "'nonexistent'")."""
  def check(*args):
    config_argv.check_config_argv(config_argv.resolve_config_argv(['run.py', *args]))
  check('--config=phase_a', '--config.rl.learning_rate=3e-6', '--config.seed', '1')
  with pytest.raises(ValueError, match=r"--config.rl.learning_rat: config.rl has no field "
                     r"'learning_rat' \(did you mean 'learning_rate'\?\); its fields: "
                     r'adam_b1, adam_b2, adam_eps, clip_epsilon, '):
    check('--config=phase_a', '--config.rl.learning_rat=1')
  with pytest.raises(ValueError, match="config has no field 'bogus'"):
    check('--config', 'sft', '--config.bogus.x=1')
  with pytest.raises(ValueError, match='config.rl.learning_rate is a value, not a section'):
    check('--config=phase_a', '--config.rl.learning_rate.x=1')
  with pytest.raises(ValueError, match=r"phase_b.py:scale=huge: unknown scale 'huge'"):
    check('--config=phase_b.py:scale=huge')


def test_cli_bad_override_is_one_line_without_traceback(tmp_path):
  res = _cli('--config=phase_a', '--config.rl.nonexistent=1', '--dry_run', cwd=tmp_path)
  assert res.returncode == 2
  assert "error: --config.rl.nonexistent: config.rl has no field 'nonexistent'" in res.stderr
  assert 'Traceback' not in res.stderr


def test_unwritable_workdir_fails_before_any_phase(tmp_path, monkeypatch):
  calls = []
  _fake_runners(monkeypatch, calls)
  blocker = tmp_path / 'a_file'
  blocker.write_text('')  # a path below a file can never be created (even as root)
  with pytest.raises(ValueError, match=r'--workdir=.*a_file/runs: cannot write there'):
    run_cli.run(common.get_config('sft'), str(blocker / 'runs'))
  with pytest.raises(ValueError, match=r'--workdir=.*a_file is a file, not a directory'):
    run_cli.run(common.get_config('sft'), str(blocker))
  assert calls == []


def test_tokenizer_larger_than_model_vocab_fails_before_any_phase(tmp_path, monkeypatch):
  calls = []
  _fake_runners(monkeypatch, calls)
  config = common.get_config('sft')
  config.model.hf_checkpoint = str(tmp_path)  # tiny HF config, default 4k tokenizer
  (tmp_path / 'config.json').write_text(json.dumps({
      'model_type': 'qwen2', 'vocab_size': 1000, 'hidden_size': 64,
      'intermediate_size': 128, 'num_hidden_layers': 2, 'num_attention_heads': 4,
      'rope_theta': 1e4}))
  with pytest.raises(ValueError, match=r"config.tokenizer.path: .*4096 ids but the "
                     r"model's vocab_size \(embedding rows\) is 1000"):
    run_cli.run(config, str(tmp_path / 'runs'))
  assert calls == []


def test_failing_later_phase_keeps_earlier_checkpoints(tmp_path, monkeypatch):
  """A phase that dies on bad input leaves the completed phases' files untouched."""
  calls = []
  _fake_runners(monkeypatch, calls)
  def bad_phase_a(config, workdir):
    raise ValueError('malformed HotpotQA row _id=x: field question is empty')
  monkeypatch.setitem(run_cli.PHASE_RUNNERS, 'phase_a', bad_phase_a)
  workdir = str(tmp_path)
  with pytest.raises(ValueError, match='malformed HotpotQA row'):
    run_cli.run(common.get_config('phase_a'), workdir)
  sft_dir = os.path.join(workdir, 'sft')
  assert ck.phase_complete_step(sft_dir) == 3 and ck.has_checkpoint(sft_dir)
  assert not phase_plan.phase_is_complete(workdir, 'phase_a')
  # The next attempt does not redo sft.
  monkeypatch.setattr(run_cli, 'PHASE_RUNNERS', dict(run_cli.PHASE_RUNNERS,
                                                     phase_a=lambda c, w: None))
  with pytest.raises(RuntimeError, match='phase_a finished without a checkpoint'):
    run_cli.run(common.get_config('phase_a'), workdir)
  assert [c[0] for c in calls] == ['sft']


def test_unreachable_verifier_fails_before_any_phase(tmp_path, monkeypatch):
  """Scoring turns transport errors into fallback scores, so a wrong base_url would
  silently train on fallbacks; run() probes the endpoint first."""
  calls = []
  _fake_runners(monkeypatch, calls)
  config = common.get_config('phase_a')
  config.verifier.backend = 'openai_compatible'
  config.verifier.base_url = 'http://127.0.0.1:9/v1'  # discard port: refused
  config.verifier.api_key_env = ''
  config.verifier.timeout_s = 1.0
  with pytest.raises(ValueError, match=r"config.verifier: verifier endpoint check failed: "
                     r"connection to http://127.0.0.1:9/v1/chat/completions failed"):
    run_cli.run(config, str(tmp_path))
  assert calls == []
  config.verifier.api_key_env = 'VERMEM_TEST_UNSET_KEY_VAR'
  monkeypatch.delenv('VERMEM_TEST_UNSET_KEY_VAR', raising=False)
  with pytest.raises(ValueError, match="config.verifier: .*'VERMEM_TEST_UNSET_KEY_VAR', "
                     'which is unset'):
    run_cli.run(config, str(tmp_path))
  assert calls == []


def test_random_local_verifier_is_said_before_any_phase(tmp_path, monkeypatch, caplog):
  calls = []
  _fake_runners(monkeypatch, calls)
  monkeypatch.setattr(preflight.logging, 'warning',
                      lambda msg, *a: calls.append(('warning', msg % a)))
  c = common.get_config('phase_a')
  c.verifier.backend = 'local_model'
  run_cli.run(c, str(tmp_path / 'w'))
  assert 'the verifier has random weights' in calls[0][1]
  assert len(calls) > 1  # the phases ran after the warning
  calls.clear()
  c.verifier.backend = 'heuristic'
  preflight.check_local_verifier(c)
  assert calls == []


def test_config_override_args_keeps_every_flag_as_one_word():
  argv = ['run.py', '--config=x.py', '--config.seed', '42', '--workdir=w',
          '--config.data.hotpotqa_dir=/my data', '-config.rl.learning_rate=3e-6', '--dry_run']
  assert config_argv.config_override_args(argv) == [
      ('seed', '--config.seed=42'), ('data.hotpotqa_dir', '--config.data.hotpotqa_dir=/my data'),
      ('rl.learning_rate', '--config.rl.learning_rate=3e-6')]


def test_missing_prerequisite_command_carries_quoted_overrides(tmp_path):
  """Item: the printed paper-scale command dropped the user's --config.* flags."""
  flags_ = ['--config.model.hf_checkpoint=/ckpt/Qwen 7B', '--config.seed=43']
  with pytest.raises(phase_plan.MissingPrerequisiteError) as e:
    phase_plan.plan_phases('phase_b', str(tmp_path), 'paper', flags_)
  assert (f"python experiments/run.py --config=phase_a.py:scale=paper "
          f"'--config.model.hf_checkpoint=/ckpt/Qwen 7B' --config.seed=43 "
          f"--workdir={tmp_path}") in str(e.value)
  # The printed command parses back to the same words (pasteable in a shell).
  import shlex
  cmd = str(e.value).splitlines()[-1].strip()
  assert shlex.split(cmd)[3:5] == flags_


def test_cli_paper_prerequisite_command_includes_overrides(tmp_path):
  ckpt = tmp_path / 'my ckpt'
  res = _cli('--config=phase_b.py:scale=paper', f'--config.model.hf_checkpoint={ckpt}',
             '--config.tokenizer.path=/tok', f'--workdir={tmp_path}', '--dry_run')
  assert res.returncode == 2
  assert (f"--config=phase_a.py:scale=paper '--config.model.hf_checkpoint={ckpt}' "
          f"--config.tokenizer.path=/tok --workdir={tmp_path}") in res.stderr


def _hold_lock(path):
  """A separate process holding an flock on `path`; returns it once the lock is held."""
  proc = subprocess.Popen(
      [sys.executable, '-c',
       'import fcntl, os, sys, time\n'
       'os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)\n'
       'f = open(sys.argv[1], "a")\n'
       'fcntl.flock(f, fcntl.LOCK_EX)\n'
       'print("locked", flush=True)\n'
       'time.sleep(120)\n', str(path)],
      stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == 'locked'
  return proc


def test_phase_lock_excludes_other_process_and_stale_file_does_not_block(tmp_path):
  workdir = str(tmp_path)
  proc = _hold_lock(tmp_path / 'phase_a' / '.lock')
  try:
    with pytest.raises(workdir_lock.PhaseLockedError,
                       match=f'another run holds .*phase_a/.lock.*workdir {workdir}'):
      with workdir_lock.phase_lock(workdir, 'phase_a'):
        pass
    with workdir_lock.phase_lock(workdir, 'phase_b'):  # other phases are free
      pass
  finally:
    proc.kill()
    proc.wait()
  assert os.path.exists(tmp_path / 'phase_a' / '.lock')  # left by the killed holder
  with workdir_lock.phase_lock(workdir, 'phase_a') as lock:  # flock died with it
    # Held: a second open file description cannot take it.
    import fcntl
    with open(lock) as f:
      with pytest.raises(BlockingIOError):
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    (tmp_path / 'phase_a' / 'metrics.jsonl').write_text('{}\n')
  with open(tmp_path / 'phase_a' / '.lock') as f:  # released on exit
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_run_holds_phase_lock_around_runner(tmp_path, monkeypatch):
  seen = []
  def runner(config, workdir):
    lock = os.path.join(workdir, 'sft', '.lock')
    import fcntl
    with open(lock) as f:  # held by run() while the runner runs
      with pytest.raises(BlockingIOError):
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    seen.append(config.phase)
    raise ValueError('bad row')
  monkeypatch.setattr(run_cli, 'PHASE_RUNNERS', {'sft': runner})
  workdir = tmp_path / 'new_wd'
  with pytest.raises(ValueError, match='bad row'):
    run_cli.run(common.get_config('sft'), str(workdir))
  assert seen == ['sft']
  # Failed before writing anything: no empty workdir / phase folder left behind.
  assert not workdir.exists()


def test_cli_second_run_on_locked_phase_exits_2(tmp_path):
  proc = _hold_lock(tmp_path / 'sft' / '.lock')
  try:
    res = _cli('--config=sft', f'--workdir={tmp_path}')
  finally:
    proc.kill()
    proc.wait()
  assert res.returncode == 2, res.stderr
  assert (f'error: another run holds {tmp_path}/sft/.lock: it is running sft in '
          f'workdir {tmp_path}') in res.stderr
  assert 'Traceback' not in res.stderr
  assert os.listdir(tmp_path / 'sft') == ['.lock']


def test_cli_dry_run_paper_without_checkpoint_prints_then_fails(tmp_path):
  """The config and plan still print; the problem is an error with status 2 (as the
  real run), not a warning with status 0; the printed workdir is the one used."""
  res = _cli('--config=sft.py:scale=paper', f'--workdir={tmp_path / "wd"}', '--dry_run')
  assert res.returncode == 2, res.stderr
  assert "config.scale = 'paper'" in res.stdout and 'plan: sft' in res.stdout
  assert f"config.workdir = '{tmp_path / 'wd'}'" in res.stdout
  assert 'error: config.model.hf_checkpoint: paper scale needs' in res.stderr
  assert 'Traceback' not in res.stderr
  assert not os.listdir(tmp_path)


def test_cli_non_numeric_override_is_one_error_line_with_status_2(tmp_path):
  res = _cli('--config=phase_a', '--config.rl.learning_rate=abc',
             f'--workdir={tmp_path}', '--dry_run')
  assert res.returncode == 2
  assert res.stderr.strip().splitlines() == [
      "error: flag --config.rl.learning_rate=abc: could not convert string to float: "
      "'abc'"]
  res = _cli('--config=phase_a', '--config.rl.learning_rate=-1', f'--workdir={tmp_path}',
             '--dry_run')
  assert res.returncode == 2 and 'config.rl.learning_rate = -1.0' in res.stdout
  assert 'error: config.rl.learning_rate: must be a finite number > 0, got -1.0' in res.stderr
  assert not os.listdir(tmp_path)
  for bad in ('inf', 'nan'):  # inf passes `> 0`, nan fails it for another reason
    res = _cli('--config=sft', f'--config.sft.learning_rate={bad}',
               f'--workdir={tmp_path}', '--dry_run')
    assert res.returncode == 2
    assert f'config.sft.learning_rate: must be a finite number > 0, got {bad}' in res.stderr
  res = _cli('--config=phase_a', '--config.memory.local_ids=maybe',
             f'--workdir={tmp_path}', '--dry_run')
  assert res.returncode == 2
  assert res.stderr.strip().splitlines() == [
      "error: flag --config.memory.local_ids=maybe: expected true or false, got 'maybe'"]


def test_cli_positional_argument_is_one_error_line_with_status_2(tmp_path):
  res = _cli('--config=phase_b', f'--workdir={tmp_path}', 'extra_arg')
  assert res.returncode == 2
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      "error: unexpected arguments ['extra_arg']"), res.stderr
  assert not os.listdir(tmp_path)


def test_cli_dry_run_tiny_fails_on_missing_data_as_the_real_run(tmp_path):
  env_dir = tmp_path / 'nowhere'
  res = subprocess.run(
      [sys.executable, str(REPO / 'experiments' / 'run.py'), '--config=sft',
       f'--workdir={tmp_path / "wd"}', '--dry_run'], cwd=tmp_path, capture_output=True,
      text=True, timeout=120,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'VERMEM_DATA_DIR': str(env_dir)})
  assert res.returncode == 2, res.stderr
  assert 'plan: sft' in res.stdout
  assert f"error: config.data.data_dir: '{env_dir}' is not a directory" in res.stderr
  # Data present but the tokenizer folder missing: also an error.
  res = _cli('--config=sft', f'--config.tokenizer.path={tmp_path / "tok"}',
             f'--workdir={tmp_path / "wd"}', '--dry_run')
  assert res.returncode == 2, res.stderr
  assert 'error: config.tokenizer.path:' in res.stderr
  config = common.get_config('sft')
  config.data.data_dir = str(env_dir)
  with pytest.raises(ValueError, match='config.data.data_dir'):  # real runs fail hard
    run_cli.run(config, str(tmp_path / 'wd'))
  assert not (tmp_path / 'wd').exists()


def test_cli_dry_run_lists_every_passed_override(tmp_path):
  res = _cli('--config=phase_a', '--config.seed=42', '--config.memory.policy_input_limit',
             '1024', f'--workdir={tmp_path}', '--dry_run')
  assert res.returncode == 0, res.stderr
  line = next(l for l in res.stdout.splitlines() if l.startswith('overrides:'))
  assert line == "overrides: {'seed': 42, 'memory.policy_input_limit': 1024}"
  # The derived bucket fields moved with the limit but are not listed as overrides.
  c = common.get_config('phase_a')
  c.memory.policy_input_limit = 1024
  want = derived.derived_buckets(c)['sampling.prompt_buckets']
  assert want[-1] > 1024 and f'config.sampling.prompt_buckets = {want}' in res.stdout


def test_config_overrides_without_argv_skips_derived_fields():
  config = common.get_config('phase_a')
  config.memory.policy_input_limit = 1024
  config.data.data_dir = '/elsewhere'
  assert overrides.config_overrides(config) == {'memory.policy_input_limit': 1024,
                                                'data.data_dir': '/elsewhere'}
  config.batching.command_buckets = (16, 160)
  assert overrides.config_overrides(config)['batching.command_buckets'] == (16, 160)
  assert overrides.config_overrides(config, ['seed']) == {'seed': 42}


def test_cli_missing_optional_package_is_one_line_and_leaves_no_folder(tmp_path):
  try:
    import datasets  # noqa: F401  pylint: disable=unused-import
    pytest.skip('the datasets package is installed')
  except ImportError:
    pass
  workdir = tmp_path / 'wd'
  res = _cli('--config=sft', '--config.data.source=hf', f'--workdir={workdir}')
  assert res.returncode == 2
  assert ("error: source='hf' needs the optional `datasets` package (pip install "
          "datasets)") in res.stderr
  assert 'Traceback' not in res.stderr
  assert not workdir.exists()


def test_cli_empty_workdir_and_bad_eval_dry_run_exit_2(tmp_path):
  res = _cli('--config=phase_b', '--workdir=', '--dry_run', cwd=tmp_path)
  assert res.returncode == 2
  assert res.stderr.strip().splitlines() == [
      "error: --workdir is empty (give a directory, or leave the flag out for "
      "'./workdir')"]
  res = _cli('--config=eval_hotpotqa', '--config.eval.num_questions=-1',
             f'--workdir={tmp_path}', '--dry_run')
  assert res.returncode == 2 and 'config.eval.num_questions = -1' in res.stdout
  assert res.stderr.strip().splitlines()[-1].startswith(
      'error: config.eval.num_questions: must be an int >= 0')
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('flag', ['--help', '-h', '--helpshort', '--helpfull'])
def test_cli_help_prints_usage_and_flags_with_status_0(flag, tmp_path):
  res = _cli(flag, cwd=tmp_path)
  assert res.returncode == 0, res.stderr
  assert res.stdout.startswith('Runs one phase of the VerMem curriculum')
  assert '--[no]dry_run:' in res.stdout and '--workdir:' in res.stdout
  # The multi-host flags the docstring names are listed by every form; --helpfull adds
  # every module's flags (absl's logging ones among them).
  assert '--coordinator_address:' in res.stdout and '--process_id:' in res.stdout
  assert ('--[no]logtostderr:' in res.stdout) == (flag == '--helpfull')
  assert not os.listdir(tmp_path)


def test_cli_without_config_is_one_error_line_with_status_2(tmp_path):
  res = _cli(cwd=tmp_path)
  assert res.returncode == 2
  assert res.stderr.strip().splitlines() == [
      'error: --config is required, e.g. --config=phase_b.py (--help lists the flags)']


@pytest.mark.parametrize('args, error', [
    (('--config=phase_a', '--workdir={tmp}/afile'),
     'error: --workdir={tmp}/afile is a file, not a directory'),
    (('--config=phase_a', '--workdir={tmp}/afile/sub'),
     'error: --workdir={tmp}/afile/sub: cannot write there ({tmp}/afile is not a '
     'directory)'),
    (('--config=phase_a', '--config.model.mesh_fsdp=3', '--workdir={tmp}/wd'),
     'error: config.model.mesh_fsdp * mesh_tensor = 3 does not divide the 1 devices'),
    (('--config=eval_hotpotqa', '--config.eval.policies=base,phase_c',
      '--workdir={tmp}/wd'),
     'error: config.eval.policies names phase_c, but {tmp}/wd/phase_c holds no '
     'checkpoint'),
    (('--config=eval_hotpotqa', '--config.eval.policies=x=hf:{tmp}/nowhere',
      '--workdir={tmp}/wd'),
     'error: config.eval.policies: x: {tmp}/nowhere is not a directory'),
    (('--config=table2', '--workdir={tmp}/wd'),
     'error: {tmp}/wd holds no eval_<benchmark>/results.json'),
])
def test_cli_dry_run_refuses_what_the_real_run_refuses(args, error, tmp_path):
  """The dry run makes the real run's cheap checks (same functions, same message,
  status 2) and writes nothing."""
  (tmp_path / 'afile').write_text('')
  res = _cli(*[a.format(tmp=tmp_path) for a in args], '--dry_run', cwd=tmp_path)
  assert res.returncode == 2, res.stderr
  assert res.stderr.strip().splitlines()[-1].startswith(error.format(tmp=tmp_path))
  assert 'Traceback' not in res.stderr
  assert sorted(os.listdir(tmp_path)) == ['afile']
  if args[0] != '--config=table2':  # the real run stops with the same line
    real = _cli(*[a.format(tmp=tmp_path) for a in args], cwd=tmp_path)
    assert real.returncode == 2
    # (the OS names why it cannot write: 'Not a directory')
    assert real.stderr.strip().splitlines()[-1].startswith(
        error.format(tmp=tmp_path).split(' (')[0])
    assert sorted(os.listdir(tmp_path)) == ['afile']


def test_cli_dry_run_names_a_missing_benchmark_extra(tmp_path):
  from vermem_jax.envs import interactive
  ok, _ = interactive.benchmark_available('alfworld')
  if ok:
    pytest.skip('the alfworld extra is installed')
  res = _cli('--config=eval_alfworld', f'--workdir={tmp_path}', '--dry_run')
  assert res.returncode == 2
  assert "pip install -e '.[alfworld]'" in res.stderr.strip().splitlines()[-1]
  assert not os.listdir(tmp_path)


def test_cli_dry_run_at_paper_scale_says_paths_are_not_checked(tmp_path):
  res = _cli('--config=sft.py:scale=paper', '--config.model.hf_checkpoint=/no/such/dir',
             f'--workdir={tmp_path}', '--dry_run')
  assert ("dry run at paper scale: the config's data, tokenizer and checkpoint paths "
          'are not checked') in res.stdout
  res = _cli('--config=sft', f'--workdir={tmp_path}', '--dry_run')
  assert res.returncode == 0 and 'are not checked' not in res.stdout


def test_cli_scale_override_points_to_the_config_argument(tmp_path):
  res = _cli('--config=phase_b', '--config.scale=paper', f'--workdir={tmp_path}',
             '--dry_run')
  assert res.returncode == 2
  assert res.stderr.strip().splitlines() == [
      'error: --config.scale cannot change the scale of a built config; pass '
      '--config=phase_b.py:scale=paper instead']
  assert not os.listdir(tmp_path)
