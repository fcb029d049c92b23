"""Tests for vermem_jax.envs.hotpotqa and the TFDS builder (real sample files)."""
import copy
import json
import lzma
import os
import subprocess
import sys

import pytest

from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources as sources

@pytest.fixture(scope="module")
def raw_train(raw_rows):
  return raw_rows("train")


@pytest.fixture(scope="module")
def train(hotpotqa_dir):
  return sources.load_examples("json", "train", data_dir=hotpotqa_dir)


@pytest.fixture(scope="module")
def dev(hotpotqa_dir):
  return sources.load_examples("json", "validation", data_dir=hotpotqa_dir)


def test_every_sample_example_loads(train, dev, raw_train, raw_rows):
  raw_dev = raw_rows("validation")
  assert len(train) == len(raw_train) == 592
  assert len(dev) == len(raw_dev) == 1093
  for raw, ex in zip(raw_train + raw_dev, train + dev):
    assert ex.id == raw["_id"] and ex.answer == raw["answer"]
    assert ex.question == raw["question"]
    # Round trip through the official layout is exact (text kept byte for byte).
    assert hotpotqa.example_to_json_row(ex) == {k: raw[k] for k in raw}
    units = hotpotqa.evidence_units(ex)
    assert len(units) == sum(len(p[1]) for p in raw["context"])
    sup = hotpotqa.supporting_unit_ids(ex)
    assert len(sup) == len(raw["supporting_facts"])
    by_id = {u.id: u for u in units}
    for (title, sent_id), uid in zip(raw["supporting_facts"], sup):
      assert uid == f"{title}#{sent_id}"
      para = dict((p[0], p[1]) for p in raw["context"])[title]
      assert by_id[uid].text == para[sent_id]
  assert not set(e.id for e in train) & set(e.id for e in dev)


def test_quirks_are_kept(train, dev):
  # HTML entities stay in titles and therefore in unit ids.
  with_entity = [e for e in train + dev if any("&amp;" in p.title for p in e.context)]
  assert with_entity
  ex = with_entity[0]
  title = next(p.title for p in ex.context if "&amp;" in p.title)
  assert any(u.id.startswith(title + "#") for u in hotpotqa.evidence_units(ex))
  assert hotpotqa.parse_unit_id(f"{title}#3") == (title, 3)
  # Leading spaces on later sentences, yes/no answers.
  assert any(s.startswith(" ") for p in ex.context for s in p.sentences[1:])
  assert {"yes", "no"} <= {e.answer for e in train + dev}


def test_short_context_dangling_fact_and_repeated_title(raw_train):
  row = copy.deepcopy(raw_train[0])
  gold_titles = {t for t, _ in row["supporting_facts"]}
  # Fewer than 10 paragraphs (only the gold ones) plus an empty paragraph: accepted.
  row["context"] = [p for p in row["context"] if p[0] in gold_titles] + [["Empty", []]]
  row["supporting_facts"] = row["supporting_facts"] + [["Missing title", 0]]
  row["context"].append([row["context"][0][0], ["A different repeated paragraph."]])
  ex = hotpotqa.example_from_json_row(row)
  assert len(ex.context) == 4
  units = hotpotqa.evidence_units(ex)
  assert len({u.id for u in units}) == len(units)
  first = row["context"][0]
  assert [u.text for u in units if u.title == first[0]] == first[1]
  assert hotpotqa.unresolved_supporting_facts(ex) == (("Missing title", 0),)
  assert len(hotpotqa.supporting_unit_ids(ex)) == len(raw_train[0]["supporting_facts"])


@pytest.mark.parametrize("mutate,field", [
    (lambda r: r.pop("answer"), "answer"),
    (lambda r: r.__setitem__("question", None), "question"),
    (lambda r: r.__setitem__("context", "text"), "context"),
    (lambda r: r["context"].__setitem__(2, ["t"]), "context[2]"),
    (lambda r: r["context"][1].__setitem__(1, "one string"), "context[1].sentences"),
    (lambda r: r["context"][0][1].__setitem__(0, 7), "context[0].sentences[0]"),
    (lambda r: r["supporting_facts"].__setitem__(0, ["t", "0"]),
     "supporting_facts[0].sent_id"),
    (lambda r: r["supporting_facts"].__setitem__(0, ["t", True]),
     "supporting_facts[0].sent_id"),
    (lambda r: r["supporting_facts"].__setitem__(1, ["t"]), "supporting_facts[1]"),
])
def test_malformed_row_names_id_and_field(raw_train, mutate, field):
  row = copy.deepcopy(raw_train[3])
  mutate(row)
  with pytest.raises(ValueError) as err:
    hotpotqa.example_from_json_row(row)
  assert raw_train[3]["_id"] in str(err.value)
  assert repr(field) in str(err.value)


def test_malformed_file_row_fails_load(tmp_path, raw_train):
  rows = copy.deepcopy(raw_train[:3])
  del rows[1]["supporting_facts"]
  (tmp_path / "hotpot_train_v1.1.json").write_text(json.dumps(rows))
  with pytest.raises(ValueError, match=rows[1]["_id"]):
    sources.load_examples("json", "train", data_dir=str(tmp_path))
  rows[1] = copy.deepcopy(rows[0])  # duplicate id
  (tmp_path / "hotpot_train_v1.1.json").write_text(json.dumps(rows))
  with pytest.raises(ValueError, match="duplicate"):
    sources.load_examples("json", "train", data_dir=str(tmp_path))


