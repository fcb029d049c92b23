"""Config of experiments/download_data.py: the official HotpotQA files (docs/data.md).

    python experiments/download_data.py --data_dir=/data/vermem
    python experiments/download_data.py --data_dir=/data/vermem \
        --config.files.train.url=https://mirror.example/hotpot_train_v1.1.json
"""

import ml_collections

from vermem_jax.envs import hotpotqa

_BASE_URL = 'http://curtis.ml.cmu.edu/datasets/hotpot/'


def _file(split: str, sha256: str) -> ml_collections.ConfigDict:
  filename = hotpotqa.SPLIT_FILES[split][0]  # the official name the loader looks for
  return ml_collections.ConfigDict({'url': _BASE_URL + filename, 'filename': filename,
                                    'sha256': sha256})


def get_config() -> ml_collections.ConfigDict:
  """files.<name>.{url, filename, sha256} and the transfer settings."""
  c = ml_collections.ConfigDict()
  c.files = ml_collections.ConfigDict()
  # sha256 sums as recorded by the Hugging Face `hotpot_qa` builder (its
  # dataset_infos.json "download_checksums"); '' needs --allow_unverified.
  c.files.train = _file(hotpotqa.TRAIN,
                        '26650cf50234ef5fb2e664ed70bbecdfd87815e6bffc257e068efea5cf7cd316')
  c.files.dev_distractor = _file(
      hotpotqa.VALIDATION, '4e9ecb5c8d3b719f624d66b60f8d56bf227f03914f5f0753d6fa1b359d7104ea')
  c.timeout_s = 60.0        # seconds a connect or a read may block
  c.chunk_bytes = 1 << 20   # bytes per read and progress-bar step
  c.retries = 5             # resumptions of a dropped transfer within one run
  return c
