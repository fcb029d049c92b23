"""Tests for vermem_jax.models.qwen: config parsing, presets, padding, KV cache, params.

Parity with transformers on saved checkpoints is tested in test_hf_io.py; the one
independent torch check here copies a random in-memory HF model's state_dict.
"""
import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vermem_jax.models import kv_cache
from vermem_jax.models import qwen
from vermem_jax.models.qwen_config import QwenConfig
from vermem_jax.models import qwen_config

# Small vocabulary keeps [B, T, V] logits cheap; the `tiny` preset itself is checked
# separately.
SMALL = QwenConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, rope_theta=10_000.0, max_position_embeddings=512)


def _params(config, seed=0):
  """Random parameters in the model's tree layout, filled with NumPy (fast on CPU).

  Norm scales and biases are random too (not 1 / 0) so that they are exercised.
  """
  shapes = jax.eval_shape(lambda: qwen.init_params(config, jax.random.PRNGKey(0)))
  rs = np.random.RandomState(seed)
  fill = lambda s: (1.0 + 0.1 * rs.randn(*s.shape) if len(s.shape) == 1
                    else 0.08 * rs.randn(*s.shape))
  return jax.tree.map(lambda s: jnp.asarray(fill(s), jnp.float32), shapes)


@functools.partial(jax.jit, static_argnames=('config', 'return_hidden'))
def _forward(config, params, ids, attention_mask=None, positions=None,
             return_hidden=False):
  return qwen.Qwen(config).apply({'params': params}, ids, positions=positions,
                                 attention_mask=attention_mask,
                                 return_hidden=return_hidden)


def _ids(shape, vocab, seed=0):
  return jnp.asarray(np.random.RandomState(seed).randint(0, vocab, shape), jnp.int32)


# ----------------------------------------------------------------------- config


def test_from_hf_transformers4_layout_qwen2():
  raw = {'model_type': 'qwen2', 'vocab_size': 1000, 'hidden_size': 96,
         'intermediate_size': 200, 'num_hidden_layers': 3, 'num_attention_heads': 6,
         'num_key_value_heads': 2, 'rope_theta': 10000.0, 'rope_scaling': None,
         'rms_norm_eps': 1e-5, 'tie_word_embeddings': False,
         'max_position_embeddings': 4096, 'use_sliding_window': False}
  cfg = QwenConfig.from_hf(raw)
  assert cfg.head_dim == 16  # hidden / heads
  assert cfg.rope_theta == 10000.0 and cfg.rms_norm_eps == 1e-5
  assert cfg.attention_bias and not cfg.qk_norm
  assert not cfg.tie_word_embeddings and cfg.max_position_embeddings == 4096
  assert cfg.num_key_value_heads == 2 and cfg.num_hidden_layers == 3


def test_from_hf_transformers5_layout_qwen3_explicit_head_dim(tmp_path):
  raw = {'model_type': 'qwen3', 'vocab_size': 1000, 'hidden_size': 64,
         'intermediate_size': 200, 'num_hidden_layers': 2, 'num_attention_heads': 4,
         'num_key_value_heads': 2, 'head_dim': 32,
         'rope_parameters': {'rope_theta': 5000000.0, 'rope_type': 'default'},
         'tie_word_embeddings': True}
  (tmp_path / 'config.json').write_text(json.dumps(raw))
  for source in (raw, tmp_path, str(tmp_path / 'config.json')):
    cfg = QwenConfig.from_hf(source, dtype='bfloat16', remat=True)
    assert cfg.head_dim == 32  # explicit head_dim wins over 64 / 4 = 16
    assert cfg.rope_theta == 5e6
    assert cfg.qk_norm and not cfg.attention_bias
    assert cfg.dtype == 'bfloat16' and cfg.remat


