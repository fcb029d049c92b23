"""Tests for vermem_jax.tokenization against the known Qwen ids (shared tokenizer README)
and a SentencePiece model trained here on HotpotQA sample sentences."""

import pytest

from vermem_jax import paths
from vermem_jax import tokenization
from vermem_jax.tokenization import load_tokenizer

# Reference values from data/tokenizers/README.md (checked there with transformers 4.46.3
# and 5.24.0).
HELLO_WORLD_IDS = [9707, 1879]
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello world"},
]
CHAT_TEXT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
             "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n")
CHAT_IDS = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644,
            872, 198, 9707, 1879, 151645, 198, 151644, 77091, 198]
ENDOFTEXT, IM_START, IM_END, THINK, END_THINK = 151643, 151644, 151645, 151667, 151668


def _hotpot_sentences(raw_rows, limit):
  rows = raw_rows("train")
  out = []
  for row in rows:
    for _, sents in row["context"]:
      for s in sents:
        s = s.strip()
        if s:
          out.append(s)
        if len(out) >= limit:
          return out
  return out


@pytest.fixture(scope="module")
def qwen25(qwen25_tokenizer_dir):
  return load_tokenizer(qwen25_tokenizer_dir)


@pytest.fixture(scope="module")
def qwen3(data_dir):
  return load_tokenizer(paths.tokenizer_dir("qwen3", data_dir))


@pytest.fixture(scope="module")
def sentences(raw_rows):
  return _hotpot_sentences(raw_rows, 400)


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory, sentences):
  spm = pytest.importorskip("sentencepiece")
  d = tmp_path_factory.mktemp("spm")
  corpus = d / "corpus.txt"
  corpus.write_text("\n".join(sentences[:300]) + "\n")
  prefix = str(d / "hotpot")
  spm.SentencePieceTrainer.Train(
      input=str(corpus), model_prefix=prefix, vocab_size=800, model_type="unigram",
      character_coverage=0.9995, byte_fallback=True,
      normalization_rule_name="identity", remove_extra_whitespaces=False,
      user_defined_symbols=["<|im_start|>", "<|im_end|>"], num_threads=1,
      minloglevel=2)
  return prefix + ".model"


def test_qwen25_known_ids(qwen25):
  assert isinstance(qwen25, tokenization.HFTokenizer)
  assert qwen25.encode("Hello world") == HELLO_WORLD_IDS
  assert qwen25.count_tokens("Hello world") == 2
  assert qwen25.decode(HELLO_WORLD_IDS) == "Hello world"
  text = qwen25.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True)
  assert text == CHAT_TEXT
  assert qwen25.encode(text) == CHAT_IDS
  assert qwen25.count_tokens(text) == len(CHAT_IDS)
  no_prompt = qwen25.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=False)
  assert no_prompt == CHAT_TEXT[: -len("<|im_start|>assistant\n")]


def test_qwen25_special_ids(qwen25):
  assert qwen25.eos_token_id == IM_END
  assert qwen25.pad_token_id == ENDOFTEXT
  assert qwen25.stop_token_ids == (ENDOFTEXT, IM_END)
  assert qwen25.vocab_size == 151665
  assert qwen25.token_to_id("<|im_start|>") == IM_START
  assert qwen25.token_to_id("<definitely-not-a-token>") is None
  assert qwen25.decode(CHAT_IDS, skip_special_tokens=True).startswith("system\n")


def test_qwen3_folder(qwen3):
  assert qwen3.encode("Hello world") == HELLO_WORLD_IDS
  assert qwen3.vocab_size == 151669
  assert qwen3.eos_token_id == IM_END
  assert qwen3.pad_token_id == ENDOFTEXT
  assert qwen3.stop_token_ids == (ENDOFTEXT, IM_END)
  text = qwen3.apply_chat_template(CHAT_MESSAGES, enable_thinking=False)
  assert text == CHAT_TEXT + "<think>\n\n</think>\n\n"
  assert qwen3.encode(text) == CHAT_IDS + [THINK, 271, END_THINK, 271]


def test_hf_round_trip_and_batch(qwen25, sentences):
  texts = sentences[:50] + ["Zürich — 3.5 km², 1990–2001 ✓", "  two  spaces\n\ttab", ""]
  batch = qwen25.encode_batch(texts)
  for text, ids in zip(texts, batch):
    assert ids == qwen25.encode(text)
    # Independent path: the transformers tokenizer's own __call__.
    assert ids == qwen25.hf(text, add_special_tokens=False)["input_ids"]
    assert qwen25.decode(ids) == text
    assert qwen25.count_tokens(text) == len(ids)
  # Counting twice (memoised) gives the same answer; long texts bypass the memo.
  long_text = " ".join(sentences[:200])
  assert len(long_text) > tokenization.COUNT_CACHE_MAX_CHARS
  assert qwen25.count_tokens(long_text) == len(qwen25.encode(long_text))
  assert qwen25.count_tokens(texts[0]) == len(batch[0])
  assert qwen25(texts[0]) == len(batch[0])


