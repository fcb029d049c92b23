"""Tests for the FLOP accounting of experiments/benchmarks/gpu_check.py (its MFU)."""
import importlib
import os
import sys

import jax
import numpy as np
import pytest

from vermem_jax.models import qwen

_BENCH = os.path.join(os.path.dirname(__file__), '..', 'experiments', 'benchmarks')


@pytest.fixture(scope='module')
def gpu_check():
  sys.path.insert(0, os.path.abspath(_BENCH))
  try:
    return importlib.import_module('gpu_check')
  finally:
    sys.path.pop(0)


@pytest.mark.parametrize('preset', ['tiny', 'qwen2.5-0.5b-instruct', 'qwen3-0.6b'])
def test_non_embedding_params_match_the_parameter_tree(gpu_check, preset):
  cfg = qwen.QwenConfig.preset(preset)
  shapes = jax.eval_shape(lambda: qwen.init_params(cfg, jax.random.PRNGKey(0)))
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  embedding = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
  assert gpu_check.non_embedding_params(cfg) == total - embedding


def test_flops_per_token(gpu_check):
  cfg = qwen.QwenConfig.preset('tiny')
  n = gpu_check.non_embedding_params(cfg)
  assert gpu_check.forward_flops(cfg, 10, 0.0) == 10 * 2 * n
  attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
  assert gpu_check.forward_flops(cfg, 3, 5.0) == 3 * (2 * n + attn * 5.0)
  assert gpu_check.head_flops(cfg, 7) == 2 * 7 * cfg.hidden_size * cfg.vocab_size
