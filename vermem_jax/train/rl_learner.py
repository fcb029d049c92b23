"""The GRPO learner of an RL phase: optimizer and the jitted update over one update's
decisions (SPEC §6, Eq. 11; paper App. F.6).

Optimizer (SPEC §6). clip_by_global_norm(rl.max_grad_norm = 1.0) -> optax AdamW at the
constant rate rl.learning_rate (1e-6; the paper names no schedule), weight decay
rl.weight_decay (not applied to 1-D parameters, as in SFT), no entropy bonus
(rl.entropy_coef must be 0; the loss has no entropy term).

One learner step per update (`learner_update`): every decision (∅ and rejected
commands included) becomes one row of the padded micro-batches
(`batching.micro_batches`; command-token weights already divided by the update's N
decisions). `grpo_step` (grpo.command_logits + grpo.grpo_loss_from_logits, jitted; the
computation of grpo.grpo_loss_and_grads) returns loss and gradient SUMS per
micro-batch; they are accumulated and divided once by N, then one optimizer step is
applied (`apply_update`; SPEC §6: per-command token mean, then mean over all decisions
of the update).

θ_old's log-probabilities. With exactly one optimizer step per update, the parameters
that sampled the update are θ_old exactly. The sampler records each command token's
log-probability under the distribution it was DRAWN from: logits / T restricted to the
top-p nucleus and renormalized (models/sampling.py), which exceeds log π_θold(y | h) at
temperature T (the policy the loss evaluates) by the log of the nucleus mass (≈ log
0.95 for a flat tiny model). The default (`rl.old_logprobs = 'learner'`, read with a
default since the config field is optional) therefore takes log π_θold at temperature T
from the learner's own forward pass under stop_gradient (`grpo_step`): θ = θ_old at the
single step, so ρ = 1 exactly and ∇ρ = ∇ log π_θ, as in GRPO with one policy iteration,
at no extra forward pass. The sampler's values are kept as a diagnostic
(`train/sampler_logprob_gap`, learner minus sampler per command token: ≈ 0 up to the
nucleus renormalization and KV-cache vs full-sequence rounding). `rl.old_logprobs =
'sampler'` uses the sampler's numbers in the ratio instead.

Devices (`train/setup.py`). θ, π_ref and the AdamW state are placed on the
('data', 'fsdp', 'tensor') mesh by the caller; learner micro-batch rows are split over
('data', 'fsdp') and the jitted learner runs under `sharding.use_sharding`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Mapping, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from vermem_jax.models import qwen
from vermem_jax.rl import batching
from vermem_jax.rl import grpo
from vermem_jax.train import setup as setup_lib

# Sources of θ_old's log-probabilities (module docstring).
OLD_LOGPROBS_SOURCES = ('learner', 'sampler')
DEFAULT_OLD_LOGPROBS = 'learner'
# AdamW moments/epsilon: the PyTorch / HF defaults, as in SFT (SPEC §6 names AdamW only
# through the SFT recipe; the paper gives no RL optimizer details beyond lr and clip).
ADAM_B1 = 0.9
ADAM_B2 = 0.999
ADAM_EPS = 1e-8


def learner_batching_config(bcfg: batching.BatchingConfig, *, policy_input_limit: int,
                            prompt_overhead: int,
                            max_command_tokens: int) -> batching.BatchingConfig:
  """`bcfg` with a last length bucket covering the longest possible learner row.

  A row is the chat-templated x_t (at most policy_input_limit + prompt_overhead tokens)
  plus at most max_command_tokens command tokens. When config.batching.length_buckets
  ends below that, one bucket of exactly that length is appended (one more jit shape)
  and a warning names the config field, instead of failing mid-run.
  """
  need = int(policy_input_limit) + int(prompt_overhead) + int(max_command_tokens)
  if bcfg.length_buckets[-1] >= need:
    return bcfg
  logging.warning(
      'config.batching.length_buckets ends at %d tokens, below policy_input_limit (%d) '
      '+ chat-template overhead (%d) + max_command_tokens (%d) = %d; adding a %d-token '
      'bucket', bcfg.length_buckets[-1], policy_input_limit, prompt_overhead,
      max_command_tokens, need, need)
  return dataclasses.replace(bcfg, length_buckets=tuple(bcfg.length_buckets) + (need,))


# ----------------------------------------------------------------------------- optimizer
@dataclasses.dataclass(frozen=True)
class RLOptimizerConfig:
  """RL optimizer (config section `rl`; SPEC §6). Hashable: a static jit argument.

  Attributes:
    learning_rate: constant AdamW rate (SPEC §6: 1e-6).
    max_grad_norm: global-norm clip (SPEC §6: 1.0).
    weight_decay: AdamW decoupled weight decay, not on 1-D params (SPEC gives none: 0).
  """
  learning_rate: float = 1e-6
  max_grad_norm: float = 1.0
  weight_decay: float = 0.0

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f'rl.learning_rate must be > 0, got {self.learning_rate}')
    if not self.max_grad_norm > 0:
      raise ValueError(f'rl.max_grad_norm must be > 0, got {self.max_grad_norm}')
    if self.weight_decay < 0:
      raise ValueError(f'rl.weight_decay must be >= 0, got {self.weight_decay}')


def make_optimizer(opt: RLOptimizerConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) -> AdamW(learning_rate) (SPEC §6)."""
  return optax.chain(
      optax.clip_by_global_norm(opt.max_grad_norm),
      optax.adamw(opt.learning_rate, b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS,
                  weight_decay=opt.weight_decay,
                  mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)))




