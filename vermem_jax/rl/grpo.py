"""Token-level clipped GRPO objective on command tokens (paper Eq. 10-11, App. B, F.6).

For command u_{t,k} with tokens y_{t,k,1:L} and shared advantage A = A^hier_{t,k}:

  ρ_j   = π_θ(y_j | h_j) / π_θold(y_j | h_j)                       (Eq. 10)
  d_j   = KL(π_θ(· | h_j) || π_ref(· | h_j))                        (Eq. 10)
  ℓ_j   = min(ρ_j A, clip(ρ_j, 1-ε, 1+ε) A) - β d_j                 (Eq. 11)
  J     = (1/|B_op|) Σ_{decisions} (1/L) Σ_j ℓ_j                    (Eq. 11)

and the loss is -J. `reduction` chooses the 1/L: 'decision' is Eq. 11 (each command's
token mean); 'sqrt' (1/√L) and 'sequence' (1: each command's token sum, as Dr. GRPO,
Liu et al. 2025, drops GRPO's 1/|o|) are ours, not the paper's. Under 1/L a rejected
command's tokens are pushed down less the longer it is, and the command's first (tool)
token gets 1/L of its advantage: in the tiny default's Phase A (issue 22) every Add was
rejected at A^hier < 0, yet log π of the `Add(` token rose over an update (+0.27 on
17 rejected Adds of 53 tokens on average, update 3 of seed 42) and the sampled Add
share went 11% -> 42%.

Everything is evaluated at the policy temperature (logits / T), the log-ratio is
clamped to ±max_log_ratio before exp, and d_j is either the exact KL over the
vocabulary (default) or the k3 estimator on the sampled token.

Layout. The loss works on command tokens only, gathered into a fixed [B, L] layout
(L = a bucketed maximum number of command tokens per row):
  target_ids    [B, L] int32    the command token y_j,
  command_ids   [B, L] int32    decision id of the token, 0 = not trained (padding),
  advantages    [B, L] float32  A^hier of the token's decision,
  old_logprobs  [B, L] float32  log π_θold(y_j | h_j) at the policy temperature,
and, for the model step, command_positions [B, L] int32: the index t of the hidden state
that PREDICTS y_j (the token itself sits at t + 1 in input_ids; next-token convention).
`select_command_tokens` builds this layout from the token-aligned [B, T] learner batch.

Decision identity (decided here): a decision is a maximal run of consecutive slots in
one row that share the same non-zero command id. A command's tokens are contiguous in its
sequence and are gathered in order, so ids only need to differ between adjacent
commands of a row; the batcher may use per-row or global per-update ids. Decision
segments are therefore counted with a segment_sum over at most B·L (+1 for masked)
segments, a static bound, so the loss jit-compiles once per [B, L] bucket.

Memory: the model steps (rl/loss_step.py: grpo_loss_and_grads, sft_loss_and_grads,
policy_logprobs) never form [B, L, V] logits:
`loss_step.command_token_stats` projects the gathered hidden states onto the vocabulary in chunks of `loss_chunk_size`
command positions (rl/token_stats.py) and the losses read per-token statistics
(`grpo_loss_from_token_stats`, `command_nll_from_token_stats`); tests/grpo_reference.py
holds the same losses on full logits (the reference definitions).

Deferred normalization (as Tunix/MaxText do for gradient accumulation): the loss returns
the SUM over decisions of each decision's reduced loss (its token mean under Eq. 11)
and the NUMBER of decisions;
micro-batches and devices add both and divide once per update, so any split of an update
gives the same loss and gradient. Metrics are (sum, count) pairs (`*_min`/`*_max` are
(value, count) pairs reduced by min/max) combined with `combine_metrics` and read with
`finalize_metrics`.
"""
from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from vermem_jax.rl import token_stats

# What divides a command's summed loss, from its token count n (per-command reductions
# of the GRPO loss and of SFT's NLL; SFT's 'token' divides the step's sum by its
# command-token count instead). jnp.sqrt is correctly rounded, n ** 0.5 need not be;
# tiny SFT runs are chaotic in the last bits (seed 42's 480-step dev tool accuracy: 0.58
# with one, 0.48 with the other), so compare multi-seed figures only (parts/tiny.py).
_LENGTH_NORM = {'decision': lambda n: n, 'sqrt': jnp.sqrt, 'sequence': None}
GRPO_REDUCTIONS = tuple(_LENGTH_NORM)

