"""Glue both trainers share: policy config, tokenizer, device mesh and sharded state.

The readers of config sections `model` and `tokenizer` (experiments/configs/parts/
paper.py; `train/run_setup.py` calls them once per phase) and what works on their
typed results:

  model_config_from(config)        -> models.QwenConfig (HF folder or preset)
  model_identity(config)           -> the model's name in a resume fingerprint
  tokenizer_path(config)           -> the tokenizer folder
  load_tokenizer(path, model_config) -> tokenization.Tokenizer, checked against the model
  MeshConfig.from_section(config.model), make_mesh(mesh_config)
                                   -> ('data', 'fsdp', 'tensor') Mesh (models/sharding.py)
  init_or_load_params(model_cfg, rng, mesh, hf_checkpoint=...) -> params on the mesh
  opt_state_shardings / init_opt_state -> optimizer state sharded like the params
  abstract_like(shapes, shardings) -> ShapeDtypeStructs carrying shardings (Orbax
                                      restore templates)
  shard_batch(batch, mesh)         -> learner batch split over ('data', 'fsdp') rows
  zeros_like_params(params)        -> float32 accumulators with the params' shardings
  generate_fn_for(mesh)            -> the sampler under the mesh's sharding rules
  process_local_mesh(mesh_config)  -> a mesh over this process's devices (multi-host)
  check_resume(metadata, fingerprint, directory) -> refuses a resume with other settings
  older_identity_forms(hf_checkpoint) -> how runs stored before the digest named the model

Sharding scheme (models/sharding.py). Parameters follow the logical-axis rules (FSDP
over 'embed', tensor parallelism over heads / MLP / vocabulary). Optimizer-state leaves
mirror the parameter tree (optax AdamW's mu / nu), so each leaf whose trailing dict
path and shape equal a parameter's gets that parameter's sharding; everything else
(step counts) is replicated. Learner batches shard their leading (row) axis over
('data', 'fsdp') when the row count divides, else they are replicated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vermem_jax.models import qwen_config
from vermem_jax import tokenization
from vermem_jax.models import hf_io
from vermem_jax.models import qwen
from vermem_jax.models import sampling
from vermem_jax.models import sharding as sharding_lib
from vermem_jax.train import distributed

# Mesh axes the learner batch's row dimension is split over (data parallelism).
BATCH_AXES = ('data', 'fsdp')


# Architecture fields of `config.model` that override the preset's value when set
# (None = the preset's); HF `config.json` names (models.QwenConfig fields).
MODEL_DIM_FIELDS = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
                    'num_attention_heads', 'num_key_value_heads', 'head_dim')


def model_dims_from(config: ml_collections.ConfigDict) -> dict[str, int]:
  """The `model.<MODEL_DIM_FIELDS>` the config sets (not None), as {field: int}.

  Raises:
    ValueError: a value that is not a positive int (names the field).
  """
  out = {}
  for name in MODEL_DIM_FIELDS:
    value = config.model.get(name)
    if value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ValueError(f'config.model.{name}: must be a positive int or None (the '
                       f"preset's value), got {value!r}")
    out[name] = int(value)
  return out


def model_identity(config: ml_collections.ConfigDict) -> str:
  """The policy model in a resume fingerprint: a checkpoint's content digest
  (`hf-checkpoint sha256:...`, `hf_io.checkpoint_digest`: a copied or moved folder
  keeps it), or the preset name followed by the dimensions the config sets
  (`tiny-sp4k hidden_size=384`). Runs stored before the digest held the folder's path
  (`older_identity_forms`).

  Raises:
    ValueError: a checkpoint folder without config.json or weights, or with a malformed
      index (names `config.model.hf_checkpoint`); bad dimensions (`model_dims_from`).
  """
  if config.model.hf_checkpoint:
    try:
      return 'hf-checkpoint ' + hf_io.checkpoint_digest(config.model.hf_checkpoint)
    except (OSError, ValueError) as e:
      raise ValueError(f'config.model.hf_checkpoint: {e}') from e
  dims = model_dims_from(config)
  return ' '.join([str(config.model.preset)] + [f'{k}={v}' for k, v in dims.items()])


def older_identity_forms(hf_checkpoint: str) -> dict[str, str]:
  """`check_resume`'s `older_forms` for the model: runs stored before the content
  digest fingerprinted a checkpoint by its folder path, so a stored 'model' equal to
  this run's `hf_checkpoint` path is this model ({} for a random init)."""
  return {'model': str(hf_checkpoint)} if hf_checkpoint else {}


