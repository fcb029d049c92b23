"""Hugging Face Qwen2/Qwen3/Llama checkpoints (safetensors) <-> our parameter trees.

Reads and writes the transformers layout (`Qwen2ForCausalLM`, `Qwen3ForCausalLM`,
`LlamaForCausalLM`, whose tensor names are the same):

    HF tensor name                                  param path                       op
    model.embed_tokens.weight            [V, D]     embed_tokens/embedding           -
    model.layers.{i}.input_layernorm.weight [D]     layers_{i}/input_layernorm/scale -
    model.layers.{i}.self_attn.q_proj.weight [N*Hd, D]  .../q_proj/kernel [D, N*Hd]  T
    model.layers.{i}.self_attn.{q,k,v}_proj.bias    .../{q,k,v}_proj/bias            -
    model.layers.{i}.self_attn.{k,v}_proj.weight    .../{k,v}_proj/kernel            T
    model.layers.{i}.self_attn.o_proj.weight [D, N*Hd]  .../o_proj/kernel [N*Hd, D]  T
    model.layers.{i}.self_attn.{q,k}_norm.weight [Hd]   .../{q,k}_norm/scale         -
    model.layers.{i}.post_attention_layernorm.weight    .../post_attention_layernorm/scale
    model.layers.{i}.mlp.{gate,up,down}_proj.weight     .../mlp/{...}/kernel         T
    model.norm.weight                    [D]        norm/scale                       -
    lm_head.weight                       [V, D]     lm_head/kernel [D, V]            T

(torch `nn.Linear` stores [out, in]; Flax `Dense` kernels are [in, out].) Biases exist
when `attention_bias`, q/k norms when `qk_norm`, `lm_head` when not
`tie_word_embeddings`. transformers' Qwen2 always has q/k/v biases, so a model without
them exports zero biases (and reloads with attention_bias=True); transformers' Qwen3
with `attention_bias` also has an `o_proj.bias`, which this model lacks: export writes
zeros, and `qwen_config.QwenConfig.from_hf` refuses such folders on load. A Llama
config (`model_type='llama'`) has no biases and is written back as Llama.
Source: transformers 5.x `modeling_qwen2.py` / `modeling_qwen3.py` /
`modeling_llama.py`.
"""

import dataclasses
import hashlib
import json
import math
import os
import re
from typing import Any, Callable, Iterator, Mapping

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import safetensors
from safetensors import safe_open
import safetensors.numpy

