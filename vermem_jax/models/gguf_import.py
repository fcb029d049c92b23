"""Import a Llama-architecture GGUF file (llama.cpp's format) as a Hugging Face folder.

    python -m vermem_jax.models.gguf_import SRC.gguf OUT_DIR

writes OUT_DIR with `config.json` and `model.safetensors` (float32, through
`hf_io.save_hf_checkpoint`, so `hf_io.load_hf_checkpoint` and transformers both load
it), the tokenizer files (`tokenizer.json`, `tokenizer_config.json`, the chat template)
converted from the GGUF metadata by transformers' GGUF tokenizer conversion, and
`generation_config.json`. Quantized tensors (Q4_1, Q8_0, ...) are dequantized to
float32 once, by the `gguf` package (`pip install gguf`; optional, imported here only).
Used for SmolLM2-135M-Instruct, the `small` scale's policy (docs/real-weights.md).

GGUF layout (llama.cpp `convert_hf_to_gguf.py`, GGUF spec in ggml's docs/gguf.md):
tensor shapes are listed fastest axis first, so a [out, in] torch weight is listed as
[in, out] and its NumPy array is [out, in]. The converter reorders the rows of each
head's q and k projection from the rotate-half RoPE layout of transformers to the
interleaved pair layout of llama.cpp; `unpermute_rope_rows` puts them back. A file with
no `output.weight` ties the head to the embedding.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Any, Sequence

import numpy as np

from vermem_jax.models import hf_io
from vermem_jax.models import qwen_config

# GGUF tensor names of one decoder layer -> (param path below layers_{i}, is a
# torch-layout [out, in] weight that becomes a Flax [in, out] kernel).
_LAYER_TENSORS = {
    'attn_norm': (('input_layernorm', 'scale'), False),
    'attn_q': (('self_attn', 'q_proj', 'kernel'), True),
    'attn_k': (('self_attn', 'k_proj', 'kernel'), True),
    'attn_v': (('self_attn', 'v_proj', 'kernel'), True),
    'attn_output': (('self_attn', 'o_proj', 'kernel'), True),
    'ffn_norm': (('post_attention_layernorm', 'scale'), False),
    'ffn_gate': (('mlp', 'gate_proj', 'kernel'), True),
    'ffn_up': (('mlp', 'up_proj', 'kernel'), True),
    'ffn_down': (('mlp', 'down_proj', 'kernel'), True),
}
# Written last by `import_gguf`: its presence marks a whole conversion.
GENERATION_CONFIG = 'generation_config.json'
# Exit status of the command line on bad input (a missing or malformed file).
EXIT_BAD_INPUT = 2


class GGUFImportError(ValueError):
  """The file is not a GGUF this importer handles (named in the message)."""


def _reader(path: str):
  try:
    import gguf  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise GGUFImportError('reading GGUF needs the `gguf` package: pip install gguf '
                          '(or `make install-small`)') from e
  if not os.path.isfile(path):
    raise GGUFImportError(f'no GGUF file at {path!r}')
  try:
    return gguf.GGUFReader(path)
  except (ValueError, OSError, KeyError) as e:
    raise GGUFImportError(f'{path}: not a readable GGUF file ({e})') from e


def _field(reader, key: str, default: Any = None) -> Any:
  f = reader.fields.get(key)
  if f is None:
    if default is None:
      raise GGUFImportError(f'GGUF metadata has no {key!r}')
    return default
  return f.contents()


def _float32_value(x: Any) -> float:
  # GGUF stores float32 metadata; its shortest decimal (1e-05, not 9.9999997e-06) is
  # the value the original config.json held and rounds to the same float32.
  return float(str(np.float32(x)))


def config_from_gguf(reader) -> qwen_config.QwenConfig:
  """The float32 `QwenConfig` (model_type 'llama') of a Llama GGUF's metadata.

  Args:
    reader: a `gguf.GGUFReader`.
  Raises:
    GGUFImportError: the architecture is not llama, a field is missing, or a feature
      the model lacks (RoPE scaling, RoPE over part of a head).
  """
  arch = _field(reader, 'general.architecture')
  if arch != 'llama':
    raise GGUFImportError(f'GGUF architecture {arch!r} is not llama')
  get = lambda k, d=None: _field(reader, f'llama.{k}', d)
  heads = int(get('attention.head_count'))
  hidden = int(get('embedding_length'))
  head_dim = int(get('attention.key_length', hidden // heads))
  if int(get('rope.dimension_count', head_dim)) != head_dim:
    raise GGUFImportError('RoPE over part of each head (llama.rope.dimension_count '
                          f'{get("rope.dimension_count")} != head_dim {head_dim}) is not '
                          'supported')
  if get('rope.scaling.type', 'none') not in ('none', 'linear') or float(
      get('rope.scaling.factor', 1.0)) != 1.0:
    raise GGUFImportError('GGUF with RoPE scaling is not supported')
  names = {t.name for t in reader.tensors}
  vocab = get('vocab_size', len(_field(reader, 'tokenizer.ggml.tokens')))
  return qwen_config.QwenConfig(
      vocab_size=int(vocab), hidden_size=hidden,
      intermediate_size=int(get('feed_forward_length')),
      num_hidden_layers=int(get('block_count')), num_attention_heads=heads,
      num_key_value_heads=int(get('attention.head_count_kv', heads)),
      head_dim=head_dim, rope_theta=_float32_value(get('rope.freq_base', 10000.0)),
      rms_norm_eps=_float32_value(get('attention.layer_norm_rms_epsilon')),
      tie_word_embeddings='output.weight' not in names,
      max_position_embeddings=int(get('context_length')),
      attention_bias=False, qk_norm=False, model_type='llama')


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's per-head row order of a q or k projection.

  Within each head of Hd rows, llama.cpp stores row 2j + s at what transformers holds
  as row j + s * Hd/2 (s in {0, 1}, j < Hd/2): the rotate-half pairs (j, j + Hd/2)
  become adjacent. This returns the transformers order.

  Args:
    w: [num_heads * Hd, D] float array (torch layout, llama.cpp row order).
    num_heads: heads of this projection (query heads for q, key/value heads for k).
  Returns:
    [num_heads * Hd, D] array in transformers' row order.
  """
  rows, cols = w.shape
  hd = rows // num_heads
  return w.reshape(num_heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _dequantized(tensor) -> np.ndarray:
  import gguf  # pylint: disable=import-outside-toplevel
  return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type),
                    np.float32)


