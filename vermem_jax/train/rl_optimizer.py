"""Optimizer of an RL phase (SPEC §6; module docstring of train/rl_learner.py): the
PPO pass counts that size its schedule and the guarded step that applies one
mini-batch's gradient with `optim.make_optimizer` (the optimizer SFT uses too).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import optax

from vermem_jax.train import optim


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """Passes over an update's rollouts (config section `rl`; SPEC §6 GRPO passes).

  Attributes:
    num_iterations: μ >= 1 passes over the update's decisions with θ_old frozen
      (decision: 1, the paper gives no value).
    mini_batches_per_iteration: M >= 1 shuffled mini-batches per pass, one optimizer
      step each (decision: 1); more than N decisions gives N.
  """
  num_iterations: int = 1
  mini_batches_per_iteration: int = 1

  def __post_init__(self):
    for name in ('num_iterations', 'mini_batches_per_iteration'):
      if int(getattr(self, name)) < 1:
        raise ValueError(f'rl.{name} must be >= 1, got {getattr(self, name)}')

  @property
  def steps_per_update(self) -> int:
    return int(self.num_iterations) * int(self.mini_batches_per_iteration)


@jax.jit
def add_grads(acc: Any, grads: Any) -> Any:
  return jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)


@functools.partial(jax.jit, static_argnames=('opt',))
def apply_update(params: Any, opt_state: Any, grad_sum: Any, num_decisions: jax.Array,
                 *, opt: optim.OptimizerConfig) -> tuple[Any, Any, jax.Array]:
  """One optimizer step from a mini-batch's summed gradient (jitted; divides once).

  The caller skips it when the loss or gradient is not finite (nonfinite.is_finite).

  Args:
    params, opt_state: θ and the `optim.make_optimizer(opt)` state.
    grad_sum: Σ over micro-batches of ∂(Σ_decisions per-command token-mean loss)/∂θ
      (float32 tree shaped like params).
    num_decisions: N_b, decisions in the mini-batch (float32 scalar, >= 1).
  Returns:
    (new params, new opt_state, global norm of the mean gradient before clipping).
  """
  grads = jax.tree.map(lambda g, p: (g / num_decisions).astype(p.dtype), grad_sum,
                       params)
  updates, new_opt_state = optim.make_optimizer(opt).update(grads, opt_state, params)
  return optax.apply_updates(params, updates), new_opt_state, optax.global_norm(grads)
