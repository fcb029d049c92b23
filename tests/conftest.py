"""Shared pytest fixtures. The data root comes from vermem_jax.paths (never the repo)."""
import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache for the session and the processes its tests
# start: the suite compiles the same tiny programs in many tests and subprocesses
# (measured cold: test_curriculum_e2e + test_sft 170 -> 147 s, test_multihost 206 ->
# 187 s). A cache directory the user set is used as it is.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE_DIR = tempfile.mkdtemp(prefix="vermem-jax-test-xla-cache-")
  atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

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
  from vermem_jax.envs import hotpotqa_sources  # pylint: disable=import-outside-toplevel
  examples = hotpotqa_sources.load_examples("json", "train", data_dir=hotpotqa_dir)
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


def pytest_addoption(parser):
  parser.addoption(
      "--attn-implementation", default=None,
      choices=("eager", "sdpa", "blockwise", "pallas"),
      help="run every model call with this attention kernel (blockwise and pallas "
           "with 8-token / 128-token blocks, pallas in TPU interpret mode), e.g. "
           "`pytest tests/test_qwen.py tests/test_hf_io.py tests/test_sampling.py "
           "--attn-implementation=blockwise`")


@pytest.fixture(autouse=True)
def _forced_attention_kernel(request, monkeypatch):
  impl = request.config.getoption("--attn-implementation")
  if impl is None:
    yield
    return
  import contextlib  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import attention  # pylint: disable=g-import-not-at-top
  original = attention.attend
  block = 128 if impl == "pallas" else 8

  def attend(q, k, v, mask, *, config, cached):
    config = config.replace(attn_implementation=impl, attn_block_q=block,
                            attn_block_kv=block)
    return original(q, k, v, mask, config=config, cached=cached)

  monkeypatch.setattr(attention, "attend", attend)
  if impl == "pallas":
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
    ctx = pltpu.force_tpu_interpret_mode()
  else:
    ctx = contextlib.nullcontext()
  with ctx:
    yield
