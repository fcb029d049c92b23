"""Tests for vermem_jax.train.time_plan and experiments/benchmarks/plan_time.py: the
analytic FLOPs against XLA's cost_analysis() of the memory plan's programs, the
update's work on a hand-built episode sample, seconds from hand-computed cases, and the
CLI's refusals."""
import dataclasses
import os
import subprocess
import sys

import jax
import pytest

from experiments.configs import common
from vermem_jax.models.qwen_config import QwenConfig
from vermem_jax.train import memory_plan
from vermem_jax.train import time_plan

_PLAN_TIME = os.path.join(os.path.dirname(__file__), '..', 'experiments', 'benchmarks',
                          'plan_time.py')


def _small_settings(remat: bool) -> memory_plan.PlanSettings:
  config = common.get_config('phase_b', 'scale=paper')
  m = config.model
  m.preset, m.hf_checkpoint = 'qwen2.5-0.5b-instruct', None
  m.hidden_size, m.intermediate_size, m.num_hidden_layers = 256, 1024, 2
  m.num_attention_heads, m.num_key_value_heads, m.vocab_size = 4, 2, 4096
  m.scan_layers, m.remat = False, remat  # unscanned: XLA counts every layer
  m.mesh_data, m.mesh_fsdp, m.mesh_tensor = 1, 1, 1
  b = config.batching
  b.micro_batch_size, b.length_buckets, b.command_buckets = 2, (256,), (32,)
  b.loss_chunk_size = 32
  s = memory_plan.plan_settings(config, 1)
  # Prompt 128 < sampling.PREFILL_ROW_TOKENS with 2 rows: one prefill pass (no lax.map,
  # whose body XLA would count once).
  return dataclasses.replace(s, rollout_rows=2, shared_prefill_rows=2, prompt_len=128,
                             max_new_tokens=16)


@pytest.mark.slow
@pytest.mark.parametrize('remat', [True, False])
def test_analytic_learner_and_prefill_flops_match_cost_analysis(remat):
  s = _small_settings(remat)
  plan = memory_plan.make_plan(s, stages=('learner', 'sampler'), devices=jax.devices()[:1])
  mc = s.model_config
  # Matmuls are ~97 % of the FLOPs here; the rest (softmax, norms, the loss, top-p) is
  # what the analytic count leaves out, hence 10 %.
  learner = time_plan.learner_flops(mc, 2, 256, 32)
  assert learner == pytest.approx(plan.stages['learner']['flops'], rel=0.10)
  # XLA counts the token loop's body once: the prefill, the first token and one step.
  generate = time_plan.generate_flops(mc, 2, 2, 128, 16, 1)
  assert generate == pytest.approx(plan.stages['sampler']['flops'], rel=0.10)


_MC = QwenConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, tie_word_embeddings=False, max_position_embeddings=4096,
                 remat=True, dtype='bfloat16')


def test_forward_flops_by_hand():
  # Per layer: q, o 64x64 each, k, v 64x32 each, MLP 3 x 64x128 = 36,864 weights.
  assert time_plan.layer_matmul_params(_MC) == 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
  # 3 rows x 10 tokens, 20 keys, 3 head rows: 2*30*36864 + 4*30*20*64 per layer.
  per_layer = 2 * 30 * 36864 + 4 * 30 * 20 * 64
  assert time_plan.forward_flops(_MC, 3, 10, 20, 3) == 2 * per_layer + 2 * 3 * 64 * 1000
  # Learner under remat: 4 policy passes + 1 reference, the head 3 + 1 times.
  body = time_plan.forward_flops(_MC, 2, 50, 50, 0)
  assert time_plan.learner_flops(_MC, 2, 50, 8) == 5 * body + 4 * 2 * 2 * 8 * 64 * 1000


def _shape(**kw):
  base = dict(tasks=2, rollouts=4, prompt_buckets=(128, 256), max_command_tokens=32,
              solver_new_tokens=8, micro_batch=4, length_buckets=(256, 512),
              command_buckets=(16, 32), mini_batches=1, iterations=1, eval_every=10,
              dev_episodes=16, verifier_batch=4, verifier_concurrency=2)
  base.update(kw)
  return time_plan.UpdateShape(**base)


def test_update_work_of_a_uniform_sample():
  # Every episode: one decision with a 100-token prompt, a 10-token command, one
  # solver call of a 50-token prompt.
  ep = time_plan.EpisodeShape(decisions=[1] * 5, prompts=[[100]] * 5, commands=[10] * 5,
                              solver_prompts=[50] * 5, solver_calls=[1] * 5)
  s = _shape()
  w = time_plan.update_work(_MC, s, ep, samples=3)
  rows = 8
  # One round: 2 distinct prompts prefilled (shared), bucket 128, 10 decode steps over
  # 128 + 32 slots for all 8 rows.
  assert w.flops['rollout_prefill'] == pytest.approx(
      time_plan.generate_flops(_MC, 2, rows, 128, 32, 0))
  assert w.flops['rollout_decode'] == pytest.approx(
      10 * time_plan.forward_flops(_MC, rows, 1, 160, rows))
  copy = time_plan.matrix_params(_MC) * 2
  assert w.hbm_bytes['rollout_decode_per_chip'] == pytest.approx(10 * copy)
  # Learner: 8 rows of 110 tokens -> 2 micro-batches of 4 at bucket 256, command 16.
  assert w.flops['learner'] == pytest.approx(
      2 * time_plan.learner_flops(_MC, 4, 256, 16))
  # Verifier: ceil(8 decisions / 4) + ceil(8 trajectories / 4) requests.
  assert w.calls['verifier'] == pytest.approx(4)
  # Dev: 16 episodes in chunks of 8 = 2 chunks every 10 updates, nothing shared.
  assert w.flops['dev_prefill'] == pytest.approx(
      0.2 * time_plan.generate_flops(_MC, rows, rows, 128, 32, 0))


def test_stage_seconds_by_hand():
  hw = time_plan.Hardware('x', 2, 100.0, 10.0, 5.0, 1)
  eff = time_plan.Efficiency(prefill_mfu=0.5, learner_mfu=0.25, decode_hbm=0.5,
                             collective=0.5)
  w = time_plan.Work(flops={'rollout_prefill': 200.0, 'learner': 100.0},
                     hbm_bytes={'rollout_decode_per_chip': 10.0, 'rollout_decode': 20.0,
                                'optimizer': 40.0},
                     link_bytes={'learner': 3.0}, calls={'verifier': 5})
  out = time_plan.stage_seconds(w, hw, eff, verifier_call_s=1.5, verifier_concurrency=2)
  assert out['rollout_prefill'] == pytest.approx(200 / (2 * 100 * 0.5))
  # Per-chip weight stream over one chip + the cache over both.
  assert out['rollout_decode'] == pytest.approx(10 / (10 * 0.5) + 20 / (2 * 10 * 0.5))
  # Learner: max(compute 100 / (2*100*0.25) = 2, link 3 * 1/2 / (5*0.5) = 0.6).
  assert out['learner'] == pytest.approx(2.0)
  assert out['optimizer'] == pytest.approx(40 / (2 * 10 * 0.5))
  assert out['verifier'] == pytest.approx(3 * 1.5)  # ceil(5 / 2) waves


@pytest.mark.parametrize('flag,named', [('--config=phase_x.py', 'phase_x'),
                                        ('--hardware=h100x8,tpu9', 'tpu9'),
                                        ('--set=model.no_such_field=1', 'no_such_field')])
def test_plan_time_cli_names_a_bad_flag(flag, named):
  proc = subprocess.run([sys.executable, _PLAN_TIME, flag], capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert named in proc.stderr
