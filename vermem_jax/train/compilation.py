"""Compiled XLA programs of a run: a counter and the persistent compilation cache.

Counter
-------
JAX announces every program it asks XLA for through `jax.monitoring`: the event
'/jax/core/compile/backend_compile_duration' (jax/_src/dispatch.py
`BACKEND_COMPILE_EVENT`, recorded around `compiler.compile_or_get_cached`) fires once
per program, whether XLA compiles it or the persistent cache supplies it, and
'/jax/compilation_cache/cache_hits' (jax/_src/compiler.py) fires for the latter. So

    programs compiled     = backend-compile events - cache hits
    programs from cache   = cache hits

A program jit finds in its in-memory cache raises neither event (no XLA work). The
listeners are registered once per process (`install`); `snapshot()` reads the
process-wide totals and `CompileCounts` differences give a phase's or an update's own
figures. `train/phase_runner.py` writes them into every metrics row
(`compile/programs`, `compile/cache_hits` per step, `compile/after_first_step`
cumulative) and the phase summary prints "programs compiled: N; after update 1: M"
(docs/compilation.md).

Persistent cache
----------------
`CompilationCacheConfig` (config section `runtime`) names the directory XLA
executables are written to and read from across processes (`jax_compilation_cache_dir`)
and the two thresholds below which a program is not written. `apply` sets them once
at process start (`experiments/run.py`); '' turns the cache off.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Mapping

import jax
from jax.experimental.compilation_cache import compilation_cache

from vermem_jax import config_util

# jax 0.10 event names (module docstring).
BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'
CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'

_LOCK = threading.Lock()
_TOTALS = {'requested': 0, 'cache_hits': 0}
# The name of every program requested, in order (the event's `fun_name`).
_NAMES: list[str] = []
_INSTALLED = False


@dataclasses.dataclass(frozen=True)
class CompileCounts:
  """Programs JAX asked XLA for (`requested`) and how many of them the persistent
  cache supplied (`cache_hits`); `compiled` = requested - cache_hits."""
  requested: int = 0
  cache_hits: int = 0

  @property
  def compiled(self) -> int:
    return self.requested - self.cache_hits

  def __sub__(self, other: 'CompileCounts') -> 'CompileCounts':
    return CompileCounts(self.requested - other.requested,
                         self.cache_hits - other.cache_hits)


def _on_duration(event: str, duration: float, **kwargs: Any) -> None:
  del duration
  if event == BACKEND_COMPILE_EVENT:
    with _LOCK:
      _TOTALS['requested'] += 1
      _NAMES.append(str(kwargs.get('fun_name', '?')))


def _on_event(event: str, **kwargs: Any) -> None:
  del kwargs
  if event == CACHE_HIT_EVENT:
    with _LOCK:
      _TOTALS['cache_hits'] += 1


def install() -> None:
  """Registers the two `jax.monitoring` listeners (once per process; idempotent)."""
  global _INSTALLED
  with _LOCK:
    if _INSTALLED:
      return
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)
    _INSTALLED = True


def snapshot() -> CompileCounts:
  """Process-wide totals since `install` (installs the listeners on first use, so
  the first snapshot reads zero)."""
  install()
  with _LOCK:
    return CompileCounts(**_TOTALS)


def program_names(since: CompileCounts) -> list[str]:
  """Names of the programs requested after the snapshot `since` (jit's function
  names, e.g. 'jit(_generate_jit)'), in order: what to look at when a step compiles."""
  with _LOCK:
    return list(_NAMES[since.requested:])


@dataclasses.dataclass(frozen=True)
class CompilationCacheConfig:
  """The persistent compilation cache (config section `runtime`; field names = keys).

  Attributes:
    compilation_cache_dir: directory of the cache ('' = off; the config's default is
      `paths.default_compilation_cache_dir()`). Any path jax's file cache accepts, a
      shared filesystem or a `gs://` bucket included (docs/compilation.md).
    cache_min_compile_time_secs: programs that compiled faster than this (seconds)
      are not written (`jax_persistent_cache_min_compile_time_secs`).
    cache_min_entry_size_bytes: executables smaller than this (bytes) are not
      written (`jax_persistent_cache_min_entry_size_bytes`; -1 = no limit).
  """
  compilation_cache_dir: str = ''
  cache_min_compile_time_secs: float = 1.0
  cache_min_entry_size_bytes: int = 0

  def __post_init__(self):
    if not isinstance(self.compilation_cache_dir, str):
      raise ValueError('runtime.compilation_cache_dir must be a path string (\'\' = '
                       f'off), got {self.compilation_cache_dir!r}')
    if not self.cache_min_compile_time_secs >= 0:
      raise ValueError('runtime.cache_min_compile_time_secs must be >= 0, got '
                       f'{self.cache_min_compile_time_secs!r}')
    if (isinstance(self.cache_min_entry_size_bytes, bool)
        or int(self.cache_min_entry_size_bytes) != self.cache_min_entry_size_bytes
        or self.cache_min_entry_size_bytes < -1):
      raise ValueError('runtime.cache_min_entry_size_bytes must be an int >= -1, got '
                       f'{self.cache_min_entry_size_bytes!r}')

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> 'CompilationCacheConfig':
    """From config section `runtime` (its other keys are ignored).

    Raises:
      ValueError: a bad value, naming `runtime.<field>`.
    """
    return config_util.dataclass_from_mapping(cls, section)

  def apply(self) -> None:
    """Sets jax's cache directory and thresholds for this process and installs the
    compile counter. A directory other than the one jax already uses resets jax's
    cache object so the new one takes effect (tests run phases of several configs in
    one process)."""
    install()
    path = os.path.expanduser(self.compilation_cache_dir) if self.compilation_cache_dir else None
    if jax.config.jax_compilation_cache_dir != path:
      compilation_cache.reset_cache()
      jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs',
                      float(self.cache_min_compile_time_secs))
    jax.config.update('jax_persistent_cache_min_entry_size_bytes',
                      int(self.cache_min_entry_size_bytes))


def summary_line(result: Mapping[str, Any], unit: str = 'update') -> str | None:
  """The phase summary's compile line from a phase result's compile figures
  (`phase_runner.PhaseRunner.compile_figures`); None when it has none."""
  if 'compile/programs_total' not in result:
    return None
  return (f'programs compiled: {int(result["compile/programs_total"])} '
          f'(+{int(result["compile/cache_hits_total"])} from the persistent cache); '
          f'after {unit} 1: {int(result["compile/after_first_step"])}')