# Keys of the gathered [B, L] loss batch.
LOSS_BATCH_KEYS = ('target_ids', 'command_ids', 'advantages', 'old_logprobs')
# Keys of the model-step batch: the [B, T] model inputs plus the [B, L] loss batch.
STEP_BATCH_KEYS = ('input_ids', 'attention_mask', 'command_positions') + LOSS_BATCH_KEYS

# Defaults: SPEC §6 / paper App. F.6 (ε_clip 0.2, β_KL 0.1). The log-ratio clamp only
# guards exp() against overflow; |log ρ| = 20 is far outside any trust region.
DEFAULT_CLIP_EPSILON = 0.2
DEFAULT_KL_BETA = 0.1
DEFAULT_MAX_LOG_RATIO = 20.0


# --------------------------------------------------------------------------- helpers


def decision_segments(command_ids: jax.Array) -> tuple[jax.Array, int]:
  """Segment index of every [B, L] slot: one segment per decision, masked slots last.

  Args:
    command_ids: [B, L] int, 0 = not trained.

  Returns:
    (segments [B*L] int32 in [0, B*L], num_segments = B*L + 1). Slots with id 0 map to
    segment B*L; each maximal run of equal non-zero ids within a row gets its own
    segment in [0, B*L).
  """
  b, l = command_ids.shape
  mask = command_ids > 0
  prev = jnp.pad(command_ids[:, :-1], ((0, 0), (1, 0)))
  starts = (mask & (command_ids != prev)).reshape(-1)
  seg = jnp.cumsum(starts.astype(jnp.int32)) - 1
  seg = jnp.where(mask.reshape(-1), seg, b * l)
  return seg, b * l + 1


def _decision_reduce(token_values: jax.Array, command_ids: jax.Array, *,
                     length_norm=lambda n: n) -> tuple[jax.Array, jax.Array]:
  """(Σ_decisions Σ_j token_values / length_norm(n), number of decisions), n = the
  decision's token count: the default gives each decision's token mean, None its
  token sum."""
  mask = command_ids > 0
  seg, nseg = decision_segments(command_ids)
  vals = jnp.where(mask, token_values, 0.0).reshape(-1)
  sums = jax.ops.segment_sum(vals, seg, num_segments=nseg)[:-1]
  counts = jax.ops.segment_sum(mask.reshape(-1).astype(vals.dtype), seg,
                               num_segments=nseg)[:-1]
  present = counts > 0
  if length_norm is not None:
    sums = jnp.where(present, sums / length_norm(jnp.where(present, counts, 1.0)), 0.0)
  return jnp.sum(sums), jnp.sum(present.astype(jnp.float32))


def _masked_sum_count(values, mask):
  return (jnp.sum(jnp.where(mask, values, 0.0)),
          jnp.sum(mask.astype(jnp.float32)))


def _masked_min_max(values, mask):
  n = jnp.sum(mask.astype(jnp.float32))
  return ((jnp.min(jnp.where(mask, values, jnp.inf)), n),
          (jnp.max(jnp.where(mask, values, -jnp.inf)), n))


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """x[b, positions[b, l]] for every b, l.

  Args:
    x: [B, T, ...] (hidden states or logits).
    positions: [B, L] int indices into T.

  Returns:
    [B, L, ...]; the gradient scatters back only to the gathered positions.
  """
  return jax.vmap(lambda row, idx: row[idx])(x, positions)


def combine_metrics(a: Mapping, b: Mapping) -> dict:
  """Adds two metric dicts of (value, count) pairs from micro-batches or devices.

  Keys ending in '_min' / '_max' combine their values by min / max; the others sum.
  Works on Python floats, NumPy and JAX arrays.
  """
  if set(a) != set(b):
    raise ValueError(f"metric keys differ: {sorted(set(a) ^ set(b))}")
  out = {}
  for k in a:
    (va, na), (vb, nb) = a[k], b[k]
    if k.endswith('_min'):
      v = jnp.minimum(va, vb)
    elif k.endswith('_max'):
      v = jnp.maximum(va, vb)
    else:
      v = va + vb
    out[k] = (v, na + nb)
  return out


