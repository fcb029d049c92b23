"""Tests for vermem_jax.models.attention: every kernel against the eager reference.

Parity is float32 <= 1e-5 at real (non-padding) queries, for outputs and gradients,
with left padding, per-row positions, GQA, a KV cache (prefill + decode) and blocks
that do not divide the lengths. The Pallas TPU kernel runs in Pallas' TPU interpret
mode on CPU. The memory test compiles (never runs) the forward at two lengths.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from vermem_jax.models import attention
from vermem_jax.models import kv_cache
from vermem_jax.models import qwen
from vermem_jax.models.attention import AttentionMask
from vermem_jax.models import qwen_config

SMALL = qwen_config.QwenConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, rope_theta=10_000.0,
                        max_position_embeddings=512)
# Blocks far smaller than the test lengths, one not dividing them.
KERNELS = [('sdpa', 512, 512), ('blockwise', 8, 8), ('blockwise', 7, 5)]


def _rand(shape, seed):
  return jnp.asarray(np.random.RandomState(seed).randn(*shape), jnp.float32)


def _kernel(name, bq, bk):
  if name == 'sdpa':
    return attention.sdpa_attention
  return functools.partial(attention.blockwise_attention, block_q=bq, block_kv=bk)


def _masks(b, t, s, cached):
  """Left padding (no cache) or a cache with holes and a slot offset."""
  rs = np.random.RandomState(1)
  if not cached:
    valid = np.ones((b, s), bool)
    for row in range(b):
      valid[row, :rs.randint(0, t // 2)] = False
    return AttentionMask(jnp.asarray(valid), jnp.arange(t, dtype=jnp.int32))
  valid = rs.rand(b, s) > 0.3
  offset = s - t - 3  # the T new queries sit at slots [offset, offset + T)
  return AttentionMask(jnp.asarray(valid), offset + jnp.arange(t, dtype=jnp.int32))


def _kernel_case(cached):
  b, t, kvh, g, hd = 3, 29, 2, 3, 8
  s = t if not cached else t + 11
  q, k, v = _rand((b, t, kvh, g, hd), 0), _rand((b, s, kvh, hd), 1), _rand(
      (b, s, kvh, hd), 2)
  mask = _masks(b, t, s, cached)
  # Real queries: those that see at least one valid key.
  real = np.asarray(jnp.any(mask.dense(), axis=-1))[:, :, None, None, None]
  weights = _rand((b, t, kvh, g, hd), 3) * real
  return (q, k, v), mask, real, weights, hd ** -0.5


def _values_and_grads(fn, args, mask, weights, scale):
  loss = lambda q, k, v: jnp.sum(fn(q, k, v, mask, scale) * weights)
  run = jax.jit(lambda q, k, v: (fn(q, k, v, mask, scale),
                                 jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))
  return run(*args)


@functools.lru_cache(maxsize=None)
def _eager_kernel_reference(cached):
  args, mask, _, weights, scale = _kernel_case(cached)
  return _values_and_grads(attention.eager_attention, args, mask, weights, scale)


@pytest.mark.parametrize('name,bq,bk', KERNELS)
@pytest.mark.parametrize('cached', [False, True])
def test_kernel_matches_eager_values_and_grads(name, bq, bk, cached):
  args, mask, real, weights, scale = _kernel_case(cached)
  ref_out, ref_grads = _eager_kernel_reference(cached)
  out, grads = _values_and_grads(_kernel(name, bq, bk), args, mask, weights, scale)
  np.testing.assert_allclose(np.where(real, out, 0), np.where(real, ref_out, 0),
                             atol=1e-5, rtol=0)
  for got, want in zip(grads, ref_grads):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def _model_params(config, seed=0):
  shapes = jax.eval_shape(lambda: qwen.init_params(config, jax.random.PRNGKey(0)))
  rs = np.random.RandomState(seed)
  return jax.tree.map(lambda s: jnp.asarray(
      1.0 + 0.1 * rs.randn(*s.shape) if len(s.shape) == 1
      else 0.08 * rs.randn(*s.shape), jnp.float32), shapes)


@functools.lru_cache(maxsize=None)
def _model_case(qk_norm):
  cfg = SMALL.replace(qk_norm=qk_norm, attention_bias=not qk_norm)
  b, t = 3, 37
  rs = np.random.RandomState(0)
  ids = jnp.asarray(rs.randint(0, 256, (b, t)), jnp.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, :9] = 0
  mask[2, :20] = 0
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0) * 2 + 5  # per row, not 0..T-1
  return cfg, _model_params(cfg), ids, mask, jnp.asarray(positions, jnp.int32)


@functools.lru_cache(maxsize=None)
def _run_model(config, qk_norm):
  """(logits [B, T, V], grads, prefill + 3 decode steps' logits [B, 4, V])."""
  _, params, ids, mask_np, positions = _model_case(qk_norm)
  mask = jnp.asarray(mask_np)
  b, t = ids.shape
  model = qwen.Qwen(config)

  def full(p):
    return model.apply({'params': p}, ids, positions=positions, attention_mask=mask)

  def loss(p):
    return jnp.sum(jnp.where(mask[..., None] > 0, full(p), 0.0) ** 2) * 1e-3

  def decode(p):
    cache = kv_cache.init_cache(config, b, t + 3)
    logits, cache = model.apply({'params': p}, ids, attention_mask=mask, cache=cache)
    steps = [logits[:, -1]]
    for _ in range(3):
      tok = jnp.argmax(steps[-1], -1)[:, None]
      logits, cache = model.apply({'params': p}, tok, cache=cache,
                                  attention_mask=jnp.ones((b, 1), jnp.int32))
      steps.append(logits[:, 0])
    return jnp.stack(steps, 1)

  run = jax.jit(lambda p: (full(p), jax.grad(loss)(p), decode(p)))
  return run(params)


@pytest.mark.parametrize('name,bq,bk,qk_norm', [
    ('sdpa', 512, 512, False), ('blockwise', 8, 8, False), ('blockwise', 7, 5, True)])
def test_model_matches_eager_padding_positions_cache(name, bq, bk, qk_norm):
  cfg, _, _, mask_np, _ = _model_case(qk_norm)
  ref = _run_model(cfg.replace(attn_implementation='eager'), qk_norm)
  got = _run_model(cfg.replace(attn_implementation=name, attn_block_q=bq,
                               attn_block_kv=bk), qk_norm)
  real = mask_np[..., None] > 0
  np.testing.assert_allclose(np.where(real, got[0], 0), np.where(real, ref[0], 0),
                             atol=1e-5, rtol=0)
  for a, r in zip(jax.tree.leaves(got[1]), jax.tree.leaves(ref[1])):
    np.testing.assert_allclose(a, r, atol=1e-5, rtol=0)
  np.testing.assert_allclose(got[2], ref[2], atol=1e-5, rtol=0)


def test_pallas_tpu_kernel_in_interpret_mode_matches_eager():
  # The TPU kernel itself, simulated on CPU (slow: one small case, forward + grads).
  b, t, kvh, g, hd = 2, 100, 1, 2, 8  # one 128 block, padded
  q, k, v = _rand((b, t, kvh, g, hd), 0), _rand((b, t, kvh, hd), 1), _rand(
      (b, t, kvh, hd), 2)
  mask = _masks(b, t, t, cached=False)
  real = np.asarray(mask.key_valid)[:, :, None, None, None]
  weights = _rand((b, t, kvh, g, hd), 3) * real
  scale = hd ** -0.5

  def loss(fn, q, k, v):
    return jnp.sum(fn(q, k, v, mask, scale) * weights)

  with pltpu.force_tpu_interpret_mode():
    pallas = functools.partial(attention.pallas_attention, block=128)
    out = pallas(q, k, v, mask, scale)
    grads = jax.grad(functools.partial(loss, pallas), argnums=(0, 1, 2))(q, k, v)
  ref_out = attention.eager_attention(q, k, v, mask, scale)
  ref_grads = jax.grad(functools.partial(loss, attention.eager_attention),
                       argnums=(0, 1, 2))(q, k, v)
  np.testing.assert_allclose(np.where(real, out, 0), np.where(real, ref_out, 0),
                             atol=1e-5, rtol=0)
  for got, want in zip(grads, ref_grads):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def _forward_temp_bytes(config, t):
  params = jax.eval_shape(lambda: qwen.init_params(config, jax.random.PRNGKey(0)))
  ids = jax.ShapeDtypeStruct((1, t), jnp.int32)
  fn = lambda p, x: qwen.Qwen(config).apply({'params': p}, x, return_hidden=True)
  return jax.jit(fn).lower(params, ids).compile().memory_analysis().temp_size_in_bytes


def test_blockwise_forward_memory_grows_linearly_eager_quadratically():
  cfg = SMALL.replace(num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=8,
                      attn_block_q=128, attn_block_kv=128)
  ratio = {}
  for impl in ('eager', 'blockwise'):
    c = cfg.replace(attn_implementation=impl)
    ratio[impl] = _forward_temp_bytes(c, 2048) / _forward_temp_bytes(c, 1024)
  assert ratio['eager'] > 3.5, ratio
  assert ratio['blockwise'] < 2.6, ratio


def test_resolve_implementation_per_backend():
  auto = SMALL.replace(attn_implementation='auto')
  resolve = attention.resolve_implementation
  assert resolve(auto, False, 'cpu') == 'blockwise'
  assert resolve(auto, False, 'tpu') == 'pallas'
  assert resolve(auto, True, 'tpu') == 'blockwise'  # no cache support in the kernel
  assert resolve(auto, False, 'gpu') == 'blockwise'  # float32: cuDNN needs bf16/f16
  assert resolve(auto.replace(dtype='bfloat16'), False, 'gpu') == 'sdpa'
  assert resolve(auto.replace(dtype='bfloat16'), True, 'gpu', queries=1) == 'blockwise'
  assert resolve(SMALL.replace(attn_implementation='eager'), True, 'tpu') == 'eager'
  with pytest.raises(ValueError, match='attn_implementation'):
    SMALL.replace(attn_implementation='flash_attention_2')
  with pytest.raises(ValueError, match='attn_block_q'):
    SMALL.replace(attn_block_q=0)


_PALLAS_MESH_SCRIPT = '''
import json
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P
from vermem_jax.models import qwen, sharding
cfg = qwen.QwenConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=512)
params = qwen.init_params(cfg, jax.random.PRNGKey(0))
rs = np.random.RandomState(0)
ids = jnp.asarray(rs.randint(0, 256, (2, 100)), jnp.int32)
mask = jnp.ones((2, 100), jnp.int32).at[1, :30].set(0)
def loss_of(c):
  def loss(p, x, m):
    logits = qwen.Qwen(c).apply({'params': p}, x, attention_mask=m)
    return jnp.sum(jnp.where(m[..., None] > 0, logits, 0.0) ** 2) * 1e-3
  return jax.jit(jax.value_and_grad(loss))
ref_loss, ref_grad = loss_of(cfg.replace(attn_implementation='eager'))(params, ids, mask)
mesh = sharding.make_mesh(1, 2, 4)
rows = NamedSharding(mesh, P(('data', 'fsdp')))
with pltpu.force_tpu_interpret_mode(), sharding.use_sharding(mesh):
  loss, grad = loss_of(cfg.replace(attn_implementation='pallas', attn_block_q=128))(
      sharding.shard_params(params, mesh), jax.device_put(ids, rows),
      jax.device_put(mask, rows))
diff = max([abs(float(loss) - float(ref_loss))] + [
    float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad))])
print('RESULT', json.dumps({'diff': diff}))
'''


def test_pallas_kernel_under_a_mesh_matches_eager():
  # shard_map over the batch (fsdp=2) and heads (tensor=4), TPU interpret mode.
  import multidevice  # pylint: disable=g-import-not-at-top
  assert multidevice.run_on_8_devices(_PALLAS_MESH_SCRIPT)['diff'] <= 1e-5
