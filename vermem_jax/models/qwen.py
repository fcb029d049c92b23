"""Qwen2 / Qwen2.5 / Qwen3 decoder-only language models in Flax Linen.

Parameters are a separate pytree (see `Qwen`); modules follow the small-module style of
google-deepmind/gemma and the numerics of the Hugging Face reference
(`transformers.models.qwen2.modeling_qwen2`, `transformers.models.qwen3.modeling_qwen3`):
pre-norm decoder layers, RMSNorm without offset, SwiGLU MLP, grouped-query attention
with rotary position embeddings (rotate-half convention), q/k/v projection bias for
Qwen2/2.5 and a per-head RMSNorm on q and k (before RoPE) for Qwen3.

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

import dataclasses
import functools
import json
import os
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

# Large finite negative logit for masked keys: exp() of it underflows to exactly 0 for
# any query that has one real key, and a query with no real key (a padding row) gets a
# uniform, finite distribution instead of NaN (the gemma convention).
_MASK_VALUE = -2.3819763e38

_DTYPES = {'bfloat16': jnp.bfloat16, 'float32': jnp.float32, 'float16': jnp.float16}

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


# --------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class QwenConfig:
  """Architecture + numerics of a Qwen2/2.5/3 model (Hugging Face field names).

  The architecture defaults are the CPU `tiny` preset (DESIGN.md: the embedded default
  is a small Qwen-architecture model); published models come from `preset(name)` or
  `from_hf(config.json)`.

  Attributes:
    vocab_size: V, embedding rows (Qwen tokenizer ids need 151936).
    hidden_size: D, residual width.
    intermediate_size: I, SwiGLU hidden width.
    num_hidden_layers: L.
    num_attention_heads: N query heads.
    num_key_value_heads: Kv key/value heads (GQA; N % Kv == 0).
    head_dim: Hd; None means hidden_size // num_attention_heads (resolved in
      __post_init__, so the field is always an int afterwards).
    rope_theta: RoPE base.
    rms_norm_eps: RMSNorm epsilon.
    tie_word_embeddings: lm head = transposed input embedding (no 'lm_head' params).
    max_position_embeddings: longest position the checkpoint was trained for.
    attention_bias: q/k/v projection biases (Qwen2/2.5).
    qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
    dtype: compute dtype name, 'bfloat16' | 'float32' | 'float16'.
    param_dtype: parameter storage dtype name.
    remat: rematerialize each decoder layer in the backward pass (saves activations).
  """
  vocab_size: int = 151936
  hidden_size: int = 64
  intermediate_size: int = 128
  num_hidden_layers: int = 2
  num_attention_heads: int = 4
  num_key_value_heads: int = 2
  head_dim: int | None = 16
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  max_position_embeddings: int = 32768
  attention_bias: bool = True
  qk_norm: bool = False
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  remat: bool = False

  def __post_init__(self):
    if self.head_dim is None:
      if self.num_attention_heads <= 0 or self.hidden_size % self.num_attention_heads:
        raise ValueError(
            f'QwenConfig: hidden_size={self.hidden_size} is not divisible by '
            f'num_attention_heads={self.num_attention_heads}; give head_dim explicitly')
      object.__setattr__(self, 'head_dim',
                         self.hidden_size // self.num_attention_heads)
    for name in ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
                 'num_attention_heads', 'num_key_value_heads', 'head_dim',
                 'max_position_embeddings'):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f'QwenConfig.{name} must be a positive int, got {value!r}')
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f'QwenConfig: num_attention_heads={self.num_attention_heads} is not a multiple '
          f'of num_key_value_heads={self.num_key_value_heads}')
    if self.head_dim % 2:
      raise ValueError(f'QwenConfig.head_dim must be even for RoPE, got {self.head_dim}')
    if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
      raise ValueError('QwenConfig: rope_theta and rms_norm_eps must be positive, got '
                       f'{self.rope_theta!r}, {self.rms_norm_eps!r}')
    for name in ('dtype', 'param_dtype'):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f'QwenConfig.{name} must be one of {sorted(_DTYPES)}, '
                         f'got {getattr(self, name)!r}')

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def params_dtype(self):
    return _DTYPES[self.param_dtype]

  def replace(self, **changes) -> 'QwenConfig':
    return dataclasses.replace(self, **changes)

  @classmethod
  def preset(cls, name: str, **overrides) -> 'QwenConfig':
    """Returns the named preset (see `PRESETS`), with optional field overrides.

    Raises:
      KeyError: unknown preset name (the message lists the known ones).
    """
    key = name.lower()
    if key not in PRESETS:
      raise KeyError(f'unknown Qwen preset {name!r}; known: {sorted(PRESETS)}')
    return PRESETS[key].replace(**overrides)

  @classmethod
  def from_hf(cls, path_or_dict: str | os.PathLike | Mapping[str, Any],
              **overrides) -> 'QwenConfig':
    """Builds a config from a Hugging Face Qwen2/Qwen3 `config.json`.

    Accepts a checkpoint folder, a path to the json file, or the parsed dict. Reads the
    transformers-4 layout (`rope_theta`, `rope_scaling`) and the transformers-5 layout
    (`rope_parameters: {rope_theta, rope_type}`); an explicit `head_dim` wins over
    hidden_size // num_attention_heads. model_type 'qwen2' has q/k/v bias and no q/k
    norm (HF hard-codes them); 'qwen3' has q/k norm and takes `attention_bias` from the
    file (default False). `overrides` set numerics fields (dtype, param_dtype, remat)
    or anything else.

    Raises:
      FileNotFoundError: no config.json at the path.
      ValueError: not a qwen2/qwen3 config, a required field is missing, or a feature
        this implementation does not have (RoPE scaling, sliding-window attention,
        Qwen3 attention_bias which also adds an o_proj bias).
    """
    if isinstance(path_or_dict, Mapping):
      raw = dict(path_or_dict)
      where = 'config dict'
    else:
      path = os.fspath(path_or_dict)
      if os.path.isdir(path):
        path = os.path.join(path, 'config.json')
      if not os.path.isfile(path):
        raise FileNotFoundError(f'no Hugging Face config.json at {path}')
      with open(path, encoding='utf-8') as f:
        try:
          raw = json.load(f)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
          raise ValueError(f'{path}: not valid JSON ({e})') from e
      where = path
    if not isinstance(raw, Mapping):
      raise ValueError(f'{where}: expected a JSON object, got {type(raw).__name__}')

    model_type = raw.get('model_type')
    if model_type is None:
      archs = ' '.join(raw.get('architectures') or ())
      model_type = ('qwen3' if 'Qwen3' in archs else 'qwen2' if 'Qwen2' in archs
                    else None)
    if model_type not in ('qwen2', 'qwen3'):
      raise ValueError(f'{where}: model_type {raw.get("model_type")!r} is not qwen2 or '
                       'qwen3')

    required = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
                'num_attention_heads')
    missing = [k for k in required if k not in raw]
    if missing:
      raise ValueError(f'{where}: missing required field(s) {missing}')

    rope = raw.get('rope_parameters')
    if isinstance(rope, Mapping):
      rope_theta = rope.get('rope_theta', raw.get('rope_theta'))
      rope_type = rope.get('rope_type', rope.get('type', 'default'))
    else:
      rope_theta = raw.get('rope_theta')
      scaling = raw.get('rope_scaling')
      rope_type = (scaling.get('rope_type', scaling.get('type', 'default'))
                   if isinstance(scaling, Mapping) else 'default')
    if rope_theta is None:
      raise ValueError(f'{where}: no rope_theta (neither top-level nor in '
                       'rope_parameters)')
    if rope_type != 'default':
      raise ValueError(f'{where}: RoPE scaling type {rope_type!r} is not supported '
                       '(only the default rotary embedding)')
    if raw.get('use_sliding_window'):
      raise ValueError(f'{where}: use_sliding_window=true is not supported')

    if model_type == 'qwen2':
      attention_bias, qk_norm = True, False
    else:
      attention_bias, qk_norm = bool(raw.get('attention_bias', False)), True
      if attention_bias:
        raise ValueError(
            f'{where}: qwen3 with attention_bias=true also has an o_proj bias, which '
            'the parameter tree does not hold; not supported')

    def num(key, kind, value):
      # A JSON number of the right kind; '4096' or 4096.5 is a corrupt config, not a
      # value to coerce (int('abc') would fail without naming the field).
      ok = (isinstance(value, int) if kind is int else isinstance(value, (int, float)))
      if isinstance(value, bool) or not ok:
        raise ValueError(f'{where}: field {key!r} must be a JSON '
                         f'{"integer" if kind is int else "number"}, got {value!r}')
      return kind(value)

    num_heads = num('num_attention_heads', int, raw['num_attention_heads'])
    fields = dict(
        vocab_size=num('vocab_size', int, raw['vocab_size']),
        hidden_size=num('hidden_size', int, raw['hidden_size']),
        intermediate_size=num('intermediate_size', int, raw['intermediate_size']),
        num_hidden_layers=num('num_hidden_layers', int, raw['num_hidden_layers']),
        num_attention_heads=num_heads,
        num_key_value_heads=num('num_key_value_heads', int,
                                raw.get('num_key_value_heads') or num_heads),
        head_dim=(num('head_dim', int, raw['head_dim'])
                  if raw.get('head_dim') is not None else None),
        rope_theta=num('rope_theta', float, rope_theta),
        rms_norm_eps=num('rms_norm_eps', float, raw.get('rms_norm_eps', 1e-6)),
        tie_word_embeddings=bool(raw.get('tie_word_embeddings', False)),
        max_position_embeddings=num('max_position_embeddings', int,
                                    raw.get('max_position_embeddings', 32768)),
        attention_bias=attention_bias,
        qk_norm=qk_norm,
    )
    fields.update(overrides)
    try:
      return cls(**fields)
    except ValueError as e:  # __post_init__'s range checks: say which file
      raise ValueError(f'{where}: {e}') from e


# Published presets compute in bfloat16 but keep float32 master parameters: an RL
# update at lr 1e-6 (SPEC §6) is below bfloat16's resolution for typical weights.
_NUMERICS = dict(dtype='bfloat16', param_dtype='float32')


def _qwen25(**kw) -> QwenConfig:
  # Shared by every Qwen2.5 *-Instruct config.json on the Hugging Face hub.
  base = dict(vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
              max_position_embeddings=32768, attention_bias=True, qk_norm=False,
              head_dim=None, tie_word_embeddings=True, **_NUMERICS)
  base.update(kw)
  return QwenConfig(**base)


def _qwen3(**kw) -> QwenConfig:
  # Shared by every dense Qwen3 config.json on the Hugging Face hub (head_dim 128).
  base = dict(vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
              max_position_embeddings=40960, attention_bias=False, qk_norm=True,
              head_dim=128, num_key_value_heads=8, tie_word_embeddings=True,
              **_NUMERICS)
  base.update(kw)
  return QwenConfig(**base)


# Published numbers: each model's config.json on huggingface.co/Qwen (the 0.5B and 1.7B
# values are also checked against the files in shared/data/tokenizers by the tests).
PRESETS: dict[str, QwenConfig] = {
    'qwen2.5-0.5b-instruct': _qwen25(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2),
    'qwen2.5-1.5b-instruct': _qwen25(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2),
    'qwen2.5-3b-instruct': _qwen25(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2),
    'qwen2.5-7b-instruct': _qwen25(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944,
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        tie_word_embeddings=False),
    'qwen3-0.6b': _qwen3(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16),
    'qwen3-1.7b': _qwen3(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16),
    'qwen3-4b': _qwen3(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32),
    'qwen3-8b': _qwen3(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, tie_word_embeddings=False),
    'qwen3-4b-instruct-2507': _qwen3(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32, rope_theta=5_000_000.0,
        max_position_embeddings=262144),
    # CPU model for tests and demos: Qwen2-style (q/k/v bias), GQA 4/2, Qwen vocab.
    'tiny': QwenConfig(),
    # The CPU default (experiments/configs/parts/tiny.py): Qwen2-style, sized by
    # measurement to learn the SFT classes on 2 cores in minutes, for the 4,096-piece
    # SentencePiece vocabulary of `vermem_jax.tokenizer_build` (paths.packaged_tokenizer).
    # Two wide heads: on CPU the [B, H, T, T] attention softmax costs more than the
    # matmuls at this width, so fewer heads of 128 train faster than four of 64.
    'tiny-sp4k': QwenConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        max_position_embeddings=4096, dtype='bfloat16'),
}


# --------------------------------------------------------------------------- modules


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


def default_positions(attention_mask: Array, cache: dict | None = None) -> Array:
  """Per-row RoPE positions [B, T] int32: cumsum(mask) - 1 (+ real tokens in cache)."""
  mask = attention_mask.astype(jnp.int32)
  pos = jnp.cumsum(mask, axis=-1) - 1
  if cache is not None:
    pos = pos + jnp.sum(cache['valid'], axis=-1, dtype=jnp.int32)[:, None]
  return jnp.maximum(pos, 0)


class Qwen(nn.Module):
  """Qwen2/2.5/3 causal language model.

  `Qwen(config).apply({'params': params}, input_ids, positions=None,
  attention_mask=None, cache=None, return_hidden=False)`

  Args (of __call__):
    input_ids: [B, T] int32 token ids.
    positions: [B, T] int32 RoPE positions; default per the module docstring.
    attention_mask: [B, T] (1 real, 0 padding); default all ones.
    cache: a cache from `init_cache` (layout in the module docstring), or None.
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
      causal = jnp.tril(jnp.ones((t, t), bool))
      attn_mask = causal[None] & real[:, None, :]  # [B, T, S=T]
    else:
      cache_index = cache['index']
      num_slots = cache['valid'].shape[1]
      valid = jax.lax.dynamic_update_slice(cache['valid'], real, (0, cache_index))
      query_slot = cache_index + jnp.arange(t)
      causal = jnp.arange(num_slots)[None, :] <= query_slot[:, None]  # [T, S]
      attn_mask = causal[None] & valid[:, None, :]

    embed = Embed(cfg.vocab_size, cfg.hidden_size, dt, pdt, name='embed_tokens')
    x = embed(input_ids)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))

    layer_cls = nn.remat(DecoderLayer) if cfg.remat else DecoderLayer
    new_cache = None if cache is None else {
        'index': cache_index + t, 'valid': valid}
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