from vermem_jax.models import qwen_config
from vermem_jax.models import sharding as sharding_lib

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
# Floating dtypes a checkpoint may store (safetensors dtype tags).
_FLOAT_DTYPES = frozenset({"F32", "BF16", "F16"})
# Tensors older transformers versions saved but that carry no parameters.
_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")
# checkpoint_digest reads a folder's weights whole up to this many bytes, and sampled
# chunks of larger ones: hashing 15 GB at every phase start would add tens of seconds.
DIGEST_FULL_BYTES = 2 * 2**30
_DIGEST_CHUNKS = 16
_DIGEST_CHUNK_BYTES = 2**20
_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "llama": "LlamaForCausalLM"}
_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One HF tensor: its name, where it goes in the param tree and its HF shape."""
  hf_name: str
  path: tuple[str, ...]
  hf_shape: tuple[int, ...]
  transpose: bool


def _head_dim(config: qwen_config.QwenConfig) -> int:
  hd = getattr(config, "head_dim", None)
  return int(hd) if hd else config.hidden_size // config.num_attention_heads


def _entries(config: qwen_config.QwenConfig) -> list[_Entry]:
  """All HF tensors a checkpoint of `config` holds, in transformers' order."""
  d, v, inter = config.hidden_size, config.vocab_size, config.intermediate_size
  hd = _head_dim(config)
  nq, nkv = config.num_attention_heads * hd, config.num_key_value_heads * hd
  out = [_Entry("model.embed_tokens.weight", ("embed_tokens", "embedding"), (v, d),
                False)]
  for i in range(config.num_hidden_layers):
    hf, p = f"model.layers.{i}.", (f"layers_{i}",)
    att, mlp = p + ("self_attn",), p + ("mlp",)
    out.append(_Entry(hf + "input_layernorm.weight", p + ("input_layernorm", "scale"),
                      (d,), False))
    for name, width in (("q_proj", nq), ("k_proj", nkv), ("v_proj", nkv)):
      out.append(_Entry(f"{hf}self_attn.{name}.weight", att + (name, "kernel"),
                        (width, d), True))
      if config.attention_bias:
        out.append(_Entry(f"{hf}self_attn.{name}.bias", att + (name, "bias"),
                          (width,), False))
    out.append(_Entry(hf + "self_attn.o_proj.weight", att + ("o_proj", "kernel"),
                      (d, nq), True))
    if config.qk_norm:
      for name in ("q_norm", "k_norm"):
        out.append(_Entry(f"{hf}self_attn.{name}.weight", att + (name, "scale"),
                          (hd,), False))
    out.append(_Entry(hf + "post_attention_layernorm.weight",
                      p + ("post_attention_layernorm", "scale"), (d,), False))
    for name, shape in (("gate_proj", (inter, d)), ("up_proj", (inter, d)),
                        ("down_proj", (d, inter))):
      out.append(_Entry(f"{hf}mlp.{name}.weight", mlp + (name, "kernel"), shape, True))
  out.append(_Entry("model.norm.weight", ("norm", "scale"), (d,), False))
  if not config.tie_word_embeddings:
    out.append(_Entry("lm_head.weight", ("lm_head", "kernel"), (v, d), True))
  return out


def _param_shape(e: _Entry) -> tuple[int, ...]:
  return tuple(reversed(e.hf_shape)) if e.transpose else e.hf_shape


def _o_proj_bias_names(config: qwen_config.QwenConfig) -> set[str]:
  # transformers' Qwen3 gives o_proj a bias when attention_bias; Qwen2 never does.
  if not (config.attention_bias and config.qk_norm):
    return set()
  return {f"model.layers.{i}.self_attn.o_proj.bias"
          for i in range(config.num_hidden_layers)}


# ----------------------------------------------------------------------------- reading


def _checkpoint_files(path: str) -> tuple[list[str], dict[str, str] | None]:
  """Returns (safetensors files, weight_map from the index or None)."""
  index = os.path.join(path, SAFETENSORS_INDEX)
  single = os.path.join(path, SAFETENSORS_SINGLE)
  if os.path.isfile(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      if not isinstance(weight_map, dict):
        raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f"malformed safetensors index {index}: {e!r}") from e
    files = sorted(set(weight_map.values()))
    missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
    if missing:
      raise ValueError(f"safetensors index {index} lists missing shard files: {missing}")
    return [os.path.join(path, f) for f in files], weight_map
  if os.path.isfile(single):
    return [single], None
  raise FileNotFoundError(
      f"no {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX} in checkpoint folder {path!r}")


