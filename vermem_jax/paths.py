"""Where shared, non-repository files live (HotpotQA samples, tokenizer folders).

The data never lives in the repository. Resolution order for the data root:
  1. the `VERMEM_DATA_DIR` environment variable, if set;
  2. `<repository root>/../shared/data` (the layout of a development checkout and CI).
Configs carry the resolved path in a field (`config.data.data_dir`) that users override.
"""

import os
import pathlib

DATA_DIR_ENV = "VERMEM_DATA_DIR"
_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def default_data_dir() -> str:
  """Returns the shared data root as a string path (it may not exist)."""
  env = os.environ.get(DATA_DIR_ENV)
  if env:
    return env
  return str(_REPO_ROOT.parent / "shared" / "data")


def hotpotqa_dir(data_dir: str | None = None) -> str:
  """Folder with `train_sample.json` and `dev_distractor_sample.json`."""
  return os.path.join(data_dir or default_data_dir(), "hotpotqa")


def tokenizer_dir(name: str = "qwen2.5", data_dir: str | None = None) -> str:
  """Hugging Face tokenizer folder `qwen2.5` or `qwen3` under the data root."""
  return os.path.join(data_dir or default_data_dir(), "tokenizers", name)
