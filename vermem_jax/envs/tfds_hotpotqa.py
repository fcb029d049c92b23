"""TFDS builder over the official HotpotQA JSON files, written as array_record.

The builder reads the split files from its *manual dir* (the folder that holds
`hotpot_train_v1.1.json` / `hotpot_dev_distractor_v1.json`, or the samples
`train_sample.json` / `dev_distractor_sample.json`) and writes array_record shards that
`tfds.data_source` reads by random access. Nothing here needs TensorFlow: features are
flat (a ragged list of lists would need TF to serialize), so each context is stored as
paragraph titles, a sentence count per paragraph and the concatenated sentences.

Usage:
    examples = load('train', manual_dir='/path/to/hotpotqa', tfds_data_dir='/tmp/tfds')
or, once prepared:
    ds = tfds.data_source('vermem_hotpotqa', data_dir='/tmp/tfds', split='validation')

The prepared dataset records which source files (name and size) it was built from; load()
refuses a prepared dataset built from different files (use another `tfds_data_dir`).
Records are shuffled on disk by TFDS; each carries its position in the source file and
`load` returns Examples in source order, identical to `hotpotqa.load_examples('json')`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Mapping

import numpy as np

from vermem_jax.envs import hotpotqa

DATASET_NAME = "vermem_hotpotqa"
FILE_FORMAT = "array_record"
_TFDS_SPLIT = {hotpotqa.TRAIN: "train", hotpotqa.VALIDATION: "validation"}


def _tfds():
  """`tensorflow_datasets`, imported on first use: it is the optional `tfds` extra and
  slow to import, and only the tfds source needs it."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("source='tfds' needs the optional tfds extra "
                      "(pip install -e '.[tfds]'); use source='json' otherwise "
                      f"({e})") from e
  return tfds


def _source_files(manual_dir: str) -> dict[str, str]:
  """split -> path of the JSON files present in manual_dir."""
  out = {}
  for split in (hotpotqa.TRAIN, hotpotqa.VALIDATION):
    try:
      out[split] = hotpotqa.find_split_file(split, manual_dir)
    except FileNotFoundError:
      pass
  return out


def _fingerprint(files: Mapping[str, str]) -> dict[str, str]:
  return {split: f"{os.path.basename(p)}:{os.path.getsize(p)}"
          for split, p in sorted(files.items())}


