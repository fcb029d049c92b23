"""Tests for experiments/benchmarks/gpu_check.py: the FLOP accounting of its MFU and its
memory plan (the planned learner bytes are those of the program it runs)."""
import json

import jax
import numpy as np
import pytest

import benchmark_scripts

from vermem_jax.models import qwen
from vermem_jax.models import qwen_config


@pytest.fixture(scope='module')
def gpu_check():
  return benchmark_scripts.load('gpu_check')


@pytest.mark.parametrize('preset', ['tiny', 'qwen2.5-0.5b-instruct', 'qwen3-0.6b'])
def test_non_embedding_params_match_the_parameter_tree(gpu_check, preset):
  cfg = qwen_config.QwenConfig.preset(preset)
  shapes = jax.eval_shape(lambda: qwen.init_params(cfg, jax.random.PRNGKey(0)))
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  embedding = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
  assert gpu_check.non_embedding_params(cfg) == total - embedding


def test_flops_per_token(gpu_check):
  cfg = qwen_config.QwenConfig.preset('tiny')
  n = gpu_check.non_embedding_params(cfg)
  assert gpu_check.forward_flops(cfg, 10, 0.0) == 10 * 2 * n
  attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
  assert gpu_check.forward_flops(cfg, 3, 5.0) == 3 * (2 * n + attn * 5.0)
  assert gpu_check.head_flops(cfg, 7) == 2 * 7 * cfg.hidden_size * cfg.vocab_size


def _figures(gpu_check, tmp_path, *flags) -> dict:
  """The figures of `gpu_check.main` on the tiny preset (V = 4,096, one repeat)."""
  out = tmp_path / 'gpu_check.json'
  assert gpu_check.main(['--preset=tiny', '--hf_checkpoint=', '--vocab_size=4096',
                         '--repeats=1', *flags,
                         f'--out={out}']) == 0
  return json.loads(out.read_text())['figures']


def test_planned_learner_bytes_are_those_of_the_program_it_runs(gpu_check, tmp_path):
  # The plan compiles the learner with abstract inputs on a one-device mesh; the check
  # runs the same jitted function on real arrays: the same shapes give the same
  # argument + output + temporary bytes (a shape or setting the two disagree on, e.g.
  # a batch key or the loss chunk, shows here).
  figures = _figures(gpu_check, tmp_path, '--length=256', '--command_tokens=32',
                     '--learner_batch=2', '--decode_batch=4', '--new_tokens=8',
                     '--skip=decode,rollout')
  ran = figures['learner']['program_gib']
  # θ, π_ref (float32) and the batch are arguments: at least twice the parameters.
  cfg = qwen_config.QwenConfig.preset('tiny', vocab_size=4096)
  shapes = jax.eval_shape(lambda: qwen.init_params(cfg, jax.random.PRNGKey(0)))
  params_gib = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(shapes)) / 2**30
  assert ran > 2 * params_gib
  assert figures['plan']['learner_gib'] == pytest.approx(ran, rel=0.01)
  assert figures['plan']['decode_gib'] > params_gib


def test_planned_generate_seconds_on_one_h100_by_hand(gpu_check):
  hw = gpu_check.one_chip('NVIDIA H100 80GB HBM3')
  assert hw.chips == 1 and hw.peak_flops == 989e12
  assert gpu_check.one_chip('cpu') is None
  cfg = qwen_config.QwenConfig.preset('tiny', vocab_size=4096, dtype='bfloat16')
  d, layers, f = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
  h, kv, hd, v = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                  cfg.vocab_size)
  w = d * h * hd * 2 + d * kv * hd * 2 + 3 * d * f
  rows, prompt, new = 4, 64, 8
  prefill = layers * (2 * rows * prompt * w + 4 * rows * prompt * prompt * h * hd) + (
      2 * rows * d * v)
  matrices = layers * w + v * d * (1 if cfg.tie_word_embeddings else 2)
  kv_bytes = 2 * layers * kv * hd * 2 * rows * (prompt + new)
  step = layers * (2 * rows * w + 4 * rows * (prompt + new) * h * hd) + 2 * rows * d * v
  # Prefill at 50 % of 989 TFLOP/s; the steps take the longer of streaming the bf16
  # weights and the cache at 70 % of 3.35 TB/s and their FLOPs at 50 % (this tiny
  # model's steps are compute-bound).
  want = prefill / (989e12 * 0.5) + max(new * (2 * matrices + kv_bytes) / (3.35e12 * 0.7),
                                        new * step / (989e12 * 0.5))
  got = gpu_check.planned_generate_s(cfg, hw, rows, prompt, new)
  assert got == pytest.approx(want, rel=1e-9)


def test_rollout_part_runs_the_copy_a_dev_chunk_and_the_solver_on_cpu(gpu_check, tmp_path):
  r = _figures(gpu_check, tmp_path, '--length=128', '--decode_batch=2', '--new_tokens=8',
               '--solver_prompt=32', '--solver_new_tokens=4',
               '--skip=learner,decode,plan')['rollout']
  for name in ('copy', 'dev_chunk', 'solver'):
    assert r[f'{name}_s'] > 0, name
  # A CPU is no hardware of the time plan: nothing planned, nothing measured by JAX.
  assert r['dev_chunk_planned_s'] is None and r['solver_peak_memory_gib'] is None
