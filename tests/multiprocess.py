"""Runs commands as the processes of one JAX job on this machine (loopback).

Each process gets `--xla_force_host_platform_device_count=<devices>` CPU devices; the
caller passes the coordinator flags (`free_port()` for the address). `Job.wait` bounds
the run: processes still alive at the deadline are all killed and `JobTimeout` is
raised, so a hung peer fails a test instead of hanging it. Output goes to one log file
per process (`Job.log(i)`).
"""
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _die_with_parent() -> None:
  """Child-side: SIGKILL this process when the test process dies (Linux prctl
  PR_SET_PDEATHSIG), so a test runner killed from outside (a CI or `timeout` deadline)
  leaves no JAX processes behind; elsewhere a no-op."""
  if sys.platform.startswith('linux'):
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class JobTimeout(AssertionError):
  """Some processes were still running at the deadline (all were killed)."""


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def env_for(devices: int, **extra) -> dict:
  """Environment of one process: CPU backend with `devices` devices."""
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
             PYTHONPATH=os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')]))
  env.update(extra)
  return env


class Job:
  """Processes started together; `commands[i]` is process i's argv."""

  def __init__(self, commands, log_dir, *, devices: int = 4, env=None, name='job'):
    os.makedirs(log_dir, exist_ok=True)
    self.logs = [os.path.join(log_dir, f'{name}.p{i}.log') for i in range(len(commands))]
    self.procs = []
    for cmd, log in zip(commands, self.logs):
      with open(log, 'w') as f:
        self.procs.append(subprocess.Popen(
            cmd, cwd=REPO, env=env or env_for(devices), stdout=f,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent))

  def log(self, i: int) -> str:
    with open(self.logs[i], errors='replace') as f:
      return f.read()

  def kill(self, i: int, sig=signal.SIGKILL) -> None:
    if self.procs[i].poll() is None:
      os.killpg(self.procs[i].pid, sig)

  def kill_all(self) -> None:
    for i in range(len(self.procs)):
      self.kill(i)
    for p in self.procs:
      p.wait()

  def wait(self, timeout: float) -> list[int]:
    """Return codes once every process exited; JobTimeout after killing them all when
    some are still running after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
      if all(p.poll() is not None for p in self.procs):
        return [p.returncode for p in self.procs]
      time.sleep(0.2)
    alive = [i for i, p in enumerate(self.procs) if p.poll() is None]
    self.kill_all()
    tails = '\n'.join(f'--- process {i}:\n{self.log(i)[-2000:]}' for i in alive)
    raise JobTimeout(f'processes {alive} still running after {timeout:.0f} s (killed):\n'
                     + tails)

  def wait_for(self, condition, timeout: float, what: str) -> None:
    """Polls `condition()` until true; kills the job and fails when a process exits or
    the deadline passes first."""
    deadline = time.time() + timeout
    while not condition():
      dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
      if dead or time.time() > deadline:
        self.kill_all()
        why = f'processes {dead} exited' if dead else f'{timeout:.0f} s passed'
        raise AssertionError(f'{why} before {what}:\n' + '\n'.join(
            f'--- process {i}:\n{self.log(i)[-2000:]}' for i in range(len(self.procs))))
      time.sleep(0.1)


def run_py(*args) -> list[str]:
  """argv of experiments/run.py with `args`."""
  return [sys.executable, os.path.join(REPO, 'experiments', 'run.py'), *args]


def coordinator_flags(port: int, num_processes: int, process_id: int,
                      timeout_s: int = 60) -> list[str]:
  return [f'--coordinator_address=127.0.0.1:{port}', f'--num_processes={num_processes}',
          f'--process_id={process_id}', f'--distributed_timeout_s={timeout_s}']
