"""Non-finite guard for optimizer steps (SPEC §6: a non-finite loss or gradient never
reaches the parameters; the step is skipped and counted).

A trainer computes its loss and gradient, then calls `guarded_step` inside its jitted
update: when the loss or any gradient entry is NaN/Inf, the parameters and optimizer
state come back unchanged (the whole step is skipped, Adam moments and step count
included) and `finite` is False. On the host, `SkipCounter.record` counts skipped
steps and raises `NonFiniteError` naming the step after `max_consecutive` skips in a
row, so a diverged run stops instead of spinning. `checkpoints.PhaseCheckpointManager.
save` refuses parameters that are not finite (`tree_all_finite`), so a checkpoint never
holds them.

Decision: not `optax.apply_if_finite`. It adds a state to the optimizer (an existing
checkpoint's optimizer state would no longer restore) and, after its
`max_consecutive_errors`, applies the non-finite update anyway; here the state tree is
unchanged and the run stops instead.
"""

from __future__ import annotations

from typing import Any, Callable

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


def guarded_step(params: Any, opt_state: Any, loss: jax.Array, grads: Any,
                 step_fn: Callable[[Any, Any, Any], tuple[Any, Any]]
                 ) -> tuple[Any, Any, jax.Array]:
  """Applies `step_fn(params, opt_state, grads) -> (params, opt_state)` only when
  `loss` and `grads` are finite; otherwise returns params and opt_state unchanged.

  Traceable under jit: both branches are computed and selected leaf by leaf (a
  non-finite gradient cannot leak through the unselected branch).

  Returns:
    (params, opt_state, finite: scalar bool).
  """
  finite = jnp.isfinite(loss) & tree_all_finite(grads)
  safe = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
  new_params, new_opt_state = step_fn(params, opt_state, safe)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  return keep(new_params, params), keep(new_opt_state, opt_state), finite


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