def test_official_file_names_win_and_path_override(tmp_path, raw_train):
  (tmp_path / "train_sample.json").write_text(json.dumps(raw_train[:2]))
  (tmp_path / "hotpot_train_v1.1.json").write_text(json.dumps(raw_train[:5]))
  assert len(sources.load_examples("json", "train", data_dir=str(tmp_path))) == 5
  got = sources.load_examples("json", "train", path=str(tmp_path / "train_sample.json"))
  assert [e.id for e in got] == [r["_id"] for r in raw_train[:2]]
  with pytest.raises(FileNotFoundError, match="hotpot_dev_distractor_v1.json"):
    sources.load_examples("json", "dev", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="split"):
    sources.load_examples("json", "test", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="source"):
    sources.load_examples("csv", "train", data_dir=str(tmp_path))


def test_tfds_matches_json(hotpotqa_dir, train, dev, tmp_path_factory):
  tfds_dir = str(tmp_path_factory.mktemp("tfds"))
  assert "tensorflow" not in sys.modules
  got_train = sources.load_examples("tfds", "train", data_dir=hotpotqa_dir,
                                    tfds_data_dir=tfds_dir)
  got_dev = sources.load_examples("tfds", "validation", data_dir=hotpotqa_dir,
                                  tfds_data_dir=tfds_dir)
  assert got_train == train
  assert got_dev == dev
  assert "tensorflow" not in sys.modules  # TFDS ran without TensorFlow.
  files = os.listdir(os.path.join(tfds_dir, "vermem_hotpotqa", "1.0.0"))
  assert any(".array_record" in f for f in files)


def test_tfds_refuses_data_prepared_from_other_files(hotpotqa_dir, raw_train, tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "train_sample.json").write_text(json.dumps(raw_train[:4]))
  tfds_dir = str(tmp_path / "tfds")
  got = sources.load_examples("tfds", "train", data_dir=str(manual),
                              tfds_data_dir=tfds_dir)
  assert [e.id for e in got] == [r["_id"] for r in raw_train[:4]]
  with pytest.raises(FileNotFoundError):
    sources.load_examples("tfds", "dev", data_dir=str(manual), tfds_data_dir=tfds_dir)
  with pytest.raises(ValueError, match="different tfds_data_dir"):
    sources.load_examples("tfds", "train", data_dir=hotpotqa_dir,
                          tfds_data_dir=tfds_dir)


def test_hf_row_conversion(raw_train, train):
  raw = raw_train[5]
  hf_row = {
      "id": raw["_id"], "question": raw["question"], "answer": raw["answer"],
      "type": raw["type"], "level": raw["level"],
      "supporting_facts": {"title": [t for t, _ in raw["supporting_facts"]],
                           "sent_id": [s for _, s in raw["supporting_facts"]]},
      "context": {"title": [t for t, _ in raw["context"]],
                  "sentences": [s for _, s in raw["context"]]},
  }
  assert hotpotqa.example_from_hf_row(hf_row) == train[5]
  bad = copy.deepcopy(hf_row)
  bad["context"]["sentences"] = bad["context"]["sentences"][:-1]
  with pytest.raises(ValueError, match=f"{raw['_id']}.*'context'"):
    hotpotqa.example_from_hf_row(bad)
  bad = copy.deepcopy(hf_row)
  del bad["supporting_facts"]["sent_id"]
  with pytest.raises(ValueError, match="'supporting_facts'"):
    hotpotqa.example_from_hf_row(bad)


def test_hf_source_needs_datasets_lazily():
  try:
    import datasets  # noqa: F401
  except ImportError:
    with pytest.raises(ImportError, match="datasets"):
      sources.load_examples("hf", "validation")
  else:
    pytest.skip("datasets installed; the hf source would try the network")


def _pools(examples, seed=0):
  cons, dev = hotpotqa.split_train_pools(examples, dev_fraction=0.1, seed=seed)
  return [e.id for e in cons], [e.id for e in dev]


def test_split_disjoint_stable_and_about_ten_percent(train):
  cons, dev = _pools(train)
  assert not set(cons) & set(dev)
  assert sorted(cons + dev) == sorted(e.id for e in train)
  assert 0.06 < len(dev) / len(train) < 0.14  # 59 expected; binomial sd ~7.3
  assert _pools(train) == (cons, dev)
  # A question's pool does not depend on which other questions are present.
  sub_cons, sub_dev = _pools(train[::3])
  assert set(sub_dev) == set(dev) & {e.id for e in train[::3]}
  # A different seed gives a different split.
  assert _pools(train, seed=1)[1] != dev
  assert hotpotqa.pool_of(train[0].id, dev_fraction=0.0) == hotpotqa.CONSTRUCTION
  assert hotpotqa.pool_of(train[0].id, dev_fraction=1.0) == hotpotqa.INTERNAL_DEV
  with pytest.raises(ValueError):
    hotpotqa.pool_of("x", dev_fraction=1.5)