@functools.cache
def builder_class() -> type:
  """The TFDS builder class `VermemHotpotqa` (defined once, on first use).

  It subclasses `tfds.core.GeneratorBasedBuilder`, so defining it imports
  `tensorflow_datasets`; that happens here, not when this module is imported.

  Raises:
    ImportError: the optional `tfds` extra is not installed (the message says so).
  """
  tfds = _tfds()
  from etils import epath  # pylint: disable=import-outside-toplevel  (comes with tfds)

  class VermemHotpotqa(tfds.core.GeneratorBasedBuilder):
    """HotpotQA (distractor setting) from local official-format JSON files."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Official HotpotQA layout, flat features, array_record."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Place hotpot_train_v1.1.json and/or hotpot_dev_distractor_v1.json (from "
        "https://hotpotqa.github.io/) or the samples train_sample.json / "
        "dev_distractor_sample.json in the manual dir.")

    # TFDS 4.9 locates a builder's source through `importlib_resources` (an undeclared
    # dependency) for classes inside packages; this file is its own code path.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
      return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
      text = tfds.features.Text()
      return tfds.core.DatasetInfo(
          builder=self,
          description="HotpotQA distractor-setting questions in the official layout.",
          features=tfds.features.FeaturesDict({
              "index": np.int64,  # Position in the source file (restores file order).
              "id": text,
              "question": text,
              "answer": text,
              "type": text,
              "level": text,
              "supporting_facts_title": tfds.features.Sequence(text),
              "supporting_facts_sent_id": tfds.features.Sequence(np.int64),
              "context_title": tfds.features.Sequence(text),
              "context_num_sentences": tfds.features.Sequence(np.int64),
              "context_sentences": tfds.features.Sequence(text),
          }),
          supervised_keys=None,
          homepage="https://hotpotqa.github.io/",
          metadata=tfds.core.MetadataDict(),
      )

    def _split_generators(self, dl_manager):
      files = _source_files(os.fspath(dl_manager.manual_dir))
      if not files:
        raise FileNotFoundError(
            f"no HotpotQA JSON files in manual dir {dl_manager.manual_dir}. "
            + self.MANUAL_DOWNLOAD_INSTRUCTIONS)
      self.info.metadata["source_files"] = _fingerprint(files)
      return {_TFDS_SPLIT[s]: self._generate_examples(p) for s, p in files.items()}

    def _generate_examples(self, path: str):
      for i, row in enumerate(hotpotqa.read_json_rows(path)):
        # Validate through the same code as the JSON source so bad rows fail identically.
        ex = hotpotqa.example_from_json_row(row)
        yield i, example_to_features(ex, i)

  return VermemHotpotqa


def example_to_features(ex: hotpotqa.Example, index: int) -> dict[str, Any]:
  """Flat feature dict of one Example (see module docstring)."""
  return {
      "index": index,
      "id": ex.id,
      "question": ex.question,
      "answer": ex.answer,
      "type": ex.type,
      "level": ex.level,
      "supporting_facts_title": [t for t, _ in ex.supporting_facts],
      "supporting_facts_sent_id": [s for _, s in ex.supporting_facts],
      "context_title": [p.title for p in ex.context],
      "context_num_sentences": [len(p.sentences) for p in ex.context],
      "context_sentences": [s for p in ex.context for s in p.sentences],
  }


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def example_from_features(record: Mapping[str, Any]) -> hotpotqa.Example:
  """Inverse of `example_to_features` on a decoded data-source record.

  Raises:
    ValueError: when the sentence counts do not match the stored sentences.
  """
  row_id = _text(record["id"])
  counts = [int(n) for n in record["context_num_sentences"]]
  sentences = [_text(s) for s in record["context_sentences"]]
  titles = [_text(t) for t in record["context_title"]]
  if sum(counts) != len(sentences) or len(counts) != len(titles):
    raise ValueError(f"corrupt TFDS HotpotQA record _id={row_id!r}: field "
                     f"'context_num_sentences' does not match the stored sentences")
  paragraphs, start = [], 0
  for title, n in zip(titles, counts):
    paragraphs.append(hotpotqa.Paragraph(title, tuple(sentences[start:start + n])))
    start += n
  return hotpotqa.Example(
      id=row_id,
      question=_text(record["question"]),
      answer=_text(record["answer"]),
      type=_text(record["type"]),
      level=_text(record["level"]),
      supporting_facts=tuple(
          (_text(t), int(s)) for t, s in zip(record["supporting_facts_title"],
                                             record["supporting_facts_sent_id"])),
      context=tuple(paragraphs))


def prepare(manual_dir: str, tfds_data_dir: str | None = None) -> Any:
  """Builds (once) the array_record dataset from `manual_dir`; returns the builder
  (a `builder_class()` instance).

  Raises:
    ValueError: the prepared data in `tfds_data_dir` came from other source files.
    FileNotFoundError: no split file in `manual_dir`.
  """
  builder = builder_class()(data_dir=tfds_data_dir, file_format=FILE_FORMAT)
  builder.download_and_prepare(
      download_config=_tfds().download.DownloadConfig(manual_dir=manual_dir))
  built_from = dict(builder.info.metadata.get("source_files", {}))
  current = _fingerprint(_source_files(manual_dir))
  if built_from != current:
    raise ValueError(
        f"TFDS data in {builder.data_dir} was prepared from {built_from}, but the manual "
        f"dir {manual_dir} holds {current}; use a different tfds_data_dir")
  return builder


def load(split: str, *, manual_dir: str,
         tfds_data_dir: str | None = None) -> list[hotpotqa.Example]:
  """Examples of one split in source-file order, read with `tfds.data_source`.

  Prepares the dataset first if `tfds_data_dir` does not hold it yet.
  """
  split = hotpotqa.canonical_split(split)
  builder = prepare(manual_dir, tfds_data_dir)
  tfds_split = _TFDS_SPLIT[split]
  if tfds_split not in builder.info.splits:
    raise FileNotFoundError(f"no HotpotQA {split} file was in manual dir {manual_dir}")
  source = _tfds().data_source(DATASET_NAME, split=tfds_split,
                            data_dir=builder.data_dir_root)
  records = [source[i] for i in range(len(source))]
  records.sort(key=lambda r: int(r["index"]))
  return [example_from_features(r) for r in records]
