"""Shared pytest fixtures. The data root comes from vermem_jax.paths (never the repo)."""
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from vermem_jax import paths  # noqa: E402


@pytest.fixture(scope="session")
def data_dir():
  d = paths.default_data_dir()
  if not os.path.isdir(d):
    pytest.fail(f"shared data not found at {d}; set {paths.DATA_DIR_ENV}")
  return d


@pytest.fixture(scope="session")
def qwen25_tokenizer_dir(data_dir):
  return paths.tokenizer_dir("qwen2.5", data_dir)


@pytest.fixture(scope="session")
def hotpotqa_dir(data_dir):
  return paths.hotpotqa_dir(data_dir)


@pytest.fixture(scope="module")
def pools(hotpotqa_dir):
  """(construction pool, internal-dev pool) of the HotpotQA train sample (SPEC §4)."""
  from vermem_jax.envs import hotpotqa  # pylint: disable=import-outside-toplevel
  examples = hotpotqa.load_examples("json", "train", data_dir=hotpotqa_dir)
  return hotpotqa.split_train_pools(examples)