def test_from_hf_transformers_written_dicts():
  transformers = pytest.importorskip('transformers')
  d = transformers.Qwen3Config(
      vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
      rope_theta=5e6).to_dict()
  cfg = QwenConfig.from_hf(d)
  assert (cfg.rope_theta, cfg.head_dim, cfg.qk_norm) == (5e6, 16, True)
  d = transformers.Qwen2Config(
      vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, rope_theta=1e4).to_dict()
  cfg = QwenConfig.from_hf(d)
  assert (cfg.rope_theta, cfg.head_dim, cfg.attention_bias) == (1e4, 12, True)


def test_from_hf_shared_config_files(data_dir):
  cfg25 = QwenConfig.from_hf(os.path.join(data_dir, 'tokenizers', 'qwen2.5'))
  cfg3 = QwenConfig.from_hf(os.path.join(data_dir, 'tokenizers', 'qwen3',
                                         'config.json'))
  arch = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
          'num_attention_heads', 'num_key_value_heads', 'head_dim', 'rope_theta',
          'rms_norm_eps', 'tie_word_embeddings', 'max_position_embeddings',
          'attention_bias', 'qk_norm')
  p25 = QwenConfig.preset('qwen2.5-0.5b-instruct')
  p3 = QwenConfig.preset('qwen3-1.7b')
  for name in arch:
    assert getattr(cfg25, name) == getattr(p25, name), name
    assert getattr(cfg3, name) == getattr(p3, name), name
  assert cfg25.head_dim == 64 and cfg3.head_dim == 128


_LLAMA = {'model_type': 'llama', 'vocab_size': 10, 'hidden_size': 8,
          'intermediate_size': 8, 'num_hidden_layers': 1, 'num_attention_heads': 2,
          'rope_theta': 1e5}


@pytest.mark.parametrize('raw, match', [
    ({'model_type': 'mistral'}, "not one of \\('qwen2', 'qwen3', 'llama'\\)"),
    ({**_LLAMA, 'attention_bias': True}, 'attention_bias=True is not supported'),
    ({**_LLAMA, 'mlp_bias': True}, 'mlp_bias=True is not supported'),
    ({**_LLAMA, 'pretraining_tp': 2}, 'pretraining_tp=2'),
    ({**_LLAMA, 'rope_scaling': {'rope_type': 'llama3', 'factor': 8.0}}, 'llama3'),
    ({'model_type': 'qwen2', 'vocab_size': 10}, 'missing required'),
    ({'model_type': 'qwen2', 'vocab_size': 10, 'hidden_size': 8,
      'intermediate_size': 8, 'num_hidden_layers': 1, 'num_attention_heads': 2,
      'rope_theta': 1e4, 'rope_scaling': {'rope_type': 'yarn', 'factor': 4.0}},
     'yarn'),
    ({'model_type': 'qwen3', 'vocab_size': 10, 'hidden_size': 8,
      'intermediate_size': 8, 'num_hidden_layers': 1, 'num_attention_heads': 2,
      'rope_theta': 1e4, 'attention_bias': True}, 'o_proj bias'),
    ({'model_type': 'qwen2', 'vocab_size': 10, 'hidden_size': 8,
      'intermediate_size': 8, 'num_hidden_layers': 1, 'num_attention_heads': 3,
      'rope_theta': 1e4}, 'not divisible'),
])
def test_from_hf_rejects_bad_configs(raw, match):
  with pytest.raises(ValueError, match=match):
    QwenConfig.from_hf(raw)


def test_config_validation_and_missing_file(tmp_path):
  with pytest.raises(ValueError, match='num_key_value_heads'):
    QwenConfig(num_attention_heads=4, num_key_value_heads=3)
  with pytest.raises(ValueError, match='dtype'):
    QwenConfig(dtype='float8')
  with pytest.raises(FileNotFoundError):
    QwenConfig.from_hf(tmp_path)
  with pytest.raises(KeyError, match='known'):
    QwenConfig.preset('qwen9-1b')


