"""RL phase provenance records (vermem_jax/train/rl_resume.py)."""
import jax
import numpy as np

from vermem_jax.train import rl_resume


def test_params_fingerprint_detects_one_changed_bit():
  tree = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 'b': {'c': np.ones(4)}}
  same = jax.tree.map(np.copy, tree)
  assert rl_resume.params_fingerprint(tree) == rl_resume.params_fingerprint(same)
  flipped = jax.tree.map(np.copy, tree)
  flipped['a'].view(np.uint32)[1, 2] ^= 1
  assert rl_resume.params_fingerprint(tree) != rl_resume.params_fingerprint(flipped)
  reshaped = {'a': tree['a'].reshape(3, 2), 'b': tree['b']}
  assert rl_resume.params_fingerprint(tree) != rl_resume.params_fingerprint(reshaped)
