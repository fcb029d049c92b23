"""Orbax checkpoints, one CheckpointManager per phase directory (DESIGN.md).

Layout: `workdir/<phase>/` (`sft`, `phase_a`, `phase_b`, `phase_c`) holds Orbax step
directories `<step>/` with three items:

- `params` — the policy parameter pytree (StandardSave; restored into a template's
  shapes/dtypes/shardings, or as plain arrays without one);
- `train`  — `{'opt_state': ..., 'rng': uint32 key data}` (StandardSave), present when the
  state has them;
- `meta`   — JSON: `step`, `running_stats` (the phase's running local statistics, a dict),
  `data_position` (data-iterator position, any JSON value), `metadata` (free JSON),
  `selection_metrics` (the metrics that pick the best checkpoint), `rng_impl`.

A checkpoint's step is the number of completed updates (RL) or optimizer steps (SFT), so
resuming from step s continues with update s + 1.

Guarantees:
- `save` refuses parameters holding NaN or Inf (CheckpointError, nothing written).
- Saving is off the critical path (Orbax async checkpointing, `async_save=True`, config
  `checkpoint.async_save`): `save` returns once the arrays are copied off the devices
  and the files are written by a background thread while training continues. The next
  `save`, every query and restore, and `close` first wait for it and raise
  `CheckpointError` if it failed, so nothing ever reads a step that is still being
  written. With `async_save=False`, `save` returns only after the commit.
- Orbax writes a step into a temporary directory and renames it when complete, so a
  process killed mid-save (in the background or not) leaves only a
  `<step>.orbax-checkpoint-tmp-*` folder, which is not a step; the previous step stays
  intact, and a resume starts from it exactly (redoing the later updates).
- `restore()` (latest) falls back step by step to the newest restorable checkpoint,
  logging a warning that names each bad step and its error. Nothing is deleted: when a
  later save reaches a step number held by an unrestorable checkpoint, that directory is
  moved to `<phase_dir>/unrestorable/<step>-<UTC time>/` (logged) so Orbax can write the
  step again. If no checkpoint is restorable, `CheckpointError` lists every error.
- Retention: the newest `max_to_keep` steps, plus the best step by `selection_metrics`
  (SFT: dev tool accuracy, ties broken by a lower invalid rate, SPEC §4, a full tie on
  both going to the later step; RL phases: the internal-dev score, paper C.8, ties to
  the lower dev invalid rate, then to the later step). A best step that is no longer
  among the newest `max_to_keep` keeps its `params` and `meta` only: its `train` item
  (optimizer state and key, twice the parameters under AdamW) is removed after the next
  save commits, because it is read as parameters only (`restore_params_only`: the next
  phase's start and π_ref, evaluation) while resuming starts from the newest step.
  Restoring such a step with an optimizer-state template raises CheckpointError.

Silent bit flips inside array files are not detected (no checksums); truncated, missing
or unparsable files are.

Multi-host (train/distributed.py): every process calls `save` / `restore` with the same
arguments; Orbax writes each process's shards and commits on its primary host. Moving
unrestorable steps aside is done by process 0 while the others wait; the phase-complete
marker is written by the caller on process 0 only (experiments/run.py). The RNG key is
stored as a host array, so a checkpoint restores under any process / device count.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import shutil
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp_lib

from vermem_jax.train import checkpoint_values
from vermem_jax.train import distributed
from vermem_jax.train.checkpoint_values import CheckpointError
from vermem_jax.train.checkpoint_selection import selection_key
from vermem_jax.train import nonfinite

PyTree = Any
_ITEMS = ('params', 'train', 'meta')
UNRESTORABLE_DIR = 'unrestorable'
COMPLETE_MARKER = 'phase_complete.json'


@dataclasses.dataclass
class TrainState:
  """Everything a killed run needs to resume exactly.

  Attributes:
    step: completed updates (RL) / optimizer steps (SFT); the checkpoint's step.
    params: policy parameter pytree (see models/qwen.py for its layout).
    opt_state: optax state pytree, or None.
    rng: a JAX PRNG key (raw uint32 `[2]` from `jax.random.PRNGKey`, or a typed key from
      `jax.random.key`), or None.
    running_stats: running local-advantage statistics per operation type (SPEC §6); a
      JSON-serializable dict (NumPy/JAX scalars and arrays are converted on save).
    data_position: data-iterator position (JSON value: int, dict, ...).
    metadata: free JSON metadata (config snapshot, wall time, ...).
  """
  step: int
  params: PyTree
  opt_state: PyTree = None
  rng: Any = None
  running_stats: dict = dataclasses.field(default_factory=dict)
  data_position: Any = None
  metadata: dict = dataclasses.field(default_factory=dict)


def phase_dir(workdir: str | os.PathLike, phase: str) -> str:
  """`workdir/<phase>` as an absolute path string (Orbax needs absolute paths)."""
  return str(pathlib.Path(workdir).expanduser().resolve() / phase)


def _abstract(tree: PyTree) -> PyTree:
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class _KeepStep(pp_lib.PreservationPolicy):
  """Preserves the step returned by a callback (the best SFT step), if any."""

  def __init__(self, get_step: Callable[[], int | None]):
    self._get_step = get_step

  def should_preserve(self, checkpoints, *, context):
    keep = self._get_step()
    return [info.step == keep for info in checkpoints]


class PhaseCheckpointManager:
  """One Orbax CheckpointManager for one phase directory (`workdir/<phase>`).

  Args:
    directory: the phase directory (created if missing).
    max_to_keep: newest checkpoints kept (config `checkpoint.max_to_keep`); the best one
      by `selection_metrics` is kept in addition.
    best_key: ranks `selection_metrics` (larger is better); default `selection_key`
      (SFT: dev tool accuracy then invalid rate; RL: internal-dev score, then invalid
      rate, ties to the later step).
    async_save: write checkpoints in a background thread (module docstring; config
      `checkpoint.async_save`).
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
               best_key: Callable[[Mapping[str, float]], Any] = selection_key,
               async_save: bool = True):
    if max_to_keep < 1:
      raise ValueError(f'max_to_keep must be >= 1, got {max_to_keep}')
    self.directory = str(pathlib.Path(directory).expanduser().resolve())
    os.makedirs(self.directory, exist_ok=True)
    self._best_key = best_key
    self._unrestorable: dict[int, str] = {}
    self._best: tuple[Any, int] | None = None
    self._pending: int | None = None  # step being written in the background
    self._async = bool(async_save)
    self._max_to_keep = max_to_keep
    options = ocp.CheckpointManagerOptions(
        create=True,
        enable_async_checkpointing=bool(async_save),
        preservation_policy=pp_lib.AnyPreservationPolicy([
            pp_lib.LatestN(n=max_to_keep), _KeepStep(self.best_step)]),
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=_ITEMS)
    self._scan_best()

  # ----------------------------------------------------------------- queries
  def wait_until_finished(self) -> None:
    """Blocks until a background save is committed.

    Raises:
      CheckpointError: the background save failed or did not produce its step.
    """
    if self._pending is None:
      return
    step, self._pending = self._pending, None
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f'saving step {step} in {self.directory} failed: '
                            f'{type(e).__name__}: {e}') from e
    if step not in self._manager.all_steps():
      raise CheckpointError(f'Orbax did not save step {step} in {self.directory}')
    logging.info('saved checkpoint step %d in %s', step, self.directory)
    self._prune_superseded()

  def _prune_superseded(self) -> None:
    """Removes the `train` item of kept steps older than the newest `max_to_keep`
    (module docstring, Retention): they are kept as the best step, for their params."""
    steps = sorted(self._manager.all_steps())
    if len(steps) <= self._max_to_keep:
      return
    if distributed.is_primary():  # one process removes; the others wait
      for s in steps[:-self._max_to_keep]:
        if os.path.isdir(self._train_dir(s)):
          shutil.rmtree(self._train_dir(s))
          logging.info('checkpoint step %d in %s: kept as the best step, parameters '
                       'only (optimizer state removed)', s, self.directory)
    distributed.barrier(f'prune {self.directory} {steps[-1]}')

  def _train_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step), 'train')

  def all_steps(self) -> list[int]:
    """Committed step numbers, ascending (temporary, half-written saves excluded)."""
    self.wait_until_finished()
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """Newest committed step (it may still be unrestorable), or None."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def best_step(self) -> int | None:
    """Step with the best `selection_metrics` (None if none was saved with metrics)."""
    return None if self._best is None else self._best[1]

  def selected_with(self, step: int,
                    selection_metrics: Mapping[str, float] | None) -> int | None:
    """The step this phase selects once `step` is saved with `selection_metrics`
    (`save`'s ranking): `step` when its metrics rank at least as high as the best saved
    step's, else that step (None: nothing saved or to be saved carries metrics)."""
    if selection_metrics:
      key = self._best_key(selection_metrics)
      if self._best is None or key >= self._best[0]:
        return int(step)
    return self.best_step()

  def read_meta(self, step: int) -> dict:
    """The JSON `meta` item of `step` (raises what Orbax raises when it is corrupt)."""
    self.wait_until_finished()
    restored = self._manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))
    meta = restored['meta']
    if not isinstance(meta, dict) or meta.get('step') != step:
      raise CheckpointError(f'meta of step {step} is malformed: {str(meta)[:200]}')
    return meta

  def _scan_best(self) -> None:
    self._best = None
    for step in self.all_steps():
      try:
        metrics = self.read_meta(step).get('selection_metrics')
      except Exception:  # pylint: disable=broad-except
        continue  # reported when someone restores it
      if metrics:
        self._consider_best(step, metrics)

  def _consider_best(self, step: int, metrics: Mapping[str, float]) -> None:
    key = self._best_key(metrics)
    # >=: steps arrive in ascending order, so a full tie goes to the later step (more
    # training at equal dev metrics; with max_to_keep=1 the earlier one can go).
    if self._best is None or key >= self._best[0]:
      self._best = (key, step)

  # ----------------------------------------------------------------- save
  def save(self, state: TrainState, *,
           selection_metrics: Mapping[str, float] | None = None) -> None:
    """Writes `state` as step `state.step`: in the background with async_save (returns
    once the arrays are off the devices), else returning once it is committed.

    Args:
      state: what to save; `running_stats`, `data_position`, `metadata` must be JSON
        values (NumPy/JAX scalars and arrays are converted).
      selection_metrics: metrics for best-checkpoint selection (`selection_key`: SFT
        dev metrics, SPEC §4; RL {'dev_score', 'step'}, paper C.8).
    Raises:
      CheckpointError: the parameters hold NaN/Inf (nothing is written), the step is
        not newer than a restorable saved step, or a value is not JSON-serializable,
        or Orbax refused the save (or the previous background save failed).
    """
    self.wait_until_finished()
    step = int(state.step)
    if not bool(nonfinite.tree_all_finite(state.params)):
      raise CheckpointError(
          f'refusing to save step {step} in {self.directory}: the parameters hold NaN '
          'or Inf values (the checkpoints already there are unchanged)')
    self._quarantine_from(step)
    latest = self.latest_step()
    if latest is not None and step <= latest:
      raise CheckpointError(
          f'cannot save step {step} in {self.directory}: step {latest} already exists '
          '(resume from it with restore(), or use a fresh workdir)')
    rng_data, rng_impl = checkpoint_values.rng_to_data(state.rng)
    meta = {
        'step': step,
        'running_stats': checkpoint_values.to_json(state.running_stats, 'running_stats'),
        'data_position': checkpoint_values.to_json(state.data_position, 'data_position'),
        'metadata': checkpoint_values.to_json(state.metadata, 'metadata'),
        'selection_metrics': checkpoint_values.to_json(
            dict(selection_metrics) if selection_metrics else None, 'selection_metrics'),
        'rng_impl': rng_impl,
        'has_opt_state': state.opt_state is not None,
        'has_rng': rng_data is not None,
    }
    items = {'params': ocp.args.StandardSave(state.params),
             'meta': ocp.args.JsonSave(meta)}
    train = {}
    if state.opt_state is not None:
      train['opt_state'] = state.opt_state
    if rng_data is not None:
      train['rng'] = rng_data
    if train:
      items['train'] = ocp.args.StandardSave(train)
    if selection_metrics:
      self._consider_best(step, selection_metrics)
    saved = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    if not saved:
      raise CheckpointError(f'Orbax did not save step {step} in {self.directory}')
    self._pending = step
    if not self._async:
      self.wait_until_finished()

  def _quarantine_from(self, step: int) -> None:
    """Moves unrestorable checkpoints at or after `step` aside (never deletes them)."""
    bad = [s for s in self.all_steps() if s >= step]
    if not bad or any(s not in self._unrestorable for s in bad):
      return
    if distributed.is_primary():  # one process moves; the others wait, then re-list
      stamp = datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S%f')
      dest_root = os.path.join(self.directory, UNRESTORABLE_DIR)
      os.makedirs(dest_root, exist_ok=True)
      for s in bad:
        dest = os.path.join(dest_root, f'{s}-{stamp}')
        shutil.move(os.path.join(self.directory, str(s)), dest)
        logging.warning('moved unrestorable checkpoint step %d (%s) to %s', s,
                        self._unrestorable[s], dest)
    distributed.barrier(f'quarantine {self.directory} {step}')
    self._manager.reload()

  # ----------------------------------------------------------------- restore
  def _restore_step(self, step: int, template: TrainState | None) -> TrainState:
    meta = self.read_meta(step)  # waits for a background save
    has_train = meta.get('has_opt_state') or meta.get('has_rng')
    if has_train and not os.path.isdir(self._train_dir(step)):
      raise CheckpointError(
          f'step {step} holds parameters only: its optimizer state and key are not '
          'on disk (a best step older than the newest checkpoint.max_to_keep is '
          'pruned to its parameters; restore_params_only reads it)')
    params_args = ocp.args.StandardRestore(
        None if template is None else _abstract(template.params))
    restored = self._manager.restore(step, args=ocp.args.Composite(params=params_args))
    train = {}
    if has_train:
      train_template = None
      if template is not None:
        train_template = {}
        if meta.get('has_opt_state'):
          if template.opt_state is None:
            raise CheckpointError(f'step {step} has an optimizer state but the template '
                                  'has none')
          train_template['opt_state'] = _abstract(template.opt_state)
        if meta.get('has_rng'):
          if template.rng is None:
            raise CheckpointError(f'step {step} has an RNG key but the template has none')
          train_template['rng'] = checkpoint_values.rng_to_data(template.rng)[0]  # restored as NumPy
      # Restored after the parameters, so a mismatch here is the optimizer's, not the
      # model's (checkpoint_values.no_restorable_error names it).
      try:
        train = self._manager.restore(step, args=ocp.args.Composite(
            train=ocp.args.StandardRestore(train_template)))['train']
      except ValueError as e:
        if template is None or not any(m in str(e) for m in
                                       checkpoint_values.MISMATCH_MARKERS):
          raise
        raise CheckpointError(f'{checkpoint_values.OPT_STATE_MISMATCH} '
                              f'({checkpoint_values.error_line(e)})') from e
    rng = train.get('rng')
    if rng is not None:
      rng = jax.device_get(rng)
    if rng is not None and meta.get('rng_impl'):
      rng = jax.random.wrap_key_data(rng, impl=meta['rng_impl'])
    running = meta['running_stats']
    position = meta['data_position']
    if template is not None:
      running = checkpoint_values.like_template(running, template.running_stats)
      position = checkpoint_values.like_template(position, template.data_position)
    return TrainState(step=step, params=restored['params'],
                      opt_state=train.get('opt_state'), rng=rng,
                      running_stats=running, data_position=position,
                      metadata=meta['metadata'])

  def restore(self, template: TrainState | None = None,
              step: int | None = None) -> TrainState | None:
    """Restores a checkpoint into `template`'s structure.

    Args:
      template: a TrainState whose params/opt_state/rng give the pytree structure,
        shapes, dtypes and shardings (arrays or jax.ShapeDtypeStruct). Without one,
        params come back as nested dicts of arrays and the optimizer state loses its
        NamedTuple types.
      step: a specific step (no fallback: its failure raises), or None for the newest
        restorable step, falling back past corrupt ones with a logged warning.
    Returns:
      The restored TrainState, or None when the directory has no checkpoint.
    Raises:
      CheckpointError: `step` cannot be restored, or no checkpoint is restorable.
    """
    if step is not None:
      try:
        return self._restore_step(step, template)
      except Exception as e:  # pylint: disable=broad-except
        raise CheckpointError(f'cannot restore step {step} from {self.directory}: '
                              f'{type(e).__name__}: {e}') from e
    return self._restore_first(sorted(self.all_steps(), reverse=True), template)

  def _restore_first(self, steps: Sequence[int],
                     template: TrainState | None) -> TrainState | None:
    if not steps:
      return None
    errors = []
    for i, s in enumerate(steps):
      try:
        state = self._restore_step(s, template)
      except Exception as e:  # pylint: disable=broad-except
        why = checkpoint_values.error_line(e)
        self._unrestorable[s] = why
        errors.append(f'step {s}: {why}')
        if i + 1 < len(steps):  # the last one's error is raised below, not warned
          logging.warning('checkpoint step %d in %s is unrestorable (%s); trying step '
                          '%d', s, self.directory, why, steps[i + 1])
        continue
      if errors:
        logging.warning('restored checkpoint step %d in %s after skipping %d '
                        'unrestorable step(s); nothing was deleted', s, self.directory,
                        len(errors))
      return state
    raise checkpoint_values.no_restorable_error(self.directory, errors)

  def close(self) -> None:
    """Waits for a background save (raising CheckpointError if it failed), then closes."""
    try:
      self.wait_until_finished()
    finally:
      self._manager.close()

  def __enter__(self) -> 'PhaseCheckpointManager':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def selected_step(directory: str | os.PathLike) -> int | None:
  """The step `restore_params_only(directory)` reads first: the best step by
  selection metrics, else the newest (None: no checkpoint)."""
  if not has_checkpoint(directory):
    return None
  mgr = PhaseCheckpointManager(directory, max_to_keep=10**9)
  try:
    best = mgr.best_step()
    return best if best is not None else mgr.latest_step()
  finally:
    mgr.close()