def test_presets_published_values():
  expected = {  # (D, I, L, N, Kv, Hd, V, tied, theta, max_pos)
      'qwen2.5-0.5b-instruct': (896, 4864, 24, 14, 2, 64, 151936, True, 1e6, 32768),
      'qwen2.5-1.5b-instruct': (1536, 8960, 28, 12, 2, 128, 151936, True, 1e6, 32768),
      'qwen2.5-3b-instruct': (2048, 11008, 36, 16, 2, 128, 151936, True, 1e6, 32768),
      'qwen2.5-7b-instruct': (3584, 18944, 28, 28, 4, 128, 152064, False, 1e6, 32768),
      'qwen3-0.6b': (1024, 3072, 28, 16, 8, 128, 151936, True, 1e6, 40960),
      'qwen3-1.7b': (2048, 6144, 28, 16, 8, 128, 151936, True, 1e6, 40960),
      'qwen3-4b': (2560, 9728, 36, 32, 8, 128, 151936, True, 1e6, 40960),
      'qwen3-8b': (4096, 12288, 36, 32, 8, 128, 151936, False, 1e6, 40960),
      'qwen3-4b-instruct-2507': (2560, 9728, 36, 32, 8, 128, 151936, True, 5e6,
                                 262144),
  }
  # SmolLM2-135M-Instruct's config.json (a Llama model; the small scale's policy).
  smol = QwenConfig.preset('smollm2-135m-instruct')
  assert (smol.hidden_size, smol.intermediate_size, smol.num_hidden_layers,
          smol.num_attention_heads, smol.num_key_value_heads, smol.head_dim,
          smol.vocab_size, smol.tie_word_embeddings, smol.rope_theta,
          smol.rms_norm_eps, smol.max_position_embeddings) == (
              576, 1536, 30, 9, 3, 64, 49152, True, 1e5, 1e-5, 8192)
  assert (smol.model_type, smol.attention_bias, smol.qk_norm) == ('llama', False, False)
  assert set(qwen_config.PRESETS) == set(expected) | {'tiny', 'tiny-sp4k',
                                                      'smollm2-135m-instruct'}
  for name, values in expected.items():
    c = QwenConfig.preset(name)
    got = (c.hidden_size, c.intermediate_size, c.num_hidden_layers,
           c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size,
           c.tie_word_embeddings, c.rope_theta, c.max_position_embeddings)
    assert got == values, name
    assert (c.dtype, c.param_dtype) == ('bfloat16', 'float32'), name
    assert (c.attention_bias, c.qk_norm) == (
        (True, False) if name.startswith('qwen2.5') else (False, True)), name
  tiny = QwenConfig.preset('tiny')
  assert tiny.vocab_size == 151936 and tiny.num_hidden_layers == 2
  assert QwenConfig.preset('Qwen3-0.6B', dtype='float32').dtype == 'float32'


# ----------------------------------------------------------------------- params


def _shapes(tree):
  return jax.tree.map(lambda x: tuple(x.shape), tree)


@pytest.mark.parametrize('bias, qk_norm, tied', [(True, False, True),
                                                 (False, True, False)])
def test_param_tree_contract(bias, qk_norm, tied):
  cfg = QwenConfig(vocab_size=100, hidden_size=24, intermediate_size=40,
                   num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                   head_dim=10, attention_bias=bias, qk_norm=qk_norm,
                   tie_word_embeddings=tied)
  shapes = _shapes(jax.eval_shape(lambda: qwen.init_params(cfg, jax.random.PRNGKey(0))))
  attn = {'q_proj': {'kernel': (24, 30)}, 'k_proj': {'kernel': (24, 10)},
          'v_proj': {'kernel': (24, 10)}, 'o_proj': {'kernel': (30, 24)}}
  if bias:
    attn['q_proj']['bias'] = (30,)
    attn['k_proj']['bias'] = (10,)
    attn['v_proj']['bias'] = (10,)
  if qk_norm:
    attn['q_norm'] = {'scale': (10,)}
    attn['k_norm'] = {'scale': (10,)}
  layer = {'input_layernorm': {'scale': (24,)}, 'self_attn': attn,
           'post_attention_layernorm': {'scale': (24,)},
           'mlp': {'gate_proj': {'kernel': (24, 40)}, 'up_proj': {'kernel': (24, 40)},
                   'down_proj': {'kernel': (40, 24)}}}
  expected = {'embed_tokens': {'embedding': (100, 24)}, 'layers_0': layer,
              'layers_1': layer, 'norm': {'scale': (24,)}}
  if not tied:
    expected['lm_head'] = {'kernel': (24, 100)}
  assert shapes == expected


