"""Where HotpotQA examples come from: the json, tfds and hf sources (SPEC §4).

`load_examples(source, split)` reads one split from the source a config names
(`DataConfig.source`); the formats, splits and pools are `hotpotqa`'s, the TFDS builder
is `tfds_hotpotqa`'s. This module sits above both, so neither imports the other's
caller.
"""

from __future__ import annotations

from typing import Sequence

from vermem_jax import paths
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import tfds_hotpotqa
from vermem_jax.envs.hotpotqa import DataConfig, Example


def load_examples(source: str, split: str, *, data_dir: str | None = None,
                  path: str | None = None, tfds_data_dir: str | None = None,
                  hf_name: str = "hotpot_qa", hf_config: str = "distractor",
                  ) -> list[Example]:
  """Loads one HotpotQA split as a list of Examples in source file order.

  Args:
    source: 'json' | 'tfds' | 'hf'.
    split: 'train' | 'validation' (aliases 'dev', 'dev_distractor').
    data_dir: folder with the JSON files (json source; the manual dir of the tfds
      source). Default `paths.hotpotqa_dir()`.
    path: an explicit JSON file (json source only); overrides `data_dir`.
    tfds_data_dir: TFDS data dir (prepared on first use if missing).
    hf_name, hf_config: the Hugging Face dataset (hf source).

  Raises:
    ValueError: unknown source or split, malformed rows (naming id and field), duplicate
      ids within the split.
    FileNotFoundError: no file for the split.
    ImportError: source 'hf' without the `datasets` package, or source 'tfds' without
      the `tfds` extra.
  """
  split = hotpotqa.canonical_split(split)
  if source == "json":
    file = path or hotpotqa.find_split_file(split, data_dir)
    examples = []
    for i, row in enumerate(hotpotqa.read_json_rows(file)):
      try:
        examples.append(hotpotqa.example_from_json_row(row))
      except ValueError as e:  # say where: a row without `_id` has no other name
        raise ValueError(f"{file}: row {i}: {e}") from e
  elif source == "tfds":
    if path is not None:
      raise ValueError("path= is only for source='json'; the tfds source reads the "
                       "split files in data_dir (its manual dir)")
    examples = tfds_hotpotqa.load(split, manual_dir=data_dir or paths.hotpotqa_dir(),
                                  tfds_data_dir=tfds_data_dir)
  elif source == "hf":
    try:
      import datasets  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("source='hf' needs the optional `datasets` package "
                        "(pip install datasets); use source='json' otherwise") from e
    ds = datasets.load_dataset(hf_name, hf_config, split=split)
    examples = [hotpotqa.example_from_hf_row(r) for r in ds]
  else:
    raise ValueError(f"unknown HotpotQA source {source!r}; expected one of "
                     f"{hotpotqa.SOURCES}")
  _check_unique_ids(examples, split)
  return examples


def _check_unique_ids(examples: Sequence[Example], split: str) -> None:
  seen = set()
  for ex in examples:
    if ex.id in seen:
      raise ValueError(f"HotpotQA {split}: duplicate _id {ex.id!r}")
    seen.add(ex.id)


def load_from_config(config: DataConfig, split: str) -> list[Example]:
  """`load_examples` driven by a DataConfig."""
  return load_examples(config.source, split, data_dir=config.resolved_hotpotqa_dir,
                       tfds_data_dir=config.tfds_data_dir)


def train_pools_from_config(config: DataConfig) -> tuple[list[Example], list[Example]]:
  """(construction pool, internal-dev pool) of the train split under `config`."""
  return hotpotqa.split_train_pools(load_from_config(config, hotpotqa.TRAIN),
                                    dev_fraction=config.dev_fraction,
                                    seed=config.split_seed)
