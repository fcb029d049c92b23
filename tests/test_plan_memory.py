"""Tests for experiments/benchmarks/plan_memory.py (the ahead-of-time memory plan) and
the paper config's FSDP mesh it chose: the planned learner peak against a measured one,
the mesh of each scale, and GRPO updates under fsdp=8 against one device."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import multidevice

from experiments.configs import common
from vermem_jax.train import memory_plan
from vermem_jax.train import setup

_PLAN = os.path.join(os.path.dirname(__file__), '..', 'experiments', 'benchmarks',
                     'plan_memory.py')
# A learner stage small enough to run here (~1.4 GB of RSS) and large enough that the
# process's fixed allocations are a small share of it.
_SMALL = ['--model=qwen2.5-0.5b-instruct', '--mesh=1,1,1', '--micro_batch=2',
          '--loss_chunk_size=64', '--set=model.hidden_size=512',
          '--set=model.intermediate_size=2048', '--set=model.num_hidden_layers=2',
          '--set=model.num_attention_heads=4', '--set=model.num_key_value_heads=2',
          '--set=model.vocab_size=65536', '--set=batching.length_buckets=(1024,)',
          '--set=batching.command_buckets=(128,)']


@pytest.mark.slow
def test_planned_learner_peak_is_within_20_percent_of_the_measured_one(tmp_path):
  out = tmp_path / 'measure.json'
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=os.path.dirname(_PLAN) + '/../..')
  env.pop('XLA_FLAGS', None)
  proc = subprocess.run([sys.executable, _PLAN, '--measure', f'--out={out}', *_SMALL],
                        env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads(out.read_text())['figures']
  # The state alone (θ, π_ref, two moments, gradient sum) is ~0.8 GB: the step ran.
  assert r['state'] > 0.5e9
  assert abs(r['planned'] - r['measured']) <= 0.2 * r['measured'], r


def test_plan_cli_rejects_a_bad_field():
  proc = subprocess.run([sys.executable, _PLAN, '--set=model.no_such_field=1'],
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert proc.returncode == 2
  assert 'model.no_such_field' in proc.stderr


def test_paper_mesh_is_fsdp_over_8_devices_and_tiny_stays_data_parallel():
  paper = common.get_config('phase_b', 'scale=paper')
  assert setup.MeshConfig.from_section(paper.model).shape(8) == (1, 8, 1)
  assert setup.MeshConfig.from_section(paper.model).shape(16) == (2, 8, 1)
  tiny = common.get_config('phase_b')
  assert setup.MeshConfig.from_section(tiny.model).shape(8) == (8, 1, 1)
  assert setup.MeshConfig.from_section(tiny.model).shape(1) == (1, 1, 1)


_FSDP_SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from experiments.configs import common
    from vermem_jax.models import qwen, sharding
    from vermem_jax.rl import batching
    from vermem_jax.train import optim, rl_learner, setup

    cfg = qwen.QwenConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                          max_position_embeddings=256, remat=True)
    params = qwen.init_params(cfg, jax.random.PRNGKey(0))
    ref = jax.tree.map(lambda x: x + 0.01 * jnp.sign(x), params)
    rs = np.random.RandomState(0)
    def decisions(k):
      out = []
      for i in range(16):
        p, c = int(rs.randint(5, 40)), int(rs.randint(1, 12))
        out.append(batching.DecisionTokens(
            tuple(rs.randint(1, 512, p).tolist()), tuple(rs.randint(1, 512, c).tolist()),
            tuple(rs.uniform(-6, -1, c).tolist()), float(rs.normal())))
      return out
    updates = [decisions(k) for k in range(3)]
    bcfg = batching.BatchingConfig(micro_batch_size=8, length_buckets=(64,),
                                   command_buckets=(16,))
    ropt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=1, warmup_ratio=0.0,
                                 lr_schedule='constant')
    tx = optim.make_optimizer(ropt)
    lc = rl_learner.LearnerConfig(cfg, bcfg, ropt)
    mesh = setup.make_mesh(setup.MeshConfig.from_section(
        common.get_config('phase_b', 'scale=paper').model))
    assert tuple(mesh.shape.values()) == (1, 8, 1), mesh.shape
    one = jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), params)
    p1, s1 = one, tx.init(one)
    p8 = sharding.shard_params(params, mesh)
    r8 = sharding.shard_params(ref, mesh)
    s8 = setup.init_opt_state(tx.init, p8, mesh)
    losses = []
    for d in updates:
      p1, s1, m1 = rl_learner.learner_update(p1, ref, s1, d, lc)
      p8, s8, m8 = rl_learner.learner_update(p8, r8, s8, d, lc, mesh=mesh)
      losses.append([m1['train/loss'], m8['train/loss'], m1['train/grad_norm'],
                     m8['train/grad_norm']])
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)))
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(params)))
    emb = p8['embed_tokens']['embedding']
    print('RESULT', json.dumps({'losses': losses, 'param_diff': diff, 'moved': moved,
                                'embed_shard': list(emb.addressable_shards[0].data.shape),
                                'mu_shard': list(s8[1][0].mu['embed_tokens']['embedding']
                                                 .addressable_shards[0].data.shape)}))
""")