def params_from_gguf(reader, config: qwen_config.QwenConfig) -> dict[str, Any]:
  """Float32 NumPy parameter tree (`vermem_jax.models.qwen` layout) of a Llama GGUF.

  Raises:
    GGUFImportError: a missing, unknown or mis-shaped tensor (all named).
  """
  by_name = {t.name: t for t in reader.tensors}
  params: dict[str, Any] = {}
  expected = {'token_embd.weight': (('embed_tokens', 'embedding'), False),
              'output_norm.weight': (('norm', 'scale'), False)}
  if not config.tie_word_embeddings:
    expected['output.weight'] = (('lm_head', 'kernel'), True)
  for i in range(config.num_hidden_layers):
    for short, (path, kernel) in _LAYER_TENSORS.items():
      expected[f'blk.{i}.{short}.weight'] = ((f'layers_{i}',) + path, kernel)
  missing = sorted(set(expected) - set(by_name))
  # RoPE frequency tables (rope_freqs, rope_factors_*) carry no parameters here.
  unknown = sorted(n for n in set(by_name) - set(expected) if 'rope' not in n)
  if missing or unknown:
    raise GGUFImportError(f'GGUF tensors do not match a {config.num_hidden_layers}-layer '
                          f'llama: missing {missing}, unknown {unknown}')
  heads = {'attn_q': config.num_attention_heads, 'attn_k': config.num_key_value_heads}
  for name, (path, kernel) in expected.items():
    w = _dequantized(by_name[name])
    short = name.split('.')[-2]
    if short in heads:
      w = unpermute_rope_rows(w, heads[short])
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = np.ascontiguousarray(w.T if kernel else w)
  return params


