"""Model steps on command tokens: hidden states at the command positions, the chunked
vocabulary head, and the GRPO / SFT losses of rl/grpo.py with their gradients (jitted).

The [B, L] layout, the equations and the deferred normalization are rl/grpo.py's (its
module docstring). These steps never form [B, L, V] logits: `command_token_stats`
projects the gathered hidden states onto the vocabulary in chunks of `loss_chunk_size`
command positions (rl/token_stats.py) and the losses read per-token statistics
(`grpo.grpo_loss_from_token_stats`, `grpo.command_nll_from_token_stats`).
"""
from __future__ import annotations

import functools
from typing import Mapping, Optional

import jax
import jax.numpy as jnp

from vermem_jax.models import qwen
from vermem_jax.models import sharding
from vermem_jax.rl import token_stats
from vermem_jax.rl.grpo import DEFAULT_CLIP_EPSILON
from vermem_jax.rl.grpo import DEFAULT_KL_BETA
from vermem_jax.rl.grpo import DEFAULT_MAX_LOG_RATIO
from vermem_jax.rl.grpo import STEP_BATCH_KEYS
from vermem_jax.rl.grpo import check_loss_args
from vermem_jax.rl.grpo import command_nll_from_token_stats
from vermem_jax.rl.grpo import gather_positions
from vermem_jax.rl.grpo import grpo_loss_from_token_stats

# Command positions per vocabulary chunk of the learner's head and loss
# (rl/token_stats.py): [128, 151936] float32 logits are 74 MiB, and the whole head +
# exact-KL loss stays well under 1 GiB of temporaries at any micro-batch size. The
# config key is `rl.loss_chunk_size` / `sft.loss_chunk_size`; None = unchunked.
DEFAULT_LOSS_CHUNK_SIZE = 128


def command_hidden(model_config, params, batch: Mapping[str, jax.Array]) -> jax.Array:
  """Final hidden states at the command positions only: [B, L, D] (compute dtype).

  Runs the Qwen trunk over the full [B, T] sequence (return_hidden=True) and gathers
  the states at batch['command_positions'] [B, L].
  """
  hidden = qwen.Qwen(model_config).apply(
      {'params': params}, batch['input_ids'], positions=batch.get('positions'),
      attention_mask=batch['attention_mask'], return_hidden=True)
  return gather_positions(hidden, batch['command_positions'])


def command_logits(model_config, params, batch: Mapping[str, jax.Array]) -> jax.Array:
  """Policy logits at the command positions only: [B, L, V] float32.

  `command_hidden` projected with `lm_head_logits`, so no [B, T, V] array is formed;
  the losses below go further and never form [B, L, V] (`command_token_stats`).
  """
  return qwen.lm_head_logits(model_config, params,
                             command_hidden(model_config, params, batch))


def command_token_stats(model_config, params, batch: Mapping[str, jax.Array], *,
                        ref_params=None, kl_estimator: Optional[str] = None,
                        temperature: float = 1.0,
                        chunk_size: Optional[int] = DEFAULT_LOSS_CHUNK_SIZE,
                        entropy: bool = True, correct: bool = False) -> dict:
  """Per-token statistics of the command tokens (rl/token_stats.py) through the model.

  Policy trunk -> hidden states at command_positions -> head and statistics in chunks
  of `chunk_size` positions; with `kl_estimator`, the reference trunk likewise (a
  constant: no gradient reaches ref_params).

  Args:
    model_config: QwenConfig.
    params: policy parameters (differentiable).
    batch: input_ids, attention_mask, (positions), command_positions, target_ids.
    ref_params: reference parameters, required with kl_estimator.
    kl_estimator: None, 'exact' or 'k3' (what token_stats adds: 'kl' / 'ref_logp').
    temperature: T of every log-probability.
    chunk_size: positions per chunk; None projects all [B, L, V] logits at once.
    entropy, correct: include 'entropy' / 'correct'.
  Returns:
    {'logp', ...} [B, L] float32 arrays.
  """
  hidden = command_hidden(model_config, params, batch)
  ref_hidden = None
  if kl_estimator is not None:
    if ref_params is None:
      raise ValueError('ref_params are required with a KL estimator')
    ref_hidden = jax.lax.stop_gradient(command_hidden(model_config, ref_params, batch))
  targets = batch['target_ids']
  if chunk_size is None:
    ref_logits = None if ref_hidden is None else qwen.lm_head_logits(
        model_config, jax.lax.stop_gradient(ref_params), ref_hidden)
    return token_stats.stats_from_logits(
        qwen.lm_head_logits(model_config, params, hidden), ref_logits, targets,
        temperature=temperature, kl_estimator=kl_estimator, entropy=entropy,
        correct=correct)
  project, select = token_stats.head_projection(model_config)
  return token_stats.chunked_stats(
      project, select(params), hidden, targets,
      ref_head=None if ref_params is None else select(ref_params),
      ref_hidden=ref_hidden, chunk_size=chunk_size, temperature=temperature,
      kl_estimator=kl_estimator, entropy=entropy, correct=correct)


@functools.partial(jax.jit, static_argnames=(
    'model_config', 'clip_epsilon', 'kl_beta', 'kl_estimator', 'temperature',
    'old_from_learner', 'max_log_ratio', 'loss_chunk_size', 'reduction'))
