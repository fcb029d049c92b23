"""Tests for vermem_jax.train.nonfinite: skipped steps leave params and state as they
were; consecutive skips stop the run with a message naming the step."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vermem_jax.train import nonfinite


def _setup():
  params = {'w': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones((3,))}
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(0.1))
  opt_state = tx.init(params)

  def step_fn(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  @jax.jit
  def update(p, s, loss, g):
    return nonfinite.guarded_step(p, s, loss, g, step_fn)
  return params, opt_state, update


def _equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_tree_all_finite():
  assert bool(nonfinite.tree_all_finite({'a': jnp.ones(3), 'n': jnp.int32(4)}))
  assert not bool(nonfinite.tree_all_finite({'a': jnp.array([1.0, jnp.nan])}))
  assert not bool(nonfinite.tree_all_finite([jnp.array([jnp.inf])]))
  assert bool(nonfinite.tree_all_finite({}))


@pytest.mark.parametrize('where', ['grad_nan', 'grad_inf', 'loss_nan'])
def test_non_finite_step_is_skipped_entirely(where):
  params, opt_state, update = _setup()
  grads = jax.tree.map(jnp.ones_like, params)
  loss = jnp.float32(1.0)
  if where == 'grad_nan':
    grads['w'] = grads['w'].at[0, 1].set(jnp.nan)
  elif where == 'grad_inf':
    grads['b'] = grads['b'].at[2].set(jnp.inf)
  else:
    loss = jnp.float32(jnp.nan)
  p1, s1, finite = update(params, opt_state, loss, grads)
  assert not bool(finite)
  _equal(p1, params)
  _equal(s1, opt_state)  # Adam moments and count untouched
  # A finite step afterwards is exactly the step that would have happened first.
  good = jax.tree.map(jnp.ones_like, params)
  p2, s2, finite = update(p1, s1, jnp.float32(1.0), good)
  p_ref, s_ref, _ = update(params, opt_state, jnp.float32(1.0), good)
  assert bool(finite)
  _equal(p2, p_ref)
  _equal(s2, s_ref)
  assert not np.allclose(np.asarray(p2['w']), np.asarray(params['w']))


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
