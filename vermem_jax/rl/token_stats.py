"""Per-token statistics over the vocabulary, computed in chunks of command positions.

Every loss of the learner (the GRPO objective, the SFT NLL, the learner's θ_old
log-probabilities) reads only a few numbers per command token y_j out of its
full-vocabulary distribution, all at the policy temperature T:

  logp      log π_θ(y_j | h_j)                        log_softmax(z_j / T)[y_j]
  entropy   -Σ_v π_θ(v) log π_θ(v)                     (metrics)
  kl        Σ_v π_θ(v) (log π_θ(v) - log π_ref(v))     the exact KL (paper Eq. 10)
  ref_logp  log π_ref(y_j | h_j)                       (the k3 estimator's input)
  correct   1[argmax_v z_j = y_j]                      (SFT token accuracy)

`stats_from_logits` computes them from [B, L, V] logits (the reference definitions).
`chunked_stats` computes the same values from the hidden states [B, L, D] and the
vocabulary head: the B·L positions are flattened and cut into chunks of `chunk_size`
positions; a `lax.scan` projects one chunk at a time ([chunk_size, V] logits) and the
scanned function is rematerialized (`jax.checkpoint`), so the backward pass recomputes
each chunk's logits instead of keeping them: no [B, L, V] array exists in the forward
or the backward pass, and the memory of the head and loss is O(chunk_size · V)
whatever B and L are. The cost is one extra head projection per position in the
backward pass (two with the exact KL, whose gradient needs the reference
distribution). Results equal the unchunked ones to float32 rounding (only the
matmul's blocking differs).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp

from vermem_jax.models import qwen

Stats = dict  # name -> [B, L] array

KL_ESTIMATORS = ('exact', 'k3')


def compute_dtype(x) -> jnp.dtype:
  """float32, or float64 when x is float64 (x64 tests); bf16/f16 are upcast."""
  return jnp.promote_types(x.dtype, jnp.float32)


def _row_stats(logits, ref_logits, targets, *, temperature, kl, entropy, correct):
  """The statistics of `names` for logits [..., V] and targets [...] (module doc)."""
  dt = compute_dtype(logits)
  logp_all = jax.nn.log_softmax(logits.astype(dt) / temperature, axis=-1)
  take = lambda lp: jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
  out = {'logp': take(logp_all)}
  if entropy or kl == 'exact':
    p_all = jnp.exp(logp_all)
  if entropy:
    out['entropy'] = -jnp.sum(p_all * logp_all, axis=-1)
  if correct:
    out['correct'] = (jnp.argmax(logits, axis=-1) == targets).astype(dt)
  if kl is not None:
    ref_logp_all = jax.nn.log_softmax(
        jax.lax.stop_gradient(ref_logits).astype(dt) / temperature, axis=-1)
    if kl == 'exact':
      out['kl'] = jnp.sum(p_all * (logp_all - ref_logp_all), axis=-1)
    else:
      out['ref_logp'] = take(ref_logp_all)
  return out


def _check(kl, temperature):
  if kl is not None and kl not in KL_ESTIMATORS:
    raise ValueError(f'kl_estimator must be one of {KL_ESTIMATORS}, got {kl!r}')
  if not temperature > 0:
    raise ValueError(f'temperature must be > 0, got {temperature}')


def stats_from_logits(logits: jax.Array, ref_logits: Optional[jax.Array],
                      targets: jax.Array, *, temperature: float = 1.0,
                      kl_estimator: Optional[str] = None, entropy: bool = True,
                      correct: bool = False) -> Stats:
  """Per-token statistics from full logits (the reference definitions).

  Args:
    logits: [B, L, V] policy logits at the command positions (any float dtype).
    ref_logits: [B, L, V] reference logits (constants), or None without KL.
    targets: [B, L] int token ids y_j.
    temperature: T (> 0).
    kl_estimator: None (no KL), 'exact' (adds 'kl') or 'k3' (adds 'ref_logp').
    entropy, correct: add 'entropy' / 'correct'.
  Returns:
    {'logp', ...} [B, L] arrays in float32 (float64 for float64 logits).
  Raises:
    ValueError: bad estimator or temperature, or ref_logits missing for a KL.
  """
  _check(kl_estimator, temperature)
  if kl_estimator is not None and ref_logits is None:
    raise ValueError('ref_logits is required for a KL estimator')
  return _row_stats(logits, ref_logits, targets.astype(jnp.int32),
                    temperature=temperature, kl=kl_estimator, entropy=entropy,
                    correct=correct)


def chunked_stats(project: Callable[[Any, jax.Array], jax.Array], head: Any,
                  hidden: jax.Array, targets: jax.Array, *,
                  ref_head: Any = None, ref_hidden: Optional[jax.Array] = None,
                  chunk_size: int, temperature: float = 1.0,
                  kl_estimator: Optional[str] = None, entropy: bool = True,
                  correct: bool = False) -> Stats:
  """`stats_from_logits(project(head, hidden), project(ref_head, ref_hidden), ...)`
  without ever forming [B, L, V] (module docstring); differentiable in `head` and
  `hidden` (the reference side is a constant).

  Args:
    project: (head params, h [C, D]) -> float logits [C, V].
    head: the policy's head parameters (what `project` reads).
    hidden: [B, L, D] policy hidden states at the command positions.
    targets: [B, L] int token ids.
    ref_head, ref_hidden: the reference policy's head and [B, L, D] hidden states
      (needed when kl_estimator is set).
    chunk_size: positions per chunk (of the flattened B·L; > 0).
    temperature, kl_estimator, entropy, correct: as in `stats_from_logits`.
  Returns:
    The same dict of [B, L] arrays as `stats_from_logits`.
  Raises:
    ValueError: bad chunk_size, estimator or temperature; reference inputs missing
      for a KL.
  """
  _check(kl_estimator, temperature)
  if int(chunk_size) != chunk_size or chunk_size < 1:
    raise ValueError(f'chunk_size must be a positive int, got {chunk_size!r}')
  if kl_estimator is not None and (ref_hidden is None or ref_head is None):
    raise ValueError('ref_head and ref_hidden are required for a KL estimator')
  b, l = targets.shape
  n = b * l
  c = min(int(chunk_size), n)
  pad = -n % c

  def chunks(x):  # [B, L, ...] -> [n_chunks, C, ...]
    x = x.reshape((n,) + x.shape[2:])
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((-1, c) + x.shape[1:])

  ys = chunks(targets.astype(jnp.int32))
  hs = chunks(hidden)
  ref_head = jax.lax.stop_gradient(ref_head)

  # k3 needs only log π_ref(y): one forward-only pass, so the policy's rematerialized
  # chunks need not recompute the reference head in the backward pass.
  ref_logp = None
  if kl_estimator == 'k3':
    rhs = chunks(jax.lax.stop_gradient(ref_hidden))

    def ref_chunk(_, xs):
      rh, y = xs
      return None, _row_stats(project(ref_head, rh), None, y, temperature=temperature,
                              kl=None, entropy=False, correct=False)['logp']
    _, ref_logp = jax.lax.scan(ref_chunk, None, (rhs, ys))

  exact = kl_estimator == 'exact'

  @jax.checkpoint
  def policy_chunk(head, h, rh, y):
    ref_logits = project(ref_head, rh) if exact else None
    return _row_stats(project(head, h), ref_logits, y, temperature=temperature,
                      kl='exact' if exact else None, entropy=entropy, correct=correct)

  rhs = chunks(jax.lax.stop_gradient(ref_hidden)) if exact else jnp.zeros(
      (hs.shape[0], 0))
  _, out = jax.lax.scan(lambda _, xs: (None, policy_chunk(head, *xs)), None,
                        (hs, rhs, ys))
  if ref_logp is not None:
    out['ref_logp'] = ref_logp
  return {k: v.reshape(-1)[:n].reshape(b, l) for k, v in out.items()}


def head_projection(model_config) -> tuple[Callable[[Any, jax.Array], jax.Array],
                                            Callable[[Mapping[str, Any]], Any]]:
  """(project, select) for a Qwen config: `select(params)` is the head's parameter
  subtree and `project(subtree, h [C, D])` its float32 logits [C, V]
  (`qwen.lm_head_logits`, tied or untied)."""
  key = 'embed_tokens' if model_config.tie_word_embeddings else 'lm_head'

  def select(params):
    if 'params' in params and key not in params:
      params = params['params']
    if key not in params:
      raise KeyError(f'head parameters {key!r} missing from the parameter tree')
    return {key: params[key]}

  def project(head, h):
    return qwen.lm_head_logits(model_config, head, h)
  return project, select
