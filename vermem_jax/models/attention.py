"""Grouped-query self-attention of the Qwen model (RoPE, q/k/v bias, q/k norm).

Padding and KV-cache rules: qwen.py's module docstring.
"""

from __future__ import annotations

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


class Attention(nn.Module):
  """Grouped-query self-attention with RoPE, optional q/k/v bias and q/k norm."""
  config: QwenConfig

  @nn.compact
  def __call__(self, x: Array, positions: Array, attn_mask: Array,
               layer_cache: dict | None, cache_index: Array | None):
    """x [B, T, D]; attn_mask [B, T, S] bool; returns ([B, T, D], new layer cache)."""
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

    groups = n // kv
    qg = q.reshape(b, t, kv, groups, hd)
    logits = jnp.einsum('btkgh,bskh->bkgts', qg, k,
                        preferred_element_type=jnp.float32)
    logits = logits * (hd ** -0.5)
    logits = jnp.where(attn_mask[:, None, None, :, :], logits, _MASK_VALUE)
    probs = jax.nn.softmax(logits, axis=-1).astype(dt)
    out = jnp.einsum('bkgts,bskh->btkgh', probs, v,
                     preferred_element_type=jnp.float32).astype(dt)
    out = out.reshape(b, t, n * hd)
    out = Dense(cfg.hidden_size, dtype=dt, param_dtype=pdt, name='o_proj')(out)
    return out, new_cache