def _write_tokenizer(src: str, out_dir: str) -> None:
  # transformers' GGUF tokenizer conversion (tokenizer.ggml.* and the chat template).
  import transformers  # pylint: disable=import-outside-toplevel
  tok = transformers.AutoTokenizer.from_pretrained(
      os.path.dirname(os.path.abspath(src)), gguf_file=os.path.basename(src))
  tok.save_pretrained(out_dir)


def import_gguf(src: str | os.PathLike, out_dir: str | os.PathLike) -> qwen_config.QwenConfig:
  """Converts a Llama GGUF file into a Hugging Face folder (module docstring).

  Args:
    src: the `.gguf` file.
    out_dir: output folder (created; files of the same names are replaced).
  Returns:
    The model's QwenConfig (float32).
  Raises:
    GGUFImportError: `gguf` not installed, no such file, not a llama GGUF, or tensors
      that do not match its metadata.
  """
  src, out_dir = os.fspath(src), os.fspath(out_dir)
  reader = _reader(src)
  config = config_from_gguf(reader)
  params = params_from_gguf(reader, config)
  os.makedirs(out_dir, exist_ok=True)
  # Written beside OUT_DIR and moved in file by file, GENERATION_CONFIG last, so an
  # interrupted import never leaves a folder that `is_converted` takes for whole.
  staging = tempfile.mkdtemp(prefix='.gguf_import-', dir=os.path.dirname(
      os.path.abspath(out_dir)))
  try:
    try:
      hf_io.save_hf_checkpoint(config, params, staging, dtype='float32')
    except ValueError as e:  # its parameter check names each mis-shaped tensor
      raise GGUFImportError(f'GGUF tensors do not match its metadata: {e}') from e
    del params
    _write_tokenizer(src, staging)
    eos = int(_field(reader, 'tokenizer.ggml.eos_token_id'))
    generation = {'bos_token_id': int(_field(reader, 'tokenizer.ggml.bos_token_id')),
                  'eos_token_id': eos,
                  'pad_token_id': int(_field(reader, 'tokenizer.ggml.padding_token_id',
                                             eos))}
    with open(os.path.join(staging, GENERATION_CONFIG), 'w') as f:
      json.dump(generation, f, indent=2, sort_keys=True)
    names = sorted(os.listdir(staging), key=lambda n: n == GENERATION_CONFIG)
    for name in names:
      os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return config


def is_converted(out_dir: str | os.PathLike) -> bool:
  """Whether `out_dir` holds a finished `import_gguf` conversion."""
  return os.path.isfile(os.path.join(out_dir, GENERATION_CONFIG)) and os.path.isfile(
      os.path.join(out_dir, hf_io.SAFETENSORS_SINGLE))


def main(argv: Sequence[str] | None = None) -> int:
  """Command line: `python -m vermem_jax.models.gguf_import SRC.gguf OUT_DIR`.

  Returns 0 on success, EXIT_BAD_INPUT (2) with a message on stderr for bad input.
  """
  args = list(sys.argv[1:] if argv is None else argv)
  if len(args) != 2 or args[0].startswith('-'):
    print('usage: python -m vermem_jax.models.gguf_import SRC.gguf OUT_DIR',
          file=sys.stderr)
    return EXIT_BAD_INPUT
  try:
    config = import_gguf(args[0], args[1])
  except GGUFImportError as e:
    print(f'gguf_import: {e}', file=sys.stderr)
    return EXIT_BAD_INPUT
  print(f'wrote {args[1]}: llama, {config.num_hidden_layers} layers, hidden '
        f'{config.hidden_size}, vocab {config.vocab_size}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
