"""Tests for the rollout copy of θ (`models.sampling.rollout_copy`, issue 38).

On 8 forced host devices with the paper's mesh (fsdp=8) and a small Qwen-shaped
model, the compiled programs are read as HLO text right after SPMD partitioning: the
program the partitioner asks every backend to run. (XLA:CPU later rewrites each bf16
collective to float32 -- its float-normalization-bf16 pass, the CPU has no bf16
collectives -- so the final CPU text would show float32 for a bf16 gather; GPU and TPU
keep bf16.) Parameter all-gathers are counted by their result shape (the model's
dimensions differ from every activation's row count) and by where they are: in a
computation a while loop reaches (the token loop, the layer scans) or outside.
"""
import collections
import glob
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multidevice

from vermem_jax.models import qwen
from vermem_jax.models import sampling
from vermem_jax.models.qwen_config import QwenConfig

_COMPUTATION = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$')
_CALLEE = re.compile(r'(?:calls|to_apply|body|condition)=%?([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_WHILE_BODY = re.compile(r' while\(.*body=%?([\w.\-]+)')
_ALL_GATHER = re.compile(r'= (\w+)\[([\d,]*)\][^=]*? all-gather(?:-start)?\(')


def hlo_all_gathers(text: str) -> list[tuple[str, tuple[int, ...], bool]]:
  """(element type, result shape, inside a while loop) of every all-gather of an HLO
  module's text; inside = in a computation reachable from some while body."""
  body: dict[str, list[str]] = {}
  name = None
  for line in text.splitlines():
    m = _COMPUTATION.match(line)
    if m:
      name = m.group(1)
      body[name] = []
    elif line.startswith('}'):
      name = None
    elif name is not None:
      body[name].append(line)
  callees = {n: {c for l in lines for c in _CALLEE.findall(l)}
             | {c.strip().lstrip('%') for l in lines for g in _BRANCHES.findall(l)
                for c in g.split(',')} for n, lines in body.items()}
  looped = {b for lines in body.values() for l in lines for b in _WHILE_BODY.findall(l)}
  todo = list(looped)
  while todo:
    for c in callees.get(todo.pop(), ()):
      if c not in looped:
        looped.add(c)
        todo.append(c)
  out = []
  for n, lines in body.items():
    for l in lines:
      for dtype, dims in _ALL_GATHER.findall(l):
        shape = tuple(int(d) for d in dims.split(',') if d)
        out.append((dtype, shape, n in looped))
  return out


def test_hlo_all_gathers_finds_loop_bodies_and_branches():
  text = textwrap.dedent("""\
      %inner (p: f32[4]) -> f32[8] {
        %p = f32[4]{0} parameter(0)
        ROOT %ag = f32[8]{0} all-gather(%p), dimensions={0}
      }
      %b1 (p: f32[4]) -> bf16[6,2] {
        ROOT %ag2 = bf16[6,2]{1,0} all-gather-start(%p), dimensions={0}
      }
      %body (s: (s32[], f32[4])) -> (s32[], f32[4]) {
        %c = f32[8]{0} call(%x), to_apply=%inner
        %k = f32[4] conditional(%i, %x), branch_computations={%b1, %b2}
      }
      %cond (s: (s32[], f32[4])) -> pred[] {
        ROOT %lt = pred[] compare(%a, %b), direction=LT
      }
      ENTRY %main (x: f32[4]) -> f32[4] {
        %g = bf16[3,5]{1,0} all-gather(%x), dimensions={0}
        %w = (s32[], f32[4]) while(%t), condition=%cond, body=%body
      }
      """)
  assert sorted(hlo_all_gathers(text)) == [
      ('bf16', (3, 5), False), ('bf16', (6, 2), True), ('f32', (8,), True)]


_CFG = dict(vocab_size=4096, hidden_size=256, intermediate_size=512,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, tie_word_embeddings=False, max_position_embeddings=1024,
            dtype='bfloat16', param_dtype='float32')

_SCRIPT = textwrap.dedent("""
    import json, os
    import jax, jax.numpy as jnp, numpy as np
    from experiments.configs import common
    from vermem_jax.models import qwen, qwen_config, sampling, sharding
    from vermem_jax.train import setup
    cfg = qwen_config.QwenConfig(**CFG)
    mesh = setup.make_mesh(setup.MeshConfig.from_section(
        common.get_config('phase_b', 'scale=paper').model))
    assert tuple(mesh.shape.values()) == (1, 8, 1), mesh.shape
    shapes = jax.eval_shape(lambda: qwen.init_params(cfg, jax.random.PRNGKey(0)))
    theta = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         shapes, sharding.param_shardings(cfg, mesh))
    copy = sampling.abstract_rollout_copy(cfg, theta, mesh)
    rep = setup.replicated(mesh)
    sampling.lower_rollout_copy(cfg, theta, mesh).compile()
    for p in (copy, theta):  # the copy's generate program first, then θ's
      with sharding.use_sharding(mesh):
        sampling.lower_generate(cfg, p, batch=16, prefill_rows=16, prompt_len=64,
                                max_new_tokens=32, do_sample=True,
                                input_sharding=rep).compile()
    # Real arrays: the copy decodes the same tokens as θ (its 1-D leaves stay f32 and
    # the model casts every matrix to bf16 at use).
    params = sharding.shard_params(qwen.init_params(cfg, jax.random.PRNGKey(1)), mesh)
    real = sampling.rollout_copy(cfg, params, mesh)
    rs = np.random.RandomState(0)
    prompts = [rs.randint(1, 4096, rs.randint(3, 40)).tolist() for _ in range(16)]
    outs = []
    for p in (real, params):
      with sharding.use_sharding(mesh):
        out = sampling.generate(cfg, p, prompts, rng=3, max_new_tokens=12,
                                temperature=0.7, top_p=0.95, prompt_buckets=(64,))
      outs.append(np.asarray(out.tokens).tolist())
    emb = real['embed_tokens']['embedding']
    print('RESULT', json.dumps({
        'param_shapes': sorted({tuple(x.shape) for x in jax.tree.leaves(shapes)}),
        'tokens_copy': outs[0], 'tokens_theta': outs[1],
        'copy_dtype': str(emb.dtype), 'copy_shard': list(emb.addressable_shards[0].data.shape),
        'norm_dtype': str(real['norm']['scale'].dtype)}))
""")


@pytest.mark.slow
def test_generate_on_the_rollout_copy_gathers_no_parameters_in_the_token_loop(tmp_path):
  dump = tmp_path / 'hlo'
  r = multidevice.run_on_8_devices(
      f'CFG = {_CFG!r}\n' + _SCRIPT, timeout=900,
      xla_flags=f'--xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning')

  def module(name):
    files = sorted(glob.glob(str(dump / f'*{name}*after_spmd-partitioning*')))
    return [open(f, encoding='utf-8').read() for f in files]

  param_shapes = {tuple(s) for s in r['param_shapes']}
  # The AOT compiles come first (the real-array calls compile again after them).
  copy_text = module('jit__cast_for_decode')[0]
  gen_copy, gen_theta = module('jit__generate_jit')[:2]

  def params_gathered(text):
    return collections.Counter((dtype, inside) for dtype, shape, inside
                               in hlo_all_gathers(text) if shape in param_shapes)

  # The copy gathers every matrix once, in bf16: 7 per layer + embedding + head.
  assert params_gathered(copy_text) == {('bf16', False): 2 * 7 + 2}
  # Generate on the copy gathers no parameter at all (inside the loop or out).
  assert params_gathered(gen_copy) == {}
  # The same program on float32 FSDP θ gathers every matrix inside the loops (token
  # loop and prefill; the partitioner converts to bf16 first, as the model casts at
  # use) and again outside: what the counter must see for the assertion above to mean
  # anything. (XLA:CPU's final text shows these as f32: its bf16 normalization.)
  theta = params_gathered(gen_theta)
  assert theta[('bf16', True)] >= 2 * 7 + 1 and ('f32', True) not in theta, theta
  # The copy: bf16 matrices, replicated (fsdp=8, tensor=1), f32 norm scales; it decodes
  # the same tokens as θ.
  assert r['copy_dtype'] == 'bfloat16' and r['norm_dtype'] == 'float32'
  assert r['copy_shard'] == [4096, 256]
  assert r['tokens_copy'] == r['tokens_theta']


def test_rollout_copy_casts_matrices_and_keeps_vectors_on_one_device():
  cfg = QwenConfig(**dict(_CFG, vocab_size=256, hidden_size=64, intermediate_size=128,
                          head_dim=16))
  params = qwen.init_params(cfg, jax.random.PRNGKey(0))
  copy = sampling.rollout_copy(cfg, params)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(params),
                          jax.tree.leaves(copy)):
    want = jnp.bfloat16 if x.ndim >= 2 else jnp.float32
    assert y.dtype == want, path
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x.astype(want)))
  prompts = [[5, 9, 11], [7] * 20]
  a, b = (sampling.generate(cfg, p, prompts, rng=0, max_new_tokens=6)
          for p in (copy, params))
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))
