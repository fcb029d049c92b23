"""One run per phase and workdir: an exclusive lock on `<workdir>/<phase>/.lock`."""

from __future__ import annotations

import contextlib
import fcntl
import os

from experiments.cli import phase_plan


class PhaseLockedError(RuntimeError):
  """Another process is running the same phase in the same workdir."""


@contextlib.contextmanager
def phase_lock(workdir: str, phase: str):
  """Holds an exclusive, non-blocking `fcntl.flock` on `<workdir>/<phase>/.lock`.

  Two runs writing one phase's checkpoints and metrics.jsonl would clobber each other.
  The lock dies with its process, so a lock file left by a killed run does not block.
  Creates the phase folder; if the phase leaves it holding only the lock file (it
  failed before writing anything), the folder is removed again.

  Raises:
    PhaseLockedError: another process holds the lock (names the folder and workdir).
  """
  d = phase_plan.phase_dir(workdir, phase)
  os.makedirs(d, exist_ok=True)
  lock_path = os.path.join(d, '.lock')
  fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    raise PhaseLockedError(
        f'another run holds {lock_path}: it is running {phase} in workdir {workdir}. '
        'Wait for it to finish, or pass a different --workdir') from None
  try:
    os.ftruncate(fd, 0)
    os.write(fd, f'{os.getpid()}\n'.encode())
    yield lock_path
  finally:
    try:
      if os.listdir(d) == ['.lock']:
        os.unlink(lock_path)
        os.rmdir(d)
    except OSError:
      pass
    os.close(fd)  # releases the flock
