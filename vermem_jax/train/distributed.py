"""Multi-host runs on JAX's distributed runtime (DESIGN.md "Scale").

One command runs on every host of a TPU pod slice or of a multi-node GPU job. Each
host's process drives its local devices; all processes share one global
('data', 'fsdp', 'tensor') mesh over every device (`setup.make_mesh`), so every
jitted step is one SPMD program. This module is the process-aware layer the trainers
use; with one process every helper is the identity or a plain local call.

  initialize(options)        jax.distributed.initialize from flags, or automatically
                             where JAX detects a multi-process cluster (Cloud TPU pod
                             slices, SLURM, Open MPI); single-process otherwise;
                             pathwaysutils when asked
  process_index / process_count / is_primary
  share(n)                   this process's contiguous block of n work items
  ProcessGroup, process_group()   the object exchange the rl/ layer is given
  allgather_object / broadcast_object
  agree(fn) / on_primary(fn) the same result, or the same error, on every process
  check_same(what, value)    fails on every process when the processes disagree
  barrier(name)
  global_batch_array(x, sharding)  a learner-batch array from the rows this process's
                             devices hold (`jax.make_array_from_process_local_data`)
  to_host(x)                 a NumPy copy of any array (gathers shards other processes
                             hold)

Who does what in a run with P processes:
- Every process builds the config, data and episodes (seeded, so identical; digests
  are compared across processes and a mismatch stops the run), runs every jitted step
  on its devices' shards, and calls Orbax save / restore (each process writes the
  shards it holds; Orbax's primary host writes the metadata and commits the step).
- SFT: every process derives the same global micro-batch plan from the seeded data
  order; each places only the rows its devices hold.
- RL: update n's T tasks are split into P contiguous blocks. Each process runs its
  tasks' K rollouts (environment, task solver, verifiers, group rewards and
  A^global need no cross-host traffic); its policy calls join one collective sampler
  call per decision step (rl/policy.py); the per-decision inputs of A^local (batch
  statistics per op type, then the running statistics) are gathered so every process
  computes the same advantages (rl/rollout.py); the learner sees the gathered
  decisions as global arrays.
- Process 0 only: the per-phase lock, `phase_complete.json`, `metrics.jsonl`,
  TensorBoard events, `advantages.jsonl`, `reference.json`, `sft_data_counts.txt`,
  progress bars and INFO logs (the others log warnings and errors only).

Object exchange pickles Python objects and moves them as uint8 arrays through
`multihost_utils.process_allgather` (the runtime's collective path), lengths padded to
powers of two so the number of compiled exchange programs stays small. Every call is a
collective: all processes must make the same sequence of calls.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
from typing import Any, Callable, Optional, Sequence, TypeVar

from absl import logging
import jax
import numpy as np

from vermem_jax.rl import process_split

T = TypeVar('T')

# Cluster environments whose launchers start one process per host / task and that
# jax.distributed.initialize() configures by itself (JAX's class names).
AUTO_CLUSTERS = ('GceTpuCluster', 'GkeTpuCluster', 'SlurmCluster', 'OmpiCluster')
MODES = ('auto', 'off')
# Smallest exchange buffer (bytes); buffers are powers of two above it.
_MIN_EXCHANGE_BYTES = 256


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
  """How `initialize` joins the processes (experiments/run.py flags of the same names).

  Attributes:
    coordinator_address: 'host:port' of process 0 (all processes pass the same).
    num_processes: number of processes in the job.
    process_id: this process's id in [0, num_processes).
    local_device_ids: devices this process drives (default: all local ones, or one per
      process under SLURM / Open MPI on GPUs, JAX's rule).
    mode: 'auto' = initialize when any of the fields above (or JAX_COORDINATOR_ADDRESS)
      is set, or when JAX detects a multi-process cluster; 'off' = never.
    initialization_timeout_s: seconds to wait for all processes to join.
    pathways: use pathwaysutils (a single controller sees every device; no
      jax.distributed.initialize).
  """
  coordinator_address: Optional[str] = None
  num_processes: Optional[int] = None
  process_id: Optional[int] = None
  local_device_ids: Optional[tuple[int, ...]] = None
  mode: str = 'auto'
  initialization_timeout_s: int = 300
  pathways: bool = False

  @property
  def explicit(self) -> bool:
    """Whether a flag or JAX_COORDINATOR_ADDRESS asks for the distributed runtime."""
    return (any(v is not None for v in (self.coordinator_address, self.num_processes,
                                        self.process_id, self.local_device_ids))
            or bool(os.environ.get('JAX_COORDINATOR_ADDRESS')))


def detected_cluster() -> Optional[tuple[str, int]]:
  """(JAX cluster class name, process count) of a detected TPU pod slice / SLURM /
  Open MPI environment, or None.

  Uses the cluster classes `jax.distributed.initialize()` walks (a private JAX module;
  None when it is unavailable). Kubernetes and mpi4py detection are opt-in in JAX and
  not used here.
  """
  try:
    from jax._src import clusters  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  for env in clusters.ClusterEnv._cluster_types:  # pylint: disable=protected-access
    if env.__name__ not in AUTO_CLUSTERS:
      continue
    try:
      if env.is_env_present():
        return env.__name__, int(env.get_process_count())
    except Exception:  # pylint: disable=broad-except
      continue  # a half-configured environment: JAX would fail on it too
  return None


def initialize(options: DistributedOptions = DistributedOptions()) -> str:
  """Joins the job's processes before any JAX computation; returns what was done.

  - pathways: `pathwaysutils.initialize()` (single controller; process 0 sees all
    devices).
  - mode 'off': nothing (single process).
  - any of coordinator_address / num_processes / process_id / local_device_ids (or
    JAX_COORDINATOR_ADDRESS): `jax.distributed.initialize` with them (missing ones
    auto-detected by JAX where it can).
  - otherwise, a detected TPU pod slice / SLURM / Open MPI job with more than one
    process: `jax.distributed.initialize()` (JAX fills everything in). A one-process
    job stays a plain single process (under SLURM JAX would otherwise limit a GPU
    process to one device).
  On CPU the cross-process collectives are gloo (`jax_cpu_collectives_implementation`,
  JAX 0.10's default, set explicitly).

  Returns:
    'pathways', 'single' or 'distributed (<source>): process i of P'.
  Raises:
    ValueError: a bad flag combination or missing job layout (names the flags), or
      pathways without the package. Processes that do not all join within
      `initialization_timeout_s` are aborted by JAX's runtime (not catchable).
  """
  if options.mode not in MODES:
    raise ValueError(f'--distributed must be one of {MODES}, got {options.mode!r}')
  if options.pathways:
    try:
      import pathwaysutils  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ValueError('--pathways needs the pathwaysutils package (pip install '
                       'pathwaysutils); leave the flag off on plain multi-controller '
                       'JAX') from e
    pathwaysutils.initialize()
    return 'pathways'
  if options.mode == 'off':
    if options.explicit:
      raise ValueError('--distributed=off contradicts --coordinator_address / '
                       '--num_processes / --process_id / --local_device_ids')
    return 'single'
  if jax.distributed.is_initialized():
    return f'distributed (already initialized): {_describe()}'
  if options.explicit:
    source = 'flags'
  else:
    found = detected_cluster()
    if found is None or found[1] <= 1:
      return 'single'
    source = found[0]
  if options.num_processes is not None and options.num_processes < 1:
    raise ValueError(f'--num_processes must be >= 1, got {options.num_processes}')
  if options.process_id is not None and options.num_processes is not None and not (
      0 <= options.process_id < options.num_processes):
    raise ValueError(f'--process_id must be in [0, --num_processes={options.num_processes}'
                     f'), got {options.process_id}')
  if _platform_is_cpu():
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  try:
    jax.distributed.initialize(
        coordinator_address=options.coordinator_address,
        num_processes=options.num_processes, process_id=options.process_id,
        local_device_ids=(list(options.local_device_ids)
                          if options.local_device_ids is not None else None),
        initialization_timeout=int(options.initialization_timeout_s))
  except (ValueError, TypeError) as e:
    raise ValueError(f'jax.distributed.initialize ({source}): {e}; pass '
                     '--coordinator_address, --num_processes and --process_id') from e
  return f'distributed ({source}): {_describe()}'


def _platform_is_cpu() -> bool:
  platforms = (os.environ.get('JAX_PLATFORMS') or jax.config.jax_platforms or '')
  return platforms.split(',')[0].strip().lower() == 'cpu'


def _describe() -> str:
  return (f'process {jax.process_index()} of {jax.process_count()}, '
          f'{jax.local_device_count()} local of {jax.device_count()} devices')


# ----------------------------------------------------------------------------- processes
def process_index() -> int:
  """This process's index (0 = the primary, which writes logs and markers)."""
  return int(jax.process_index())


def process_count() -> int:
  """Number of processes in the job (1 without the distributed runtime)."""
  return int(jax.process_count())


def is_primary() -> bool:
  """Whether this process writes the run's files (process 0)."""
  return process_index() == 0


def share(n: int, index: Optional[int] = None,
          count: Optional[int] = None) -> tuple[int, int]:
  """[start, stop) of this process's contiguous block of n items (earlier processes
  take one more when n does not divide; `process_split.block`)."""
  return process_split.block(n, process_index() if index is None else int(index),
                             process_count() if count is None else int(count))


def _bucket(n: int) -> int:
  return max(_MIN_EXCHANGE_BYTES, 1 << max(0, int(n) - 1).bit_length())


def allgather_object(obj: Any) -> list[Any]:
  """[object of process 0, ..., object of process P-1] on every process (a collective).

  Objects are pickled; use plain data (NumPy arrays, dataclasses of this package).
  """
  if process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(
      np.asarray([data.size], np.int64))).reshape(-1)
  buf = np.zeros((_bucket(int(sizes.max())),), np.uint8)
  buf[:data.size] = data
  everyone = np.asarray(multihost_utils.process_allgather(buf))
  return [pickle.loads(everyone[i, :int(s)].tobytes()) for i, s in enumerate(sizes)]


def broadcast_object(obj: Any) -> Any:
  """Process 0's `obj` on every process (a collective; others' `obj` is ignored)."""
  if process_count() == 1:
    return obj
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  data = (np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
          if is_primary() else np.zeros((0,), np.uint8))
  size = int(np.asarray(multihost_utils.broadcast_one_to_all(
      np.asarray([data.size], np.int64)))[0])
  buf = np.zeros((_bucket(size),), np.uint8)
  buf[:data.size] = data
  out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
  return pickle.loads(out[:size].tobytes())


def barrier(name: str) -> None:
  """Waits until every process reached the barrier `name`."""
  if process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def agree(fn: Callable[[], T]) -> T:
  """Runs `fn` on every process; if it raised on any, every process raises the error of
  the lowest such process (same type and message), so all stop together.

  Use it around host-only work whose failure can differ between processes (file
  checks, data loading, a lock): without it one process would stop while the others
  wait in the next collective.
  """
  if process_count() == 1:
    return fn()
  return process_split.run_and_share(fn, allgather_object, process_index(),
                                     share=lambda _: None)[0]


def on_primary(fn: Callable[[], T]) -> T:
  """`fn()` run on process 0 only; its result (or its error) on every process.

  For work that must happen once (a verifier-scored statistics init, a plan read from
  files process 0 writes).
  """
  if process_count() == 1:
    return fn()
  own, result = None, None
  if is_primary():
    try:
      result = fn()
    except Exception as e:  # pylint: disable=broad-except
      own = e
  outcome = broadcast_object(
      (None if own is None else process_split.portable_error(own), result))
  if outcome[0] is not None:
    raise own if own is not None else outcome[0]
  return outcome[1]


def digest(obj: Any) -> str:
  """SHA-256 of the pickled `obj` (for `check_same`)."""
  return hashlib.sha256(pickle.dumps(obj, protocol=4)).hexdigest()


def check_same(what: str, value: Any) -> None:
  """Raises ValueError on every process when `value` (a digest or small object)
  differs between processes, naming `what` and the processes that differ."""
  if process_count() == 1:
    return
  values = allgather_object(value)
  differ = [i for i, v in enumerate(values) if v != values[0]]
  if differ:
    raise ValueError(f'{what} differs between processes (process 0 vs {differ}); every '
                     'process must build the same data: check that all hosts read the '
                     'same files and config')


class ProcessGroup:
  """The processes of this job, as the rl/ layer sees them (rl does not import train):
  `index`, `count` and `allgather(obj) -> [obj of each process]`."""

  def __init__(self):
    self.index = process_index()
    self.count = process_count()

  def allgather(self, obj: Any) -> list[Any]:
    return allgather_object(obj)

  def __repr__(self) -> str:
    return f'ProcessGroup(index={self.index}, count={self.count})'


def process_group() -> Optional[ProcessGroup]:
  """A ProcessGroup when the job has several processes, else None (the single-process
  code paths)."""
  return ProcessGroup() if process_count() > 1 else None


# ----------------------------------------------------------------------------- arrays
def local_rows(sharding: jax.sharding.Sharding, global_shape: Sequence[int]) -> slice:
  """The rows (leading axis) of a `global_shape` array that this process's devices hold
  under `sharding`, as one slice.

  Raises:
    ValueError: this process holds non-contiguous rows (a mesh whose device order
      interleaves processes along the batch axes).
  """
  index_map = sharding.addressable_devices_indices_map(tuple(global_shape))
  n = int(global_shape[0])
  starts, stops = [], []
  for idx in index_map.values():
    rows = idx[0] if idx else slice(None)
    start, stop, _ = rows.indices(n)
    starts.append(start)
    stops.append(stop)
  lo, hi = min(starts), max(stops)
  covered = np.zeros((n,), bool)
  for a, b in zip(starts, stops):
    covered[a:b] = True
  if not covered[lo:hi].all():
    raise ValueError(f'process {process_index()} holds non-contiguous rows of a '
                     f'{tuple(global_shape)} batch under {sharding}')
  return slice(lo, hi)


def global_batch_array(value: Any, sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array from the full host value `value` (the same on every process): each
  process passes only the rows its devices hold
  (`jax.make_array_from_process_local_data`). One process: `jax.device_put`."""
  if process_count() == 1 or np.ndim(value) == 0:
    return jax.device_put(value, sharding)
  value = np.asarray(value)
  rows = local_rows(sharding, value.shape)
  return jax.make_array_from_process_local_data(sharding, value[rows], value.shape)


def to_host(x: Any) -> np.ndarray:
  """NumPy value of `x`; a jax.Array whose shards live partly on other processes is
  gathered first (`multihost_utils.process_allgather`, a collective)."""
  if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def tree_to_host(tree: Any) -> Any:
  """`to_host` on every leaf of a pytree."""
  return jax.tree.map(to_host, tree)


def log_setup(description: str) -> None:
  """Logs how the run joined its processes (every process, at INFO on process 0)."""
  logging.info('JAX runtime: %s; %d devices (%d local)', description,
               jax.device_count(), jax.local_device_count())


def quiet_non_primary() -> None:
  """Non-primary processes log warnings and errors only (process 0 writes the log)."""
  if process_count() > 1 and not is_primary():
    if logging.get_verbosity() == logging.INFO:  # `-v 1` keeps debug logs everywhere
      logging.set_verbosity(logging.WARNING)

