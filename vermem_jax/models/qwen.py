"""Qwen2 / Qwen2.5 / Qwen3 decoder-only language models in Flax Linen.

Parameters are a separate pytree (see `Qwen`); modules follow the small-module style of
google-deepmind/gemma and the numerics of the Hugging Face reference
(`transformers.models.qwen2.modeling_qwen2`, `transformers.models.qwen3.modeling_qwen3`):
pre-norm decoder layers, RMSNorm without offset, SwiGLU MLP, grouped-query attention
with rotary position embeddings (rotate-half convention), q/k/v projection bias for
Qwen2/2.5 and a per-head RMSNorm on q and k (before RoPE) for Qwen3.

Modules: qwen_config.py (QwenConfig, presets), layers.py (Dense, RMSNorm, Embed, RoPE,
vocab head, parameter logical axes), attention.py (self-attention), kv_cache.py (cache
and positions), decode_head.py (the decode step's fused vocabulary head), and this file (decoder layers, the model, parameter helpers); import
each name from the module that defines it.

Numerics: matmuls take `config.dtype` inputs and accumulate in float32
(`preferred_element_type=float32`); RMSNorm, RoPE angles and the attention softmax are
computed in float32; logits are float32.

Padding and KV-cache layout (the one place these rules are written down)
------------------------------------------------------------------------
* `attention_mask [B, T]`: 1 = real token, 0 = padding. Padding may be anywhere, but
  batches are normally LEFT-padded so that the last column is the newest real token of
  every row. A padding key is never attended. Outputs at padding query positions are
  finite but meaningless.
* `positions [B, T]` (RoPE positions) are per row. By default they are
  `cumsum(mask) - 1` clipped at 0, so a left-padded row numbers its real tokens
  0, 1, 2, ... exactly as the same row without padding. With a cache, the default adds
  the number of real tokens already in the cache for that row. There is never one
  position counter shared by the batch.
* Cache (`init_cache`) is a dict:
    {'index': int32 []          next slot to write (shared by the batch),
     'valid': bool [B, S]       slot holds a real (non-padding) token of that row,
     'layers_{i}': {'k': [B, S, Kv, Hd], 'v': [B, S, Kv, Hd]}  in config.dtype}
  with S = max_length slots. `apply` with a cache writes the T new tokens' keys and
  values into slots [index, index + T), marks those slots valid where
  attention_mask is 1, attends each new query to every valid slot up to and including
  its own slot (slot order is token order, so this is causal), and returns the cache
  with index + T. Only the slot index is shared: rows keep their own positions and
  validity, so left-padded prompts of different lengths decode together. Writing past
  S is the caller's error (XLA would clamp the write); `init_cache` callers size S as
  prompt length + new tokens.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from vermem_jax.models.attention import Attention, AttentionMask
from vermem_jax.models.kv_cache import default_positions
from vermem_jax.models.layers import (PARAM_LOGICAL_AXES, Dense, Embed, RMSNorm,
                                      project_vocab)
from vermem_jax.models.qwen_config import QwenConfig

Array = jax.Array


class MLP(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  config: QwenConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    dt, pdt = cfg.compute_dtype, cfg.params_dtype
    gate = Dense(cfg.intermediate_size, dtype=dt, param_dtype=pdt, out_dtype=jnp.float32,
                 name='gate_proj')(x)
    up = Dense(cfg.intermediate_size, dtype=dt, param_dtype=pdt, out_dtype=jnp.float32,
               name='up_proj')(x)
    h = (jax.nn.silu(gate) * up).astype(dt)
    h = nn.with_logical_constraint(h, ('batch', 'length', 'mlp'))
    return Dense(cfg.hidden_size, dtype=dt, param_dtype=pdt, name='down_proj')(h)


class DecoderLayer(nn.Module):
  """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.))."""
  config: QwenConfig

  @nn.compact
  def __call__(self, x, positions, attn_mask, layer_cache, cache_index):
    cfg = self.config
    dt, pdt = cfg.compute_dtype, cfg.params_dtype
    h = RMSNorm(cfg.rms_norm_eps, dt, pdt, name='input_layernorm')(x)
    h, new_cache = Attention(cfg, name='self_attn')(h, positions, attn_mask,
                                                     layer_cache, cache_index)
    x = x + h
    h = RMSNorm(cfg.rms_norm_eps, dt, pdt, name='post_attention_layernorm')(x)
    x = x + MLP(cfg, name='mlp')(h)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    return x, new_cache


def scan_layers(config: QwenConfig, params: Mapping[str, Any], x: Array,
                positions: Array, attn_mask: AttentionMask) -> Array:
  """The decoder layers without a KV cache, as one `lax.scan` over their parameters
  stacked at call time (the tree keeps its `layers_{i}` entries); `Qwen` runs it when
  `config.scan_layers` (`QwenConfig`: on at paper scale, off in the tiny config).

  Why a loop and not Python-unrolled layers (for training and the reference forward):
  in an unrolled program the compiler is free to (1) run the rematerialized
  forward of many layers early and keep their MLP activations alive, and (2) merge the
  weight-gradient all-reduces of every layer into one at the end of the backward, so
  each layer's full-size float32 partial gradient lives until then (XLA:CPU emits
  all-reduce + slice there, not reduce-scatter). A loop iteration cannot overlap the
  next, so at most one layer's activations and partial gradients are alive. Measured
  (`plan_memory.py --model=qwen2.5-7b-instruct --stages=learner`, 8 devices, mesh
  (1, 8, 1)): learner temporaries 70.4 GiB unrolled, 16.1 GiB scanned. The cost is one
  copy of the (sharded) layer parameters per call and of their gradients in the
  backward.

  Args:
    config: the model config (remat applies per layer, as in the unrolled model).
    params: the model's parameter tree (with `layers_0` ... `layers_{L-1}`).
    x: [B, T, D] embedded inputs (compute dtype); positions [B, T] int32.
    attn_mask: the layers' `AttentionMask`.
  Returns:
    [B, T, D] hidden states after the last layer (before the final norm).
  """
  stacked = jax.tree.map(lambda *ps: jnp.stack(ps), *[
      params[f'layers_{i}'] for i in range(config.num_hidden_layers)])
  layer_cls = nn.remat(DecoderLayer) if config.remat else DecoderLayer
  # parent=None: an unbound layer applied to one slice of the stack, not a child
  # module of the caller (which would add it to the parameter tree).
  layer = layer_cls(config, parent=None)

  def body(h, layer_params):
    h, _ = layer.apply({'params': layer_params}, h, positions, attn_mask, None, None)
    return h, None
  x, _ = jax.lax.scan(body, x, stacked)
  return x


class Qwen(nn.Module):
  """Qwen2/2.5/3 causal language model.

  `Qwen(config).apply({'params': params}, input_ids, positions=None,
  attention_mask=None, cache=None, return_hidden=False)`

  Args (of __call__):
    input_ids: [B, T] int32 token ids.
    positions: [B, T] int32 RoPE positions; default per the module docstring.
    attention_mask: [B, T] (1 real, 0 padding); default all ones.
    cache: a cache from `init_cache` (layout: qwen.py's module docstring), or None.
    return_hidden: return the final-normed hidden states [B, T, D] (config.dtype)
      instead of logits, so a loss can gather positions and call `lm_head_logits`.
  Returns:
    float32 logits [B, T, V] (or hidden [B, T, D]); with a cache, a tuple
    (logits_or_hidden, new_cache).
  """
  config: QwenConfig

  @nn.compact
  def __call__(self, input_ids: Array, positions: Array | None = None,
               attention_mask: Array | None = None, cache: dict | None = None,
               return_hidden: bool = False):
    cfg = self.config
    dt, pdt = cfg.compute_dtype, cfg.params_dtype
    if input_ids.ndim != 2:
      raise ValueError(f'input_ids must be [B, T], got shape {input_ids.shape}')
    b, t = input_ids.shape
    if attention_mask is None:
      attention_mask = jnp.ones((b, t), jnp.int32)
    if attention_mask.shape != (b, t):
      raise ValueError(f'attention_mask shape {attention_mask.shape} != input_ids '
                       f'shape {(b, t)}')
    if positions is None:
      positions = default_positions(attention_mask, cache)
    real = attention_mask.astype(bool)

    if cache is None:
      cache_index = None
      attn_mask = AttentionMask(real, jnp.arange(t, dtype=jnp.int32))
    else:
      cache_index = cache['index']
      valid = jax.lax.dynamic_update_slice(cache['valid'], real, (0, cache_index))
      attn_mask = AttentionMask(valid, cache_index + jnp.arange(t, dtype=jnp.int32))

    embed = Embed(cfg.vocab_size, cfg.hidden_size, dt, pdt, name='embed_tokens')
    x = embed(input_ids)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))

    layer_cls = nn.remat(DecoderLayer) if cfg.remat else DecoderLayer
    new_cache = None if cache is None else {
        'index': cache_index + t, 'valid': valid}
    # Initialization goes through the unrolled loop: it creates the `layers_{i}` tree.
    if cfg.scan_layers and cache is None and not self.is_initializing():
      x = scan_layers(cfg, self.variables['params'], x, positions, attn_mask)
    else:
      for i in range(cfg.num_hidden_layers):
        name = f'layers_{i}'
        x, layer_cache = layer_cls(cfg, name=name)(
            x, positions, attn_mask, None if cache is None else cache[name], cache_index)
        if cache is not None:
          new_cache[name] = layer_cache
    x = RMSNorm(cfg.rms_norm_eps, dt, pdt, name='norm')(x)

    if return_hidden:
      out = x
    elif cfg.tie_word_embeddings:
      out = embed.attend(x)
    else:
      out = Dense(cfg.vocab_size, dtype=dt, param_dtype=pdt, out_dtype=jnp.float32,
                  name='lm_head')(x)
    if not return_hidden:
      out = nn.with_logical_constraint(out, ('batch', 'length', 'vocab'))
    if cache is None:
      return out
    return out, new_cache


def lm_head_weight(config: QwenConfig, params: Mapping[str, Any]
                   ) -> tuple[Array, bool]:
  """The vocabulary head's weight and layout: (`params['lm_head']['kernel']` [D, V],
  False), or (the tied embedding [V, D], True) when config.tie_word_embeddings.
  `params` is the parameter tree (a {'params': tree} wrapper is accepted too).

  Raises:
    KeyError: the tree lacks the weight the config asks for.
  """
  if 'params' in params and 'embed_tokens' not in params:
    params = params['params']
  if config.tie_word_embeddings:
    if 'embed_tokens' not in params:
      raise KeyError("lm_head_weight: params lack 'embed_tokens' (tied head)")
    return params['embed_tokens']['embedding'], True
  if 'lm_head' not in params:
    raise KeyError("lm_head_weight: config is untied but params lack 'lm_head'")
  return params['lm_head']['kernel'], False


def lm_head_logits(config: QwenConfig, params: Mapping[str, Any],
                   hidden: Array) -> Array:
  """Projects hidden states [..., D] to float32 logits [..., V] with the weight of
  `lm_head_weight` (same math as `Qwen(...)(..., return_hidden=False)`).

  Raises:
    KeyError: the tree lacks the weight the config asks for.
  """
  weight, transposed = lm_head_weight(config, params)
  return project_vocab(hidden, weight, transposed=transposed,
                       dtype=config.compute_dtype)


@functools.partial(jax.jit, static_argnums=0)
def _init_params_jit(config: QwenConfig, rng: Array) -> dict:
  # One jitted program per config: an eager init would compile every initializer op.
  variables = Qwen(config).init(rng, jnp.zeros((1, 1), jnp.int32))
  return nn.meta.unbox(variables['params'])


def init_params(config: QwenConfig, rng: Array) -> dict:
  """Random parameters (plain arrays, param_dtype) in the documented tree layout.

  Linears and embeddings ~ N(0, 0.02) (HF initializer_range), biases 0, norm scales 1.
  """
  return _init_params_jit(config, rng)


def param_logical_axes(params: Mapping[str, Any]) -> Any:
  """Maps a parameter tree to a tree of logical axis-name tuples (same structure).

  Raises:
    KeyError: a leaf whose (module, name) is not in PARAM_LOGICAL_AXES.
  """
  def lookup(path, leaf):
    keys = tuple(getattr(p, 'key', getattr(p, 'name', None)) for p in path)
    key = keys[-2:]
    if key not in PARAM_LOGICAL_AXES:
      raise KeyError(f'no logical axes for parameter {"/".join(map(str, keys))}')
    axes = PARAM_LOGICAL_AXES[key]
    if len(axes) != len(leaf.shape):
      raise ValueError(f'parameter {"/".join(map(str, keys))} has rank {len(leaf.shape)}'
                       f', expected {len(axes)} for axes {axes}')
    return axes
  return jax.tree_util.tree_map_with_path(lookup, params)
