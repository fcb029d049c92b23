"""Which phases a command runs: a phase needs the previous one complete (SPEC §4).

A phase is complete when `<workdir>/<phase>/` holds the `phase_complete.json` marker
and a checkpoint. At the tiny and small scales the missing phases are planned first;
at paper scale the plan stops with the command that makes the missing checkpoint.
"""

from __future__ import annotations

import os
import shlex
from typing import Sequence

from experiments.configs.parts import curriculum


class MissingPrerequisiteError(RuntimeError):
  """A phase needs a previous phase's checkpoint that the workdir does not hold."""


def phase_dir(workdir: str, phase: str) -> str:
  """`<workdir>/<phase>`: the phase's checkpoints, metrics and lock."""
  return os.path.join(workdir, phase)


def phase_is_complete(workdir: str, phase: str) -> bool:
  """Whether `<workdir>/<phase>` holds a finished phase (marker + a checkpoint)."""
  from vermem_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  d = phase_dir(workdir, phase)
  return (checkpoints.phase_complete_step(d) is not None and
          checkpoints.has_checkpoint(d))


def command_for(phase: str, scale: str, workdir: str,
                override_args: Sequence[str] = ()) -> str:
  """The command line that runs `phase` at `scale` into `workdir`, with this command's
  `--config.<field>=...` flags (`override_args`, shell-quoted) so it can be pasted."""
  arg = '' if scale == 'tiny' else f':scale={scale}'
  words = [f'--config={phase}.py{arg}', *override_args, f'--workdir={workdir}']
  return 'python experiments/run.py ' + ' '.join(shlex.quote(w) for w in words)


def plan_phases(phase: str, workdir: str, scale: str,
                override_args: Sequence[str] = ()) -> list[str]:
  """Phases to run, in order, to produce `phase` (SPEC §4 curriculum).

  At the tiny and small scales, every incomplete phase before `phase` back to the last
  complete one (or sft) is run first. At paper scale nothing is run implicitly.

  Raises:
    MissingPrerequisiteError: paper scale and the previous phase is not complete (names
      its directory and the command that makes it).
  """
  order = list(curriculum.PHASE_ORDER)
  if phase not in order:
    raise ValueError(f'unknown phase {phase!r}; expected one of {order}')
  needed = []
  for prev in reversed(order[:order.index(phase)]):
    if phase_is_complete(workdir, prev):
      break
    needed.insert(0, prev)
  if needed and scale not in curriculum.IMPLICIT_PHASE_SCALES:
    prev = curriculum.PREVIOUS_PHASE[phase]
    raise MissingPrerequisiteError(
        f'{phase} starts from the {prev} parameters, but {phase_dir(workdir, prev)} '
        f'holds no completed {prev} checkpoint. Make it first with:\n  '
        f'{command_for(prev, scale, workdir, override_args)}')
  return needed + [phase]