def test_param_logical_axes_match_module_annotations():
  cfg = SMALL.replace(qk_norm=True, tie_word_embeddings=False)
  boxed = jax.eval_shape(
      lambda: qwen.Qwen(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32)))
  specs = nn.get_partition_spec(boxed)['params']
  axes = qwen.param_logical_axes(nn.meta.unbox(boxed['params']))
  flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
  assert [tuple(s) for s in flat_specs] == flat_axes
  assert axes['lm_head']['kernel'] == ('embed', 'vocab')
  with pytest.raises(KeyError, match='bogus'):
    qwen.param_logical_axes({'bogus': {'kernel': jnp.zeros((2, 2))}})


# ----------------------------------------------------------------------- forward


@pytest.mark.parametrize('tied', [True, False])
def test_hidden_then_lm_head_equals_logits(tied):
  cfg = SMALL.replace(tie_word_embeddings=tied)
  params = _params(cfg)
  ids = _ids((2, 6), cfg.vocab_size)
  logits = _forward(cfg, params, ids)
  hidden = _forward(cfg, params, ids, return_hidden=True)
  assert logits.dtype == jnp.float32 and logits.shape == (2, 6, cfg.vocab_size)
  assert hidden.shape == (2, 6, cfg.hidden_size)
  np.testing.assert_allclose(qwen.lm_head_logits(cfg, params, hidden), logits,
                             atol=1e-6)
  # Gathered positions only (what a loss does).
  np.testing.assert_allclose(qwen.lm_head_logits(cfg, {'params': params}, hidden[:, 2]),
                             logits[:, 2], atol=1e-6)


def test_tiny_preset_forward_shapes():
  cfg = QwenConfig.preset('tiny')
  params = qwen.init_params(cfg, jax.random.PRNGKey(0))
  logits = _forward(cfg, params, _ids((1, 3), 151936))
  assert logits.shape == (1, 3, 151936) and bool(jnp.all(jnp.isfinite(logits)))


@pytest.mark.parametrize('cfg', [SMALL, SMALL.replace(qk_norm=True,
                                                      attention_bias=False)],
                         ids=['qwen2', 'qwen3'])
def test_left_padding_matches_unpadded(cfg):
  params = _params(cfg)
  short = _ids((5,), cfg.vocab_size, seed=1)
  long = _ids((9,), cfg.vocab_size, seed=2)
  pad = 4
  fill = jnp.full((pad,), 7, jnp.int32)
  batch = jnp.stack([jnp.concatenate([fill, short]), long])
  mask = jnp.ones((2, 9), jnp.int32).at[0, :pad].set(0)
  out = _forward(cfg, params, batch, mask)
  # Reference: each row unpadded (the short one followed by tokens it cannot see).
  ref = _forward(cfg, params, jnp.stack([jnp.concatenate([short, fill]), long]),
                 jnp.ones((2, 9), jnp.int32))
  np.testing.assert_allclose(out[0, pad:], ref[0, :5], atol=1e-5)
  np.testing.assert_allclose(out[1], ref[1], atol=1e-5)
  assert bool(jnp.all(jnp.isfinite(out)))  # padding queries stay finite
  # The padded row differs from treating padding as real tokens.
  wrong = _forward(cfg, params, batch, jnp.ones((2, 9), jnp.int32))
  assert float(jnp.max(jnp.abs(wrong[0, pad:] - ref[0, :5]))) > 1e-3


