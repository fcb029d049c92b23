"""Which tasks and which PRNG keys one GRPO update uses (SPEC §4; resumable by
construction).

`select_tasks` chooses the `tasks_per_update` tasks of update n (SPEC §4: 8) from a
pool as a pure function of (seed, n), so the data position is the update index
itself. `update_rng(seed, n)` is the update's key; `BoundPolicy` folds it with the index
of each policy call, so the same params, tasks and key reproduce the same rollouts
(rl.rollout, Determinism).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

# A rollout policy: (x_t of every live episode, PRNG key) -> one PolicyOutput (or plain
# command string, for scripted policies) per input. `policy.SamplerPolicy` is one.
RolloutPolicy = Callable[[Sequence[str], Any], Sequence[Any]]


def update_rng(seed: int, update: int) -> jax.Array:
  """The PRNG key of update `update` (1-based) of a run seeded with `seed`."""
  return jax.random.fold_in(jax.random.PRNGKey(int(seed)), int(update))


def select_tasks(num_tasks_in_pool: int, update: int, tasks_per_update: int, *,
                 seed: int) -> list[int]:
  """Pool indices of the tasks of update `update` (1-based); resumable by construction.

  The pool is walked in epochs; epoch e is a permutation of range(pool) drawn from
  NumPy's PCG64 seeded with (seed, e). Update u takes positions
  [(u-1)*T, u*T) of the concatenated epochs, so the data position is the update index
  itself (a resumed run needs no iterator state).

  Raises:
    ValueError: an empty pool or update < 1.
  """
  if num_tasks_in_pool < 1:
    raise ValueError('select_tasks: the task pool is empty')
  if update < 1:
    raise ValueError(f'select_tasks: update is 1-based, got {update}')
  n = int(num_tasks_in_pool)
  out = []
  perms = {}
  for pos in range((update - 1) * tasks_per_update, update * tasks_per_update):
    epoch, i = divmod(pos, n)
    if epoch not in perms:
      perms[epoch] = np.random.default_rng([int(seed), epoch]).permutation(n)
    out.append(int(perms[epoch][i]))
  return out


class BoundPolicy:
  """A RolloutPolicy bound to a key: the `environment.Policy` run_episodes calls.

  Call i (0-based) passes jax.random.fold_in(rng, i) to the policy, so a run with the
  same key, params and inputs repeats exactly. Attributes: `calls` (policy calls so
  far) and `seconds` (wall time inside the policy).

  Args:
    policy: RolloutPolicy, `(inputs, rng) -> outputs`.
    rng: a jax PRNG key or an int seed.
  """

  def __init__(self, policy: RolloutPolicy, rng: Any):
    if isinstance(rng, (int, np.integer)):
      rng = jax.random.PRNGKey(int(rng))
    self.policy = policy
    self.rng = rng
    self.calls = 0
    self.seconds = 0.0

  def __call__(self, inputs: Sequence[str]) -> Sequence[Any]:
    t0 = time.perf_counter()
    key = jax.random.fold_in(self.rng, self.calls)
    self.calls += 1
    try:
      return self.policy(inputs, key)
    finally:
      self.seconds += time.perf_counter() - t0