def model_config_from(config: ml_collections.ConfigDict) -> qwen_config.QwenConfig:
  """The policy's QwenConfig: `model.hf_checkpoint`'s config.json, else `model.preset`
  with the dimensions the config sets (`model.hidden_size=...`, `MODEL_DIM_FIELDS`),
  with `model.dtype` / `param_dtype` / `remat` / `scan_layers` and the attention kernel
  (`model.attn_implementation`, `attn_block_q`, `attn_block_kv`) applied.

  With `head_dim` unset and `hidden_size` or `num_attention_heads` set, head_dim is
  hidden_size // num_attention_heads (HF's rule), not the preset's head_dim.

  Raises:
    ValueError: unknown preset, unreadable checkpoint config, dimensions set together
      with a checkpoint (its shapes are fixed), or dimensions the model rejects (names
      the field).
  """
  numerics = dict(dtype=config.model.dtype, param_dtype=config.model.param_dtype,
                  remat=config.model.remat)
  # Configs written before these keys existed keep QwenConfig's defaults.
  for key in ('attn_implementation', 'attn_block_q', 'attn_block_kv', 'scan_layers'):
    if key in config.model:
      numerics[key] = config.model[key]
  dims = model_dims_from(config)
  if config.model.hf_checkpoint:
    if dims:
      raise ValueError(f'config.model.{next(iter(dims))}: model dimensions apply to '
                       'model.preset; a checkpoint (model.hf_checkpoint) brings its own '
                       '(add --config.model.hf_checkpoint= to start from random weights '
                       'of the preset)')
    try:
      return qwen_config.QwenConfig.from_hf(config.model.hf_checkpoint, **numerics)
    except (OSError, ValueError, KeyError) as e:
      raise ValueError(f'config.model.hf_checkpoint: {e}') from e
  if ('head_dim' not in dims and
      ('hidden_size' in dims or 'num_attention_heads' in dims)):
    dims['head_dim'] = None  # QwenConfig derives hidden_size // num_attention_heads
  try:
    return qwen_config.QwenConfig.preset(config.model.preset, **numerics, **dims)
  except KeyError as e:
    raise ValueError(f'config.model.preset: {e.args[0]}') from e
  except ValueError as e:
    field = next((k for k in dims if dims[k] is not None), 'preset')
    raise ValueError(f'config.model.{field}: {e}') from e


NO_TOKENIZER = ('config.tokenizer.path: no tokenizer folder (set it, or '
                'config.model.hf_checkpoint whose folder holds the tokenizer)')


def tokenizer_path(config: ml_collections.ConfigDict, *, required: bool = True) -> str:
  """`tokenizer.path`, else the `model.hf_checkpoint` folder (which holds one).

  Raises:
    ValueError: neither is set and `required` (else: '').
  """
  path = config.tokenizer.path or config.model.hf_checkpoint
  if not path and required:
    raise ValueError(NO_TOKENIZER)
  return str(path or '')


@functools.lru_cache(maxsize=4)
def load_tokenizer_cached(path: str) -> tokenization.Tokenizer:
  """`tokenization.load_tokenizer(path)`, cached: tokenizers are immutable once loaded
  and transformers makes loading take seconds."""
  return tokenization.load_tokenizer(path)


def load_tokenizer_for(config: ml_collections.ConfigDict,
                       model_config: qwen_config.QwenConfig | None = None
                       ) -> tokenization.Tokenizer:
  """`load_tokenizer(tokenizer_path(config), model_config)`."""
  return load_tokenizer(tokenizer_path(config), model_config)


