"""Tests for vermem_jax.train.nonfinite: the finiteness check and the consecutive-skip
counter (the trainers' skipped steps: tests/test_ppo_passes.py, test_rl_phase.py,
test_sft.py)."""
import jax
import jax.numpy as jnp
import pytest

from vermem_jax.train import nonfinite


def test_tree_all_finite():
  assert bool(nonfinite.tree_all_finite({'a': jnp.ones(3), 'n': jnp.int32(4)}))
  assert not bool(nonfinite.tree_all_finite({'a': jnp.array([1.0, jnp.nan])}))
  assert not bool(nonfinite.tree_all_finite([jnp.array([jnp.inf])]))
  assert bool(nonfinite.tree_all_finite({}))


def test_is_finite_checks_loss_and_every_gradient_entry():
  grads = {'w': jnp.ones((2, 3)), 'b': jnp.zeros((3,))}
  assert nonfinite.is_finite(1.5, grads)
  assert not nonfinite.is_finite(float('nan'), grads)
  assert not nonfinite.is_finite(jnp.float32(jnp.inf), grads)
  assert not nonfinite.is_finite(0.0, dict(grads, w=grads['w'].at[1, 2].set(jnp.nan)))
  assert not nonfinite.is_finite(0.0, dict(grads, b=grads['b'].at[0].set(-jnp.inf)))


def test_skip_counter_stops_after_consecutive_skips_naming_the_step():
  c = nonfinite.SkipCounter(3)
  assert c.record(False, 'update 5') and c.record(False, 'update 6')
  assert not c.record(True, 'update 7')  # a finite step resets the run
  assert c.total == 2 and c.consecutive == 0
  c.record(False, 'update 8')
  c.record(False, 'update 9')
  with pytest.raises(nonfinite.NonFiniteError,
                     match=r'phase_b update 10, pass 2: .* 3 consecutive'):
    c.record(False, 'phase_b update 10, pass 2')
  assert c.total == 5
  with pytest.raises(ValueError):
    nonfinite.SkipCounter(0)
