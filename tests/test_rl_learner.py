"""GRPO learner of an RL phase (vermem_jax/train/rl_learner.py): the loss at θ = θ_old =
θ_ref, the sampler log-prob mode, micro-batch independence and the learner shapes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float_tolerance  # tests/ helper

from vermem_jax.models import qwen
from vermem_jax.models import qwen_config
from vermem_jax.rl import batching
from vermem_jax.rl import loss_step
from vermem_jax.train import optim
from vermem_jax.train import rl_learner


def _tiny_model():
  config = qwen_config.QwenConfig()
  return config, qwen.init_params(config, jax.random.PRNGKey(0))


def _decisions(rng, n, advantages, command_lengths):
  out = []
  for i in range(n):
    p = int(rng.integers(12, 40))
    c = int(command_lengths[i])
    out.append(batching.DecisionTokens(
        prompt_tokens=tuple(int(x) for x in rng.integers(0, 151000, p)),
        command_tokens=tuple(int(x) for x in rng.integers(0, 151000, c)),
        # Arbitrary sampler numbers: the learner recomputes θ_old's (module docstring).
        old_logprobs=tuple(float(x) for x in rng.uniform(-12, -1, c)),
        advantage=float(advantages[i])))
  return out


def test_learner_update_loss_is_minus_mean_advantage_at_theta_ref():
  """θ = θ_old = θ_ref: ρ = 1 and KL = 0, so loss = −(1/N) Σ_d A_d exactly per decision
  (commands of different lengths weigh the same, SPEC §6)."""
  mc, params = _tiny_model()
  rng = np.random.default_rng(0)
  adv = np.array([1.5, -0.5, 2.0, -3.0, 0.25])
  lengths = [1, 7, 3, 8, 2]
  decisions = _decisions(rng, 5, adv, lengths)
  bcfg = batching.BatchingConfig(micro_batch_size=2, length_buckets=(64,),
                                 command_buckets=(8,))
  opt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=1, warmup_ratio=0.0,
                              lr_schedule='constant')
  new_params, _, m = rl_learner.learner_update(
      params, params, optim.make_optimizer(opt).init(params), decisions,
      rl_learner.LearnerConfig(mc, bcfg, opt))
  assert m['train/loss'] == pytest.approx(-adv.mean(), abs=1e-5)
  # A per-token mean would give −Σ L_d A_d / Σ L_d instead.
  assert abs(-(adv * lengths).sum() / sum(lengths) - (-adv.mean())) > 0.1
  assert abs(m['train/kl']) < 1e-6
  assert m['train/ratio'] == pytest.approx(1.0, abs=1e-5)
  assert m['train/clip_fraction'] == 0.0
  assert m['train/num_decisions'] == 5 and m['train/num_micro_batches'] == 3
  assert m['train/grad_norm'] > 0
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                     jax.tree.leaves(new_params))]
  assert any(moved)


def test_sampler_logprobs_mode_uses_the_recorded_numbers():
  """rl.old_logprobs='sampler': ρ = π_θ / exp(recorded); recorded = learner log-prob +
  log 0.95 (a top-p renormalization) gives ρ = 1/0.95 on every token."""
  mc, params = _tiny_model()
  rng = np.random.default_rng(2)
  base = _decisions(rng, 3, [1.0, -2.0, 0.5], [2, 4, 3])
  bcfg = batching.BatchingConfig(micro_batch_size=4, length_buckets=(64,),
                                 command_buckets=(8,))
  batch = batching.to_step_batch(batching.micro_batches(base, bcfg)[0])
  lp = np.asarray(loss_step.policy_logprobs(params, batch, model_config=mc, temperature=0.7))
  shifted = []
  for i, d in enumerate(base):
    row = int(np.flatnonzero(batch['command_ids'][:, 0] == i + 1)[0])
    recorded = lp[row, :len(d.command_tokens)] + np.log(0.95)
    shifted.append(batching.DecisionTokens(d.prompt_tokens, d.command_tokens,
                                           tuple(float(x) for x in recorded),
                                           d.advantage))
  opt = optim.OptimizerConfig(learning_rate=1e-6, total_steps=1, warmup_ratio=0.0,
                              lr_schedule='constant')
  _, _, m = rl_learner.learner_update(
      params, params, optim.make_optimizer(opt).init(params), shifted,
      rl_learner.LearnerConfig(mc, bcfg, opt,
                               loss=rl_learner.LossConfig(old_logprobs='sampler')))
  assert m['train/ratio'] == pytest.approx(1 / 0.95, rel=1e-4)
  assert m['train/sampler_logprob_gap'] == pytest.approx(-np.log(0.95), abs=1e-4)
  # min(ρA, clip(ρ)A) with ρ = 1/0.95 < 1 + ε: the loss is −mean(ρ A).
  assert m['train/loss'] == pytest.approx(-np.mean([1.0, -2.0, 0.5]) / 0.95, rel=1e-4)
  with pytest.raises(ValueError, match='old_logprobs'):
    rl_learner.LossConfig(old_logprobs='bogus')


def test_learner_update_is_independent_of_the_micro_batch_split():
  """Sums over micro-batches divided once by N: 1 x 5 rows == 3 batches of <= 2.

  The gradient the optimizer received is compared (float_tolerance: tolerances are
  the summed tokens x float32 eps x the magnitude compared); a per-micro-batch mean, or
  a micro-batch left out, moves it by O(1) of its size instead.
  """
  mc, params = _tiny_model()
  ref = jax.tree.map(lambda x: x + 0.01 * jnp.sign(x), params)  # θ_ref != θ: KL > 0
  rng = np.random.default_rng(1)
  adv = rng.normal(size=5)
  decisions = _decisions(rng, 5, adv, [2, 5, 1, 6, 3])
  n_terms = sum(len(d.prompt_tokens) + len(d.command_tokens) for d in decisions)
  opt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=1, warmup_ratio=0.0,
                              lr_schedule='constant')
  outs = []
  for mb in (8, 2):
    bcfg = batching.BatchingConfig(micro_batch_size=mb, length_buckets=(64,),
                                   command_buckets=(8,))
    outs.append(rl_learner.learner_update(
        params, ref, optim.make_optimizer(opt).init(params), decisions,
        rl_learner.LearnerConfig(mc, bcfg, opt)))
  (_, s1, m1), (_, s2, m2) = outs
  assert m1['train/num_micro_batches'] == 1 and m2['train/num_micro_batches'] == 3
  assert m1['train/kl'] > 1e-6
  # loss = (1/N) Σ_d (ρ A_d − β KL_d), ρ ≈ 1: its terms are of size |A_d|.
  assert m1['train/loss'] == pytest.approx(
      m2['train/loss'], abs=float_tolerance.reassociation_atol(n_terms, np.abs(adv).mean()))
  assert m1['train/grad_norm'] == pytest.approx(
      m2['train/grad_norm'], rel=float_tolerance.reassociation_atol(n_terms, 1.0))
  float_tolerance.assert_same_adam_moments(s1, s2, n_terms=n_terms)

def test_learner_buckets_cover_the_longest_row():
  bcfg = batching.BatchingConfig(length_buckets=(256, 512), command_buckets=(16,))
  out = rl_learner.learner_batching_config(bcfg, policy_input_limit=512,
                                           prompt_overhead=30, max_command_tokens=16)
  assert out.length_buckets == (256, 512, 558)
  same = rl_learner.learner_batching_config(out, policy_input_limit=512,
                                            prompt_overhead=30, max_command_tokens=16)
  assert same is out
