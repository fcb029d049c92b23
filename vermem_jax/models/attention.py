"""Grouped-query self-attention of the Qwen model, with four interchangeable kernels.

Padding and KV-cache rules: qwen.py's module docstring. The mask is never passed as a
[B, T, S] array: `AttentionMask` holds `key_valid [B, S]` (the slot holds a real token
of the row) and `query_slot [T]` (the slot of each query; a query attends the valid
slots at or before its own, which is the causal rule both without a cache, where
slot = position in the row, and with one, where slot = cache index + t). Each kernel
builds what it needs from these, so memory never has to hold a [T, S] matrix.

Kernels (`QwenConfig.attn_implementation`; `resolve_implementation` applies 'auto':
Pallas on TPU, sdpa on GPU in bf16/f16 for T > 1 new tokens, blockwise otherwise):
  eager      scores [B, N, T, S] in float32, masked, softmax, times V: the reference.
  sdpa       `jax.nn.dot_product_attention` with a boolean mask; cuDNN's fused flash
             kernel on GPU for bf16/f16 compute (a shape cuDNN refuses falls back to
             blockwise, with a warning), JAX's XLA composition elsewhere (which
             materializes scores like eager). The mask reaches cuDNN as a [B, 1, T, S]
             bias in the compute dtype (JAX's cuDNN binding has no per-row offset
             padding), so its memory is B·T·S·2 bytes per call, not per head.
  blockwise  queries in blocks of attn_block_q, keys in blocks of attn_block_kv,
             online softmax (running max and sum per query row) in float32, and a
             custom VJP that saves only the output and the row log-sum-exp and
             recomputes each block's probabilities in the backward pass (the
             FlashAttention-2 algorithm, Dao 2023, written in plain XLA). Temp memory
             is O(T + S) per head, not O(T·S); blocks that no query of the block can see
             (all keys after every query, or no valid key) are skipped with a
             `lax.cond`. Runs on every backend. When T·S fits in one block
             (decoding: T = 1) it is the eager computation.
  pallas     `jax.experimental.pallas.ops.tpu.flash_attention` (TPU) with segment ids
             for padding; without a KV cache only (its causal rule has no slot
             offset), so cached calls use blockwise. Under a mesh it runs inside
             `shard_map` over the batch and head axes of the logical rules.
All four agree to float32 rounding at every real (non-padding) query; outputs at
padding queries are finite but meaningless (qwen.py) and may differ between kernels.
Masked logits use _MASK_VALUE, so a query without any visible key gets a uniform
distribution instead of NaN.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from vermem_jax.models.layers import Dense, RMSNorm, apply_rope
from vermem_jax.models.qwen_config import QwenConfig

Array = jax.Array

# Large finite negative logit for masked keys: exp() of it underflows to exactly 0 for
# any query that has one real key, and a query with no real key (a padding row) gets a
# uniform, finite distribution instead of NaN (the gemma convention).
_MASK_VALUE = -2.3819763e38

# Block size floor of the Pallas TPU kernel (its tiles are multiples of 128).
_PALLAS_MIN_BLOCK = 128


class AttentionMask(NamedTuple):
  """Which keys each query sees (module docstring).

  key_valid:  [B, S] bool, slot s holds a real token of row b.
  query_slot: [T] int32, slot of query t; it sees valid slots s <= query_slot[t].
  """
  key_valid: Array
  query_slot: Array

  def dense(self) -> Array:
    """The [B, T, S] bool mask (what eager and sdpa use)."""
    s = self.key_valid.shape[1]
    causal = jnp.arange(s, dtype=jnp.int32)[None, :] <= self.query_slot[:, None]
    return causal[None] & self.key_valid[:, None, :]


def resolve_implementation(config: QwenConfig, cached: bool,
                           backend: str | None = None, queries: int = 2) -> str:
  """The kernel used for `config.attn_implementation` (module docstring).

  Args:
    config: the model config.
    cached: the call reads/writes a KV cache (the Pallas kernel cannot).
    backend: 'cpu' | 'gpu' | 'tpu'; default `jax.default_backend()`.
    queries: T, the new tokens of the call: 'auto' decodes single tokens with the
      blockwise kernel (then one small eager block) rather than cuDNN.
  Returns:
    'eager' | 'sdpa' | 'blockwise' | 'pallas'.
  """
  impl = config.attn_implementation
  backend = backend or jax.default_backend()
  if impl == 'auto':
    if backend == 'tpu':
      impl = 'pallas'
    elif (backend in ('gpu', 'cuda', 'rocm') and queries > 1
          and config.dtype in ('bfloat16', 'float16')):
      impl = 'sdpa'
    else:
      impl = 'blockwise'
  if impl == 'pallas' and cached:
    impl = 'blockwise'
  return impl


# --------------------------------------------------------------------------- kernels
# q [B, T, Kv, G, Hd] (G = query heads per kv head), k, v [B, S, Kv, Hd], all in the
# compute dtype; every kernel returns [B, T, Kv, G, Hd] in that dtype.


def _scores(q: Array, k: Array, scale: float) -> Array:
  """[B, Kv, G, Tq, Sk] float32 logits (scaled after the product, as eager does)."""
  return jnp.einsum('btkgh,bskh->bkgts', q, k,
                    preferred_element_type=jnp.float32) * scale


def eager_attention(q: Array, k: Array, v: Array, mask: AttentionMask,
                    scale: float) -> Array:
  """Reference kernel: full float32 scores, masked softmax, probabilities @ V."""
  logits = _scores(q, k, scale)
  logits = jnp.where(mask.dense()[:, None, None], logits, _MASK_VALUE)
  probs = jax.nn.softmax(logits, axis=-1).astype(q.dtype)
  return jnp.einsum('bkgts,bskh->btkgh', probs, v,
                    preferred_element_type=jnp.float32).astype(q.dtype)


def sdpa_attention(q: Array, k: Array, v: Array, mask: AttentionMask,
                   scale: float) -> Array:
  """`jax.nn.dot_product_attention`; cuDNN on GPU for bf16/f16, XLA otherwise."""
  b, t, kvh, g, hd = q.shape
  on_gpu = jax.default_backend() in ('gpu', 'cuda', 'rocm')
  implementation = 'cudnn' if on_gpu and q.dtype in (jnp.bfloat16, jnp.float16) else None
  call = functools.partial(jax.nn.dot_product_attention,
                           q.reshape(b, t, kvh * g, hd), k, v,
                           mask=mask.dense()[:, None], scale=scale)
  try:
    out = call(implementation=implementation)
  except (ValueError, NotImplementedError, RuntimeError) as e:
    if implementation is None:
      raise
    # A shape or head size cuDNN does not support: the memory-efficient XLA kernel.
    logging.warning('cuDNN attention unavailable for q %s, k %s (%s); using the '
                    'blockwise kernel', q.shape, k.shape, e)
    return blockwise_attention(q, k, v, mask, scale)
  return out.reshape(b, t, kvh, g, hd).astype(q.dtype)


def _block_mask(valid: Array, q_slot: Array, k_slot: Array) -> Array:
  """[B, 1, 1, bq, bk] bool for key validity [B, bk] and slots [bq], [bk]."""
  causal = k_slot[None, :] <= q_slot[:, None]
  return (causal[None] & valid[:, None, :])[:, None, None]


def _block_visible(valid: Array, q_slot: Array, k_slot: Array) -> Array:
  """Scalar: some query of the block may see some key of the block."""
  return (jnp.min(k_slot) <= jnp.max(q_slot)) & jnp.any(valid)


def _split_blocks(x: Array, axis: int, size: int) -> Array:
  """Moves blocks of `size` along `axis` to a new leading axis."""
  n = x.shape[axis] // size
  x = x.reshape(x.shape[:axis] + (n, size) + x.shape[axis + 1:])
  return jnp.moveaxis(x, axis, 0)


def _flash_forward(q, k, v, key_valid, query_slot, scale, block_q, block_kv):
  """Online-softmax forward over blocks. Returns (out like q, lse [B, Kv, G, T])."""
  b, tp, kvh, g, hd = q.shape
  dt = q.dtype
  blocks_q = (_split_blocks(q, 1, block_q), query_slot.reshape(-1, block_q))
  blocks_kv = (_split_blocks(k, 1, block_kv), _split_blocks(v, 1, block_kv),
               _split_blocks(key_valid, 1, block_kv),
               jnp.arange(k.shape[1], dtype=jnp.int32).reshape(-1, block_kv))

  def q_block(_, xs):
    qi, qs = xs

    def kv_block(carry, ys):
      kj, vj, valid, ks = ys

      def visit(carry):
        m, l, acc = carry
        s = jnp.where(_block_mask(valid, qs, ks), _scores(qi, kj, scale), _MASK_VALUE)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        l = l * corr + jnp.sum(p, axis=-1)
        acc = acc * corr[..., None] + jnp.einsum(
            'bkgts,bskh->bkgth', p.astype(dt), vj, preferred_element_type=jnp.float32)
        return m_new, l, acc

      return jax.lax.cond(_block_visible(valid, qs, ks), visit, lambda c: c,
                          carry), None

    init = (jnp.full((b, kvh, g, block_q), _MASK_VALUE, jnp.float32),
            jnp.zeros((b, kvh, g, block_q), jnp.float32),
            jnp.zeros((b, kvh, g, block_q, hd), jnp.float32))
    (m, l, acc), _ = jax.lax.scan(kv_block, init, blocks_kv)
    # A row that saw no block at all (l = 0) is a padding query: output 0.
    safe_l = jnp.where(l > 0, l, 1.0)
    return None, (acc / safe_l[..., None], m + jnp.log(safe_l))

  _, (out, lse) = jax.lax.scan(q_block, None, blocks_q)
  out = jnp.transpose(out, (1, 0, 4, 2, 3, 5)).reshape(b, tp, kvh, g, hd)
  lse = jnp.transpose(lse, (1, 2, 3, 0, 4)).reshape(b, kvh, g, tp)
  return out.astype(dt), lse


def _flash_backward(scale, block_q, block_kv, res, dout):
  """FlashAttention-2 backward: recompute each block's probabilities from the lse."""
  q, k, v, key_valid, query_slot, out, lse = res
  dt = q.dtype
  b, tp, kvh, g, hd = q.shape
  delta = jnp.einsum('btkgh,btkgh->bkgt', dout.astype(jnp.float32),
                     out.astype(jnp.float32))
  dout = dout.astype(dt)
  blocks_q = (_split_blocks(q, 1, block_q), _split_blocks(dout, 1, block_q),
              _split_blocks(lse, 3, block_q), _split_blocks(delta, 3, block_q),
              query_slot.reshape(-1, block_q),
              jnp.arange(tp // block_q, dtype=jnp.int32))
  blocks_kv = (_split_blocks(k, 1, block_kv), _split_blocks(v, 1, block_kv),
               _split_blocks(key_valid, 1, block_kv),
               jnp.arange(k.shape[1], dtype=jnp.int32).reshape(-1, block_kv))

  def kv_block(dq, ys):
    kj, vj, valid, ks = ys

    def q_block(carry, xs):
      qi, doi, lsei, di, qs, i = xs

      def visit(carry):
        dq, dk, dv = carry
        mask = _block_mask(valid, qs, ks)
        s = jnp.where(mask, _scores(qi, kj, scale), _MASK_VALUE)
        p = jnp.exp(s - lsei[..., None])
        dv = dv + jnp.einsum('bkgts,btkgh->bskh', p.astype(dt), doi,
                             preferred_element_type=jnp.float32)
        dp = jnp.einsum('btkgh,bskh->bkgts', doi, vj, preferred_element_type=jnp.float32)
        # Masked logits are constants (no gradient), as in eager's jnp.where.
        ds = jnp.where(mask, p * (dp - di[..., None]), 0.0).astype(dt)
        dk = dk + scale * jnp.einsum('bkgts,btkgh->bskh', ds, qi,
                                     preferred_element_type=jnp.float32)
        dqi = scale * jnp.einsum('bkgts,bskh->btkgh', ds, kj,
                                 preferred_element_type=jnp.float32)
        start = i * block_q
        dq = jax.lax.dynamic_update_slice_in_dim(
            dq, jax.lax.dynamic_slice_in_dim(dq, start, block_q, 1) + dqi, start, 1)
        return dq, dk, dv

      return jax.lax.cond(_block_visible(valid, qs, ks), visit, lambda c: c,
                          carry), None

    zero = jnp.zeros((b, block_kv, kvh, hd), jnp.float32)
    (dq, dk, dv), _ = jax.lax.scan(q_block, (dq, zero, zero), blocks_q)
    return dq, (dk, dv)

  dq, (dk, dv) = jax.lax.scan(kv_block, jnp.zeros(q.shape, jnp.float32), blocks_kv)
  merge = lambda x: jnp.moveaxis(x, 0, 1).reshape(k.shape)
  return (dq.astype(dt), merge(dk).astype(k.dtype), merge(dv).astype(v.dtype),
          None, None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, key_valid, query_slot, scale, block_q, block_kv):
  return _flash_forward(q, k, v, key_valid, query_slot, scale, block_q, block_kv)[0]


def _flash_fwd(q, k, v, key_valid, query_slot, scale, block_q, block_kv):
  out, lse = _flash_forward(q, k, v, key_valid, query_slot, scale, block_q, block_kv)
  return out, (q, k, v, key_valid, query_slot, out, lse)


_flash.defvjp(_flash_fwd, _flash_backward)


def _pad_to(x: Array, axis: int, multiple: int, value=0) -> Array:
  pad = -x.shape[axis] % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths, constant_values=value)


def blockwise_attention(q: Array, k: Array, v: Array, mask: AttentionMask,
                        scale: float, block_q: int = 512,
                        block_kv: int = 512) -> Array:
  """Query- and key-blocked online-softmax attention (module docstring).

  Args:
    q: [B, T, Kv, G, Hd]; k, v: [B, S, Kv, Hd] (compute dtype).
    mask: which keys each query sees.
    scale: logit scale (Hd ** -0.5).
    block_q, block_kv: block sizes in tokens (clipped to T and S).
  Returns:
    [B, T, Kv, G, Hd] in q.dtype; differentiable in q, k, v (custom VJP).
  """
  t, s = q.shape[1], k.shape[1]
  if t * s <= block_q * block_kv:
    return eager_attention(q, k, v, mask, scale)
  bq, bk = min(block_q, t), min(block_kv, s)
  # Padded queries see nothing (slot -1); padded keys are invalid.
  qp = _pad_to(q, 1, bq)
  slots = _pad_to(mask.query_slot.astype(jnp.int32), 0, bq, value=-1)
  kp, vp = _pad_to(k, 1, bk), _pad_to(v, 1, bk)
  valid = _pad_to(mask.key_valid, 1, bk, value=False)
  return _flash(qp, kp, vp, valid, slots, float(scale), bq, bk)[:, :t]


def pallas_attention(q: Array, k: Array, v: Array, mask: AttentionMask,
                     scale: float, block: int = 512) -> Array:
  """Pallas TPU flash attention for a call without KV cache (slots = positions).

  Padding is a segment id 0 (real tokens 1), so real queries never see padding keys;
  kv heads are repeated to the query heads (the kernel has no GQA). Lengths are padded
  to a multiple of the block (>= 128).
  """
  from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash  # pylint: disable=g-import-not-at-top
  b, t, kvh, g, hd = q.shape
  blk = max(_PALLAS_MIN_BLOCK, min(block, -(-t // _PALLAS_MIN_BLOCK) * _PALLAS_MIN_BLOCK))
  sizes = tpu_flash.BlockSizes(
      block_q=blk, block_k_major=blk, block_k=blk, block_b=1,
      block_q_major_dkv=blk, block_k_major_dkv=blk, block_k_dkv=blk, block_q_dkv=blk,
      block_k_major_dq=blk, block_k_dq=blk, block_q_dq=blk)
  seg = _pad_to(mask.key_valid.astype(jnp.int32), 1, blk)
  heads = lambda x: _pad_to(jnp.moveaxis(x.reshape(b, t, kvh * g, hd), 1, 2), 2, blk)
  qh = heads(q)
  kh = heads(jnp.repeat(k[:, :, :, None], g, axis=3))
  vh = heads(jnp.repeat(v[:, :, :, None], g, axis=3))

  def kernel(qh, kh, vh, seg):
    return tpu_flash.flash_attention(qh, kh, vh, segment_ids=tpu_flash.SegmentIds(seg, seg),
                                     causal=True, sm_scale=float(scale), block_sizes=sizes)

  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    batch_axes, head_axes = _mesh_axes_for(mesh, b, kvh * g)
    spec = jax.sharding.PartitionSpec(batch_axes, head_axes, None, None)
    seg_spec = jax.sharding.PartitionSpec(batch_axes, None)
    kernel = jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec, seg_spec),
                           out_specs=spec, check_vma=False)
  out = kernel(qh, kh, vh, seg)[:, :, :t]
  return jnp.moveaxis(out, 2, 1).reshape(b, t, kvh, g, hd).astype(q.dtype)


def _mesh_axes_for(mesh, batch: int, heads: int):
  """Mesh axes of the logical 'batch' and 'heads' axes that divide the sizes."""
  rules = nn.get_logical_axis_rules()
  spec = nn.logical_to_mesh_axes(('batch', 'heads'), rules) if rules else (None, None)

  def fit(axes, size):
    if axes is None:
      return None
    names = axes if isinstance(axes, tuple) else (axes,)
    total = 1
    for a in names:
      total *= mesh.shape[a]
    return axes if size % total == 0 else None
  return fit(spec[0], batch), fit(spec[1], heads)


def attend(q: Array, k: Array, v: Array, mask: AttentionMask, *, config: QwenConfig,
           cached: bool) -> Array:
  """Dispatches to the configured kernel; q [B, T, N, Hd] -> [B, T, N * Hd]."""
  b, t, n, hd = q.shape
  kvh = k.shape[2]
  qg = q.reshape(b, t, kvh, n // kvh, hd)
  scale = hd ** -0.5
  impl = resolve_implementation(config, cached, queries=t)
  if impl == 'eager':
    out = eager_attention(qg, k, v, mask, scale)
  elif impl == 'sdpa':
    out = sdpa_attention(qg, k, v, mask, scale)
  elif impl == 'pallas':
    out = pallas_attention(qg, k, v, mask, scale, config.attn_block_q)
  else:
    out = blockwise_attention(qg, k, v, mask, scale, config.attn_block_q,
                              config.attn_block_kv)
  return out.reshape(b, t, n * hd)


class Attention(nn.Module):
  """Grouped-query self-attention with RoPE, optional q/k/v bias and q/k norm."""
  config: QwenConfig

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: AttentionMask,
               layer_cache: dict | None, cache_index: Array | None):
    """x [B, T, D]; returns ([B, T, D], new layer cache or None)."""
    cfg = self.config
    dt, pdt = cfg.compute_dtype, cfg.params_dtype
    n, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    b, t, _ = x.shape
    dense = lambda f, name, bias: Dense(f, use_bias=bias, dtype=dt, param_dtype=pdt,
                                        name=name)
    q = dense(n * hd, 'q_proj', cfg.attention_bias)(x).reshape(b, t, n, hd)
    k = dense(kv * hd, 'k_proj', cfg.attention_bias)(x).reshape(b, t, kv, hd)
    v = dense(kv * hd, 'v_proj', cfg.attention_bias)(x).reshape(b, t, kv, hd)
    if cfg.qk_norm:
      q = RMSNorm(cfg.rms_norm_eps, dt, pdt, name='q_norm')(q)
      k = RMSNorm(cfg.rms_norm_eps, dt, pdt, name='k_norm')(k)
    q = apply_rope(q, positions, cfg.rope_theta)
    k = apply_rope(k, positions, cfg.rope_theta)
    q = nn.with_logical_constraint(q, ('batch', 'length', 'heads', 'head_dim'))
    k = nn.with_logical_constraint(k, ('batch', 'length', 'kv_heads', 'head_dim'))

    new_cache = None
    if layer_cache is not None:
      start = (0, cache_index, 0, 0)
      k = jax.lax.dynamic_update_slice(layer_cache['k'],
                                       k.astype(layer_cache['k'].dtype), start)
      v = jax.lax.dynamic_update_slice(layer_cache['v'],
                                       v.astype(layer_cache['v'].dtype), start)
      new_cache = {'k': k, 'v': v}
      k, v = k.astype(dt), v.astype(dt)

    out = attend(q, k, v, mask, config=cfg, cached=layer_cache is not None)
    out = Dense(cfg.hidden_size, dtype=dt, param_dtype=pdt, name='o_proj')(out)
    return out, new_cache
