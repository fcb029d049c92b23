"""Data root precedence (vermem_jax.paths; docs/data.md): $VERMEM_DATA_DIR, then
../shared/data beside the checkout, then the packaged copy."""
import hashlib
import lzma
import os

from vermem_jax import paths
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources

# sha256 of the uncompressed packaged samples (vermem_jax/assets/hotpotqa/README.md).
PACKAGED_SHA256 = {
    'train_sample.json': 'c23ccf83a7931cfad6243e5a46a4edd83f66d9502607e0e0e66f60ff2631fbc3',
    'dev_distractor_sample.json':
        '66a082ff12c344e975ac1b85ea6f8281cfc2bd64ac2bb75d8eb0dcef0550ce7f',
}


def test_environment_variable_wins(monkeypatch, tmp_path):
  monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path))
  assert paths.default_data_dir() == str(tmp_path)
  assert paths.hotpotqa_dir() == os.path.join(str(tmp_path), 'hotpotqa')


def test_shared_data_beside_the_checkout_then_the_packaged_copy(monkeypatch, tmp_path):
  monkeypatch.delenv(paths.DATA_DIR_ENV, raising=False)
  shared = tmp_path / 'shared' / 'data'
  monkeypatch.setattr(paths, 'shared_data_dir', lambda: str(shared))
  assert paths.default_data_dir() == paths.PACKAGED_DATA_DIR
  shared.mkdir(parents=True)
  assert paths.default_data_dir() == str(shared)


def test_packaged_samples_are_the_documented_files():
  folder = paths.hotpotqa_dir(paths.PACKAGED_DATA_DIR)
  for name, digest in PACKAGED_SHA256.items():
    with lzma.open(os.path.join(folder, name + '.xz')) as f:
      assert hashlib.sha256(f.read()).hexdigest() == digest
  assert 'CC BY-SA 4.0' in open(os.path.join(folder, 'README.md'), encoding='utf-8').read()
  train = hotpotqa_sources.load_examples('json', 'train', data_dir=folder)
  dev = hotpotqa_sources.load_examples('json', 'validation', data_dir=folder)
  assert (len(train), len(dev)) == (592, 1093)
  assert hotpotqa.find_split_file('train', folder).endswith('train_sample.json.xz')