def finalize_metrics(metrics: Mapping) -> dict[str, float]:
  """Turns (value, count) pairs into floats: sum/count, or the min/max value.

  A metric with count 0 reads NaN.
  """
  out = {}
  for k, (v, n) in metrics.items():
    v, n = float(v), float(n)
    if n == 0:
      out[k] = float('nan')
    elif k.endswith('_min') or k.endswith('_max'):
      out[k] = v
    else:
      out[k] = v / n
  return out


def check_loss_args(shape, batch, temperature, kl_estimator=None):
  """Validates the [B, L] loss batch against `shape` = (B, L) and the options."""
  missing = [k for k in LOSS_BATCH_KEYS if k not in batch]
  if missing:
    raise ValueError(f"loss batch is missing keys {missing}")
  for k in LOSS_BATCH_KEYS:
    if tuple(batch[k].shape) != tuple(shape):
      raise ValueError(f"batch[{k!r}] must have shape {tuple(shape)}, got "
                       f"{tuple(batch[k].shape)}")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  if kl_estimator is not None and kl_estimator not in token_stats.KL_ESTIMATORS:
    raise ValueError(f"kl_estimator must be one of {token_stats.KL_ESTIMATORS}, got "
                     f"{kl_estimator!r}")


# --------------------------------------------------------------------------- losses


