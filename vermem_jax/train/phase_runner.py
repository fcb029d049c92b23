"""The loop every training phase shares: restore, schedule, logging, saving, summary.

A phase (SFT `train/sft.py`, the GRPO phases `train/rl_phase.py`, the tiny base's
pretraining `train/pretrain.py`) supplies what is its
own through the `Phase` protocol: one optimizer step or update (`step`), an evaluation
(`evaluate`), the rows it logs, the checkpoint it saves and its final metrics. The
runner owns the rest, once for all phases:

  restore   the newest restorable checkpoint of the phase directory (a corrupt newest
            step is skipped with a warning naming it; `checkpoints.PhaseCheckpointManager`),
            checked against the phase's trajectory fingerprint and data position by
            the phase's `check_restored`;
  schedule  `itstime(step, every, total)` (big_vision's `u.itstime`): evaluate every
            `eval_every` steps and at the last, log every `log_every` steps and at the
            last, save every `save_every` steps, at the last and at every evaluated step
            that returns selection metrics;
  logging   `metrics.MetricsWriter` (JSONL + TensorBoard, process 0 only, cut back to
            the restored step) and the progress bar with the phase's postfix plus the
            running count of skipped (non-finite) steps;
  skips     one `nonfinite.SkipCounter` per run, restored from the checkpoint's
            'skipped_steps' and stored in every checkpoint's metadata;
  wall time 'cumulative_wall_time_s' over every call of the run (restored too).
  compiles  the XLA programs of each step, its evaluation included
            (`compilation.snapshot`): 'compile/programs' compiled and
            'compile/cache_hits' read from the persistent cache at this step,
            'compile/after_first_step' programs of either kind requested after this
            call's first step (0 once every shape has been seen; a step that
            requests one logs a warning naming its programs). `compile_figures()`
            has the call's totals for the phase summary.

Per step n (1-based; a checkpoint's step = completed steps): `phase.step(n)`, the bar,
`phase.evaluate(n)` when due, the rows of `phase.rows(...)` written at n, then a save
when due. A `stop` below `total` ends the loop early as a kill would (drills, tests).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from absl import logging

from vermem_jax.train import checkpoints
from vermem_jax.train import compilation
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import nonfinite


def itstime(step: int, every: int, total: int, *, last: bool = True) -> bool:
  """Whether step `step` (1-based) of `total` is due for something done every `every`
  steps (`every` <= 0: never) and, with `last`, at the final step (big_vision's
  `u.itstime`)."""
  return (every > 0 and step % every == 0) or (last and step == total)


@dataclasses.dataclass
class StepResult:
  """What one step returns to the runner.

  row: metrics of the step (name -> number).
  postfix: progress-bar fields (name -> text).
  log: write this step's rows even when `log_every` does not say so (monitor points).
  """
  row: dict[str, float]
  postfix: dict[str, Any]
  log: bool = False


@dataclasses.dataclass
class Evaluation:
  """What an evaluation returns: its metrics and, when it ranks checkpoints, the
  selection metrics the saved step carries (`checkpoints.PhaseCheckpointManager.save`)."""
  row: dict[str, float]
  selection: Optional[dict[str, float]] = None


class Phase(Protocol):
  """What a phase supplies to `PhaseRunner.run` (module docstring)."""

  def step(self, n: int) -> StepResult:
    """Runs step n (its optimizer step(s)); books skips on the runner's counter."""

  def evaluate(self, n: int) -> Optional[Evaluation]:
    """Evaluates the parameters after step n (None: nothing to evaluate)."""

  def rows(self, n: int, result: StepResult, evaluation: Optional[Evaluation],
           log_due: bool) -> Sequence[Mapping[str, float]]:
    """The metrics rows written at step n, in order."""

  def train_state(self, n: int, metadata: dict[str, Any],
                  selection: Optional[dict[str, float]]) -> checkpoints.TrainState:
    """The checkpoint of step n; `metadata` holds the runner's fields, the phase adds
    its own (and 'final_metrics' at the last step)."""


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """What every phase's loop shares (config sections `checkpoint` and `metrics`).

  save_every, log_every: cadences in steps (0: only at the last step).
  max_to_keep: checkpoints kept (the selected one is always kept).
  async_save: save in the background while the next step runs.
  tensorboard, progress_bar: write TensorBoard events / show the bar (process 0).
  """
  save_every: int
  log_every: int
  max_to_keep: int
  async_save: bool = True
  tensorboard: bool = True
  progress_bar: bool = True

  @classmethod
  def from_config(cls, config: Any) -> 'LoopSettings':
    """From a run's `checkpoint` and `metrics` sections."""
    return cls(save_every=int(config.checkpoint.save_every),
               log_every=int(config.metrics.log_every),
               max_to_keep=int(config.checkpoint.max_to_keep),
               async_save=bool(config.checkpoint.get('async_save', True)),
               tensorboard=bool(config.metrics.tensorboard),
               progress_bar=bool(config.metrics.progress_bar))


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
  """The runner's settings (config sections `checkpoint`, `metrics` and the phase's
  cadences).

  name: the phase name (progress bar, log lines).
  total: the phase's number of steps (optimizer steps or updates).
  eval_every: evaluation cadence in steps (0: only at the last step).
  max_consecutive_skips: non-finite steps in a row that stop the run.
  loop: saving and logging, the same for every phase.
  unit: progress-bar unit ('step', 'update').
  epoch_steps: also evaluate at every multiple of it (SFT's epoch ends; 0: off).
  """
  name: str
  total: int
  eval_every: int
  max_consecutive_skips: int
  loop: LoopSettings
  unit: str = 'update'
  epoch_steps: int = 0

  def eval_due(self, step: int) -> bool:
    """Evaluate after `step`: every eval_every steps, at epoch ends, at the last."""
    return (itstime(step, self.eval_every, self.total)
            or itstime(step, self.epoch_steps, self.total, last=False))