def test_explicit_positions_equal_default():
  params = _params(SMALL)
  ids = _ids((2, 6), SMALL.vocab_size)
  mask = jnp.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], jnp.int32)
  pos = jnp.array([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]], jnp.int32)
  a = _forward(SMALL, params, ids, mask)
  b = _forward(SMALL, params, ids, mask, pos)
  np.testing.assert_allclose(a, b, atol=0)
  # RoPE is relative: a uniform shift changes nothing, stretching does.
  shifted = _forward(SMALL, params, ids, mask, pos + 3)
  np.testing.assert_allclose(shifted[:, 2:], a[:, 2:], atol=1e-5)
  stretched = _forward(SMALL, params, ids, mask, 2 * pos)
  assert float(jnp.max(jnp.abs(stretched[:, 3:] - a[:, 3:]))) > 1e-3


@pytest.mark.parametrize('cfg', [SMALL, SMALL.replace(qk_norm=True,
                                                      attention_bias=False,
                                                      tie_word_embeddings=False)],
                         ids=['qwen2', 'qwen3'])
def test_cached_incremental_forward_matches_full(cfg):
  params = _params(cfg)
  model = qwen.Qwen(cfg)
  ids = _ids((2, 10), cfg.vocab_size, seed=3)
  mask = jnp.ones((2, 10), jnp.int32).at[0, :3].set(0)  # row 0 left-padded
  full = _forward(cfg, params, ids, mask)
  cache = kv_cache.init_cache(cfg, 2, 16)
  step = jax.jit(lambda p, c, x, m: model.apply({'params': p}, x, attention_mask=m,
                                                cache=c))
  out, cache = step(params, cache, ids[:, :6], mask[:, :6])  # prefill
  outs = [out]
  for t in range(6, 10):  # then one token at a time
    out, cache = step(params, cache, ids[:, t:t + 1], mask[:, t:t + 1])
    outs.append(out)
  inc = jnp.concatenate(outs, axis=1)
  np.testing.assert_allclose(inc[0, 3:], full[0, 3:], atol=1e-5)
  np.testing.assert_allclose(inc[1], full[1], atol=1e-5)
  assert int(cache['index']) == 10
  np.testing.assert_array_equal(cache['valid'][:, :10], mask.astype(bool))
  assert not bool(jnp.any(cache['valid'][:, 10:]))
  assert cache['layers_0']['k'].shape == (2, 16, cfg.num_key_value_heads, cfg.head_dim)


def test_bfloat16_compute_close_to_float32():
  cfg32 = SMALL
  cfg16 = SMALL.replace(dtype='bfloat16')
  params = _params(cfg32)
  ids = _ids((2, 6), SMALL.vocab_size)
  a = _forward(cfg32, params, ids)
  b = _forward(cfg16, params, ids)
  h = _forward(cfg16, params, ids, return_hidden=True)
  assert b.dtype == jnp.float32 and h.dtype == jnp.bfloat16
  assert float(jnp.max(jnp.abs(a - b))) < 0.05 * float(jnp.max(jnp.abs(a)))
  assert kv_cache.init_cache(cfg16, 1, 4)['layers_0']['k'].dtype == jnp.bfloat16