def test_split_stable_across_python_hash_seeds(train, hotpotqa_dir):
  _, dev = _pools(train)
  code = ("import json\nfrom vermem_jax.envs import hotpotqa as h\n"
          "from vermem_jax.envs import hotpotqa_sources as sources\n"
          f"ex = sources.load_examples('json', 'train', data_dir={hotpotqa_dir!r})\n"
          "print(json.dumps([e.id for e in h.split_train_pools(ex)[1]]))\n")
  env = dict(os.environ, PYTHONHASHSEED="12345")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, check=True,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
  assert json.loads(out.stdout) == dev


def test_pools_from_config(train, hotpotqa_dir, data_dir):
  cfg = hotpotqa.DataConfig(data_dir=data_dir, dev_fraction=0.2, split_seed=3)
  assert cfg.resolved_hotpotqa_dir == hotpotqa_dir
  cons, dev = sources.train_pools_from_config(cfg)
  assert ([e.id for e in cons], [e.id for e in dev]) == _pools_with(train, 0.2, 3)


def _pools_with(examples, dev_fraction, seed):
  cons, dev = hotpotqa.split_train_pools(examples, dev_fraction=dev_fraction, seed=seed)
  return [e.id for e in cons], [e.id for e in dev]


def test_bad_files_name_path_and_row(tmp_path, raw_train):
  """Careless-user files: BOM, truncation, wrong top level, bad bytes, empty question."""
  f = tmp_path / "hotpot_train_v1.1.json"
  rows = copy.deepcopy(raw_train[:3])
  # A UTF-8 BOM (editor re-save) is accepted, rows unchanged.
  f.write_bytes(b"\xef\xbb\xbf" + json.dumps(rows).encode("utf-8"))
  got = sources.load_examples("json", "train", data_dir=str(tmp_path))
  assert [e.id for e in got] == [r["_id"] for r in rows]
  f.write_text(json.dumps(rows)[:-40])  # truncated download
  with pytest.raises(ValueError, match=r"hotpot_train_v1\.1\.json: not valid JSON"):
    sources.load_examples("json", "train", data_dir=str(tmp_path))
  f.write_text(json.dumps({"data": rows}))  # a dict, not the official list
  with pytest.raises(ValueError, match="expected a JSON list of HotpotQA rows, got dict"):
    sources.load_examples("json", "train", data_dir=str(tmp_path))
  f.write_bytes(b'[{"_id": "\xff\xfe"}]')  # Latin-1 / binary bytes
  with pytest.raises(ValueError, match=r"hotpot_train_v1\.1\.json: not UTF-8"):
    sources.load_examples("json", "train", data_dir=str(tmp_path))
  # A row without `_id` is named by its position in the file.
  bad = copy.deepcopy(rows)
  del bad[2]["_id"]
  f.write_text(json.dumps(bad))
  with pytest.raises(ValueError, match=r"json: row 2: .*field '_id' is missing"):
    sources.load_examples("json", "train", data_dir=str(tmp_path))
  for key in ("question", "_id"):
    bad = copy.deepcopy(rows)
    bad[1][key] = "  "
    f.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=rf"row 1: .*field '{key}' is empty"):
      sources.load_examples("json", "train", data_dir=str(tmp_path))
  bad = copy.deepcopy(rows)
  bad[0]["answer"] = 1984  # a number where the official files have a string
  f.write_text(json.dumps(bad))
  with pytest.raises(ValueError, match=r"row 0: .*field 'answer' must be a string, got int"):
    sources.load_examples("json", "train", data_dir=str(tmp_path))


@pytest.mark.parametrize("field, value, match", [
    ("source", "csv", r"source='csv'; expected one of \('json', 'tfds', 'hf'\)"),
    ("dev_fraction", 1.5, r"dev_fraction must be in \[0, 1\), got 1.5"),
    ("dev_fraction", 1.0, r"dev_fraction must be in \[0, 1\)"),
    ("split_seed", "7", "split_seed must be an int"),
])
def test_data_config_rejects_bad_values(field, value, match):
  with pytest.raises(ValueError, match=match):
    hotpotqa.DataConfig(**{field: value})


def test_xz_files_load_like_plain_ones_and_plain_wins(raw_train, tmp_path):
  with lzma.open(tmp_path / "train_sample.json.xz", "wt", encoding="utf-8") as f:
    json.dump(raw_train[:3], f)
  got = sources.load_examples("json", "train", data_dir=str(tmp_path))
  assert [e.id for e in got] == [r["_id"] for r in raw_train[:3]]
  (tmp_path / "train_sample.json").write_text(json.dumps(raw_train[3:4]))
  assert hotpotqa.find_split_file("train", str(tmp_path)).endswith("train_sample.json")
  (tmp_path / "hotpot_train_v1.1.json.xz").write_bytes(b"not xz")
  with pytest.raises(ValueError, match=r"hotpot_train_v1\.1\.json\.xz: not a valid xz"):
    sources.load_examples("json", "train", data_dir=str(tmp_path))
