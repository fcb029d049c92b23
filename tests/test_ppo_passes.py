"""PPO passes of the RL learner (train/rl_learner.py, SPEC §6 GRPO passes): μ = 1 is the
single step of one-iteration GRPO, unchanged; μ = 2 makes the clip live, and the second
pass's loss and gradient equal an independent NumPy PPO reference; mini-batches fix
θ_old from the rollout pass and normalize per mini-batch; a non-finite step is skipped.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import float_tolerance  # tests/ helper  # pylint: disable=g-bad-import-order
from test_grpo import ref_ppo_loss_and_logit_grad  # pylint: disable=g-bad-import-order
from vermem_jax.models import qwen
from vermem_jax.models import qwen_config
from vermem_jax.rl import batching
from vermem_jax.rl import loss_step
from vermem_jax.train import nonfinite
from vermem_jax.train import optim
from vermem_jax.train import rl_learner
from vermem_jax.train import rl_optimizer

# A small vocabulary keeps the NumPy reference over [B, L, V] logits cheap.
MC = qwen_config.QwenConfig(vocab_size=512)
BCFG = batching.BatchingConfig(micro_batch_size=4, length_buckets=(48,),
                               command_buckets=(8,))
LOSS = rl_learner.LossConfig(temperature=0.7)


@pytest.fixture(scope='module')
def setup():
  params = qwen.init_params(MC, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  decisions = []
  for i, c in enumerate([3, 6, 2, 8, 5, 4]):
    p = int(rng.integers(10, 30))
    decisions.append(batching.DecisionTokens(
        prompt_tokens=tuple(int(x) for x in rng.integers(0, 512, p)),
        command_tokens=tuple(int(x) for x in rng.integers(0, 512, c)),
        old_logprobs=tuple(float(x) for x in rng.uniform(-8, -1, c)),  # sampler's
        advantage=float((-1.5, 2.0, 0.7, -0.4, 1.1, -2.2)[i])))
  return params, decisions


def _run(params, decisions, *, opt, ppo=rl_optimizer.PPOConfig(), loss=LOSS, ref=None,
         state=None, **kw):
  state = optim.make_optimizer(opt).init(params) if state is None else state
  return rl_learner.learner_update(
      params, params if ref is None else ref, state, decisions,
      rl_learner.LearnerConfig(MC, BCFG, opt, loss=loss, ppo=ppo), **kw)


def _assert_trees_close(a, b, rtol=1e-6, atol=0.0):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def _one_step_reference(params, ref, state, decisions, opt, *, old_from_learner):
  """The learner's algorithm before PPO passes (one step per update), written out:
  summed micro-batch gradients / N, then one jitted clip_by_global_norm -> AdamW step
  with the old hard-coded AdamW constants."""
  tx = optax.chain(optax.clip_by_global_norm(opt.max_grad_norm), optax.adamw(
      opt.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=opt.weight_decay,
      mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)))

  @jax.jit
  def step(p, s, grad_sum, n):
    grads = jax.tree.map(lambda g, q: (g / n).astype(q.dtype), grad_sum, p)
    updates, s = tx.update(grads, s, p)
    return optax.apply_updates(p, updates), s

  total = jax.tree.map(jnp.zeros_like, params)
  loss = 0.0
  for mb in batching.micro_batches(decisions, BCFG):
    (l, _, _, _), g = loss_step.grpo_loss_and_grads(
        params, ref, batching.to_step_batch(mb), model_config=MC, clip_epsilon=0.2,
        kl_beta=0.1, kl_estimator='exact', temperature=0.7,
        old_from_learner=old_from_learner)
    total = jax.tree.map(lambda a, b: a + b, total, g)
    loss += float(l)
  new, state = step(params, state, total, jnp.float32(len(decisions)))
  return new, state, loss / len(decisions)


def test_one_iteration_is_unchanged(setup):
  params, decisions = setup
  opt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=1, warmup_ratio=0.0,
                              lr_schedule='constant')
  ref = jax.tree.map(lambda x: x * 1.01, params)
  state0 = optim.make_optimizer(opt).init(params)
  new, state, m = _run(params, decisions, opt=opt, ref=ref, state=state0)
  want, want_state, want_loss = _one_step_reference(params, ref, state0, decisions, opt,
                                                    old_from_learner=True)
  _assert_trees_close(new, want, rtol=0)  # bit for bit
  _assert_trees_close(state, want_state, rtol=0)
  assert m['train/loss'] == pytest.approx(want_loss, rel=1e-12)
  assert m['train/optimizer_steps'] == 1 and m['train/skipped_steps'] == 0
  assert m['train/ratio_min'] == m['train/ratio_max'] == 1.0  # ρ = 1: no clip
  assert m['train/pass1/clip_fraction'] == 0.0 and m['train/approx_kl'] == 0.0


def _logits(params, decisions):
  (mb,) = batching.micro_batches(decisions, dataclasses.replace(BCFG,
                                                                micro_batch_size=8))
  step = batching.to_step_batch(mb)
  return step, loss_step.command_logits(MC, params, step)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.slow  # ~35 s
def test_second_pass_is_clipped_ppo_and_matches_numpy(setup, monkeypatch):
  params, decisions = setup
  opt = optim.OptimizerConfig(learning_rate=3e-2, total_steps=1, warmup_ratio=0.0,
                              lr_schedule='constant')
  n = len(decisions)
  applied = []  # (params, summed gradient) of every optimizer step
  real_apply = rl_optimizer.apply_update

  def capture(p, state, grad_sum, num, **kw):
    applied.append((p, grad_sum, float(num)))
    return real_apply(p, state, grad_sum, num, **kw)

  monkeypatch.setattr(rl_optimizer, 'apply_update', capture)
  _, _, m = _run(params, decisions, opt=opt, ppo=rl_optimizer.PPOConfig(2, 1))
  (p0, _, n0), (p1, grad_sum2, n1) = applied
  assert n0 == n1 == n
  _assert_trees_close(p0, params, rtol=0)
  # Pass 2 runs at θ1 with θ_old = θ0: ρ != 1 and the clip acts.
  assert m['train/optimizer_steps'] == 2
  assert m['train/pass1/ratio_min'] == m['train/pass1/ratio_max'] == 1.0
  assert m['train/pass2/ratio_min'] < 0.8 and m['train/pass2/ratio_max'] > 1.2
  assert m['train/pass2/clip_fraction'] > 0 and m['train/pass2/clip_active_fraction'] > 0
  assert m['train/pass2/approx_kl'] > 0 and m['train/pass2/kl'] > 0
  # Independent reference: θ_old's log-probs from θ0's logits (NumPy log-softmax);
  # pass 2's loss and logit gradient from the NumPy PPO formula at θ1's logits,
  # pulled back to the parameters through the model's own vjp.
  step, logits0 = _logits(params, decisions)
  lp0 = _log_softmax(np.asarray(logits0, np.float64) / 0.7)
  old = np.take_along_axis(lp0, step['target_ids'][..., None], -1)[..., 0]
  batch = dict(step, old_logprobs=old.astype(np.float32))
  logits1, vjp = jax.vjp(lambda p: loss_step.command_logits(MC, p, step), p1)
  ref_loss, ref_dlogits, ratios = ref_ppo_loss_and_logit_grad(
      np.asarray(logits1), np.asarray(logits0), batch, 0.2, 0.1, 0.7)
  assert np.mean(np.abs(ratios - 1) > 0.2) == pytest.approx(
      m['train/pass2/clip_fraction'], abs=1e-6)
  assert m['train/pass2/loss'] == pytest.approx(ref_loss / n, rel=1e-5)
  (ref_grads,) = vjp(jnp.asarray(ref_dlogits, jnp.float32))
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(ref_grads))
  _assert_trees_close(grad_sum2, ref_grads, rtol=1e-5, atol=1e-5 * scale)


def test_mini_batches_fix_theta_old_and_normalize_per_mini_batch(setup):
  params, decisions = setup
  opt = optim.OptimizerConfig(learning_rate=3e-2, total_steps=1, warmup_ratio=0.0,
                              lr_schedule='constant')
  ppo = rl_optimizer.PPOConfig(1, 2)
  _, got_state, m = _run(params, decisions, opt=opt, ppo=ppo, shuffle_seed=(7, 3))
  first, second = batching.mini_batch_partition(len(decisions), 2,
                                                np.random.default_rng([7, 3, 0]))
  # Step 1: a one-step update on the first mini-batch (θ = θ_old, N_b = its size).
  p1, s1, _ = _run(params, [decisions[i] for i in first], opt=opt)
  # Step 2: the second mini-batch at θ1 with θ_old's log-probs from θ0.
  old = rl_learner.theta_old_logprobs(
      params, [decisions[i] for i in second], model_config=MC, batching_config=BCFG,
      temperature=0.7, pad_id=0)
  fixed = [dataclasses.replace(decisions[i], old_logprobs=lp)
           for i, lp in zip(second, old)]
  _, want_state, m2 = _run(p1, fixed, opt=opt, state=s1, ref=params,
                           loss=dataclasses.replace(LOSS, old_logprobs='sampler'))
  # θ_old's log-probs come from other row groupings here than in the learner, so the
  # two steps' gradients, and Adam's moments, agree to float32 reassociation.
  float_tolerance.assert_same_adam_moments(
      got_state, want_state,
      n_terms=sum(len(d.prompt_tokens) + len(d.command_tokens) for d in decisions))
  assert m['train/optimizer_steps'] == 2 and m['train/num_mini_batches'] == 2
  assert m['train/pass1/ratio_max'] == pytest.approx(m2['train/ratio_max'], rel=1e-6)
  assert m['train/pass1/ratio_max'] != 1.0  # the second step already moved off θ_old
  # Sampler gap over every decision (learner θ_old minus the recorded numbers).
  gap = []
  all_old = rl_learner.theta_old_logprobs(params, decisions, model_config=MC,
                                          batching_config=BCFG, temperature=0.7,
                                          pad_id=0)
  for lp, d in zip(all_old, decisions):
    gap.extend(np.asarray(lp, np.float64) - np.asarray(d.old_logprobs))
  assert m['train/sampler_logprob_gap'] == pytest.approx(np.mean(gap), rel=1e-5)


def test_non_finite_step_is_skipped_and_counted(setup, monkeypatch):
  params, decisions = setup
  opt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=1, warmup_ratio=0.0,
                              lr_schedule='constant')
  real = loss_step.grpo_loss_and_grads
  calls = []

  def nan_on_first_micro_batch(*args, **kwargs):
    out, grads = real(*args, **kwargs)
    calls.append(1)
    if len(calls) == 1:
      grads = jax.tree.map(lambda g: g.at[(0,) * g.ndim].set(jnp.nan), grads)
    return out, grads

  monkeypatch.setattr(loss_step, 'grpo_loss_and_grads', nan_on_first_micro_batch)
  state0 = optim.make_optimizer(opt).init(params)
  counter = nonfinite.SkipCounter(2)
  new, state, m = _run(params, decisions, opt=opt, state=state0,
                       ppo=rl_optimizer.PPOConfig(2, 1), skip_counter=counter,
                       label='phase_b update 4')
  assert m['train/skipped_steps'] == 1 and counter.total == 1
  assert counter.consecutive == 0  # pass 2 was finite
  # Pass 1 skipped: pass 2 ran from θ0 with the optimizer state untouched, so the
  # result equals one clean step (θ = θ_old, ρ = 1).
  monkeypatch.setattr(loss_step, 'grpo_loss_and_grads', real)
  clean, clean_state, _ = _run(params, decisions, opt=opt, state=state0)
  _assert_trees_close(new, clean, rtol=1e-6)
  _assert_trees_close(state, clean_state, rtol=1e-6)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new))
  # Two skips in a row stop with the update named.
  calls.clear()
  monkeypatch.setattr(loss_step, 'grpo_loss_and_grads', lambda *a, **k: (
      real(*a, **k)[0], jax.tree.map(lambda g: g * jnp.nan, real(*a, **k)[1])))
  with pytest.raises(nonfinite.NonFiniteError, match='phase_b update 5, pass 2/2'):
    _run(params, decisions, opt=opt, ppo=rl_optimizer.PPOConfig(2, 1),
         skip_counter=nonfinite.SkipCounter(2), label='phase_b update 5')
