"""RL phase provenance records (vermem_jax/train/rl_resume.py)."""
import jax
import numpy as np
import pytest

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


def test_reference_record_round_trips_and_a_corrupt_one_is_named(tmp_path):
  assert rl_resume.read_reference(str(tmp_path)) is None
  record = {'reference_phase': 'phase_a', 'reference_step': 2, 'params_sha256': 'ab'}
  rl_resume.write_reference(str(tmp_path), record)
  assert rl_resume.read_reference(str(tmp_path)) == record
  path = tmp_path / rl_resume.REFERENCE_FILE
  for data in (b'garbage', b'[1, 2]', bytes(range(128, 256))):
    path.write_bytes(data)
    with pytest.raises(ValueError, match=f'{path} is not a JSON object .*π_ref'):
      rl_resume.read_reference(str(tmp_path))
