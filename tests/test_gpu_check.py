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


def test_planned_learner_bytes_are_those_of_the_program_it_runs(gpu_check, tmp_path):
  # The plan compiles the learner with abstract inputs on a one-device mesh; the check
  # runs the same jitted function on real arrays: the same shapes give the same
  # argument + output + temporary bytes (a shape or setting the two disagree on, e.g.
  # a batch key or the loss chunk, shows here).
  out = tmp_path / 'gpu_check.json'
  assert gpu_check.main(['--preset=tiny', '--hf_checkpoint=', '--length=256',
                         '--command_tokens=32',
                         '--learner_batch=2', '--decode_batch=4', '--new_tokens=8',
                         '--vocab_size=4096', '--repeats=1', '--skip=decode',
                         f'--out={out}']) == 0
  figures = json.loads(out.read_text())['figures']
  ran = figures['learner']['program_gib']
  # θ, π_ref (float32) and the batch are arguments: at least twice the parameters.
  cfg = qwen_config.QwenConfig.preset('tiny', vocab_size=4096)
  shapes = jax.eval_shape(lambda: qwen.init_params(cfg, jax.random.PRNGKey(0)))
  params_gib = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(shapes)) / 2**30
  assert ran > 2 * params_gib
  assert figures['plan']['learner_gib'] == pytest.approx(ran, rel=0.01)
  assert figures['plan']['decode_gib'] > params_gib
