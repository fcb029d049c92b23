"""Device mesh and logical-axis rules for the Qwen model.

The model annotates parameters (`qwen.PARAM_LOGICAL_AXES`) and activations
(`nn.with_logical_constraint`) with logical axis names; the rules below map them onto a
mesh with axes ('data', 'fsdp', 'tensor'):
  data    pure data parallelism (parameters replicated),
  fsdp    data parallelism with parameters sharded along their 'embed' dimension,
  tensor  Megatron-style tensor parallelism over heads, MLP width and vocabulary.

Usage:
  mesh = make_mesh(data=1, fsdp=2, tensor=4)
  params = shard_params(params, mesh)
  with use_sharding(mesh):           # activation constraints see the mesh + rules
    logits = jax.jit(Qwen(config).apply)({'params': params}, ids)

Flax assigns rules in order and never uses one mesh axis twice in one array, so the
activation ('batch', 'length', 'embed') takes ('data', 'fsdp') for batch and leaves
embed unsharded, while the parameter ('vocab', 'embed') gets ('tensor', 'fsdp').
A dimension that the assigned mesh axes do not divide (e.g. 14 heads over tensor=4) is
replicated instead of raising.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vermem_jax.models import qwen
from vermem_jax.models import qwen_config

MESH_AXES = ('data', 'fsdp', 'tensor')

# Logical axis -> mesh axis (or tuple of axes, or None = replicated).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ('batch', ('data', 'fsdp')),
    ('length', None),
    ('vocab', 'tensor'),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('mlp', 'tensor'),
    ('embed', 'fsdp'),
    ('head_dim', None),
    ('norm', None),
)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[Any] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh of shape (data, fsdp, tensor).

  Args:
    data, fsdp, tensor: axis sizes; their product must equal the number of devices.
    devices: defaults to `jax.devices()`; with several processes, ordered by process
      so each process's devices are contiguous (its batch rows are one block).
  Raises:
    ValueError: the sizes do not multiply to the device count or are not positive.
  """
  if devices is None:
    devices = jax.devices()
    if jax.process_count() > 1:
      devices = sorted(devices, key=lambda d: (d.process_index, d.id))
  devices = list(devices)
  sizes = (data, fsdp, tensor)
  if any(int(s) != s or s <= 0 for s in sizes):
    raise ValueError(f'make_mesh: axis sizes must be positive ints, got {sizes}')
  if math.prod(sizes) != len(devices):
    raise ValueError(f'make_mesh: data*fsdp*tensor = {math.prod(sizes)} but there are '
                     f'{len(devices)} devices')
  grid = np.asarray(devices, dtype=object).reshape(sizes)
  return Mesh(grid, MESH_AXES,
              axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def _fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Any) -> PartitionSpec:
  """Replicates each dimension the assigned mesh axes do not divide evenly (`mesh`: a
  Mesh or the AbstractMesh inside jit)."""
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    if axes is None:
      fitted.append(None)
      continue
    names = axes if isinstance(axes, tuple) else (axes,)
    size = math.prod(mesh.shape[a] for a in names)
    fitted.append(axes if dim % size == 0 else None)
  return PartitionSpec(*fitted)


def logical_to_sharding(logical_axes: Any, shapes: Any, mesh: Mesh,
                        rules=DEFAULT_RULES) -> Any:
  """Tree of logical-axis tuples + matching tree of shapes -> tree of NamedSharding."""
  def one(axes, leaf):
    spec = nn.logical_to_mesh_axes(axes, rules)
    return NamedSharding(mesh, _fit_spec(spec, leaf.shape, mesh))
  return jax.tree.map(one, logical_axes, shapes,
                      is_leaf=lambda x: isinstance(x, tuple))


def param_shardings(config: qwen_config.QwenConfig, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
  """NamedSharding for every parameter of `Qwen(config)`, from an abstract init.

  Nothing is allocated: shapes come from `jax.eval_shape`. Returns a tree with the
  same structure as the plain parameter tree.
  """
  abstract = jax.eval_shape(
      lambda: qwen.init_params(config, jax.random.PRNGKey(0)))
  return logical_to_sharding(qwen.param_logical_axes(abstract), abstract, mesh, rules)


def shard_params(params: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
  """Places a plain parameter tree on `mesh` according to the logical rules.

  Raises:
    KeyError: a parameter name that the model does not define.
  """
  shardings = logical_to_sharding(qwen.param_logical_axes(params), params, mesh, rules)
  return jax.tree.map(jax.device_put, params, shardings)


@contextlib.contextmanager
def use_sharding(mesh: Mesh, rules=DEFAULT_RULES):
  """Context in which the model's activation constraints bind to `mesh` and `rules`."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def constrain_params(tree: Any) -> Any:
  """Inside jit: each leaf of a parameter-shaped tree (gradients) constrained to its
  parameter's sharding under the current `use_sharding` mesh and rules; unchanged
  outside one.

  Without it XLA may return a gradient replicated (an all-reduce where FSDP needs a
  reduce-scatter): for Qwen2.5-7B under fsdp=8 the learner step's gradients were the
  whole float32 tree, 26.6 GiB, on every device (experiments/benchmarks/plan_memory.py).
  """
  mesh = jax.sharding.get_abstract_mesh()
  rules = nn.get_logical_axis_rules()
  if mesh.empty or not rules:
    return tree

  def one(x, axes):
    spec = _fit_spec(nn.logical_to_mesh_axes(axes, rules), x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, spec)
  return jax.tree.map(one, tree, qwen.param_logical_axes(tree))