def restore_params_only(directory: str | os.PathLike, params_template: PyTree = None,
                        *, prefer_best: bool = True,
                        step: int | None = None) -> tuple[PyTree, int]:
  """Loads only the policy parameters of a phase (π_ref / initial params, SPEC §4).

  The optimizer state is not read (for a 7B policy it is twice the parameters).

  Args:
    directory: the previous phase's directory (e.g. `workdir/sft` for Phase A).
    params_template: pytree of arrays or jax.ShapeDtypeStruct (shapes, dtypes,
      shardings); None returns the stored arrays as nested dicts.
    prefer_best: take the best step by selection metrics (SFT's dev tool accuracy, an
      RL phase's internal-dev score) when there is one, else the newest; unrestorable
      steps fall back with a logged warning.
    step: this step only (no fallback).
  Returns:
    (params, step).
  Raises:
    CheckpointError: the directory has no restorable checkpoint.
  """
  if not os.path.isdir(directory):
    raise CheckpointError(f'no checkpoint directory {directory}')
  abstract = None if params_template is None else _abstract(params_template)
  mgr = PhaseCheckpointManager(directory, max_to_keep=10**9)
  try:
    steps = sorted(mgr.all_steps(), reverse=True)
    best = mgr.best_step() if prefer_best else None
    if step is not None:
      steps = [step]
    elif best is not None:
      steps = [best] + [s for s in steps if s != best]
    errors = []
    for i, s in enumerate(steps):
      try:
        mgr.read_meta(s)
        restored = mgr._manager.restore(s, args=ocp.args.Composite(  # pylint: disable=protected-access
            params=ocp.args.StandardRestore(abstract)))
      except Exception as e:  # pylint: disable=broad-except
        errors.append(f'step {s}: {checkpoint_values.error_line(e)}')
        if i + 1 < len(steps):  # the last one's error is raised below, not warned
          logging.warning('params of checkpoint step %d in %s are unrestorable (%s); '
                          'falling back to step %d', s, directory, errors[-1],
                          steps[i + 1])
        continue
      return restored['params'], s
    raise checkpoint_values.no_restorable_error(directory, errors)
  finally:
    mgr.close()


