"""Tests for vermem_jax.models.sharding on an 8-device CPU mesh (run in a subprocess,
because the device count must be fixed before jax is imported)."""
import textwrap

import pytest

import multidevice

from vermem_jax.models import sharding

_SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from vermem_jax.models import qwen, sampling, sharding

    assert jax.device_count() == 8, jax.devices()
    # Every parameter kind: q/k/v bias, q/k norm, untied lm_head.
    cfg = qwen.QwenConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, attention_bias=True,
                          qk_norm=True, tie_word_embeddings=False,
                          max_position_embeddings=512)
    shapes = jax.eval_shape(lambda: qwen.init_params(cfg, jax.random.PRNGKey(0)))
    rs = np.random.RandomState(0)
    params = jax.tree.map(lambda s: jnp.asarray(
        (1.0 + 0.1 * rs.randn(*s.shape)) if len(s.shape) == 1
        else 0.08 * rs.randn(*s.shape), jnp.float32), shapes)
    ids = jnp.asarray(rs.randint(0, 256, (4, 12)), jnp.int32)
    mask = jnp.ones((4, 12), jnp.int32).at[1, :5].set(0)
    forward = jax.jit(lambda p, x, m: qwen.Qwen(cfg).apply({'params': p}, x,
                                                         attention_mask=m))
    ref = np.asarray(forward(params, ids, mask))
    prompts = [ids[0, :7].tolist(), ids[1, 5:].tolist()]
    gen = lambda p: sampling.generate(cfg, p, prompts, rng=0, max_new_tokens=5,
                                      temperature=0.0, top_p=1.0, stop_token_ids=())
    ref_gen = gen(params)
    # The blockwise attention kernel with blocks smaller than the sequence, values and
    # gradients under each mesh against the eager kernel on one device.
    def loss_of(c):
      def loss(p, x, m):
        logits = qwen.Qwen(c).apply({'params': p}, x, attention_mask=m)
        return jnp.sum(jnp.where(m[..., None] > 0, logits, 0.0) ** 2) * 1e-3
      return jax.jit(jax.value_and_grad(loss))
    blockwise = cfg.replace(attn_implementation='blockwise', attn_block_q=4,
                            attn_block_kv=4)
    ref_loss, ref_grad = loss_of(cfg.replace(attn_implementation='eager'))(
        params, ids, mask)

    result = {}
    for shape in [(1, 2, 4), (2, 2, 2)]:
      mesh = sharding.make_mesh(*shape)
      sharded = sharding.shard_params(params, mesh)
      expected = sharding.param_shardings(cfg, mesh)
      same = jax.tree.map(lambda a, s: a.sharding.is_equivalent_to(s, a.ndim),
                          sharded, expected)
      assert all(jax.tree.leaves(same)), same
      specs = {
          'embedding': sharded['embed_tokens']['embedding'].sharding.spec,
          'q_kernel': sharded['layers_0']['self_attn']['q_proj']['kernel'].sharding.spec,
          'down': sharded['layers_1']['mlp']['down_proj']['kernel'].sharding.spec,
          'lm_head': sharded['lm_head']['kernel'].sharding.spec,
          'norm': sharded['norm']['scale'].sharding.spec,
      }
      emb = sharded['embed_tokens']['embedding']
      shard_rows = emb.addressable_shards[0].data.shape
      batch = NamedSharding(mesh, P(('data', 'fsdp')))
      with sharding.use_sharding(mesh):
        out = forward(sharded, jax.device_put(ids, batch), jax.device_put(mask, batch))
        b_loss, b_grad = loss_of(blockwise)(sharded, jax.device_put(ids, batch),
                                            jax.device_put(mask, batch))
      out = np.asarray(out)
      blockwise_diff = max(abs(float(b_loss) - float(ref_loss)), max(
          float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
          for a, b in zip(jax.tree.leaves(b_grad), jax.tree.leaves(ref_grad))))
      diff = float(np.max(np.abs(out[0] - ref[0])))
      diff = max(diff, float(np.max(np.abs(out[1, 5:] - ref[1, 5:]))),
                 float(np.max(np.abs(out[2:] - ref[2:]))))
      entry = {'diff': diff, 'blockwise_diff': blockwise_diff,
               'shard_shape': list(shard_rows),
               'specs': {k: [None if a is None else a for a in v]
                         for k, v in specs.items()}}
      if shape == (1, 2, 4):
        with sharding.use_sharding(mesh):
          out_gen = gen(sharded)
        entry['gen_equal'] = bool(np.array_equal(out_gen.tokens, ref_gen.tokens))
        entry['gen_lp_diff'] = float(np.max(np.abs(np.asarray(out_gen.logprobs)
                                                   - np.asarray(ref_gen.logprobs))))
      result['x'.join(map(str, shape))] = entry
    mesh = sharding.make_mesh(1, 2, 4)
    result['fit'] = [list(sharding._fit_spec(P('tensor'), (6,), mesh)),
                     list(sharding._fit_spec(P('tensor'), (8,), mesh)),
                     list(sharding._fit_spec(P(('data', 'tensor'), 'fsdp'), (2, 4),
                                             mesh))]
    print('RESULT', json.dumps(result))
""")


@pytest.fixture(scope='module')
def mesh_result():
  return multidevice.run_on_8_devices(_SCRIPT)


def test_fsdp2_tensor4_matches_single_device(mesh_result):
  r = mesh_result['1x2x4']
  assert r['diff'] <= 1e-5
  assert r['blockwise_diff'] <= 1e-5
  assert r['specs']['embedding'] == ['tensor', 'fsdp']
  assert r['specs']['q_kernel'] == ['fsdp', 'tensor']
  assert r['specs']['down'] == ['tensor', 'fsdp']
  assert r['specs']['lm_head'] == ['fsdp', 'tensor']
  assert r['specs']['norm'] in ([], [None])
  assert r['shard_shape'] == [256 // 4, 64 // 2]  # really split over 8 devices
  assert r['gen_equal'] and r['gen_lp_diff'] <= 1e-5


def test_data2_fsdp2_tensor2_matches_single_device(mesh_result):
  r = mesh_result['2x2x2']
  assert r['diff'] <= 1e-5
  assert r['blockwise_diff'] <= 1e-5
  assert r['shard_shape'] == [256 // 2, 64 // 2]


def test_make_mesh_rejects_wrong_device_count():
  import jax
  n = jax.device_count()
  with pytest.raises(ValueError, match='devices'):
    sharding.make_mesh(data=n + 1)
  with pytest.raises(ValueError, match='positive'):
    sharding.make_mesh(data=0)
  mesh = sharding.make_mesh(data=n)
  assert mesh.axis_names == ('data', 'fsdp', 'tensor')


def test_uneven_dimension_is_replicated(mesh_result):
  # 6 rows over tensor=4 cannot split evenly -> replicated; 8 rows split.
  assert mesh_result['fit'] == [[None], ['tensor'], [None, 'fsdp']]