def checkpoint_digest(path: str | os.PathLike) -> str:
  """A content digest of a Hugging Face folder: 'sha256:<16 hex digits>'.

  Hashes `config.json` and every safetensors file (name, size, bytes). Weights of up
  to `DIGEST_FULL_BYTES` in all are read whole; above that each file contributes its
  size and `_DIGEST_CHUNKS` chunks of 1 MiB spread evenly over it (the first and the
  last included), so two checkpoints that differ only between those chunks get one
  digest. The folder's path takes no part: a copy or a moved folder has the same digest.

  Raises:
    FileNotFoundError: no config.json, or no safetensors weights (`_checkpoint_files`).
    ValueError: a malformed safetensors index.
  """
  path = os.fspath(path)
  files, _ = _checkpoint_files(path)
  h = hashlib.sha256()
  with open(os.path.join(path, CONFIG_FILE), "rb") as f:
    h.update(f.read())
  sizes = [os.path.getsize(f) for f in files]
  whole = sum(sizes) <= DIGEST_FULL_BYTES
  for file, size in zip(files, sizes):
    h.update(f"{os.path.basename(file)}:{size}".encode())
    with open(file, "rb") as f:
      if whole:
        for block in iter(lambda: f.read(1 << 24), b""):
          h.update(block)
        continue
      last = max(0, size - _DIGEST_CHUNK_BYTES)
      for k in range(_DIGEST_CHUNKS):
        f.seek(last * k // (_DIGEST_CHUNKS - 1))
        h.update(f.read(_DIGEST_CHUNK_BYTES))
  return "sha256:" + h.hexdigest()[:16]


def _open(file: str):
  try:
    return safe_open(file, framework="numpy")
  except (safetensors.SafetensorError, OSError) as e:
    raise ValueError(f"corrupt or truncated safetensors file {file}: {e}") from e


def _scan(files: list[str], weight_map: dict[str, str] | None
          ) -> tuple[dict[str, tuple[str, str, tuple[int, ...]]], list[str]]:
  """Reads every header: name -> (file, dtype tag, shape), plus problems found."""
  found, problems = {}, []
  for file in files:
    with _open(file) as f:
      for name in f.keys():
        sl = f.get_slice(name)
        info = (file, sl.get_dtype(), tuple(int(s) for s in sl.get_shape()))
        if name in found:
          problems.append(f"tensor {name} appears in both {found[name][0]} and {file}")
        found[name] = info
  if weight_map is not None:
    for name, shard in weight_map.items():
      if name not in found:
        problems.append(f"tensor {name} listed in the index for {shard} is not stored")
      elif os.path.basename(found[name][0]) != shard:
        problems.append(f"tensor {name} is in {os.path.basename(found[name][0])}, "
                        f"the index says {shard}")
  return found, problems


class _Reader:
  """Open safetensors handles (memory-mapped), one per file, closed by `close()`."""

  def __init__(self, files: list[str]):
    self._handles = {}
    try:
      for file in files:
        self._handles[file] = _open(file).__enter__()
    except ValueError:
      self.close()
      raise

  def close(self):
    for h in self._handles.values():
      h.__exit__(None, None, None)
    self._handles = {}

  def read(self, file: str, name: str, rows: slice | None = None) -> np.ndarray:
    """Tensor `name` from `file` (only `rows` of its first axis, if given)."""
    try:
      if rows is None:
        return self._handles[file].get_tensor(name)
      return self._handles[file].get_slice(name)[rows]
    except safetensors.SafetensorError as e:
      raise ValueError(f"cannot read tensor {name} from {file}: {e}") from e


def _tied_head_matches(reader: _Reader, head_file: str, emb_file: str, rows: int,
                       block: int = 8192) -> bool:
  # Row blocks keep the comparison's host memory small for 150k-row vocabularies.
  for start in range(0, rows, block):
    sl = slice(start, min(rows, start + block))
    if not np.array_equal(reader.read(head_file, "lm_head.weight", sl),
                          reader.read(emb_file, "model.embed_tokens.weight", sl)):
      return False
  return True


def _place(w: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
  if sharding is None:
    return jnp.asarray(w)
  # Each device receives only its slice (also valid when the mesh spans hosts).
  return jax.make_array_from_callback(w.shape, sharding, lambda idx: w[idx])


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _dtype_name(dtype: Any) -> str:
  return jnp.dtype(dtype).name


def _param_shardings(config: qwen_config.QwenConfig, mesh: jax.sharding.Mesh):
  """Parameter tree of NamedShardings from the model's logical axis annotations."""
  return sharding_lib.param_shardings(config, mesh)


def load_hf_checkpoint(path: str | os.PathLike, *, dtype: Any = None,
                       mesh: jax.sharding.Mesh | None = None
                       ) -> tuple[qwen_config.QwenConfig, dict[str, Any]]:
  """Loads a Hugging Face Qwen2/Qwen3/Llama folder into (qwen_config.QwenConfig, params).

  Reads `config.json` (`qwen_config.QwenConfig.from_hf`) and either `model.safetensors` or the
  shards named by `model.safetensors.index.json`. Tensors may be float32, bfloat16 or
  float16. Tensors are read one at a time from the memory-mapped files, transposed
  where torch and Flax layouts differ, cast and placed, so host memory peaks near one
  copy of the model. With tied embeddings a stored `lm_head.weight` is checked
  (shape, and values against the embedding) and dropped, as transformers does.

  Args:
    path: checkpoint folder.
    dtype: parameter dtype (e.g. 'bfloat16', jnp.float32). None keeps
      `config.param_dtype`. The returned config's `param_dtype` is set to it.
    mesh: optional `jax.sharding.Mesh` (axes data/fsdp/tensor); each parameter is
      placed with the sharding `vermem_jax.models.sharding.param_shardings` gives it.

  Returns:
    (config, params) with params in the tree documented in `vermem_jax.models.qwen`.

  Raises:
    FileNotFoundError: no config.json or no safetensors weights in `path`.
    ValueError: corrupt or truncated safetensors file (names the file); missing,
      unknown, mis-shaped or non-float tensors (all named in one message).
  """
  path = os.fspath(path)
  config_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"no {CONFIG_FILE} in checkpoint folder {path!r}")
  config = qwen_config.QwenConfig.from_hf(config_path)
  if dtype is not None:
    config = dataclasses.replace(config, param_dtype=_dtype_name(dtype))
  target = jnp.dtype(config.param_dtype)

  files, weight_map = _checkpoint_files(path)
  found, problems = _scan(files, weight_map)
  entries = _entries(config)
  expected = {e.hf_name: e for e in entries}
  tied_head = "lm_head.weight" if config.tie_word_embeddings else None
  v, d = config.vocab_size, config.hidden_size

  missing = [n for n in expected if n not in found]
  unknown = sorted(n for n in found if n not in expected and n != tied_head
                   and not _IGNORED.match(n))
  bad_shape, bad_dtype = [], []
  for name, (_, tag, shape) in found.items():
    if name in expected and shape != expected[name].hf_shape:
      bad_shape.append(f"{name} {list(shape)} (expected {list(expected[name].hf_shape)})")
    elif name == tied_head and shape != (v, d):
      bad_shape.append(f"{name} {list(shape)} (expected {[v, d]} like the embedding)")
    if (name in expected or name == tied_head) and tag not in _FLOAT_DTYPES:
      bad_dtype.append(f"{name} ({tag})")
  if missing:
    problems.append(f"missing tensors: {missing}")
  if unknown:
    problems.append(f"unknown tensors: {unknown}")
  if bad_shape:
    problems.append(f"wrong shapes: {bad_shape}")
  if bad_dtype:
    problems.append(f"unsupported dtypes (need float32/bfloat16/float16): {bad_dtype}")
  if problems:
    raise ValueError(f"checkpoint {path!r} does not match its config "
                     f"({config.num_hidden_layers} layers, qk_norm={config.qk_norm}, "
                     f"attention_bias={config.attention_bias}, tie_word_embeddings="
                     f"{config.tie_word_embeddings}): " + "; ".join(problems))

  shardings = _param_shardings(config, mesh) if mesh is not None else None
  params: dict[str, Any] = {}
  reader = _Reader(files)
  try:
    for e in entries:
      w = reader.read(found[e.hf_name][0], e.hf_name)
      if e.transpose:
        w = w.T
      w = np.ascontiguousarray(w, dtype=target)
      sharding = None if shardings is None else _get(shardings, e.path)
      _set(params, e.path, _place(w, sharding))
      del w
    if tied_head in found and not _tied_head_matches(
        reader, found[tied_head][0], found["model.embed_tokens.weight"][0], v):
      logging.warning("%s: lm_head.weight differs from the embedding but "
                      "tie_word_embeddings is set; using the embedding (as transformers "
                      "does).", path)
  finally:
    reader.close()
  return config, params


# ----------------------------------------------------------------------------- writing


def hf_config_dict(config: qwen_config.QwenConfig, torch_dtype: str = "float32") -> dict[str, Any]:
  """transformers `config.json` contents for `config` (`config.hf_model_type`: Qwen2,
  Qwen3 with qk_norm, or Llama).

  Writes both the transformers 4 key (`rope_theta`, `torch_dtype`) and the
  transformers 5 keys (`rope_parameters`, `dtype`) so either version loads it.
  """
  model_type = config.hf_model_type
  out = {
      "architectures": [_ARCHITECTURES[model_type]],
      "model_type": model_type,
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size,
      "num_hidden_layers": config.num_hidden_layers,
      "num_attention_heads": config.num_attention_heads,
      "num_key_value_heads": config.num_key_value_heads,
      "head_dim": _head_dim(config),
      "hidden_act": "silu",
      "max_position_embeddings": config.max_position_embeddings,
      "rms_norm_eps": config.rms_norm_eps,
      "rope_theta": config.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
      "tie_word_embeddings": config.tie_word_embeddings,
      "use_sliding_window": False,
      "sliding_window": None,
      "attention_dropout": 0.0,
      "initializer_range": 0.02,
      "use_cache": True,
      "torch_dtype": torch_dtype,
      "dtype": torch_dtype,
  }
  if model_type == "qwen3":
    out["attention_bias"] = bool(config.attention_bias)
  if model_type == "llama":
    out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    del out["use_sliding_window"], out["sliding_window"]
  return out


def _parse_size(size: int | str | None) -> int | None:
  if size is None or isinstance(size, int):
    return size
  m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)\s*", str(size).upper())
  if not m:
    raise ValueError(f"max_shard_size {size!r} is not an int or like '500MB', '2GiB'")
  return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def _check_params(config: qwen_config.QwenConfig, params: Mapping[str, Any]) -> None:
  """Raises one ValueError naming every missing, unexpected or mis-shaped param."""
  expected = {e.path: _param_shape(e) for e in _entries(config)}
  flat = {tuple(getattr(k, "key", str(k)) for k in kp): x
          for kp, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  missing = ["/".join(p) for p in expected if p not in flat]
  unknown = ["/".join(p) for p in flat if p not in expected]
  bad = [f"{'/'.join(p)} {list(np.shape(x))} (expected {list(expected[p])})"
         for p, x in flat.items() if p in expected and tuple(np.shape(x)) != expected[p]]
  problems = [f"{what}: {names}" for what, names in (
      ("missing params", missing), ("unexpected params", unknown),
      ("wrong shapes", bad)) if names]
  if problems:
    raise ValueError("params do not match the config: " + "; ".join(problems))


def _torch_tensors(config: qwen_config.QwenConfig, params: Mapping[str, Any], dtype: np.dtype
                   ) -> Iterator[tuple[str, Callable[[], np.ndarray], int]]:
  """(HF name, thunk giving the host array, nbytes) in transformers' order."""
  o_bias = _o_proj_bias_names(config)
  # transformers' Qwen2 always has q/k/v bias; its Llama has none.
  zero_bias = not config.attention_bias and config.hf_model_type == "qwen2"
  hd = _head_dim(config)
  widths = {"q_proj": config.num_attention_heads * hd,
            "k_proj": config.num_key_value_heads * hd,
            "v_proj": config.num_key_value_heads * hd}
  for e in _entries(config):
    def thunk(e=e):
      x = np.asarray(jax.device_get(_get(params, e.path)))
      return np.ascontiguousarray(x.T if e.transpose else x, dtype=dtype)
    yield e.hf_name, thunk, math.prod(e.hf_shape) * dtype.itemsize
    module, leaf = e.path[-2], e.path[-1]
    if zero_bias and leaf == "kernel" and module in widths:
      n = widths[module]
      yield (f"{e.hf_name[:-len('weight')]}bias",
             lambda n=n: np.zeros((n,), dtype), n * dtype.itemsize)
    bias_name = f"{e.hf_name[:-len('weight')]}bias"
    if module == "o_proj" and bias_name in o_bias:
      d = config.hidden_size
      yield bias_name, lambda d=d: np.zeros((d,), dtype), d * dtype.itemsize


def save_hf_checkpoint(config: qwen_config.QwenConfig, params: Mapping[str, Any],
                       path: str | os.PathLike, *,
                       max_shard_size: int | str | None = None,
                       dtype: Any = None) -> None:
  """Writes a folder that `transformers.AutoModelForCausalLM.from_pretrained` loads.

  Files: `config.json` (`hf_config_dict`), and `model.safetensors` or, when the
  tensors exceed `max_shard_size`, `model-0000k-of-0000n.safetensors` shards plus
  `model.safetensors.index.json` (transformers' naming). Tensors are gathered to the
  host shard by shard, so host memory peaks near one shard (the whole model when
  unsharded). Single-process only (params must be fully addressable).

  Args:
    config: the model config.
    params: parameter tree of `Qwen(config)` (see `vermem_jax.models.qwen`).
    path: output folder (created; existing files of the same names are replaced).
    max_shard_size: bytes per shard (int, or a string such as '500MB', '2GiB'); None
      writes one file.
    dtype: storage dtype (float32/bfloat16/float16); None uses the params' dtype.

  Raises:
    ValueError: params with missing, unexpected or mis-shaped entries (all named);
      bad max_shard_size or dtype.
  """
  path = os.fspath(path)
  limit = _parse_size(max_shard_size)
  if dtype is None:
    dtype = jax.tree_util.tree_leaves(params)[0].dtype
  dtype = np.dtype(jnp.dtype(dtype))
  if dtype.name not in ("float32", "bfloat16", "float16"):
    raise ValueError(f"storage dtype must be float32, bfloat16 or float16, got {dtype}")
  _check_params(config, params)
  tensors = list(_torch_tensors(config, params, dtype))

  shards: list[list[tuple[str, Callable[[], np.ndarray], int]]] = [[]]
  size = 0
  for t in tensors:
    if limit is not None and shards[-1] and size + t[2] > limit:
      shards.append([])
      size = 0
    shards[-1].append(t)
    size += t[2]

  os.makedirs(path, exist_ok=True)
  for stale in (SAFETENSORS_SINGLE, SAFETENSORS_INDEX):
    if os.path.exists(os.path.join(path, stale)):
      os.remove(os.path.join(path, stale))
  n = len(shards)
  weight_map = {}
  for k, shard in enumerate(shards):
    name = SAFETENSORS_SINGLE if n == 1 else f"model-{k + 1:05d}-of-{n:05d}.safetensors"
    arrays = {hf_name: thunk() for hf_name, thunk, _ in shard}
    safetensors.numpy.save_file(arrays, os.path.join(path, name),
                                metadata={"format": "pt"})
    del arrays
    weight_map.update({hf_name: name for hf_name, _, _ in shard})
  if n > 1:
    with open(os.path.join(path, SAFETENSORS_INDEX), "w") as f:
      json.dump({"metadata": {"total_size": sum(t[2] for t in tensors)},
                 "weight_map": weight_map}, f, indent=2, sort_keys=True)
  to_hf = getattr(config, "to_hf_dict", None)
  hf_dict = hf_config_dict(config, dtype.name)
  if callable(to_hf):
    hf_dict = {**hf_dict, **to_hf(), "torch_dtype": dtype.name, "dtype": dtype.name}
  with open(os.path.join(path, CONFIG_FILE), "w") as f:
    json.dump(hf_dict, f, indent=2, sort_keys=True)


__all__ = ["load_hf_checkpoint", "save_hf_checkpoint", "hf_config_dict"]
