"""Shared pytest fixtures. The data root comes from vermem_jax.paths, completed with the
Qwen tokenizers shipped in tests/data/tokenizers when it lacks them."""
import json
import lzma
import os
import pathlib
import shutil

import pytest

import session_dir

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache for the session, its xdist workers and the
# processes its tests start: the suite compiles the same tiny programs many times
# (docs/performance.md). A cache directory the user set is used as it is.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(session_dir.ensure(), "xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# No size bound: one would make jax lock the folder and scan every entry on each write.
# Without it, an entry read while another process still writes it fails to load, and jax
# warns and compiles instead.

from vermem_jax import paths  # noqa: E402

# The Qwen tokenizer folders shipped for the tests (tests/data/tokenizers/README.md):
# each folder's own files, plus the BPE files both models share, stored once (xz).
_TEST_TOKENIZERS = pathlib.Path(__file__).resolve().parent / "data" / "tokenizers"
TOKENIZER_NAMES = ("qwen2.5", "qwen3")
SHARED_BPE_FILES = ("vocab.json", "merges.txt")


def _write_test_tokenizer(name: str, dest: str) -> None:
  shutil.copytree(_TEST_TOKENIZERS / name, dest)
  for file in SHARED_BPE_FILES:
    with lzma.open(_TEST_TOKENIZERS / f"{file}.xz") as src, open(
        os.path.join(dest, file), "wb") as out:
      shutil.copyfileobj(src, out)


def _test_data_root() -> str:
  """The data root the session uses: `paths.default_data_dir()` when it holds both
  tokenizer folders, else a root in the session folder that links its `hotpotqa/` (and any
  tokenizer folder it has) and adds the shipped tokenizers, so a clone with nothing
  beside it runs every test."""
  root = paths.default_data_dir()
  if all(os.path.isdir(paths.tokenizer_dir(n, root)) for n in TOKENIZER_NAMES):
    return root
  tmp = os.path.join(session_dir.ensure(), "data")
  os.mkdir(tmp)
  os.symlink(os.path.abspath(paths.hotpotqa_dir(root)), os.path.join(tmp, "hotpotqa"))
  os.mkdir(os.path.join(tmp, "tokenizers"))
  for name in TOKENIZER_NAMES:
    dest = paths.tokenizer_dir(name, tmp)
    if os.path.isdir(paths.tokenizer_dir(name, root)):
      os.symlink(os.path.abspath(paths.tokenizer_dir(name, root)), dest)
    else:
      _write_test_tokenizer(name, dest)
  return tmp


# Set for the whole session (configs read it when built, and test subprocesses inherit
# it), so every consumer of paths.default_data_dir() sees the same root.
os.environ[paths.DATA_DIR_ENV] = _test_data_root()


@pytest.fixture(scope="session")
def data_dir():
  d = paths.default_data_dir()
  if not os.path.isdir(paths.hotpotqa_dir(d)):
    pytest.fail(f"no HotpotQA folder at {paths.hotpotqa_dir(d)}; set "
                f"{paths.DATA_DIR_ENV} to a data root holding hotpotqa/ (docs/data.md)")
  return d


@pytest.fixture(scope="session")
def qwen25_tokenizer_dir(data_dir):
  return paths.tokenizer_dir("qwen2.5", data_dir)


@pytest.fixture(scope="session")
def hotpotqa_dir(data_dir):
  return paths.hotpotqa_dir(data_dir)


@pytest.fixture(scope="session")
def raw_rows(hotpotqa_dir):
  """split ('train' | 'validation') -> the sample file's raw JSON rows, read with the
  stdlib alone (plain or packaged `.xz`), as the tests' reference for the loaders."""
  cache = {}

  def read(split):
    if split not in cache:
      name = {"train": "train_sample.json", "validation": "dev_distractor_sample.json"}[split]
      path = os.path.join(hotpotqa_dir, name)
      plain = os.path.isfile(path)
      with (open(path, "rb") if plain else lzma.open(path + ".xz")) as f:
        cache[split] = json.loads(f.read().decode("utf-8"))
    return cache[split]
  return read


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


def pytest_collection_modifyitems(items):
  """Modules with a `slow` test run first (stable otherwise): `make test` spreads whole
  modules over pytest-xdist workers, and the longest ones started last would leave one
  worker running alone at the end."""
  slow_modules = {item.module.__name__ for item in items
                  if item.get_closest_marker("slow") is not None}
  items.sort(key=lambda item: item.module.__name__ not in slow_modules)
