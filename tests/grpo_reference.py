"""The GRPO and SFT losses of rl/grpo.py on full [B, L, V] logits: the reference
definitions the tests hold the chunked model steps (rl/loss_step.py) against.

Each builds the per-token statistics with `token_stats.stats_from_logits` from the whole
logits and reads them with the library's `grpo.grpo_loss_from_token_stats` /
`grpo.command_nll_from_token_stats`, so the tests of rl/grpo.py check the loss formulas
against the NumPy references of tests/test_grpo.py, and the model-step tests check the
chunked path against these.
"""
from __future__ import annotations

from typing import Mapping, Optional

import jax

from vermem_jax.rl import grpo
from vermem_jax.rl import token_stats
from vermem_jax.rl.grpo import DEFAULT_CLIP_EPSILON
from vermem_jax.rl.grpo import DEFAULT_KL_BETA
from vermem_jax.rl.grpo import DEFAULT_MAX_LOG_RATIO
from vermem_jax.rl.grpo import NLL_REDUCTIONS


def grpo_loss_from_logits(logits: jax.Array, ref_logits: Optional[jax.Array],
                          batch: Mapping[str, jax.Array], *,
                          clip_epsilon: float = DEFAULT_CLIP_EPSILON,
                          kl_beta: float = DEFAULT_KL_BETA,
                          kl_estimator: str = 'exact',
                          temperature: float = 1.0,
                          max_log_ratio: float = DEFAULT_MAX_LOG_RATIO,
                          reduction: str = 'decision'):
  """Summed token-level clipped GRPO loss over decisions (paper Eq. 10-11, App. F.6).

  Pure and jittable (the keyword arguments are Python constants).

  Args:
    logits: [B, L, V] policy logits at the command-token positions only (any float
      dtype; computed in float32).
    ref_logits: [B, L, V] reference-policy logits at the same positions (treated as
      constants), or None when kl_beta == 0.
    batch, clip_epsilon, kl_beta, kl_estimator, max_log_ratio, reduction: as in
      `grpo.grpo_loss_from_token_stats`.
    temperature: T of the policy, reference and old log-probabilities.

  Returns:
    (loss_sum, num_decisions, metrics) as `grpo.grpo_loss_from_token_stats`.

  Raises:
    ValueError: (at trace time) on missing keys, mismatched shapes, bad options, or
      ref_logits None with kl_beta != 0.
  """
  if logits.ndim != 3:
    raise ValueError(f"logits must be [B, L, V], got shape {logits.shape}")
  grpo.check_loss_args(logits.shape[:2], batch, temperature, kl_estimator)
  if ref_logits is None and kl_beta != 0:
    raise ValueError("ref_logits is required when kl_beta != 0")
  if ref_logits is not None and ref_logits.shape != logits.shape:
    raise ValueError(f"ref_logits shape {ref_logits.shape} != logits {logits.shape}")
  stats = token_stats.stats_from_logits(
      logits, ref_logits, batch['target_ids'], temperature=temperature,
      kl_estimator=None if ref_logits is None else kl_estimator)
  return grpo.grpo_loss_from_token_stats(stats, batch, clip_epsilon=clip_epsilon,
                                    kl_beta=kl_beta, kl_estimator=kl_estimator,
                                    max_log_ratio=max_log_ratio, reduction=reduction)


def command_nll_from_logits(logits: jax.Array, batch: Mapping[str, jax.Array], *,
                            reduction: str = 'token', temperature: float = 1.0):
  """Summed SFT negative log-likelihood of command tokens (paper Eq. 7).

  Pure and jittable. Uses the same [B, L] layout as grpo_loss_from_logits (only
  target_ids and command_ids are read) and the same deferred normalization.

  Args:
    logits: [B, L, V] logits at the command-token positions.
    batch: {'target_ids': [B, L] int, 'command_ids': [B, L] int (0 = not trained)}.
    reduction: one of grpo.NLL_REDUCTIONS (`grpo.command_nll_from_token_stats`).
    temperature: logits are divided by it (1.0 for SFT).

  Returns:
    (nll_sum, count, metrics) as `grpo.command_nll_from_token_stats`.

  Raises:
    ValueError: (at trace time) on missing keys, shapes or a bad reduction.
  """
  if reduction not in NLL_REDUCTIONS:
    raise ValueError(f"reduction must be one of {NLL_REDUCTIONS}, got {reduction!r}")
  for k in ('target_ids', 'command_ids'):
    if k not in batch:
      raise ValueError(f"batch is missing {k!r}")
    if tuple(batch[k].shape) != tuple(logits.shape[:2]):
      raise ValueError(f"batch[{k!r}] must have shape {tuple(logits.shape[:2])}")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  stats = token_stats.stats_from_logits(logits, None, batch['target_ids'],
                                        temperature=temperature, entropy=False,
                                        correct=True)
  return grpo.command_nll_from_token_stats(stats, batch, reduction=reduction)


def token_logprobs_from_logits(logits: jax.Array, target_ids: jax.Array, *,
                               temperature: float = 1.0) -> jax.Array:
  """log softmax(logits / T)[target] per slot: [B, L, V], [B, L] -> [B, L] float32.

  The learner-side recomputation of old_logprobs (θ_old = θ before the update).
  """
  return token_stats.stats_from_logits(logits, None, target_ids, temperature=temperature,
                                       entropy=False)['logp']