def lm_head_logits(config: QwenConfig, params: Mapping[str, Any],
                   hidden: Array) -> Array:
  """Projects hidden states [..., D] to float32 logits [..., V].

  Uses `params['lm_head']['kernel']` [D, V], or the tied embedding [V, D] when
  config.tie_word_embeddings. `params` is the parameter tree (a {'params': tree}
  wrapper is accepted too). Same math as `Qwen(...)(..., return_hidden=False)`.

  Raises:
    KeyError: the tree lacks the weight the config asks for.
  """
  if 'params' in params and 'embed_tokens' not in params:
    params = params['params']
  if config.tie_word_embeddings:
    if 'embed_tokens' not in params:
      raise KeyError("lm_head_logits: params lack 'embed_tokens' (tied head)")
    w = params['embed_tokens']['embedding']
    return project_vocab(hidden, w, transposed=True, dtype=config.compute_dtype)
  if 'lm_head' not in params:
    raise KeyError("lm_head_logits: config is untied but params lack 'lm_head'")
  return project_vocab(hidden, params['lm_head']['kernel'], transposed=False,
                       dtype=config.compute_dtype)


def init_cache(config: QwenConfig, batch_size: int, max_length: int) -> dict:
  """Empty KV cache with `max_length` slots (layout in the module docstring)."""
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
