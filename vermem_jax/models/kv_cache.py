"""KV cache and per-row RoPE positions (layout: qwen.py's module docstring)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vermem_jax.models.qwen_config import QwenConfig

Array = jax.Array


def default_positions(attention_mask: Array, cache: dict | None = None) -> Array:
  """Per-row RoPE positions [B, T] int32: cumsum(mask) - 1 (+ real tokens in cache)."""
  mask = attention_mask.astype(jnp.int32)
  pos = jnp.cumsum(mask, axis=-1) - 1
  if cache is not None:
    pos = pos + jnp.sum(cache['valid'], axis=-1, dtype=jnp.int32)[:, None]
  return jnp.maximum(pos, 0)


def init_cache(config: QwenConfig, batch_size: int, max_length: int) -> dict:
  """Empty KV cache with `max_length` slots (layout: qwen.py's module docstring)."""
  if batch_size <= 0 or max_length <= 0:
    raise ValueError(f'init_cache: batch_size={batch_size} and max_length={max_length} '
                     'must be positive')
  shape = (batch_size, max_length, config.num_key_value_heads, config.head_dim)
  cache = {'index': jnp.zeros((), jnp.int32),
           'valid': jnp.zeros((batch_size, max_length), bool)}
  for i in range(config.num_hidden_layers):
    cache[f'layers_{i}'] = {'k': jnp.zeros(shape, config.compute_dtype),
                            'v': jnp.zeros(shape, config.compute_dtype)}
  return cache
