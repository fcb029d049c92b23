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


@pytest.fixture(scope="session")
def random_sft_workdir(tmp_path_factory):
  """A workdir whose SFT phase holds one randomly initialised tiny checkpoint (step 3):
  evaluations find Base and 'sft' in it."""
  import jax  # pylint: disable=import-outside-toplevel
  from experiments.configs import common  # pylint: disable=import-outside-toplevel
  from vermem_jax.models import qwen  # pylint: disable=import-outside-toplevel
  from vermem_jax.train import checkpoints  # pylint: disable=import-outside-toplevel
  from vermem_jax.train import setup as setup_lib  # pylint: disable=import-outside-toplevel
  wd = tmp_path_factory.mktemp("wd")
  c = common.get_config("sft")
  params = qwen.init_params(setup_lib.model_config_from(c), jax.random.PRNGKey(0))
  with checkpoints.PhaseCheckpointManager(wd / "sft") as m:
    m.save(checkpoints.TrainState(step=3, params=params))
  return str(wd)