def load_tokenizer(path: str, model_config: qwen_config.QwenConfig | None = None
                   ) -> tokenization.Tokenizer:
  """The run's tokenizer (cached per folder), checked against the policy model.

  Args:
    path: the tokenizer folder (`tokenizer_path`).
    model_config: the policy's QwenConfig; when given,
      `tokenization.check_tokenizer_model_compat` runs (an id past the embedding table
      would be silently clamped by JAX gathers).
  Raises:
    ValueError: `config.tokenizer.path: ...` for a missing/unreadable folder or a
      tokenizer whose ids do not fit the model's vocab_size.
  """
  if not path:
    raise ValueError(NO_TOKENIZER)
  try:
    tok = load_tokenizer_cached(path)
  except (OSError, ValueError) as e:
    raise ValueError(f'config.tokenizer.path: {e}') from e
  if model_config is not None:
    check_tokenizer_fits(tok, model_config, field='config.tokenizer.path')
  return tok


def check_tokenizer_fits(tok: tokenization.Tokenizer, model_config: qwen_config.QwenConfig, *,
                         field: str) -> None:
  """`tokenization.check_tokenizer_model_compat` with the config field in the error."""
  try:
    tokenization.check_tokenizer_model_compat(tok, model_config)
  except ValueError as e:
    raise ValueError(f'{field}: {e}') from e


def check_resume(metadata: Mapping[str, Any] | None, fingerprint: Mapping[str, Any],
                 directory: str, *, what: str = 'a run',
                 added_keys: Mapping[str, Any] | None = None,
                 older_forms: Mapping[str, Any] | None = None) -> None:
  """Refuses to resume a checkpoint whose stored trajectory fingerprint differs.

  Args:
    metadata: the checkpoint's free metadata (`TrainState.metadata`); its
      'fingerprint' entry is compared (absent = nothing to check).
    fingerprint: the current config's trajectory fingerprint (JSON dict).
    directory: the phase directory (named in the error).
    what: how the error names the stored run ('an SFT run', 'a run').
    added_keys: fingerprint keys added after runs were stored, with the value those
      runs had: a stored fingerprint without one reads as holding that value.
    older_forms: per key, the value an older version stored for what this run
      fingerprints now (`older_identity_forms`): a stored value equal to it reads as
      this run's value.
  Raises:
    ValueError: listing every differing key as `key: old -> new`.
  """
  old = (metadata or {}).get('fingerprint')
  if old is None:
    return
  old = {**(added_keys or {}), **old}
  for key, form in (older_forms or {}).items():
    if key in old and old[key] == form:
      old[key] = fingerprint.get(key)
  diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
  if diff:
    raise ValueError(
        f'{directory} holds {what} with different settings ('
        + ', '.join(f'{k}: {old.get(k)!r} -> {fingerprint.get(k)!r}' for k in diff)
        + '); it cannot be resumed exactly. Use a fresh --workdir or the old values.')


# ----------------------------------------------------------------------------- mesh
@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """The ('data', 'fsdp', 'tensor') mesh sizes (`model.mesh_data/mesh_fsdp/mesh_tensor`);
  data = -1 takes all devices fsdp * tensor leave."""
  data: int = -1
  fsdp: int = 1
  tensor: int = 1

  @classmethod
  def from_section(cls, model: Any) -> 'MeshConfig':
    """From config section `model`."""
    return cls(data=int(model.get('mesh_data', -1)), fsdp=int(model.get('mesh_fsdp', 1)),
               tensor=int(model.get('mesh_tensor', 1)))

  def shape(self, num_devices: int | None = None) -> tuple[int, int, int]:
    """(data, fsdp, tensor) over `num_devices` (default: all devices).

    Raises:
      ValueError: naming the field when the sizes are not positive or do not multiply
        to the device count.
    """
    n = jax.device_count() if num_devices is None else int(num_devices)
    data, fsdp, tensor = self.data, self.fsdp, self.tensor
    if fsdp < 1 or tensor < 1:
      raise ValueError(f'config.model.mesh_fsdp / mesh_tensor must be >= 1, got {fsdp}, '
                       f'{tensor}')
    if data == -1:
      if n % (fsdp * tensor):
        raise ValueError(f'config.model.mesh_fsdp * mesh_tensor = {fsdp * tensor} does not '
                         f'divide the {n} devices')
      data = n // (fsdp * tensor)
    if data < 1 or data * fsdp * tensor != n:
      raise ValueError(f'config.model.mesh_data * mesh_fsdp * mesh_tensor = {data} * '
                       f'{fsdp} * {tensor} must equal the {n} devices (mesh_data=-1 takes '
                       'the rest)')
    return data, fsdp, tensor