class PhaseRunner:
  """Restores, runs and saves one phase in `directory` (module docstring).

  Use as a context manager (closes the checkpoint manager, waiting for a background
  save). Attributes after `restore`: `restored` (the TrainState or None), `step`
  (completed steps), `prior_wall` (seconds of earlier calls), `skips`.
  """

  def __init__(self, directory: str, config: RunnerConfig, *, primary: bool = True,
               t_start: Optional[float] = None):
    """`t_start`: when this call of the phase began (time.time(); default now)."""
    self.directory = directory
    self.config = config
    self.primary = primary
    self.t_start = time.time() if t_start is None else t_start
    self.manager = checkpoints.PhaseCheckpointManager(
        directory, max_to_keep=config.loop.max_to_keep, async_save=config.loop.async_save)
    self.skips = nonfinite.SkipCounter(config.max_consecutive_skips)
    self.restored: Optional[checkpoints.TrainState] = None
    self.step = 0
    self.prior_wall = 0.0
    self.compile_start = compilation.snapshot()
    self.after_first_step = 0

  def __enter__(self) -> 'PhaseRunner':
    return self

  def __exit__(self, *exc) -> None:
    self.manager.close()

  @property
  def metadata(self) -> dict[str, Any]:
    """The restored checkpoint's metadata ({} without one)."""
    return dict((self.restored.metadata or {}) if self.restored is not None else {})

  def restore(self, template: checkpoints.TrainState,
              check: Callable[[checkpoints.TrainState], None]
              ) -> Optional[checkpoints.TrainState]:
    """Restores the newest restorable checkpoint like `template` and checks it.

    Args:
      template: abstract TrainState (shapes and shardings of the arrays).
      check: raises ValueError when the checkpoint belongs to another run (trajectory
        fingerprint, data position, reference policy).
    Returns:
      The restored TrainState, or None when the directory holds none.
    Raises:
      ValueError: from `check`.
      checkpoints.CheckpointError: every checkpoint of the directory is unrestorable.
    """
    latest = self.manager.latest_step()
    restored = self.manager.restore(template)
    if restored is None:
      return None
    check(restored)
    if latest is not None and restored.step != latest:
      logging.warning(
          '%s: the newest checkpoint (step %d) cannot be restored; resuming from step '
          '%d instead and redoing steps %d..%d. The unrestorable step stays on disk '
          '(moved to %s/ when step %d is saved again).', self.config.name, latest,
          restored.step, restored.step + 1, latest,
          os.path.join(self.directory, checkpoints.UNRESTORABLE_DIR), latest)
    self.restored = restored
    self.step = int(restored.step)
    md = self.metadata
    self.prior_wall = float(md.get('cumulative_wall_time_s', 0.0))
    self.skips.total = int(md.get('skipped_steps', 0))
    return restored

  def compile_figures(self) -> dict[str, int]:
    """The phase result's compile figures of this call (since the runner was made):
    'compile/programs_total' compiled, 'compile/cache_hits_total' read from the
    persistent cache, 'compile/after_first_step' requested after run's first step."""
    counts = compilation.snapshot() - self.compile_start
    return {'compile/programs_total': counts.compiled,
            'compile/cache_hits_total': counts.cache_hits,
            'compile/after_first_step': self.after_first_step}

  def wall_time(self) -> float:
    """Seconds of this run over all its calls."""
    return self.prior_wall + time.time() - self.t_start

  def run(self, phase: Phase, *, stop: Optional[int] = None,
          first_rows: Sequence[Mapping[str, float]] = ()) -> int:
    """Runs steps step+1 .. min(stop, total); returns the completed steps.

    Args:
      phase: the phase's step, evaluation, rows and checkpoint.
      stop: stop once this many steps are complete (None: total).
      first_rows: rows written at the current step before the first one (a phase's
        figures of its starting parameters).
    Raises:
      nonfinite.NonFiniteError: too many non-finite steps in a row (from the phase's
        step, booked on `self.skips`).
    """
    c = self.config
    stop = c.total if stop is None else min(c.total, int(stop))
    writer = metrics_lib.MetricsWriter(self.directory, resume_step=self.step,
                                       tensorboard=c.loop.tensorboard, enabled=self.primary)
    for row in first_rows:
      writer.write(self.step, row)
    bar = metrics_lib.progress_bar(c.total, initial=self.step, desc=c.name, unit=c.unit,
                                   disable=not (c.loop.progress_bar and self.primary))
    first = self.step + 1
    try:
      while self.step < stop:
        n = self.step + 1
        before = compilation.snapshot()
        result = phase.step(n)
        self.step = n
        bar.update(1)
        postfix = dict(result.postfix)
        if self.skips.total:
          postfix['skipped'] = self.skips.total  # non-finite steps, not applied
        bar.set_postfix(**postfix)
        evaluation = phase.evaluate(n) if c.eval_due(n) else None
        new = compilation.snapshot() - before
        if n > first and new.requested:
          self.after_first_step += new.requested
          # Info, not a warning: SFT's length groups and the first dev evaluation
          # compile after step 1 by design; the count lands in the row and the summary.
          logging.info('%s %s %d requested %d XLA program(s) after its first %s (a '
                       'shape not seen before): %s', c.name, c.unit, n, new.requested,
                       c.unit, ', '.join(compilation.program_names(before)))
        result.row.update({'compile/programs': float(new.compiled),
                           'compile/cache_hits': float(new.cache_hits),
                           'compile/after_first_step': float(self.after_first_step)})
        for row in phase.rows(n, result, evaluation,
                              itstime(n, c.loop.log_every, c.total) or result.log):
          writer.write(n, row)
        selection = evaluation.selection if evaluation is not None else None
        if (itstime(n, c.loop.save_every, c.total) or selection is not None
            or evaluation is not None):
          metadata = {'cumulative_wall_time_s': self.wall_time(),
                      'complete': n >= c.total, 'skipped_steps': self.skips.total}
          self.manager.save(phase.train_state(n, metadata, selection),
                            selection_metrics=selection)
    finally:
      bar.close()
      writer.close()
    return self.step