def has_checkpoint(directory: str | os.PathLike) -> bool:
  """Whether `directory` holds at least one committed Orbax step (cheap listing)."""
  if not os.path.isdir(directory):
    return False
  return any(name.isdigit() and
             os.path.exists(os.path.join(directory, name, '_CHECKPOINT_METADATA'))
             for name in os.listdir(directory))


def newest_meta(directory: str | os.PathLike) -> dict | None:
  """The JSON `meta` item of the newest committed step of `directory` (its settings
  fingerprint, final metrics, ...); None when there is no checkpoint or that step's
  meta is unreadable (a restore then falls back and says so)."""
  if not has_checkpoint(directory):
    return None
  with PhaseCheckpointManager(directory) as mgr:
    try:
      return mgr.read_meta(mgr.latest_step())
    except Exception:  # pylint: disable=broad-except
      return None


def mark_phase_complete(directory: str | os.PathLike, step: int,
                        info: Mapping[str, Any] | None = None) -> None:
  """Records that a phase finished at `step` (atomic write of `phase_complete.json`)."""
  path = os.path.join(directory, COMPLETE_MARKER)
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump({'step': int(step), **checkpoint_values.to_json(dict(info or {}), 'info')}, f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def phase_complete_step(directory: str | os.PathLike) -> int | None:
  """The step recorded by `mark_phase_complete`, or None (missing/unreadable marker)."""
  path = os.path.join(directory, COMPLETE_MARKER)
  try:
    with open(path) as f:
      return int(json.load(f)['step'])
  except (OSError, ValueError, KeyError, TypeError):
    return None
