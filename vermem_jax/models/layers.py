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
  """x [..., D] as [N, D]: the linears run as 2-D matmuls (`matmul`), whose backward
  chooses the weight-gradient layout itself."""
  return x.reshape(-1, x.shape[-1])


def _weight_grad_chunks(rows: int) -> int:
  """Row chunks of the weight-gradient contraction: XLA:CPU's YNNPACK dot contracts
  [N, D] x [N, F] over N at ~130 GFLOP/s in bfloat16 but [8, N/8, D] x [8, N/8, F]
  over both leading dimensions at ~430 (same products and sums, measured at
  N = 4608, D = 256, F = 1024). Other backends get one chunk."""
  if jax.default_backend() != 'cpu':
    return 1
  return 8 if rows % 8 == 0 else 1


@jax.custom_vjp
def matmul(x: Array, kernel: Array) -> Array:
  """x [N, D_in] @ kernel [D_in, F] -> float32 [N, F] (both inputs in the compute dtype,
  products accumulated in float32).

  Backward (the reason for the custom VJP): the output cotangent is cast to the inputs'
  dtype before the two gradient matmuls, so in bfloat16 they run as bfloat16 x bfloat16
  dots with float32 accumulation, as PyTorch autocast's linear backward does (its
  grad_output is bfloat16); autodiff would contract a float32 cotangent with the
  bfloat16 operand and run the slow mixed-dtype dot. In float32 the gradients are
  autodiff's (up to summation order). dx and dW are float32 sums cast to the inputs'
  dtypes. Measured on the tiny-sp4k model (8 x 576 tokens, 2-core CPU, bfloat16): a
  forward + backward of 619 ms before, 485 ms after.

  Raises:
    ValueError: (from einsum) if the shapes do not contract.
  """
  return jnp.einsum('nd,df->nf', x, kernel, preferred_element_type=jnp.float32)


def _matmul_fwd(x, kernel):
  return matmul(x, kernel), (x, kernel)


def _matmul_bwd(res, g):
  x, kernel = res
  g = g.astype(x.dtype)
  dx = jnp.einsum('nf,df->nd', g, kernel, preferred_element_type=jnp.float32)
  c = _weight_grad_chunks(x.shape[0])
  dw = jnp.einsum('cnd,cnf->df', x.reshape(c, -1, x.shape[1]),
                  g.reshape(c, -1, g.shape[1]), preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(kernel.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


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
    y = matmul(_rows(x).astype(self.dtype),
               kernel.astype(self.dtype)).reshape(*x.shape[:-1], self.features)
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
