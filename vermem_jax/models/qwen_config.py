"""Qwen2 / Qwen2.5 / Qwen3 (and Llama) architecture configs: `QwenConfig` and presets.

Field names follow the Hugging Face `config.json`; `QwenConfig.from_hf` reads one.
Llama (transformers `LlamaForCausalLM`, e.g. SmolLM2) is the Qwen2 decoder without
q/k/v biases, so it is a `model_type` of this one family, not a second model.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

_DTYPES = {'bfloat16': jnp.bfloat16, 'float32': jnp.float32, 'float16': jnp.float16}

# Hugging Face `model_type`s of the family; qwen3 is the one with q/k norm.
MODEL_TYPES = ('qwen2', 'qwen3', 'llama')

# Attention implementations (attention.py); 'auto' picks one per backend.
ATTN_IMPLEMENTATIONS = ('auto', 'eager', 'sdpa', 'blockwise', 'pallas')

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
    model_type: 'llama' for a Llama checkpoint (no q/k/v bias, no q/k norm:
      transformers' Llama with attention_bias=False, mlp_bias=False), else None: a
      Qwen model, whose type follows qk_norm (`hf_model_type`).
    dtype: compute dtype name, 'bfloat16' | 'float32' | 'float16'.
    param_dtype: parameter storage dtype name.
    remat: rematerialize each decoder layer in the backward pass (saves activations).
    scan_layers: without a KV cache (training, the reference forward), run the decoder
      layers as one `lax.scan` over their parameters stacked at call time
      (`qwen.scan_layers`; the parameter tree is unchanged). Why: in the unrolled
      program XLA keeps every layer's full-size float32 weight gradient and many
      layers' activations alive at once; planned Qwen2.5-7B learner peak per device on
      mesh (1, 8, 1) 91.7 GiB unrolled, 37.4 GiB scanned (Qwen3-4B 72.2 -> 27.0;
      `plan_memory.py --stages=learner`, docs/hardware.md). Cost: one stacked copy of
      the layer parameters per call, and on the 2-layer CPU model a forward + backward
      8-15 % slower with different bfloat16 rounding. Off by default like `remat`; the
      experiment config sets it (`model.scan_layers`: on at paper scale, off in tiny).
      The cached (sampling) path always runs the layers unrolled.
    attn_implementation: attention kernel (Hugging Face's field name; attention.py):
      'eager' materializes every [T, S] score matrix; 'sdpa' is
      `jax.nn.dot_product_attention` (cuDNN flash attention on GPU in bf16/f16, XLA
      elsewhere); 'blockwise' is query- and key-chunked online softmax in plain XLA
      (memory linear in T, every backend); 'pallas' is JAX's Pallas flash-attention
      kernel for TPU; 'auto' = 'pallas' on TPU, 'sdpa' on GPU in bf16/f16,
      'blockwise' otherwise.
    attn_block_q: query rows per block of 'blockwise' / 'pallas' (tokens).
    attn_block_kv: key columns per block of 'blockwise' / 'pallas' (tokens).
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
  model_type: str | None = None
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  remat: bool = False
  scan_layers: bool = False
  attn_implementation: str = 'auto'
  attn_block_q: int = 512
  attn_block_kv: int = 512

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
                 'max_position_embeddings', 'attn_block_q', 'attn_block_kv'):
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
    if self.model_type not in (None, 'llama'):
      raise ValueError(f"QwenConfig.model_type must be None (Qwen) or 'llama', "
                       f'got {self.model_type!r}')
    if self.model_type == 'llama' and (self.attention_bias or self.qk_norm):
      raise ValueError('QwenConfig: model_type llama has no q/k/v bias and no q/k '
                       f'norm, got attention_bias={self.attention_bias}, '
                       f'qk_norm={self.qk_norm}')
    if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
      raise ValueError(f'QwenConfig.attn_implementation must be one of '
                       f'{ATTN_IMPLEMENTATIONS}, got {self.attn_implementation!r}')
    for name in ('dtype', 'param_dtype'):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f'QwenConfig.{name} must be one of {sorted(_DTYPES)}, '
                         f'got {getattr(self, name)!r}')

  @property
  def hf_model_type(self) -> str:
    """The Hugging Face model_type written back (`MODEL_TYPES`)."""
    if self.model_type == 'llama':
      return 'llama'
    return 'qwen3' if self.qk_norm else 'qwen2'

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
    """Builds a config from a Hugging Face Qwen2/Qwen3/Llama `config.json`.

    Accepts a checkpoint folder, a path to the json file, or the parsed dict. Reads the
    transformers-4 layout (`rope_theta`, `rope_scaling`) and the transformers-5 layout
    (`rope_parameters: {rope_theta, rope_type}`); an explicit `head_dim` wins over
    hidden_size // num_attention_heads. model_type 'qwen2' has q/k/v bias and no q/k
    norm (HF hard-codes them); 'qwen3' has q/k norm and takes `attention_bias` from the
    file (default False); 'llama' (transformers `LlamaConfig`) has no q/k norm and
    takes `attention_bias` and `mlp_bias` from the file (default False), which must
    be False: Llama's attention_bias also biases o_proj and mlp_bias every MLP
    projection, which the parameter tree does not hold. `overrides` set numerics
    fields (dtype, param_dtype, remat, scan_layers) or anything else.

    Raises:
      FileNotFoundError: no config.json at the path.
      ValueError: not a qwen2/qwen3/llama config, a required field is missing, or a
        feature this implementation does not have (RoPE scaling such as Llama 3's
        'llama3', sliding-window attention, Qwen3 or Llama attention_bias which also
        adds an o_proj bias, Llama mlp_bias, Llama pretraining_tp > 1).
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
                    else 'llama' if 'Llama' in archs else None)
    if model_type not in MODEL_TYPES:
      raise ValueError(f'{where}: model_type {raw.get("model_type")!r} is not one of '
                       f'{MODEL_TYPES}')

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
    elif model_type == 'llama':
      attention_bias, qk_norm = False, False
      unsupported = [f'{k}={raw[k]!r}' for k in ('attention_bias', 'mlp_bias')
                     if raw.get(k)]
      if (raw.get('pretraining_tp') or 1) != 1:
        unsupported.append(f'pretraining_tp={raw["pretraining_tp"]!r}')
      if unsupported:
        raise ValueError(
            f'{where}: llama with {", ".join(unsupported)} is not supported (the '
            'parameter tree has no o_proj or MLP biases and one tensor per projection)')
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
        model_type='llama' if model_type == 'llama' else None,
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
# values are also checked against the config.json files in tests/data/tokenizers).
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
    # The `small` scale's policy (experiments/configs/parts/small.py): the config.json
    # of huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct, a Llama model.
    'smollm2-135m-instruct': QwenConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192,
        attention_bias=False, qk_norm=False, model_type='llama', **_NUMERICS),
}