@jax.jit
def _add_grads(acc: Any, grads: Any) -> Any:
  return jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)


@functools.partial(jax.jit, static_argnames=('opt',))
def apply_update(params: Any, opt_state: Any, grad_sum: Any, num_decisions: jax.Array,
                 *, opt: RLOptimizerConfig) -> tuple[Any, Any, jax.Array]:
  """One optimizer step from the update's summed gradient (jitted; divides once).

  Args:
    params, opt_state: θ and the `make_optimizer(opt)` state.
    grad_sum: Σ over micro-batches of ∂(Σ_decisions per-command token-mean loss)/∂θ
      (float32 tree shaped like params).
    num_decisions: N, decisions in the update (float32 scalar, >= 1).
  Returns:
    (new params, new opt_state, global norm of the mean gradient before clipping).
  """
  grads = jax.tree.map(lambda g, p: (g / num_decisions).astype(p.dtype), grad_sum,
                       params)
  updates, new_opt_state = make_optimizer(opt).update(grads, opt_state, params)
  return optax.apply_updates(params, updates), new_opt_state, optax.global_norm(grads)


def _combine_metrics(parts: Sequence[Mapping[str, tuple]]) -> dict[str, float]:
  """Merges per-micro-batch (value, count) metrics: sums, or min/max for *_min/*_max."""
  merged: dict[str, list] = {}
  for m in parts:
    for k, (v, n) in m.items():
      v, n = float(v), float(n)
      if k not in merged:
        merged[k] = [v, n]
      elif n > 0:
        if merged[k][1] == 0:
          merged[k] = [v, n]
        elif k.endswith('_min'):
          merged[k] = [min(merged[k][0], v), merged[k][1] + n]
        elif k.endswith('_max'):
          merged[k] = [max(merged[k][0], v), merged[k][1] + n]
        else:
          merged[k] = [merged[k][0] + v, merged[k][1] + n]
  return grpo.finalize_metrics({k: tuple(v) for k, v in merged.items()})


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Static loss settings (config section `rl` + sampling temperature; SPEC §6)."""
  clip_epsilon: float = 0.2  # SPEC §6 ε_clip
  kl_beta: float = 0.1  # SPEC §6 β_KL
  kl_estimator: str = 'exact'
  temperature: float = 0.7  # SPEC §4 rollout temperature (ratios at the same T)
  old_logprobs: str = DEFAULT_OLD_LOGPROBS

  def __post_init__(self):
    if self.old_logprobs not in OLD_LOGPROBS_SOURCES:
      raise ValueError(f'rl.old_logprobs must be one of {OLD_LOGPROBS_SOURCES}, got '
                       f'{self.old_logprobs!r}')


@functools.partial(jax.jit, static_argnames=(
    'model_config', 'clip_epsilon', 'kl_beta', 'kl_estimator', 'temperature',
    'old_from_learner'))
def grpo_step(params: Any, ref_params: Any, batch: Mapping[str, jax.Array], *,
              model_config: qwen.QwenConfig, clip_epsilon: float, kl_beta: float,
              kl_estimator: str, temperature: float, old_from_learner: bool):
  """Summed GRPO loss and gradient of one micro-batch (Eq. 11), jitted.

  Same computation as `grpo.grpo_loss_and_grads` (policy and reference logits at the
  command positions only, `grpo.grpo_loss_from_logits`), plus the learner's own
  log π_θ(y_j | h_j) at `temperature`. With `old_from_learner`, θ_old's log-probs are
  those values under stop_gradient: θ = θ_old at the update's single optimizer step, so
  ρ = exp(log π_θ − sg(log π_θ)) = 1 and ∇ρ = ∇ log π_θ, without a second forward pass
  (module docstring). Otherwise batch['old_logprobs'] (the sampler's) is used.

  Args:
    params, ref_params: θ and θ_ref parameter trees.
    batch: `batching.to_step_batch` arrays ([B, T] model inputs, [B, L] loss layout).
    model_config, clip_epsilon, kl_beta, kl_estimator, temperature: static settings.
    old_from_learner: see above.
  Returns:
    ((loss_sum, num_decisions, metrics, learner_logprobs [B, L] float32 (0 on
    padding)), grads of loss_sum) — sums, not yet divided by the update's N.
  """
  ref_logits = None
  if kl_beta != 0:
    ref_logits = jax.lax.stop_gradient(grpo.command_logits(model_config, ref_params,
                                                           batch))
  mask = batch['command_ids'] > 0

  def loss_fn(p):
    logits = grpo.command_logits(model_config, p, batch)
    logp = jax.lax.stop_gradient(grpo.token_logprobs_from_logits(
        logits, batch['target_ids'], temperature=temperature))
    logp = jnp.where(mask, logp, 0.0)
    loss_batch = dict(batch, old_logprobs=logp) if old_from_learner else batch
    loss_sum, num, metrics = grpo.grpo_loss_from_logits(
        logits, ref_logits, loss_batch, clip_epsilon=clip_epsilon, kl_beta=kl_beta,
        kl_estimator=kl_estimator, temperature=temperature)
    return loss_sum, (num, metrics, logp)

  (loss_sum, (num, metrics, logp)), grads = jax.value_and_grad(
      loss_fn, has_aux=True)(params)
  return (loss_sum, num, metrics, logp), grads


def learner_update(params: Any, ref_params: Any, opt_state: Any,
                   decisions: Sequence[batching.DecisionTokens], *,
                   model_config: qwen.QwenConfig, batching_config: batching.BatchingConfig,
                   loss: LossConfig, opt: RLOptimizerConfig, pad_id: int,
                   mesh: jax.sharding.Mesh | None = None
                   ) -> tuple[Any, Any, dict[str, float]]:
  """One GRPO optimizer step over all decisions of an update (SPEC §6, Eq. 11).

  Args:
    params: θ = θ_old (frozen copy not needed: arrays are immutable).
    ref_params: θ_ref (the previous phase's parameters).
    opt_state: optimizer state.
    decisions: the update's N decisions (prompt ids [T_in], command ids [L], sampler
      logprobs [L], A^hier), ∅ and rejected commands included.
    model_config: policy QwenConfig.
    batching_config: learner shapes.
    loss: ε, β, KL estimator, temperature, θ_old log-prob source.
    opt: optimizer settings.
    pad_id: padding token id.
    mesh: the training mesh (`setup.make_mesh_from`; params, ref_params and opt_state
      already placed on it): micro-batch rows are split over ('data', 'fsdp'), the
      model's activation constraints apply, gradient sums are sharded like the params.
      None = single-device behaviour (arrays as placed).
  Returns:
    (new params, new opt_state, metrics): 'train/loss' (= Σ/N of each command's
    token-mean −ℓ), 'train/policy_loss', 'train/kl_loss', 'train/kl', 'train/
    clip_fraction', 'train/ratio', 'train/ratio_min', 'train/ratio_max',
    'train/entropy', 'train/logprob_gap', 'train/logprob_abs_gap', 'train/advantage'
    (token-level), 'train/grad_norm' (pre-clip), 'train/sampler_logprob_gap' and
    '_abs_gap' (learner θ_old minus sampler, per command token), 'train/num_decisions',
    'train/num_micro_batches', 'train/num_shapes', 'train/learning_rate', and seconds
    'time/learner_batching_s', 'time/learner_grads_s' (loss + gradient),
    'time/learner_optimizer_s'.
  Raises:
    ValueError: no decisions, or a decision longer than the learner shapes.
  """
  n = len(decisions)
  if n == 0:
    raise ValueError('an update needs at least one decision')
  t0 = time.perf_counter()
  mbs = batching.micro_batches(decisions, batching_config, pad_id=pad_id)
  t_batch = time.perf_counter() - t0
  t_grad = 0.0
  grad_sum = setup_lib.zeros_like_params(params)
  loss_sum, parts = 0.0, []
  gap_sum = gap_abs_sum = gap_count = 0.0
  kwargs = dict(model_config=model_config, clip_epsilon=loss.clip_epsilon,
                kl_beta=loss.kl_beta, kl_estimator=loss.kl_estimator,
                temperature=loss.temperature,
                old_from_learner=loss.old_logprobs == 'learner')
  for mb in mbs:
    t0 = time.perf_counter()
    step_batch = batching.to_step_batch(mb)
    with setup_lib.mesh_context(mesh):
      (l, _, m, learner_lp), grads = grpo_step(
          params, ref_params, setup_lib.place_batch(step_batch, mesh), **kwargs)
      grad_sum = _add_grads(grad_sum, grads)
    loss_sum += float(l)
    parts.append(m)
    mask = step_batch['command_ids'] > 0
    gap = (np.asarray(learner_lp) - step_batch['old_logprobs'])[mask]
    gap_sum += float(gap.sum())
    gap_abs_sum += float(np.abs(gap).sum())
    gap_count += float(mask.sum())
    t_grad += time.perf_counter() - t0
  t0 = time.perf_counter()
  with setup_lib.mesh_context(mesh):
    new_params, new_opt_state, grad_norm = apply_update(
        params, opt_state, grad_sum, jnp.asarray(float(n), jnp.float32), opt=opt)
  grad_norm = float(grad_norm)  # waits for the step
  t_opt = time.perf_counter() - t0
  out = {f'train/{k}': v for k, v in _combine_metrics(parts).items()}
  out['train/loss'] = loss_sum / n
  out['train/grad_norm'] = grad_norm
  out['train/sampler_logprob_gap'] = gap_sum / max(gap_count, 1.0)
  out['train/sampler_logprob_abs_gap'] = gap_abs_sum / max(gap_count, 1.0)
  out['train/num_decisions'] = float(n)
  out['train/num_micro_batches'] = float(len(mbs))
  out['train/num_shapes'] = float(len(batching.batch_shapes(mbs)))
  out['train/learning_rate'] = float(opt.learning_rate)
  out['time/learner_batching_s'] = t_batch
  out['time/learner_grads_s'] = t_grad
  out['time/learner_optimizer_s'] = t_opt
  return new_params, new_opt_state, out

