"""HotpotQA examples: the row formats, split files, evidence units and the 90/10 split.

One `Example` type comes out of every source (`hotpotqa_sources.load_examples` picks
one):

- `source='json'`: the official files (`hotpot_train_v1.1.json`,
  `hotpot_dev_distractor_v1.json`) or the repository's samples (`train_sample.json`,
  `dev_distractor_sample.json`, packaged as `.json.xz`). By default the folder
  `paths.hotpotqa_dir()` is searched, official names first. To use the full dataset,
  either put the official files in a folder (`experiments/download_data.py`) and pass
  `data_dir=<folder>` (config: `config.data.hotpotqa_dir`), or pass `path=<file>` for
  one explicit file.
- `source='tfds'`: the TFDS builder in `tfds_hotpotqa.py`, prepared from the same files
  (the builder's manual dir) as array_record and read with `tfds.data_source`. No
  TensorFlow is needed.
- `source='hf'`: `datasets.load_dataset("hotpot_qa", "distractor")`, imported lazily;
  `datasets` is an optional dependency.

Real-data quirks that are accepted as the official files have them:
  - contexts with fewer than 10 paragraphs (and paragraphs with no sentences);
  - HTML entities in titles (e.g. `"Tom &amp; Jerry"`): titles are kept byte-for-byte as
    in the source, because supporting facts refer to titles by that exact text, so unit
    ids carry the raw title (`"Tom &amp; Jerry#0"`);
  - the leading space on non-first sentences and odd sentence splits (text kept as is);
  - yes/no answers (comparison questions);
  - supporting facts that do not resolve to a sentence of the context (a known quirk of
    the full train file): they are kept in `Example.supporting_facts`, left out of
    `supporting_unit_ids`, and listed by `unresolved_supporting_facts`;
  - a title repeated in one context: the first paragraph with that title owns the unit
    ids (ids must be unique within a task).

A row that is malformed (missing field, wrong type) raises `ValueError` naming its `_id`
and the field.

Source: HotpotQA (Yang et al., EMNLP 2018) data format; SPEC §4 (evidence units, 90/10
split), paper Appendix C.1 (splits).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import lzma
import os
from typing import Any, Iterable, Mapping, Sequence

from vermem_jax import config_util
from vermem_jax import paths

# The two HotpotQA splits this project uses (SPEC §4, §7): the train split feeds SFT and
# RL construction; the official dev distractor split is the held-out evaluation.
TRAIN = "train"
VALIDATION = "validation"
_SPLIT_ALIASES = {
    "train": TRAIN,
    "validation": VALIDATION,
    "dev": VALIDATION,
    "dev_distractor": VALIDATION,
}

# File names searched (first match wins): official release names, then the samples.
SPLIT_FILES = {
    TRAIN: ("hotpot_train_v1.1.json", "train_sample.json"),
    VALIDATION: ("hotpot_dev_distractor_v1.json", "dev_distractor_sample.json"),
}

# Suffix of an xz-compressed JSON file (the packaged samples: vermem_jax/assets/hotpotqa).
XZ_SUFFIX = ".xz"

SOURCES = ("json", "tfds", "hf")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where HotpotQA comes from and how the train ids are split (config section `data`).

  Attributes:
    source: 'json' | 'tfds' | 'hf'.
    data_dir: shared data root (None: `paths.default_data_dir()`).
    hotpotqa_dir: folder with the JSON files (also the TFDS manual dir); None means
      `paths.hotpotqa_dir(data_dir)`. Point it at a folder holding the official
      `hotpot_train_v1.1.json` / `hotpot_dev_distractor_v1.json` for the full data.
    tfds_data_dir: where the TFDS builder writes array_record files; None means the
      TFDS default (`~/tensorflow_datasets` or $TFDS_DATA_DIR).
    dev_fraction: share of train question ids in the internal-dev pool (SPEC §4: 10%).
    split_seed: salt of the id hash that assigns the pools (any fixed integer).
  """
  source: str = "json"
  data_dir: str | None = None
  hotpotqa_dir: str | None = None
  tfds_data_dir: str | None = None
  dev_fraction: float = 0.1  # SPEC §4: 90% construction / 10% internal dev.
  split_seed: int = 0

  def __post_init__(self):
    if self.source not in SOURCES:
      raise ValueError(f"DataConfig.source={self.source!r}; expected one of {SOURCES}")
    # 1.0 would leave no construction pool (nothing to train on).
    if (isinstance(self.dev_fraction, bool) or
        not isinstance(self.dev_fraction, (int, float)) or
        not 0.0 <= self.dev_fraction < 1.0):
      raise ValueError(f"DataConfig.dev_fraction must be in [0, 1), got "
                       f"{self.dev_fraction!r}")
    if isinstance(self.split_seed, bool) or not isinstance(self.split_seed, int):
      raise ValueError(f"DataConfig.split_seed must be an int, got {self.split_seed!r}")

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "DataConfig":
    """From a config section (dict-like), ignoring keys this class lacks."""
    return config_util.dataclass_from_mapping(cls, section)

  @property
  def resolved_hotpotqa_dir(self) -> str:
    return self.hotpotqa_dir or paths.hotpotqa_dir(self.data_dir)