def test_remat_same_values_and_grads():
  params = _params(SMALL)
  ids = _ids((2, 6), SMALL.vocab_size)

  def loss(p, cfg):
    h = qwen.Qwen(cfg).apply({'params': p}, ids, return_hidden=True)
    return jnp.mean(qwen.lm_head_logits(cfg, p, h[:, -1]) ** 2)

  grad_fn = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  l1, g1 = grad_fn(params, SMALL)
  l2, g2 = grad_fn(params, SMALL.replace(remat=True))
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize('remat', [False, True])
def test_scan_layers_same_tree_logits_and_grads(remat):
  # The tiny preset in float32 with 3 layers (so the scan runs more than the 2 layers
  # an off-by-one could still match) and left padding (the mask enters every layer).
  unrolled = QwenConfig.preset('tiny', num_hidden_layers=3, dtype='float32',
                               param_dtype='float32', remat=remat)
  scanned = unrolled.replace(scan_layers=True)
  key = jax.random.PRNGKey(0)
  tree_u = jax.eval_shape(functools.partial(qwen.init_params, unrolled), key)
  tree_s = jax.eval_shape(functools.partial(qwen.init_params, scanned), key)
  assert jax.tree.structure(tree_u) == jax.tree.structure(tree_s)
  assert jax.tree.leaves(tree_u) == jax.tree.leaves(tree_s)  # shapes and dtypes
  params = _params(unrolled)
  ids = _ids((2, 7), unrolled.vocab_size)
  mask = jnp.asarray([[1] * 7, [0, 0, 1, 1, 1, 1, 1]], jnp.int32)

  def loss(p, cfg):
    logits = qwen.Qwen(cfg).apply({'params': p}, ids, attention_mask=mask)
    return jnp.sum(mask * jax.nn.logsumexp(logits, axis=-1)) / 100.0, logits

  grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (l_u, logits_u), g_u = grad_fn(params, unrolled)
  (l_s, logits_s), g_s = grad_fn(params, scanned)
  np.testing.assert_allclose(logits_s, logits_u, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(l_s, l_u, rtol=1e-6)
  assert jax.tree.structure(g_s) == jax.tree.structure(g_u)
  for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g_s), jax.tree.leaves(g_s),
                        jax.tree.leaves(g_u)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=str(path[0]))
  # The setting picks the program: a scan only when asked (the values above would
  # also agree if both configs ran the same path).
  def primitives(cfg):
    jaxpr = jax.make_jaxpr(lambda p: loss(p, cfg)[0])(params)
    return {e.primitive.name for e in jaxpr.jaxpr.eqns}
  assert 'scan' in primitives(scanned) and 'scan' not in primitives(unrolled)


def test_scan_layers_not_used_with_a_kv_cache():
  cfg = SMALL.replace(scan_layers=True)
  params = _params(cfg)
  ids = _ids((1, 5), cfg.vocab_size)
  cache = kv_cache.init_cache(cfg, 1, 8)
  jaxpr = jax.make_jaxpr(lambda p, c: qwen.Qwen(cfg).apply({'params': p}, ids, cache=c))(
      params, cache)
  assert 'scan' not in {e.primitive.name for e in jaxpr.jaxpr.eqns}
  out, _ = qwen.Qwen(cfg).apply({'params': params}, ids, cache=cache)
  np.testing.assert_allclose(out, _forward(SMALL, params, ids), atol=1e-5)


# ----------------------------------------------------------------- torch parity


def _hf_state_to_params(model, cfg):
  """Independent HF -> param-tree copy (kernels transposed), for this test only."""
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  params = {'embed_tokens': {'embedding': sd['model.embed_tokens.weight']},
            'norm': {'scale': sd['model.norm.weight']}}
  for i in range(cfg.num_hidden_layers):
    pre = f'model.layers.{i}.'
    attn = {}
    for name in ('q_proj', 'k_proj', 'v_proj', 'o_proj'):
      attn[name] = {'kernel': sd[f'{pre}self_attn.{name}.weight'].T}
      if f'{pre}self_attn.{name}.bias' in sd:
        attn[name]['bias'] = sd[f'{pre}self_attn.{name}.bias']
    for name in ('q_norm', 'k_norm'):
      if f'{pre}self_attn.{name}.weight' in sd:
        attn[name] = {'scale': sd[f'{pre}self_attn.{name}.weight']}
    params[f'layers_{i}'] = {
        'input_layernorm': {'scale': sd[f'{pre}input_layernorm.weight']},
        'post_attention_layernorm': {
            'scale': sd[f'{pre}post_attention_layernorm.weight']},
        'self_attn': attn,
        'mlp': {n: {'kernel': sd[f'{pre}mlp.{n}.weight'].T}
                for n in ('gate_proj', 'up_proj', 'down_proj')}}
  if not cfg.tie_word_embeddings:
    params['lm_head'] = {'kernel': sd['lm_head.weight'].T}
  return jax.tree.map(jnp.asarray, params)


