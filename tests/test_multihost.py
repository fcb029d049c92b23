"""Multi-host runs (train/distributed.py, rl/process_split.py): 2 processes x 4 CPU devices
on loopback against 1 process x 8 devices.

One scenario, run once per module (tests/multiprocess.py starts the processes; every
wait is bounded, so a hung process fails the test instead of hanging it):
  U. `experiments/run.py --config=phase_a` in 2 processes, uninterrupted: one SFT step,
     then two Phase A updates; both processes exit on their own.
  K. A copy of U's workdir as it was after update 1; the same command resumes it and
     process 1 is SIGKILLed during update 2; process 0, left waiting in a collective,
     is torn down with it.
  B. The same command in 2 fresh processes resumes K from update 1 and ends on its own.
  R. One process with 8 devices: the same SFT step, and the same first Phase A update
     from U's (2-process) SFT checkpoint; it restores the 2-process checkpoints into
     its 8-device layout and reports differences and SHA-256 fingerprints.
  C. Two processes restore R's (1-process) and K's checkpoints into their global layout
     and report the same fingerprints.

Phase A runs at rl.learning_rate 1e-4, so an update moves parameters by ~1e-4 and the
1e-5 tolerance means something. The 1-process comparison starts each phase from the
same parameters and covers one update: the last bits of cross-process sums (gloo vs the
in-process all-reduce) differ, Adam's first step amplifies them on near-zero gradient
coordinates, and a later update's sampled rollouts then differ. Runs with the same
process layout are deterministic, so the resumed run is compared bit for bit.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import multiprocess
from test_curriculum_e2e import override_flags  # pylint: disable=g-bad-import-order
from vermem_jax.train import checkpoints
from vermem_jax.train import metrics as metrics_lib

REPO = multiprocess.REPO
EXTRA = {'sft.train_per_target': 2, 'sft.batch_size': 6, 'sft.max_steps': 1,
         'sft.warmup_ratio': 0.0, 'rl.num_updates': 2, 'rl.learning_rate': 1e-4,
         'checkpoint.max_to_keep': 5}
RUN_TIMEOUT_S = 900  # one leg on a loaded 2-core machine takes a few minutes at most
TOL = 1e-5

# 1 process x 8 devices: the reference run, then restores of the 2-process checkpoints.
_REFERENCE = r'''
import json, os, shutil, sys
sys.path[:0] = [REPO, os.path.join(REPO, 'tests')]
import jax
import numpy as np
from experiments import run as run_lib
from test_curriculum_e2e import tiny_config
from vermem_jax.train import checkpoints, optim, rl_resume
from vermem_jax.train import setup as setup_lib

U, K, R = sys.argv[1], sys.argv[2], sys.argv[3]
extra = dict(json.loads(sys.argv[4]), **{'rl.num_updates': 1})
run_lib.run(tiny_config('sft', **extra), os.path.join(R, 'one'))
os.makedirs(os.path.join(R, 'from_u'))
shutil.copytree(os.path.join(U, 'sft'), os.path.join(R, 'from_u', 'sft'))
run_lib.run(tiny_config('phase_a', **extra), os.path.join(R, 'from_u'))

config = tiny_config('phase_a', **extra)
mesh = setup_lib.make_mesh(setup_lib.MeshConfig.from_section(config.model))
template, _ = setup_lib.abstract_train_state(
    setup_lib.model_config_from(config),
    optim.make_optimizer(optim.OptimizerConfig(
        learning_rate=1e-6, total_steps=1, warmup_ratio=0.0,
        lr_schedule='constant')).init, mesh)
def load(*path, step):
  return checkpoints.restore_params_only(os.path.join(*path), template, step=step)[0]
def max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
u_sft = load(U, 'sft', step=1)
r_a1 = load(R, 'from_u', 'phase_a', step=1)
u_a1 = load(U, 'phase_a', step=1)
out = {'devices': jax.device_count(), 'processes': jax.process_count(),
       'sft_diff': max_diff(u_sft, load(R, 'one', 'sft', step=1)),
       'a1_diff': max_diff(u_a1, r_a1), 'a1_move': max_diff(r_a1, u_sft),
       'r_a1_sha': rl_resume.params_fingerprint(r_a1)}
for name, workdir in (('u', U), ('k', K)):
  for step in (1, 2):
    out[f'{name}_a{step}_sha'] = rl_resume.params_fingerprint(
        load(workdir, 'phase_a', step=step))
assert out['k_a1_sha'] == out['u_a1_sha']  # K's update 1 is U's (copied)
print('RESULT ' + json.dumps(out))
'''

# 2 processes x 4 devices: restore a 1-process and a 2-process checkpoint.
_RESTORE = r'''
import json, os, sys
sys.path[:0] = [REPO, os.path.join(REPO, 'tests')]
from vermem_jax.train import distributed
distributed.initialize(distributed.DistributedOptions(
    coordinator_address=sys.argv[4], num_processes=2, process_id=int(sys.argv[5]),
    initialization_timeout_s=120))
import jax
from test_curriculum_e2e import tiny_config
from vermem_jax.train import checkpoints, optim, rl_resume
from vermem_jax.train import setup as setup_lib
K, R = sys.argv[1], sys.argv[2]
config = tiny_config('phase_a', **json.loads(sys.argv[3]))
mesh = setup_lib.make_mesh(setup_lib.MeshConfig.from_section(config.model))
template, _ = setup_lib.abstract_train_state(
    setup_lib.model_config_from(config),
    optim.make_optimizer(optim.OptimizerConfig(
        learning_rate=1e-6, total_steps=1, warmup_ratio=0.0,
        lr_schedule='constant')).init, mesh)
out = {'devices': jax.device_count(), 'processes': jax.process_count()}
for name, path, step in (('r_a1', os.path.join(R, 'from_u', 'phase_a'), 1),
                         ('k_a2', os.path.join(K, 'phase_a'), 2)):
  params, _ = checkpoints.restore_params_only(path, template, step=step)
  out[name + '_spans_processes'] = not jax.tree.leaves(params)[0].is_fully_addressable
  out[name + '_sha'] = rl_resume.params_fingerprint(params)
print('RESULT ' + json.dumps(out))
'''


def _result(text):
  lines = [l for l in text.splitlines() if l.startswith('RESULT ')]
  assert lines, text[-3000:]
  return json.loads(lines[-1][len('RESULT '):])


def _script(source):
  return f'REPO = {REPO!r}\n' + source


def _run_command(workdir, port, process_id, *extra_flags):
  return multiprocess.run_py(
      '--config=phase_a.py', f'--workdir={workdir}', *override_flags(**EXTRA),
      *extra_flags, *multiprocess.coordinator_flags(port, 2, process_id))


def _committed(phase_dir, step):
  return os.path.exists(os.path.join(phase_dir, str(step), '_CHECKPOINT_METADATA'))


@pytest.fixture(scope='module')
def scenario(tmp_path_factory):
  root = tmp_path_factory.mktemp('multihost')
  u_dir, k_dir, r_dir = str(root / 'u'), str(root / 'k'), str(root / 'r')
  logs = str(root / 'logs')
  out = {'u': u_dir, 'k': k_dir}

  # U: uninterrupted.
  t0 = time.time()
  port = multiprocess.free_port()
  job = multiprocess.Job([_run_command(u_dir, port, i) for i in range(2)], logs, name='u')
  out['u_returncodes'] = job.wait(RUN_TIMEOUT_S)
  out['u_seconds'] = time.time() - t0
  out['u_logs'] = [job.log(0), job.log(1)]
  assert out['u_returncodes'] == [0, 0], job.log(0)[-3000:] + job.log(1)[-3000:]

  # K: U's workdir as it was after update 1; resume, and kill process 1 during update 2.
  shutil.copytree(u_dir, k_dir)
  phase_a = os.path.join(k_dir, 'phase_a')
  shutil.rmtree(os.path.join(phase_a, '2'))
  os.remove(os.path.join(phase_a, checkpoints.COMPLETE_MARKER))
  port = multiprocess.free_port()
  job = multiprocess.Job([_run_command(k_dir, port, i) for i in range(2)], logs, name='k')
  job.wait_for(lambda: 'phase_a resumes from update 1' in job.log(0), RUN_TIMEOUT_S,
               'the resume from update 1')
  time.sleep(1)  # into update 2: its sampling and learner take seconds even compiled
  job.kill(1)
  time.sleep(3)  # process 0 waits in a collective for its peer: tear the job down
  job.kill_all()
  out['k_returncodes'] = [p.returncode for p in job.procs]
  out['k_step2_committed'] = _committed(phase_a, 2)
  out['k_marker'] = os.path.exists(os.path.join(phase_a, checkpoints.COMPLETE_MARKER))

  # B: restart both processes.
  port = multiprocess.free_port()
  job = multiprocess.Job([_run_command(k_dir, port, i) for i in range(2)], logs, name='b')
  out['b_returncodes'] = job.wait(RUN_TIMEOUT_S)
  out['b_logs'] = [job.log(0), job.log(1)]

  # R: the 1-process reference, and its restores of the 2-process checkpoints.
  proc = subprocess.run(
      [sys.executable, '-c', _script(_REFERENCE), u_dir, k_dir, r_dir,
       json.dumps(EXTRA)],
      env=multiprocess.env_for(8), capture_output=True, text=True,
      timeout=RUN_TIMEOUT_S, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-4000:]
  out['reference'] = _result(proc.stdout)

  # C: 2 processes restore a 1-process and a 2-process checkpoint.
  port = multiprocess.free_port()
  job = multiprocess.Job(
      [[sys.executable, '-c', _script(_RESTORE), k_dir, r_dir, json.dumps(EXTRA),
        f'127.0.0.1:{port}', str(i)] for i in range(2)], logs, name='c')
  assert job.wait(RUN_TIMEOUT_S) == [0, 0], job.log(0)[-3000:] + job.log(1)[-3000:]
  out['restore'] = [_result(job.log(i)) for i in range(2)]
  return out


@pytest.mark.slow  # the shared multi-process scenario takes ~150 s
def test_two_processes_match_one_process_with_eight_devices(scenario):
  ref = scenario['reference']
  print({k: v for k, v in ref.items() if not k.endswith('sha')},
        f'uninterrupted 2-process run: {scenario["u_seconds"]:.0f} s')
  assert ref['devices'] == 8 and ref['processes'] == 1
  assert ref['sft_diff'] <= TOL, ref
  assert ref['a1_diff'] <= TOL, ref
  assert ref['a1_move'] >= 5 * TOL, ref  # the update moved far more than the tolerance
  # The uninterrupted 2-process run ended on its own within the bound.
  assert scenario['u_seconds'] < RUN_TIMEOUT_S


@pytest.mark.slow  # the shared multi-process scenario takes ~150 s
def test_killed_process_and_restart_resume_to_the_same_params(scenario):
  assert scenario['k_returncodes'][1] == -signal.SIGKILL
  assert not scenario['k_step2_committed'], 'update 2 finished before the kill'
  assert not scenario['k_marker']
  assert scenario['b_returncodes'] == [0, 0], scenario['b_logs'][0][-3000:]
  assert 'phase_a resumes from update 1 of 2' in scenario['b_logs'][0]
  ref = scenario['reference']
  # Bit-identical to the uninterrupted run.
  assert ref['k_a2_sha'] == ref['u_a2_sha']
  assert ref['u_a2_sha'] != ref['u_a1_sha']
  with checkpoints.PhaseCheckpointManager(os.path.join(scenario['k'], 'phase_a')) as mgr:
    assert mgr.all_steps() == [1, 2]


@pytest.mark.slow  # the shared multi-process scenario takes ~150 s
def test_only_process_0_writes_metrics_and_logs(scenario):
  u, k = scenario['u'], scenario['k']
  for workdir, phase, steps in ((u, 'sft', [1, 1]), (u, 'phase_a', [1, 2]),
                                (k, 'phase_a', [1, 2])):
    rows = metrics_lib.read_jsonl(os.path.join(workdir, phase, metrics_lib.METRICS_FILE))
    assert [r['step'] for r in rows] == steps, (workdir, phase)  # one writer
  # One TensorBoard file per writer: one per run of a phase (K: U's, killed, resumed).
  for workdir, phase, count in ((u, 'sft', 1), (u, 'phase_a', 1), (k, 'phase_a', 3)):
    files = glob.glob(os.path.join(workdir, phase, 'events.out.tfevents.*'))
    assert len(files) == count, (workdir, phase, files)
  d = os.path.join(u, 'phase_a')
  adv = metrics_lib.read_jsonl(os.path.join(d, metrics_lib.ADVANTAGES_FILE))
  rows = metrics_lib.read_jsonl(os.path.join(d, metrics_lib.METRICS_FILE))
  assert len(adv) == sum(r['train/num_decisions'] for r in rows)
  assert sorted({r['task'] for r in adv}) == [0, 1]  # both processes' task groups
  for name in ('reference.json', checkpoints.COMPLETE_MARKER):
    assert os.path.exists(os.path.join(d, name))
  for log0, log1 in (scenario['u_logs'], scenario['b_logs']):
    assert 'saved checkpoint step 2' in log0
    # Process 1 logs warnings and errors only (JAX's own connect line aside).
    info1 = [l for l in log1.splitlines() if l[:1] == 'I' and l[1:5].isdigit()
             and 'JAX distributed service' not in l]
    assert info1 == [], info1[:5]
  table_header = 'split  target'  # sft_data.records format_table, printed by process 0
  assert table_header in scenario['u_logs'][0]
  assert table_header not in scenario['u_logs'][1]


@pytest.mark.slow  # the shared multi-process scenario takes ~150 s
def test_checkpoints_restore_across_process_counts(scenario):
  ref = scenario['reference']
  for res in scenario['restore']:
    assert res['devices'] == 8 and res['processes'] == 2
    assert res['r_a1_spans_processes'] and res['k_a2_spans_processes']
    # Bit-identical to one process's restore of the same files, both ways: a
    # 1-process checkpoint (R) in 2 processes, a 2-process checkpoint (K) in 1 (R).
    assert res['r_a1_sha'] == ref['r_a1_sha']
    assert res['k_a2_sha'] == ref['k_a2_sha']


def test_bad_input_on_one_process_stops_both_with_one_message(tmp_path):
  port = multiprocess.free_port()
  bad = str(tmp_path / 'missing_data')
  commands = [
      multiprocess.run_py('--config=sft.py', f'--workdir={tmp_path / "w"}',
                          *(['--config.data.data_dir=' + bad] if i == 1 else []),
                          *multiprocess.coordinator_flags(port, 2, i))
      for i in range(2)]
  job = multiprocess.Job(commands, str(tmp_path), name='bad')
  assert job.wait(300) == [2, 2], job.log(0)[-2000:] + job.log(1)[-2000:]
  errors = [[l for l in job.log(i).splitlines() if l.startswith('error: ')]
            for i in range(2)]
  assert errors[0] == errors[1] and len(errors[0]) == 1, errors
  assert bad in errors[0][0] and 'config.data' in errors[0][0]
  assert not os.path.exists(tmp_path / 'w')


def test_hung_peer_fails_instead_of_hanging(tmp_path):
  port = multiprocess.free_port()
  commands = [
      multiprocess.run_py('--config=sft.py', f'--workdir={tmp_path / "w"}',
                          *multiprocess.coordinator_flags(port, 2, 0, timeout_s=600)),
      [sys.executable, '-c', 'import time; time.sleep(600)']]  # never joins
  job = multiprocess.Job(commands, str(tmp_path), name='hung')
  t0 = time.time()
  with pytest.raises(multiprocess.JobTimeout, match=r'processes \[0, 1\] still running'):
    job.wait(6)
  assert time.time() - t0 < 20
  assert all(p.poll() is not None for p in job.procs)