def make_mesh(mesh_config: MeshConfig) -> Mesh:
  """The ('data', 'fsdp', 'tensor') mesh over all devices (`MeshConfig.shape`)."""
  return sharding_lib.make_mesh(*mesh_config.shape())


def replicated(mesh: Mesh) -> NamedSharding:
  """A fully replicated sharding on `mesh`."""
  return NamedSharding(mesh, PartitionSpec())


# ----------------------------------------------------------------------------- params
# QwenConfig fields that say how the model runs, not what it is: a run's config sets
# them, a checkpoint's config.json does not. (The attention kernel was once left out,
# so the tiny SFT ran the blockwise kernel while its config and the RL phases asked
# for 'sdpa'.)
EXECUTION_FIELDS = ('dtype', 'param_dtype', 'remat', 'scan_layers', 'attn_implementation',
                    'attn_block_q', 'attn_block_kv')


def init_or_load_params(model_config: qwen_config.QwenConfig, rng: jax.Array, mesh: Mesh, *,
                        hf_checkpoint: str | None,
                        param_dtype: Any) -> tuple[qwen_config.QwenConfig, Any]:
  """(QwenConfig, params on `mesh`): the `hf_checkpoint` folder when set (each device
  reads only its slice, stored as `param_dtype`), else a random init of `model_config`
  created directly sharded.

  Returns the checkpoint's own config with every execution setting of `model_config`
  (`EXECUTION_FIELDS`: numerics, remat, the layer scan and the attention kernel) applied
  when loading, so it equals `model_config_from(config)`.
  """
  if hf_checkpoint:
    loaded_cfg, params = hf_io.load_hf_checkpoint(hf_checkpoint, dtype=param_dtype,
                                                  mesh=mesh)
    return loaded_cfg.replace(**{f: getattr(model_config, f)
                                 for f in EXECUTION_FIELDS}), params
  shardings = sharding_lib.param_shardings(model_config, mesh)
  init = jax.jit(functools.partial(qwen.init_params, model_config),
                 out_shardings=shardings)
  return model_config, init(rng)


def _dict_path(path: tuple) -> tuple[str, ...]:
  """The trailing run of dict keys of a tree path (the parameter-tree part)."""
  keys = []
  for entry in reversed(path):
    if isinstance(entry, jax.tree_util.DictKey):
      keys.append(str(entry.key))
    else:
      break
  return tuple(reversed(keys))


def opt_state_shardings(opt_state_shapes: Any, param_shapes: Any, param_shard: Any,
                        mesh: Mesh) -> Any:
  """Shardings for an optax state: a leaf at a parameter's path (and shape) gets that
  parameter's sharding, other leaves (counts, empty states) are replicated.

  Args:
    opt_state_shapes: `jax.eval_shape(tx.init, params)`.
    param_shapes: the parameter tree (arrays or ShapeDtypeStructs).
    param_shard: matching tree of NamedSharding.
    mesh: the mesh.
  """
  by_path = {}
  for (path, leaf), sh in zip(jax.tree_util.tree_flatten_with_path(param_shapes)[0],
                              jax.tree.leaves(param_shard)):
    by_path[_dict_path(path)] = (tuple(leaf.shape), sh)
  rep = replicated(mesh)

  def one(path, leaf):
    hit = by_path.get(_dict_path(path))
    if hit is not None and hit[0] == tuple(leaf.shape):
      return hit[1]
    return rep
  return jax.tree_util.tree_map_with_path(one, opt_state_shapes)