def test_from_hf_llama_written_by_transformers():
  transformers = pytest.importorskip('transformers')
  d = transformers.LlamaConfig(
      vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=6, num_key_value_heads=2, rope_theta=1e5,
      rms_norm_eps=1e-5, tie_word_embeddings=True).to_dict()
  cfg = QwenConfig.from_hf(d)
  assert (cfg.model_type, cfg.hf_model_type, cfg.attention_bias, cfg.qk_norm) == (
      'llama', 'llama', False, False)
  assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.head_dim) == (1e5, 1e-5, 8)
  with pytest.raises(ValueError, match='llama has no q/k/v bias'):
    cfg.replace(attention_bias=True)


@pytest.mark.parametrize('family', ['qwen2', 'qwen3', 'llama'])
def test_matches_transformers_in_memory(family):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  common = dict(vocab_size=200, hidden_size=48, intermediate_size=80,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                rms_norm_eps=1e-6, max_position_embeddings=256)
  if family == 'qwen2':
    hf_cfg = transformers.Qwen2Config(rope_theta=1e4, tie_word_embeddings=True,
                                      **common)
    hf_model = transformers.Qwen2ForCausalLM(hf_cfg)
  elif family == 'llama':  # no biases, tied head
    hf_cfg = transformers.LlamaConfig(rope_theta=1e5, tie_word_embeddings=True,
                                      **common)
    hf_model = transformers.LlamaForCausalLM(hf_cfg)
  else:  # head_dim 16 != 48 / 4, untied head
    hf_cfg = transformers.Qwen3Config(rope_theta=1e6, head_dim=16,
                                      tie_word_embeddings=False, **common)
    hf_model = transformers.Qwen3ForCausalLM(hf_cfg)
  torch.manual_seed(0)
  with torch.no_grad():
    for p in hf_model.parameters():
      p.copy_(torch.randn_like(p) * (0.1 if p.ndim == 1 else 0.08)
              + (1.0 if p.ndim == 1 else 0.0))
  hf_model.config._attn_implementation = 'eager'
  hf_model.eval()
  cfg = QwenConfig.from_hf(hf_cfg.to_dict())
  params = _hf_state_to_params(hf_model, cfg)
  ids = np.random.RandomState(0).randint(0, 200, (2, 11))
  with torch.no_grad():
    ref = hf_model(torch.as_tensor(ids)).logits.numpy()
  ours = np.asarray(_forward(cfg, params, jnp.asarray(ids)))
  assert np.max(np.abs(ours - ref)) <= 1e-4


def test_from_hf_corrupt_config_files_name_file_and_field(tmp_path):
  """Truncated / non-object / ill-typed config.json: the error names the file and key."""
  good = {'model_type': 'qwen2', 'vocab_size': 10, 'hidden_size': 8,
          'intermediate_size': 8, 'num_hidden_layers': 1, 'num_attention_heads': 2,
          'rope_theta': 1e4}
  path = tmp_path / 'config.json'
  path.write_text(json.dumps(good)[:-5])  # cut short, e.g. by an interrupted copy
  with pytest.raises(ValueError, match=r'config\.json: not valid JSON'):
    QwenConfig.from_hf(tmp_path)
  path.write_text('[1, 2]')
  with pytest.raises(ValueError, match=r'config\.json: expected a JSON object, got list'):
    QwenConfig.from_hf(tmp_path)
  path.write_text(json.dumps({**good, 'hidden_size': '8'}))
  with pytest.raises(ValueError, match=r"field 'hidden_size' must be a JSON integer, "
                     r"got '8'"):
    QwenConfig.from_hf(tmp_path)
  path.write_text(json.dumps({**good, 'num_hidden_layers': 0}))
  with pytest.raises(ValueError, match=r'config\.json: QwenConfig\.num_hidden_layers '
                     'must be a positive int'):
    QwenConfig.from_hf(tmp_path)
  path.write_text(json.dumps({**good, 'rms_norm_eps': None}))
  with pytest.raises(ValueError, match="'rms_norm_eps' must be a JSON number"):
    QwenConfig.from_hf(tmp_path)
  path.write_text(json.dumps(good))
  assert QwenConfig.from_hf(tmp_path).hidden_size == 8
