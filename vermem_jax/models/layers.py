"""Building blocks of the Qwen model: linear, RMSNorm, embedding, RoPE, vocab head.

Numerics (qwen.py's module docstring): matmuls take the compute dtype and accumulate in
float32; RMSNorm and RoPE angles are computed in float32.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

# Logical axis names of every parameter, keyed by (module name, parameter name). The
# modules read their annotations from here and `param_logical_axes` maps a plain
# parameter tree onto them, so the two can never disagree.
PARAM_LOGICAL_AXES: dict[tuple[str, str], tuple[str, ...]] = {
    ('embed_tokens', 'embedding'): ('vocab', 'embed'),
    ('q_proj', 'kernel'): ('embed', 'heads'),
    ('q_proj', 'bias'): ('heads',),
    ('k_proj', 'kernel'): ('embed', 'kv_heads'),
    ('k_proj', 'bias'): ('kv_heads',),
    ('v_proj', 'kernel'): ('embed', 'kv_heads'),
    ('v_proj', 'bias'): ('kv_heads',),
    ('o_proj', 'kernel'): ('heads', 'embed'),
    ('q_norm', 'scale'): ('head_dim',),
    ('k_norm', 'scale'): ('head_dim',),
    ('input_layernorm', 'scale'): ('norm',),
    ('post_attention_layernorm', 'scale'): ('norm',),
    ('norm', 'scale'): ('norm',),
    ('gate_proj', 'kernel'): ('embed', 'mlp'),
    ('up_proj', 'kernel'): ('embed', 'mlp'),
    ('down_proj', 'kernel'): ('mlp', 'embed'),
    ('lm_head', 'kernel'): ('embed', 'vocab'),
}


def _axes(module: str, param: str) -> tuple[str, ...]:
  return PARAM_LOGICAL_AXES[(module, param)]


def _init(axes, init=nn.initializers.normal(stddev=0.02)):
  # Qwen's HF initializer_range is 0.02 (normal) for linears and embeddings.
  return nn.with_logical_partitioning(init, axes)


def project_vocab(hidden: Array, weight: Array, *, transposed: bool,
                  dtype) -> Array:
  """hidden [..., D] x weight -> float32 logits [..., V].

  `weight` is the embedding [V, D] (tied, `transposed=True`) or lm_head kernel [D, V].
  Inputs are cast to `dtype`, products accumulate in float32 (as HF computes the head in
  the model dtype and then upcasts).
  """
  spec = 'nd,vd->nv' if transposed else 'nd,dv->nv'
  lead = hidden.shape[:-1]
  out = jnp.einsum(spec, _rows(hidden).astype(dtype), weight.astype(dtype),
                   preferred_element_type=jnp.float32)
  return out.reshape(*lead, out.shape[-1])


def _rows(x: Array) -> Array:
  """x [..., D] as [N, D]. Matmuls run on 2-D operands: XLA:CPU computes the weight
  gradient of a 2-D dot (one contracting dimension) about 3x faster than the same
  contraction over the [B, T] dimensions of a 3-D one (measured in bfloat16 and
  float32, issue 9); the products are the same."""
  return x.reshape(-1, x.shape[-1])


class Dense(nn.Module):
  """x [..., D_in] @ kernel [D_in, features] (+ bias); HF nn.Linear transposed."""
  features: int
  use_bias: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  out_dtype: Any = None  # None: self.dtype

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = self.param('kernel', _init(_axes(self.name, 'kernel')),
                        (x.shape[-1], self.features), self.param_dtype)
    y = jnp.einsum('nd,df->nf', _rows(x).astype(self.dtype), kernel.astype(self.dtype),
                   preferred_element_type=jnp.float32).reshape(*x.shape[:-1],
                                                               self.features)
    if self.use_bias:
      bias = self.param('bias', _init(_axes(self.name, 'bias'), nn.initializers.zeros),
                        (self.features,), self.param_dtype)
      y = y + bias.astype(jnp.float32)
    return y.astype(self.out_dtype or self.dtype)


class RMSNorm(nn.Module):
  """x * rsqrt(mean(x^2) + eps) * scale over the last axis, computed in float32."""
  eps: float = 1e-6
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param('scale', _init(_axes(self.name, 'scale'), nn.initializers.ones),
                       (x.shape[-1],), self.param_dtype)
    xf = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
    y = xf * jax.lax.rsqrt(var + self.eps)
    return (y * scale.astype(jnp.float32)).astype(self.dtype)


class Embed(nn.Module):
  """Token embedding [V, D]; `attend` is the tied lm head."""
  vocab_size: int
  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    self.embedding = self.param('embedding', _init(_axes('embed_tokens', 'embedding')),
                                (self.vocab_size, self.features), self.param_dtype)

  def __call__(self, input_ids: Array) -> Array:
    return jnp.take(self.embedding, input_ids, axis=0).astype(self.dtype)

  def attend(self, hidden: Array) -> Array:
    return project_vocab(hidden, self.embedding, transposed=True, dtype=self.dtype)


def apply_rope(x: Array, positions: Array, theta: float) -> Array:
  """Rotary embedding, HF rotate-half convention; angles in float32.

  Args:
    x: [B, T, H, Hd].
    positions: [B, T] integer positions (per row).
    theta: RoPE base (config.rope_theta).
  Returns:
    [B, T, H, Hd] in x.dtype.
  """
  head_dim = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Hd/2]
  sin = jnp.sin(angles)[:, :, None, :]
  cos = jnp.cos(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