@pytest.mark.slow
def test_three_grpo_updates_under_fsdp8_match_one_device():
  r = multidevice.run_on_8_devices(_FSDP_SCRIPT)
  for loss1, loss8, norm1, norm8 in r['losses']:
    assert loss8 == pytest.approx(loss1, abs=1e-5, rel=1e-5)
    assert norm8 == pytest.approx(norm1, abs=1e-5, rel=1e-5)
  assert r['moved'] > 1e-3  # three Adam steps at lr 1e-3 moved the weights
  assert r['param_diff'] <= 2e-5
  # θ and the AdamW moments hold 1/8 of the embedding's 'embed' columns per device
  assert r['embed_shard'] == [512, 8] and r['mu_shard'] == [512, 8]


_STAGES_SCRIPT = textwrap.dedent("""
    import dataclasses, json
    from experiments.configs import common
    from vermem_jax.train import memory_plan
    config = common.get_config('phase_b', 'scale=paper')
    m = config.model
    m.preset, m.hf_checkpoint = 'qwen2.5-0.5b-instruct', None
    m.hidden_size, m.intermediate_size, m.num_hidden_layers = 256, 512, 2
    m.num_attention_heads, m.num_key_value_heads, m.vocab_size = 4, 2, 4096
    config.batching.micro_batch_size, config.batching.loss_chunk_size = 8, 32
    config.batching.length_buckets, config.batching.command_buckets = (256,), (32,)
    s = memory_plan.plan_settings(config, 8)
    s = dataclasses.replace(s, prompt_len=128, max_new_tokens=32, solver_prompt_len=64,
                            solver_new_tokens=16)
    plan = memory_plan.make_plan(s)
    mc = s.model_config
    print('RESULT', json.dumps({
        'mesh': list(s.mesh_shape), 'rows': s.rollout_rows, 'llm': s.llm_solver,
        'tied': mc.tie_word_embeddings, 'head_dim': mc.head_dim,
        'state': plan.state, 'stages': plan.stages}))
""")


@pytest.mark.slow
def test_plan_has_every_stage_with_the_rollout_and_solver_copies():
  r = multidevice.run_on_8_devices(_STAGES_SCRIPT)
  assert r['mesh'] == [1, 8, 1] and r['llm']
  d, f, v, layers, hd = 256, 512, 4096, 2, r['head_dim']
  q, kv = 4 * hd, 2 * hd
  # Qwen2.5 layer: q, k, v (with biases), o, gate/up/down; embedding (and head).
  matrices = (layers * (d * q + 2 * d * kv + q * d + 3 * d * f)
              + (1 if r['tied'] else 2) * v * d)
  vectors = layers * (2 * d + q + 2 * kv) + d  # two norms and the biases, final norm
  state, stages = r['state'], r['stages']
  # The copy is replicated on an fsdp-only mesh: bf16 matrices, f32 vectors, whole.
  assert state['rollout_copy'] == 2 * matrices + 4 * vectors
  assert state['solver_copy'] == state['rollout_copy']
  # θ is float32 with every matrix split over fsdp=8 (each has a dimension 8 divides).
  assert state['params'] == 4 * matrices // 8 + 4 * vectors
  assert set(stages) == {'learner', 'accumulate', 'optimizer', 'rollout_copy',
                         'sampler_shared', 'sampler', 'decode_step', 'dev_chunk', 'solver'}
  decoding = state['params'] + state['reference'] + state['optimizer'] + state['solver_copy']
  for name in ('sampler_shared', 'sampler', 'decode_step', 'dev_chunk'):
    assert stages[name]['resident'] == decoding, name
  assert stages['solver']['resident'] == (decoding - state['solver_copy']
                                          + state['rollout_copy'])
  for name, st in stages.items():
    assert st['stage_peak'] == st['peak'] + st['resident'], name
    assert st['flops'] > 0, name
  # The copy is the rollout programs' argument and the copy program's output.
  assert stages['sampler']['argument'] >= state['rollout_copy']
  # (+ the output tuple's table of 8-byte buffer pointers, one per leaf)
  extra = stages['rollout_copy']['output'] - state['rollout_copy']
  assert 0 <= extra <= 8 * (layers * 12 + 3), extra
  # A dev chunk holds the KV cache of the rollout batch at the same shapes.
  assert stages['dev_chunk']['temp'] >= state['kv_cache'] > 0


def test_stage_table_lists_each_stage_peak_per_backbone():
  g = memory_plan.GIB
  plans = {'a': {'stages': {'learner': {'stage_peak': 1.5 * g},
                            'solver': {'stage_peak': 2 * g}}},
           'b': {'stages': {'learner': {'stage_peak': 0.3 * g}}}}
  assert memory_plan.stage_table(plans).strip().splitlines() == [
      '| stage (peak GiB / device) | a | b |', '| --- | --- | --- |',
      '| learner | 1.5 | 0.3 |', '| solver | 2.0 | - |']
