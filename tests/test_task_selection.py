"""Tests of vermem_jax.rl.task_selection: resumable task choice and per-call keys."""
import jax
import numpy as np
import pytest

from vermem_jax.rl import task_selection


def test_select_tasks_is_a_resumable_epoch_walk():
  pool, per = 5, 2
  picks = [task_selection.select_tasks(pool, u, per, seed=3) for u in range(1, 6)]
  flat = sum(picks, [])
  assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))
  # No iterator state:
  assert picks[3] == task_selection.select_tasks(pool, 4, per, seed=3)
  assert picks != [task_selection.select_tasks(pool, u, per, seed=4) for u in range(1, 6)]
  with pytest.raises(ValueError, match="1-based"):
    task_selection.select_tasks(pool, 0, per, seed=3)


def test_bound_policy_folds_the_call_index():
  keys = []
  bound = task_selection.BoundPolicy(lambda xs, rng: keys.append(rng) or list(xs), 7)
  assert bound(["a"]) == ["a"] and bound(["b"]) == ["b"] and bound.calls == 2
  base_key = jax.random.PRNGKey(7)
  for i, k in enumerate(keys):
    np.testing.assert_array_equal(k, jax.random.fold_in(base_key, i))