def grpo_loss_and_grads(params, ref_params, batch, *, model_config,
                        clip_epsilon: float = DEFAULT_CLIP_EPSILON,
                        kl_beta: float = DEFAULT_KL_BETA,
                        kl_estimator: str = 'exact', temperature: float = 1.0,
                        old_from_learner: bool = False,
                        max_log_ratio: float = DEFAULT_MAX_LOG_RATIO,
                        loss_chunk_size: Optional[int] = DEFAULT_LOSS_CHUNK_SIZE,
                        reduction: str = 'decision'):
  """The learner step: summed GRPO loss and gradient of one micro-batch (Eq. 11), jitted.

  Policy forward over [B, T] -> hidden states gathered at command_positions ->
  per-token statistics in chunks of `loss_chunk_size` positions
  (`command_token_stats`; no [B, L, V] array) -> grpo_loss_from_token_stats; the
  reference policy (ref_params, constants) likewise when kl_beta != 0. The learner's
  own log π_θ(y_j | h_j) at `temperature` is returned too. With `old_from_learner`
  (only at θ = θ_old, an update's first optimizer step), θ_old's log-probs are those
  values under stop_gradient: ρ = exp(log π_θ − sg(log π_θ)) = 1 and ∇ρ = ∇ log π_θ,
  without a second forward pass (train/rl_learner.py docstring); otherwise
  batch['old_logprobs'] is used.

  Args:
    params: policy parameters θ (the parameter tree of vermem_jax.models.qwen).
    ref_params: reference parameters θ_ref (ignored, may be None, when kl_beta == 0).
    batch: STEP_BATCH_KEYS (+ optional 'positions'): [B, T] model inputs and the
      [B, L] loss layout (`batching.to_step_batch`; rl/grpo.py module docstring).
    model_config: QwenConfig (static, hashable).
    clip_epsilon, kl_beta, kl_estimator, max_log_ratio, reduction: as in
      grpo.grpo_loss_from_token_stats.
    temperature: T of π_θ, π_θold and π_ref (> 0).
    old_from_learner: see above.
    loss_chunk_size: command positions per vocabulary chunk (None: unchunked).

  Returns:
    ((loss_sum, num_decisions, metrics, learner_logprobs [B, L] float32, 0 on padding),
    grads): grads = ∂ loss_sum / ∂ params, NOT yet divided by the number of decisions;
    accumulate over micro-batches and divide by the mini-batch's total num_decisions
    once.

  Raises:
    ValueError: (at trace time) on missing keys, mismatched [B, L] shapes, or bad
      temperature / KL estimator.
  """
  missing = [k for k in STEP_BATCH_KEYS if k not in batch]
  if missing:
    raise ValueError(f"step batch is missing keys {missing}")
  check_loss_args(batch['target_ids'].shape, batch, temperature, kl_estimator)
  mask = batch['command_ids'] > 0

  def loss_fn(p):
    stats = command_token_stats(
        model_config, p, batch, ref_params=ref_params if kl_beta != 0 else None,
        kl_estimator=kl_estimator if kl_beta != 0 else None, temperature=temperature,
        chunk_size=loss_chunk_size)
    logp = jnp.where(mask, jax.lax.stop_gradient(stats['logp']), 0.0)
    loss_batch = dict(batch, old_logprobs=logp) if old_from_learner else batch
    loss_sum, num, metrics = grpo_loss_from_token_stats(
        stats, loss_batch, clip_epsilon=clip_epsilon, kl_beta=kl_beta,
        kl_estimator=kl_estimator, max_log_ratio=max_log_ratio, reduction=reduction)
    return loss_sum, (num, metrics, logp)

  (loss_sum, (num, metrics, logp)), grads = jax.value_and_grad(
      loss_fn, has_aux=True)(params)
  return (loss_sum, num, metrics, logp), sharding.constrain_params(grads)


@functools.partial(jax.jit, static_argnames=('model_config', 'temperature',
                                             'loss_chunk_size'))
def policy_logprobs(params, batch, *, model_config, temperature: float = 1.0,
                    loss_chunk_size: Optional[int] = DEFAULT_LOSS_CHUNK_SIZE):
  """log π_θ(target_ids) at command positions, [B, L] float32 (0 where command_ids==0).

  Used to recompute old_logprobs with θ_old on the learner instead of taking the
  sampler's values; vocabulary chunks of `loss_chunk_size` positions.
  """
  lp = command_token_stats(model_config, params, batch, temperature=temperature,
                           chunk_size=loss_chunk_size, entropy=False)['logp']
  return jnp.where(batch['command_ids'] > 0, lp, 0.0)


@functools.partial(jax.jit, static_argnames=('model_config', 'reduction',
                                             'loss_chunk_size'))
def sft_loss_and_grads(params, batch, *, model_config, reduction: str = 'token',
                       loss_chunk_size: Optional[int] = DEFAULT_LOSS_CHUNK_SIZE):
  """Jitted SFT command-token NLL and gradient (Eq. 7) with deferred normalization.

  Args:
    params: policy parameters.
    batch: input_ids, attention_mask, (positions), command_positions, target_ids,
      command_ids (select_command_tokens layout; advantages/old_logprobs unused).
    model_config: QwenConfig (static).
    reduction: see grpo.command_nll_from_token_stats.
    loss_chunk_size: command positions per vocabulary chunk (None: unchunked).

  Returns:
    ((nll_sum, count, metrics), grads of nll_sum).
  """
  def loss_fn(p):
    stats = command_token_stats(model_config, p, batch, chunk_size=loss_chunk_size,
                                entropy=False, correct=True)
    total, count, metrics = command_nll_from_token_stats(stats, batch,
                                                         reduction=reduction)
    return total, (count, metrics)

  (total, (count, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return (total, count, metrics), sharding.constrain_params(grads)