@dataclasses.dataclass(frozen=True)
class Paragraph:
  """One context paragraph: its title (raw text) and its sentences."""
  title: str
  sentences: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Example:
  """One HotpotQA question in the distractor setting.

  `supporting_facts` and `answer` are labels: they are never shown to the memory policy
  (SPEC §4); only rewards, scenario construction, the oracle reader and evaluation read
  them.
  """
  id: str
  question: str
  answer: str
  type: str
  level: str
  supporting_facts: tuple[tuple[str, int], ...]
  context: tuple[Paragraph, ...]


@dataclasses.dataclass(frozen=True)
class EvidenceUnit:
  """One context sentence, the unit of evidence (SPEC §4): id `"{title}#{sent_id}"`."""
  id: str
  title: str
  sent_id: int
  text: str


def unit_id(title: str, sent_id: int) -> str:
  """Evidence-unit id `"{title}#{sent_id}"` (title as in the source, entities and all)."""
  return f"{title}#{sent_id}"


def parse_unit_id(uid: str) -> tuple[str, int]:
  """Inverse of `unit_id`; titles may themselves contain '#'. Raises ValueError."""
  title, sep, num = uid.rpartition("#")
  if not sep or not num.isdigit():
    raise ValueError(f"not an evidence-unit id (expected 'title#n'): {uid!r}")
  return title, int(num)


def evidence_units(example: Example) -> tuple[EvidenceUnit, ...]:
  """All sentences of the context as evidence units, in context order.

  A repeated title keeps the ids of its first paragraph; later paragraphs with the same
  title are skipped so ids stay unique within the task.
  """
  units = []
  seen_titles = set()
  for para in example.context:
    if para.title in seen_titles:
      continue
    seen_titles.add(para.title)
    for i, text in enumerate(para.sentences):
      units.append(EvidenceUnit(unit_id(para.title, i), para.title, i, text))
  return tuple(units)


def _unit_index(example: Example) -> dict[str, EvidenceUnit]:
  return {u.id: u for u in evidence_units(example)}


def supporting_unit_ids(example: Example) -> tuple[str, ...]:
  """Unit ids of the supporting facts that resolve to a context sentence (label; never
  shown to the policy), in annotation order, without duplicates."""
  index = _unit_index(example)
  out = []
  for title, sent_id in example.supporting_facts:
    uid = unit_id(title, sent_id)
    if uid in index and uid not in out:
      out.append(uid)
  return tuple(out)


def unresolved_supporting_facts(example: Example) -> tuple[tuple[str, int], ...]:
  """Supporting facts whose paragraph or sentence is absent from the context."""
  index = _unit_index(example)
  return tuple((t, s) for t, s in example.supporting_facts
               if unit_id(t, s) not in index)


# ---------------------------------------------------------------------------------------
# Row validation / conversion.


def _row_error(row_id: Any, field: str, problem: str) -> ValueError:
  return ValueError(f"malformed HotpotQA row _id={row_id!r}: field {field!r} {problem}")


def _need_key(row: Mapping[str, Any], key: str, row_id: Any) -> Any:
  if key not in row:
    raise _row_error(row_id, key, "is missing")
  return row[key]


def _need_str(row: Mapping[str, Any], key: str, row_id: Any) -> str:
  value = _need_key(row, key, row_id)
  if not isinstance(value, str):
    raise _row_error(row_id, key, f"must be a string, got {type(value).__name__}")
  return value


def _need_list(value: Any, field: str, row_id: Any) -> Sequence[Any]:
  if not isinstance(value, (list, tuple)):
    raise _row_error(row_id, field, f"must be a list, got {type(value).__name__}")
  return value


def _row_fields(row: Any, id_key: str, expected: str) -> tuple[Any, dict[str, str]]:
  """(row id, the string fields id/question/answer/type/level) of one raw row."""
  if not isinstance(row, Mapping):
    raise ValueError(f"malformed HotpotQA row: expected {expected}, got "
                     f"{type(row).__name__}")
  row_id = row.get(id_key)
  fields = {"id": _need_str(row, id_key, row_id)}
  for key in ("question", "answer", "type", "level"):
    fields[key] = _need_str(row, key, row_id)
  return row_id, fields