def test_count_tokens_rejects_non_str(qwen25):
  with pytest.raises(TypeError, match="expects str"):
    qwen25.count_tokens(["Hello"])


def test_chat_template_rejects_bad_messages(qwen25):
  with pytest.raises(ValueError, match="role"):
    qwen25.apply_chat_template([{"content": "no role"}])
  with pytest.raises(ValueError, match="list"):
    qwen25.apply_chat_template("Hello")


def test_sentencepiece_round_trip(sp_model, sentences):
  tok = load_tokenizer(sp_model)
  assert isinstance(tok, tokenization.SentencePieceTokenizer)
  assert tok.vocab_size == 800
  # Held-out sentences (not in the training corpus) and characters outside it
  # (byte fallback) must survive encode -> decode.
  texts = sentences[300:340] + ["Zürich — 3.5 km², 1990–2001 ✓"]
  batch = tok.encode_batch(texts)
  for text, ids in zip(texts, batch):
    assert ids == tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.count_tokens(text) == len(ids)
  # Subword units: fewer tokens than characters on ordinary prose.
  assert sum(map(len, batch[:-1])) < 0.6 * sum(map(len, texts[:-1]))


def test_sentencepiece_specials_and_chat(sp_model):
  tok = load_tokenizer(sp_model)
  eos = tok.sp.eos_id()
  im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
  assert eos >= 0 and im_start is not None and im_end is not None
  assert tok.eos_token_id == eos
  assert tok.pad_token_id == eos  # trained without a pad piece
  assert tok.stop_token_ids == tuple(sorted({eos, im_end}))
  assert tok.token_to_id("<|endoftext|>") is None
  text = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True)
  # The fallback renders the same ChatML layout as Qwen2.5's template here.
  assert text == CHAT_TEXT
  ids = tok.encode(text)
  assert ids.count(im_start) == 3 and ids.count(im_end) == 2
  assert tok.decode(ids) == text
  assert tok.apply_chat_template(CHAT_MESSAGES[1:], add_generation_prompt=False) == (
      "<|im_start|>user\nHello world<|im_end|>\n")


def test_load_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_tokenizer(tmp_path / "missing")
  bad_file = tmp_path / "vocab.txt"
  bad_file.write_text("hello\n")
  with pytest.raises(ValueError, match="not a SentencePiece"):
    load_tokenizer(bad_file)
  corrupt = tmp_path / "broken.model"
  corrupt.write_bytes(b"\x00\x01not a protobuf")
  with pytest.raises(ValueError, match="broken.model"):
    load_tokenizer(corrupt)
  empty = tmp_path / "empty_dir"
  empty.mkdir()
  with pytest.raises(ValueError, match="empty_dir"):
    load_tokenizer(empty)


def test_qwen_tokenizer_declares_newline_split_for_fast_policy_render(qwen25_tokenizer_dir):
  """g(s) takes its per-line fast path only for counters that declare the property."""
  from vermem_jax.memory import token_count as tc
  tok = load_tokenizer(qwen25_tokenizer_dir)
  assert tok.splits_after_newline is True
  a, b = "Retrieve(query=\"x\")  ", "[c3] Paris is 2,140 km away."
  assert tok.count_tokens(a + "\n" + b) == tok.count_tokens(a + "\n") + tok.count_tokens(b)
  assert tc.tokenizer_json_splits_after_newline({"model": {"type": "WordPiece"}}) is False


def test_folder_without_tokenizer_files_names_what_is_missing(tmp_path):
  """A model folder saved without its tokenizer: a one-line error, not transformers'."""
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(ValueError, match=r"holds none of .*tokenizer\.json"):
    load_tokenizer(tmp_path)
  with pytest.raises(ValueError, match="holds none of"):
    tokenization.check_tokenizer_path(tmp_path)


class _FakeModelConfig:
  def __init__(self, vocab_size):
    self.vocab_size = vocab_size


def test_tokenizer_model_compat(qwen25, sp_model):
  # Qwen2.5: 151,665 tokenizer ids fit the 151,936-row embedding table.
  assert qwen25.vocab_size == 151665
  tokenization.check_tokenizer_model_compat(qwen25, _FakeModelConfig(151936))
  tokenization.check_tokenizer_model_compat(qwen25, _FakeModelConfig(151665))
  # One row short: the last added token (151664) would index past the table.
  with pytest.raises(ValueError, match=r"has 151665 ids but the model's vocab_size "
                     r"\(embedding rows\) is 151664"):
    tokenization.check_tokenizer_model_compat(qwen25, _FakeModelConfig(151664))
  # A Qwen tokenizer with a small custom model: eos / pad are out of range too.
  with pytest.raises(ValueError, match=r"special ids out of range: .*eos_token_id': 151645"):
    tokenization.check_tokenizer_model_compat(qwen25, _FakeModelConfig(1000))
  sp = load_tokenizer(sp_model)  # 800 pieces
  tokenization.check_tokenizer_model_compat(sp, _FakeModelConfig(800))
  with pytest.raises(ValueError, match="has 800 ids"):
    tokenization.check_tokenizer_model_compat(sp, _FakeModelConfig(799))
