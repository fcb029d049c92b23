"""Non-finite guard for optimizer steps (SPEC §6: a non-finite loss or gradient never
reaches the parameters; the step is skipped and counted).

A trainer computes a step's loss and gradient, asks `is_finite(loss, grads)` (one
jitted reduction, read on the host) and applies its optimizer only when that holds; a
skipped step leaves the parameters AND the optimizer state (Adam moments, step count)
as they were. `SkipCounter.record` counts skipped steps and raises `NonFiniteError`
naming the step after `max_consecutive` skips in a row, so a diverged run stops instead
of spinning. `checkpoints.PhaseCheckpointManager.save` refuses parameters that are not
finite (`tree_all_finite`), so a checkpoint never holds them.

Decision: not `optax.apply_if_finite`. It adds a state to the optimizer (an existing
checkpoint's optimizer state would no longer restore), compiles the guard into the
update (a finite step would round differently from before), and after its
`max_consecutive_errors` applies the non-finite update anyway; here the optimizer and
its state tree are untouched and the run stops instead.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


class NonFiniteError(RuntimeError):
  """Too many consecutive optimizer steps had a non-finite loss or gradient."""


def tree_all_finite(tree: Any) -> jax.Array:
  """Scalar bool: every floating-point leaf of `tree` is finite (no NaN/Inf).

  Non-float leaves (integer step counters) are ignored. Traceable under jit.
  """
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  if not leaves:
    return jnp.asarray(True)
  return jnp.all(jnp.stack(leaves))


@jax.jit
def _finite(loss: jax.Array, grads: Any) -> jax.Array:
  return jnp.isfinite(loss) & tree_all_finite(grads)


def is_finite(loss: Any, grads: Any) -> bool:
  """Whether the scalar `loss` and every entry of the gradient tree are finite (one
  jitted reduction; waits for both)."""
  return bool(_finite(jnp.asarray(loss, jnp.float32), grads))


class SkipCounter:
  """Host-side count of skipped (non-finite) optimizer steps.

  Args:
    max_consecutive: stop (NonFiniteError) at this many skipped steps in a row (>= 1).
  Attributes:
    total: skipped steps so far (this process); consecutive: the current run of skips.
  """

  def __init__(self, max_consecutive: int):
    if int(max_consecutive) < 1:
      raise ValueError(f'max_consecutive must be >= 1, got {max_consecutive}')
    self.max_consecutive = int(max_consecutive)
    self.total = 0
    self.consecutive = 0

  def record(self, finite: bool, where: str) -> bool:
    """Books one optimizer step (`where` names it, e.g. 'phase_b update 12, pass 2');
    returns whether it was skipped.

    Raises:
      NonFiniteError: at the `max_consecutive`-th skipped step in a row, naming `where`.
    """
    if finite:
      self.consecutive = 0
      return False
    self.total += 1
    self.consecutive += 1
    if self.consecutive >= self.max_consecutive:
      raise NonFiniteError(
          f'{where}: non-finite loss or gradient in {self.consecutive} consecutive '
          'optimizer steps (each skipped: the parameters and the last checkpoint hold '
          'no NaN/Inf); the run stops. Lower the learning rate, check the data, or '
          'raise the consecutive-skip limit.')
    return True