def _need_pairs(items: Sequence[Any], field: str, shape: str, row_id: Any
                ) -> list[tuple[Any, Any]]:
  """`items` as 2-tuples; each must be a 2-element list (`shape` names the layout)."""
  pairs = []
  for i, pair in enumerate(items):
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
      raise _row_error(row_id, f"{field}[{i}]", f"must be {shape}")
    pairs.append(tuple(pair))
  return pairs


def _sent_id(value: Any, field: str, row_id: Any) -> int:
  # bool is an int subclass; a JSON true/false here is a corrupt row.
  if isinstance(value, bool) or not isinstance(value, int) and not (
      hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu"):
    raise _row_error(row_id, field, f"must be an integer, got {value!r}")
  value = int(value)
  if value < 0:
    raise _row_error(row_id, field, f"must be >= 0, got {value}")
  return value


def _build_example(row_id: Any, fields: Mapping[str, Any],
                   sf_pairs: Iterable[tuple[Any, Any]],
                   ctx_pairs: Iterable[tuple[Any, Any]], id_field: str = "_id"
                   ) -> Example:
  """Validates already-split fields; shared by the official and HF layouts."""
  supporting = []
  for i, (title, sent) in enumerate(sf_pairs):
    if not isinstance(title, str):
      raise _row_error(row_id, f"supporting_facts[{i}].title", "must be a string")
    supporting.append((title, _sent_id(sent, f"supporting_facts[{i}].sent_id", row_id)))
  # An empty question or id gives a task the policy cannot act on (and ids key the
  # 90/10 split); the official files have none, so such a row is corrupt.
  for key, name in (("id", id_field), ("question", "question")):
    if not fields[key].strip():
      raise _row_error(row_id, name, "is empty")
  context = []
  for i, (title, sentences) in enumerate(ctx_pairs):
    if not isinstance(title, str):
      raise _row_error(row_id, f"context[{i}].title", "must be a string")
    sentences = _need_list(sentences, f"context[{i}].sentences", row_id)
    for j, s in enumerate(sentences):
      if not isinstance(s, str):
        raise _row_error(row_id, f"context[{i}].sentences[{j}]", "must be a string")
    context.append(Paragraph(title, tuple(sentences)))
  return Example(
      id=fields["id"], question=fields["question"], answer=fields["answer"],
      type=fields["type"], level=fields["level"],
      supporting_facts=tuple(supporting), context=tuple(context))


def example_from_json_row(row: Mapping[str, Any]) -> Example:
  """Converts one row of the official JSON layout.

  Layout: {_id, question, answer, type, level, supporting_facts: [[title, sent_id], ...],
  context: [[title, [sentence, ...]], ...]}.

  Raises:
    ValueError: naming the row's `_id` and the offending field.
  """
  row_id, fields = _row_fields(row, "_id", "a JSON object")
  sf, ctx = (_need_key(row, key, row_id) for key in ("supporting_facts", "context"))
  sf = _need_list(sf, "supporting_facts", row_id)
  ctx = _need_list(ctx, "context", row_id)
  sf_pairs = _need_pairs(sf, "supporting_facts", "[title, sent_id]", row_id)
  ctx_pairs = _need_pairs(ctx, "context", "[title, [sentences]]", row_id)
  return _build_example(row_id, fields, sf_pairs, ctx_pairs)


def example_from_hf_row(row: Mapping[str, Any]) -> Example:
  """Converts one row of the Hugging Face `hotpot_qa` column layout.

  Layout: {id, question, answer, type, level, supporting_facts: {title: [...],
  sent_id: [...]}, context: {title: [...], sentences: [[...], ...]}}.

  Raises:
    ValueError: naming the row's `id` and the offending field.
  """
  row_id, fields = _row_fields(row, "id", "a mapping")

  def columns(key, a, b):
    col = _need_key(row, key, row_id)
    if not isinstance(col, Mapping) or a not in col or b not in col:
      raise _row_error(row_id, key, f"must be a mapping with {a!r} and {b!r} lists")
    first = _need_list(col[a], f"{key}.{a}", row_id)
    second = _need_list(col[b], f"{key}.{b}", row_id)
    if len(first) != len(second):
      raise _row_error(row_id, key, f"has {len(first)} {a} but {len(second)} {b}")
    return list(zip(first, second))

  sf_pairs = columns("supporting_facts", "title", "sent_id")
  ctx_pairs = columns("context", "title", "sentences")
  return _build_example(row_id, fields, sf_pairs, ctx_pairs, id_field="id")


def example_to_json_row(example: Example) -> dict[str, Any]:
  """The official JSON layout of an Example (inverse of `example_from_json_row`)."""
  return {
      "_id": example.id,
      "question": example.question,
      "answer": example.answer,
      "type": example.type,
      "level": example.level,
      "supporting_facts": [[t, s] for t, s in example.supporting_facts],
      "context": [[p.title, list(p.sentences)] for p in example.context],
  }


# ---------------------------------------------------------------------------------------
# Loading.


def canonical_split(split: str) -> str:
  """'train' | 'validation' (aliases 'dev', 'dev_distractor'). Raises ValueError."""
  try:
    return _SPLIT_ALIASES[split]
  except KeyError:
    raise ValueError(f"unknown HotpotQA split {split!r}; expected one of "
                     f"{sorted(_SPLIT_ALIASES)}") from None


def find_split_file(split: str, data_dir: str | None = None) -> str:
  """Path of the JSON file for `split` in `data_dir` (default `paths.hotpotqa_dir()`).

  Official names are preferred over sample names; each name is also accepted
  xz-compressed (`<name>.xz`, as the package ships its samples), the plain file first.
  Raises FileNotFoundError listing the names searched.
  """
  split = canonical_split(split)
  folder = data_dir or paths.hotpotqa_dir()
  for name in SPLIT_FILES[split]:
    for candidate in (os.path.join(folder, name), os.path.join(folder, name + XZ_SUFFIX)):
      if os.path.isfile(candidate):
        return candidate
  raise FileNotFoundError(
      f"no HotpotQA {split} file in {folder!r} (looked for {SPLIT_FILES[split]}, "
      f"plain or {XZ_SUFFIX}); "
      f"pass data_dir=<folder with the official files> or path=<file>")


def read_json_rows(path: str) -> list[Any]:
  """The list of raw rows of one official-layout JSON file.

  A UTF-8 byte-order mark (files re-saved by some Windows editors) is accepted. A path
  ending in `.xz` is decompressed on the fly (stdlib `lzma`).

  Raises:
    ValueError: not UTF-8, not valid JSON (e.g. a truncated download), not a list, or
      (`.xz`) not a valid xz stream.
  """
  opener = lzma.open if path.endswith(XZ_SUFFIX) else open
  with opener(path, "rt", encoding="utf-8-sig") as f:
    try:
      rows = json.load(f)
    except lzma.LZMAError as e:
      raise ValueError(f"{path}: not a valid xz file ({e})") from e
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e}); a truncated download or copy "
                       "looks like this") from e
    except UnicodeDecodeError as e:
      raise ValueError(f"{path}: not UTF-8 text ({e})") from e
  if not isinstance(rows, list):
    raise ValueError(f"{path}: expected a JSON list of HotpotQA rows, got "
                     f"{type(rows).__name__}")
  return rows


