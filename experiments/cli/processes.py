"""Multi-host flags of experiments/run.py and the process-0 duties of a run.

The same command runs on every host (TPU pod slice workers, SLURM tasks); see the
docs/distributed.md ("Multi-host runs"). Flags, passed to `jax.distributed.initialize`:

  --coordinator_address=host:port  process 0's address (same on every process)
  --num_processes=N --process_id=i  the job size and this process's id
  --local_device_ids=0,1,...       the devices this process drives
  --distributed=auto|off           auto (default): initialize when any flag above (or
                                   JAX_COORDINATOR_ADDRESS) is set or JAX detects a
                                   multi-process TPU pod slice / SLURM / Open MPI job;
                                   off: always one process
  --distributed_timeout_s=300      how long to wait for every process to join
  --pathways                       use pathwaysutils (single controller), if installed

Process 0 holds the per-phase lock and writes the phase_complete markers; a failure to
take the lock stops every process with the same message (`phase_lock`).
"""

from __future__ import annotations

import contextlib

from absl import flags

from experiments.cli import workdir_lock

_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'Multi-host: host:port of process 0, the same on every '
    'process (jax.distributed.initialize).')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None, 'Multi-host: number of processes in the job.')
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', None, 'Multi-host: this process\'s id in [0, --num_processes).')
_LOCAL_DEVICE_IDS = flags.DEFINE_list(
    'local_device_ids', None, 'Multi-host: comma-separated ids of the local devices '
    'this process drives (default: all, or one per process under SLURM / Open MPI on '
    'GPUs).')
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', ['auto', 'off'], 'auto: join a multi-process job when '
    '--coordinator_address / --num_processes / --process_id are set or JAX detects a '
    'TPU pod slice / SLURM / Open MPI job with more than one process; off: always a '
    'single process.')
_TIMEOUT = flags.DEFINE_integer(
    'distributed_timeout_s', 300, 'Seconds to wait for every process to join.')
_PATHWAYS = flags.DEFINE_bool(
    'pathways', False, 'Run under Pathways via pathwaysutils (must be installed).')


def options_from_flags():
  """`distributed.DistributedOptions` from the flags.

  Raises:
    ValueError: --local_device_ids not a list of non-negative integers.
  """
  from vermem_jax.train import distributed  # pylint: disable=g-import-not-at-top
  ids = _LOCAL_DEVICE_IDS.value
  if ids is not None:
    try:
      ids = tuple(int(i) for i in ids)
    except ValueError:
      raise ValueError(f'--local_device_ids={",".join(ids)}: expected comma-separated '
                       'device numbers, e.g. 0,1,2,3') from None
    if any(i < 0 for i in ids):
      raise ValueError(f'--local_device_ids: device numbers must be >= 0, got {ids}')
  return distributed.DistributedOptions(
      coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value, local_device_ids=ids, mode=_DISTRIBUTED.value,
      initialization_timeout_s=_TIMEOUT.value, pathways=_PATHWAYS.value)


def start() -> str:
  """Joins the job's processes (before any JAX computation) and quiets the INFO logs of
  processes other than 0; returns how the runtime was set up.

  Raises:
    ValueError: bad flags, a missing pathwaysutils, or a failed join.
  """
  from vermem_jax.train import distributed  # pylint: disable=g-import-not-at-top
  how = distributed.initialize(options_from_flags())
  distributed.quiet_non_primary()
  distributed.log_setup(how)
  return how


@contextlib.contextmanager
def phase_lock(workdir: str, phase: str):
  """`workdir_lock.phase_lock`, held by process 0 alone; every process raises the same
  PhaseLockedError when process 0 cannot take it."""
  from vermem_jax.train import distributed  # pylint: disable=g-import-not-at-top
  if distributed.process_count() == 1:
    with workdir_lock.phase_lock(workdir, phase) as path:
      yield path
    return
  with contextlib.ExitStack() as stack:
    def take():
      if distributed.is_primary():
        return stack.enter_context(workdir_lock.phase_lock(workdir, phase))
      return None
    yield distributed.agree(take)


def check_config(config, plan) -> None:
  """Settings a multi-process run needs, checked before any phase trains.

  Raises:
    ValueError: an RL phase in `plan` with fewer tasks per update than processes
      (`rl_setup.check_tasks_split`).
  """
  from vermem_jax.train import distributed  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import rl_setup  # pylint: disable=g-import-not-at-top
  if any(p != 'sft' for p in plan):
    rl_setup.check_tasks_split(int(config.rl.tasks_per_update),
                               distributed.process_count())