def init_opt_state(init_fn: Callable[[Any], Any], params: Any, mesh: Mesh) -> Any:
  """`init_fn(params)` as one jitted program whose outputs are sharded like the params
  (`opt_state_shardings`), so no device ever holds the whole AdamW state."""
  shapes = jax.eval_shape(init_fn, params)
  out = opt_state_shardings(shapes, params, jax.tree.map(lambda p: p.sharding, params),
                            mesh)
  return jax.jit(init_fn, out_shardings=out)(params)


def abstract_like(shapes: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of `shapes` carrying `shardings` (an Orbax restore template)."""
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)


def abstract_train_state(model_config: qwen_config.QwenConfig, init_fn: Callable[[Any], Any],
                         mesh: Mesh) -> tuple[Any, Any]:
  """(abstract params, abstract optimizer state) with their shardings; nothing is
  allocated. Restore templates for `checkpoints.PhaseCheckpointManager`."""
  p_shapes = jax.eval_shape(functools.partial(qwen.init_params, model_config),
                            jax.random.PRNGKey(0))
  p_shard = sharding_lib.param_shardings(model_config, mesh)
  o_shapes = jax.eval_shape(init_fn, p_shapes)
  o_shard = opt_state_shardings(o_shapes, p_shapes, p_shard, mesh)
  return abstract_like(p_shapes, p_shard), abstract_like(o_shapes, o_shard)


def zeros_like_params(params: Any, dtype: Any = jnp.float32) -> Any:
  """Zeros shaped and sharded like each parameter (gradient accumulators)."""
  return jax.tree.map(
      lambda p: jnp.zeros(p.shape, dtype, device=getattr(p, 'sharding', None)), params)


# ----------------------------------------------------------------------------- batches
def batch_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
  """Rows over ('data', 'fsdp') when they divide evenly, else replicated."""
  size = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
  if shape and shape[0] % size == 0:
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))
  return replicated(mesh)


def shard_batch(batch: Mapping[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
  """Places each array of a learner batch ([B, ...]) with `batch_sharding`.

  `batch` is the full host batch, the same on every process; with several processes
  each one passes only the rows its devices hold (`distributed.global_batch_array`,
  i.e. `jax.make_array_from_process_local_data`).
  """
  return {k: distributed.global_batch_array(v, batch_sharding(mesh, np.shape(v)))
          for k, v in batch.items()}


def mesh_context(mesh: Mesh | None):
  """`sharding.use_sharding(mesh)` (activation constraints bind to the mesh), or a
  no-op context without a mesh (single-device callers and tests)."""
  if mesh is None:
    return contextlib.nullcontext()
  return sharding_lib.use_sharding(mesh)


def place_batch(batch: Mapping[str, Any], mesh: Mesh | None) -> Mapping[str, Any]:
  """`shard_batch(batch, mesh)`, or `batch` unchanged without a mesh."""
  return batch if mesh is None else shard_batch(batch, mesh)


def generate_fn_for(mesh: Mesh | None) -> Callable[..., sampling.GenerationOutput]:
  """`models.sampling.generate`, run under `use_sharding(mesh)` when a mesh is given,
  so the sampler's activations follow the same rules as the learner's (batch rows over
  ('data', 'fsdp') where they divide; `rl.policy.SamplerPolicy(generate_fn=...)`)."""
  if mesh is None:
    return sampling.generate

  def generate(*args, **kwargs):
    with sharding_lib.use_sharding(mesh):
      out = sampling.generate(*args, **kwargs)
    if distributed.process_count() > 1:  # rows live on every process's devices
      out = sampling.GenerationOutput(*distributed.tree_to_host(tuple(out)))
    return out
  return generate


def process_local_mesh(mesh_config: MeshConfig) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh over this process's devices only: where a
  process runs a model on its own inputs (an 'llm' task solver in a multi-process run),
  outside the collective programs. `model.mesh_fsdp * mesh_tensor` is kept when it
  divides the local device count, else all local devices go to 'tensor'."""
  local = jax.local_devices()
  n = len(local)
  fsdp, tensor = mesh_config.fsdp, mesh_config.tensor
  if n % (fsdp * tensor):
    fsdp, tensor = 1, n
  return sharding_lib.make_mesh(n // (fsdp * tensor), fsdp, tensor, devices=local)