# ---------------------------------------------------------------------------------------
# Construction / internal-dev split of train question ids (SPEC §4).

CONSTRUCTION = "construction"
INTERNAL_DEV = "dev"


def pool_of(question_id: str, *, dev_fraction: float = 0.1, seed: int = 0) -> str:
  """'construction' or 'dev' for one train question id.

  The assignment hashes `"{seed}:{id}"` with SHA-256 (independent of PYTHONHASHSEED and
  of which other ids are present), so a question keeps its pool across runs, file
  subsets and machines. A question's states all derive from its id, so they all stay on
  one side (SPEC §4).
  """
  if not 0.0 <= dev_fraction <= 1.0:
    raise ValueError(f"dev_fraction must be in [0, 1], got {dev_fraction}")
  digest = hashlib.sha256(f"{seed}:{question_id}".encode("utf-8")).digest()
  u = int.from_bytes(digest[:8], "big") / 2.0**64  # uniform in [0, 1)
  return INTERNAL_DEV if u < dev_fraction else CONSTRUCTION


def split_train_pools(examples: Sequence[Example], *, dev_fraction: float = 0.1,
                      seed: int = 0) -> tuple[list[Example], list[Example]]:
  """Splits train examples into (construction pool, internal-dev pool), order kept."""
  construction, dev = [], []
  for ex in examples:
    pool = pool_of(ex.id, dev_fraction=dev_fraction, seed=seed)
    (dev if pool == INTERNAL_DEV else construction).append(ex)
  return construction, dev