def grpo_loss_from_token_stats(stats: Mapping[str, jax.Array],
                               batch: Mapping[str, jax.Array], *,
                               clip_epsilon: float = DEFAULT_CLIP_EPSILON,
                               kl_beta: float = DEFAULT_KL_BETA,
                               kl_estimator: str = 'exact',
                               max_log_ratio: float = DEFAULT_MAX_LOG_RATIO,
                               reduction: str = 'decision'):
  """Summed token-level clipped GRPO loss over decisions (paper Eq. 10-11, App. F.6)
  from per-token statistics (rl/token_stats.py).

  Args:
    stats: [B, L] arrays 'logp' (log π_θ(y_j) at the policy temperature), 'entropy',
      and 'kl' (exact estimator) or 'ref_logp' (k3); without either the KL is 0
      (kl_beta must then be 0).
    batch: the [B, L] loss batch (module docstring): target_ids, command_ids,
      advantages (A^hier per token), old_logprobs (θ_old, at the policy temperature).
    clip_epsilon: PPO clip ε_clip (SPEC §6: 0.2).
    kl_beta: KL weight β_KL (SPEC §6: 0.1).
    kl_estimator: 'exact' = Σ_v p log(p / p_ref) over the vocabulary; 'k3' =
      exp(Δ) - 1 - Δ with Δ = log p_ref(y) - log p(y) on the sampled token.
    max_log_ratio: clamp of log ρ before exp.
    reduction: a command's 1/L (module docstring; GRPO_REDUCTIONS): 'decision' (Eq. 11,
      1/L), 'sqrt' (1/√L) or 'sequence' (1).

  Returns:
    (loss_sum, num_decisions, metrics): loss_sum = Σ_decisions (1/L) Σ_j -ℓ_j (float32
    scalar), num_decisions (float32 scalar) the number of trained decisions in the
    batch, metrics {name: (value, count)} with clip_fraction (ρ outside [1-ε, 1+ε]),
    clip_active_fraction (the clipped term is the min: ρ > 1+ε with A > 0 or ρ < 1-ε
    with A < 0), approx_kl ((ρ-1) - log ρ, KL(π_θold || π_θ) estimate), kl, ratio,
    ratio_min, ratio_max, entropy, logprob_gap (learner minus old/sampler log-prob),
    logprob_abs_gap, advantage (token-level) and policy_loss, kl_loss (decision-level).
    Divide loss_sum and its gradient by the update's total num_decisions.
  """
  if reduction not in GRPO_REDUCTIONS:
    raise ValueError(f"reduction must be one of {GRPO_REDUCTIONS}, got {reduction!r}")
  logp = stats['logp']
  dt = token_stats.compute_dtype(logp)
  command_ids = batch['command_ids']
  mask = command_ids > 0
  # Masked slots get neutral inputs so that arbitrary values there (NaN included)
  # cannot reach the loss or its gradient.
  adv = jnp.where(mask, batch['advantages'].astype(dt), 0.0)
  old_logp = jnp.where(mask, batch['old_logprobs'].astype(dt), 0.0)

  raw_log_ratio = logp - old_logp
  log_ratio = jnp.clip(raw_log_ratio, -max_log_ratio, max_log_ratio)
  ratio = jnp.exp(log_ratio)
  clipped_ratio = jnp.clip(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
  surrogate = jnp.minimum(ratio * adv, clipped_ratio * adv)

  if kl_estimator == 'exact' and 'kl' in stats:
    kl = stats['kl']
  elif kl_estimator == 'k3' and 'ref_logp' in stats:
    delta = jnp.clip(stats['ref_logp'] - logp, -max_log_ratio, max_log_ratio)
    kl = jnp.exp(delta) - 1.0 - delta
  elif kl_beta != 0:
    raise ValueError(f"kl_beta={kl_beta} needs the {kl_estimator!r} KL statistic "
                     f"({'kl' if kl_estimator == 'exact' else 'ref_logp'})")
  else:
    kl = jnp.zeros_like(logp)

  token_loss = -(surrogate - kl_beta * kl)
  length_norm = _LENGTH_NORM[reduction]
  loss_sum, num_decisions = _decision_reduce(token_loss, command_ids,
                                             length_norm=length_norm)

  outside = (ratio < 1.0 - clip_epsilon) | (ratio > 1.0 + clip_epsilon)
  # The clip acts (the min picks the clipped, constant term: no gradient through ρ)
  # where ρ left the range in the direction the advantage favours.
  clip_active = (((ratio > 1.0 + clip_epsilon) & (adv > 0))
                 | ((ratio < 1.0 - clip_epsilon) & (adv < 0)))
  # k3 estimate of KL(π_θold || π_θ) on the sampled token: (ρ - 1) - log ρ (PPO's
  # approx-KL diagnostic; 0 while θ = θ_old).
  approx_kl = (ratio - 1.0) - log_ratio
  ratio_min, ratio_max = _masked_min_max(ratio, mask)
  metrics = {
      'clip_fraction': _masked_sum_count(outside.astype(jnp.float32), mask),
      'clip_active_fraction': _masked_sum_count(clip_active.astype(jnp.float32), mask),
      'approx_kl': _masked_sum_count(approx_kl, mask),
      'kl': _masked_sum_count(kl, mask),
      'ratio': _masked_sum_count(ratio, mask),
      'ratio_min': ratio_min,
      'ratio_max': ratio_max,
      'entropy': _masked_sum_count(stats['entropy'], mask),
      'logprob_gap': _masked_sum_count(raw_log_ratio, mask),
      'logprob_abs_gap': _masked_sum_count(jnp.abs(raw_log_ratio), mask),
      'advantage': _masked_sum_count(adv, mask),
      'policy_loss': _decision_reduce(-surrogate, command_ids, length_norm=length_norm),
      'kl_loss': _decision_reduce(kl_beta * kl, command_ids, length_norm=length_norm),
  }
  return loss_sum, num_decisions, metrics


NLL_REDUCTIONS = ('token',) + GRPO_REDUCTIONS


def command_nll_from_token_stats(stats: Mapping[str, jax.Array],
                                 batch: Mapping[str, jax.Array], *,
                                 reduction: str = 'token'):
  """Summed SFT negative log-likelihood of command tokens (paper Eq. 7) from per-token
  'logp' and 'correct' [B, L] statistics (rl/token_stats.py).

  Args:
    stats: {'logp', 'correct'} [B, L] float32 (at the temperature they were taken at).
    batch: {'target_ids': [B, L] int, 'command_ids': [B, L] int (0 = not trained)}.
    reduction: 'token' — sum of token NLLs, count = command tokens (per-token mean);
      'decision' — each command's token-mean NLL summed, count = commands;
      'sqrt' — each command's summed NLL divided by √n (n = its tokens) summed, count
      = commands: between 'sequence' and 'decision', a command's first (tool) token
      weighs 1/√n, not 1/n (a 2-token ∅ against a 50-token Update: 5x, not 25x);
      'sequence' — each command's summed NLL (-log π(u* | x), Eq. 7 literally),
      count = commands.

  Returns:
    (nll_sum float32, count float32, metrics {'token_accuracy', 'token_nll'} as
    (sum, count) pairs over command tokens).

  Raises:
    ValueError: (at trace time) on a bad reduction.
  """
  if reduction not in NLL_REDUCTIONS:
    raise ValueError(f"reduction must be one of {NLL_REDUCTIONS}, got {reduction!r}")
  command_ids = batch['command_ids']
  mask = command_ids > 0
  nll = -stats['logp']
  if reduction == 'token':
    total, count = _masked_sum_count(nll, mask)
  else:
    total, count = _decision_reduce(nll, command_ids,
                                    length_norm=_LENGTH_NORM[reduction])
  metrics = {'token_accuracy': _masked_sum_count(stats['correct'], mask),
             'token_nll': _masked_sum_count(nll, mask)}
  return total, count, metrics


# --------------------------------------------------------------------------- layout


def select_command_tokens(batch: Mapping[str, np.ndarray],
                          num_command_tokens: int) -> dict[str, np.ndarray]:
  """Builds the model-step batch from the token-aligned [B, T] learner batch (host side).

  Input layout (DESIGN.md learner batch), all [B, T] and token-aligned: entry t
  describes token input_ids[b, t]; command_ids[b, t] > 0 marks a command token of
  decision command_ids[b, t]; advantages[b, t] is its A^hier and old_logprobs[b, t] is
  log π_θold(input_ids[b, t] | input_ids[b, <t]).

  Args:
    batch: {'input_ids', 'attention_mask', 'command_ids', 'advantages',
      'old_logprobs'} [B, T] NumPy arrays (+ optional 'positions').
    num_command_tokens: L, the bucket size; must be >= the largest number of command
      tokens in a row.

  Returns:
    {'input_ids', 'attention_mask', ('positions'), 'command_positions', 'target_ids',
    'command_ids', 'advantages', 'old_logprobs'}: [B, T] model inputs and the [B, L]
    loss layout; command_positions[b, j] = t - 1 (the predicting hidden state).

  Raises:
    ValueError: on missing keys, shape mismatches, a row with more than L command
      tokens, a command token at t = 0 (nothing predicts it) or on padding.
  """
  need = ('input_ids', 'attention_mask', 'command_ids', 'advantages', 'old_logprobs')
  missing = [k for k in need if k not in batch]
  if missing:
    raise ValueError(f"learner batch is missing keys {missing}")
  ids = np.asarray(batch['input_ids'])
  if ids.ndim != 2:
    raise ValueError(f"input_ids must be [B, T], got shape {ids.shape}")
  for k in need + (('positions',) if 'positions' in batch else ()):
    if np.asarray(batch[k]).shape != ids.shape:
      raise ValueError(f"batch[{k!r}] must have shape {ids.shape}, got "
                       f"{np.asarray(batch[k]).shape}")
  cid = np.asarray(batch['command_ids'])
  mask = cid > 0
  if np.any(mask[:, 0]):
    raise ValueError("a command token at position 0 has no predicting position")
  if np.any(mask & (np.asarray(batch['attention_mask']) == 0)):
    raise ValueError("command tokens must not be padding (attention_mask == 0)")
  per_row = mask.sum(axis=1)
  if per_row.size and per_row.max() > num_command_tokens:
    raise ValueError(f"a row holds {per_row.max()} command tokens > num_command_tokens="
                     f"{num_command_tokens}")
  b = ids.shape[0]
  l = int(num_command_tokens)
  out = {k: np.zeros((b, l), dt) for k, dt in (
      ('command_positions', np.int32), ('target_ids', np.int32),
      ('command_ids', np.int32), ('advantages', np.float32),
      ('old_logprobs', np.float32))}
  for r in range(b):
    t = np.flatnonzero(mask[r])
    n = t.size
    out['command_positions'][r, :n] = t - 1
    out['target_ids'][r, :n] = ids[r, t]
    out['command_ids'][r, :n] = cid[r, t]
    out['advantages'][r, :n] = np.asarray(batch['advantages'])[r, t]
    out['old_logprobs'][r, :n] = np.asarray(batch['old_logprobs'])[r, t]
  out['input_ids'] = ids.astype(np.int32)
  out['attention_mask'] = np.asarray(batch['attention_mask']).astype(np.int32)
  if 'positions' in batch:
    out['positions'] = np.asarray(batch['positions']).astype(np.int32)
  return out
