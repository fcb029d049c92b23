"""One folder per test session, shared by the processes of the session: pytest-xdist
workers and the subprocesses tests start inherit its path from the environment, which
the controlling process sets when tests/conftest.py is loaded (before any worker)."""
import atexit
import os
import shutil
import tempfile

ENV = "VERMEM_TEST_SESSION_DIR"


def ensure() -> str:
  """The session folder: created (and removed at exit) by the first process that
  asks, found in `$VERMEM_TEST_SESSION_DIR` by every later one."""
  if ENV not in os.environ:
    path = tempfile.mkdtemp(prefix="vermem-jax-test-session-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ[ENV] = path
  return os.environ[ENV]
