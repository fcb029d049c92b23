"""Tests for vermem_jax.train.optim: schedules against hand values, the AdamW chain."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.configs import common
from vermem_jax.train import optim
from vermem_jax.train import run_setup


def test_schedules_match_hand_values():
  peak, total = 2e-5, 100
  lin = optim.lr_schedule('linear', peak, total, 0.03)
  assert optim.warmup_steps(0.03, total) == 3
  np.testing.assert_allclose([float(lin(s)) for s in (0, 1, 3, 50, 99, 100)],
                             [peak / 3, 2 * peak / 3, peak, peak * 50 / 97, peak / 97, 0.0],
                             rtol=1e-6, atol=1e-12)
  cos = optim.lr_schedule('cosine', peak, total, 0.03)
  want = [peak * 0.5 * (1 + math.cos(math.pi * (s - 3) / 97)) for s in (3, 20, 60, 100)]
  np.testing.assert_allclose([float(cos(s)) for s in (3, 20, 60, 100)], want,
                             rtol=1e-5, atol=1e-12)
  assert float(cos(1)) == pytest.approx(2 * peak / 3)
  const = optim.lr_schedule('constant', peak, total, 0.1)
  np.testing.assert_allclose([float(const(s)) for s in (0, 5, 10, 99)],
                             [peak / 10, peak * 6 / 10, peak, peak], rtol=1e-6)
  # Constant without warmup is a number: the optimizer state carries no counter.
  assert optim.lr_schedule('constant', 1e-6, 10, 0.0) == 1e-6


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match='rl.lr_schedule'):
    optim.check_schedule('step', 0.0, 10, 'rl')
  with pytest.raises(ValueError, match='sft.warmup_ratio'):
    optim.check_schedule('linear', 1.0, 10, 'sft')
  with pytest.raises(ValueError, match='adam_b2'):
    optim.clipped_adamw(1e-3, b1=0.9, b2=1.0, eps=1e-8, weight_decay=0.0,
                        max_grad_norm=1.0)


def test_clipped_adamw_matches_optax_reference_and_masks_decay():
  params = {'w': jnp.arange(6.0).reshape(2, 3) / 7, 'scale': jnp.ones((3,))}
  grads = {'w': jnp.full((2, 3), 3.0), 'scale': jnp.full((3,), -2.0)}
  tx = optim.clipped_adamw(1e-2, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1,
                           max_grad_norm=1.0)
  updates, _ = tx.update(grads, tx.init(params), params)
  # Hand reference: clip to norm 1, first Adam step is -lr * g_hat / (|g_hat| + eps')
  # with bias correction; decay only on the 2-D kernel.
  norm = math.sqrt(6 * 9 + 3 * 4)
  for k in params:
    g = np.asarray(grads[k]) / norm
    m_hat, v_hat = g, g * g
    step = m_hat / (np.sqrt(v_hat) + 1e-6)
    if k == 'w':
      step = step + 0.1 * np.asarray(params[k])
    np.testing.assert_allclose(np.asarray(updates[k]), -1e-2 * step, rtol=1e-5)
  # Same state tree as a plain optax chain (checkpoints keep restoring).
  ref = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
      1e-2, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1,
      mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)))
  assert (jax.tree.structure(ref.init(params))
          == jax.tree.structure(tx.init(params)))


def _opt_tree(params, schedule_count: bool):
  """What main built before SFT and RL shared make_optimizer, written out by hand:
  (clip EmptyState, (ScaleByAdamState(count, mu, nu), MaskedState(EmptyState) of the
  weight decay, ScaleByScheduleState(count) or EmptyState of the rate))."""
  count = jnp.zeros([], jnp.int32)
  rate = optax.ScaleByScheduleState(count) if schedule_count else optax.EmptyState()
  return (optax.EmptyState(),
          (optax.ScaleByAdamState(count, params, params),
           optax.MaskedState(optax.EmptyState()), rate))


@pytest.mark.parametrize('phase,scale', [(p, s) for p in ('sft', 'phase_a', 'phase_b',
                                                          'phase_c')
                                         for s in ('tiny', 'paper')])
def test_default_configs_keep_their_optimizer_state_tree(phase, scale):
  """Checkpoints written before the one builder restore: the default SFT configs
  (a warmup, so a schedule counter) and RL configs (constant, no warmup: no counter)
  build the same state tree, leaf shapes and dtypes as before."""
  run = run_setup.RunSetup.from_config(common.get_config(phase, f'scale={scale}'))
  opt = run.sft.opt if phase == 'sft' else run.rl.opt
  params = {'w': jnp.zeros((2, 3), jnp.bfloat16), 'b': jnp.zeros((3,), jnp.float32)}
  got = jax.eval_shape(optim.make_optimizer(opt).init, params)
  want = jax.eval_shape(lambda: _opt_tree(params, schedule_count=phase == 'sft'))
  assert jax.tree.structure(got) == jax.tree.structure(want)
  assert jax.tree.leaves(got) == jax.tree.leaves(want)
  # The jitted init is the same state.
  assert jax.tree.structure(optim.init_optimizer(params, opt=opt)) == jax.tree.structure(want)


def test_learning_rate_fn_is_the_applied_rate():
  """The logged rate is the one make_optimizer applies, also for a constant rate: with
  sign-only first Adam steps (b1 = b2 = 0, ε ≈ 0) each update is -lr_k · sign(g)."""
  params = {'w': jnp.ones((2, 2))}
  for kind, warmup in (('constant', 0.0), ('linear', 0.25), ('cosine', 0.0)):
    opt = optim.OptimizerConfig(learning_rate=1e-2, total_steps=8, warmup_ratio=warmup,
                                lr_schedule=kind, adam_b1=0.0, adam_b2=0.0,
                                adam_eps=1e-12, max_grad_norm=1e6, section='sft')
    tx, rate = optim.make_optimizer(opt), optim.learning_rate_fn(opt)
    state, g = tx.init(params), {'w': jnp.full((2, 2), 0.5)}
    for k in range(8):
      upd, state = tx.update(g, state, params)
      np.testing.assert_allclose(np.asarray(upd['w']), -float(rate(k)), rtol=1e-5)
    if kind == 'constant':
      assert float(rate(5)) == 1e-2
