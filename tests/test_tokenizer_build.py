"""The packaged small-vocabulary SentencePiece tokenizer (vermem_jax/tokenizer_build.py):
a rebuild from the shared HotpotQA data is byte-identical, and the model has the
properties the rest of the code relies on (single-token markers, byte fallback, exact
round trips, the splits_after_newline count identity)."""

import random

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from vermem_jax import paths
from vermem_jax import tokenization
from vermem_jax import tokenizer_build
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax.memory import token_count
from vermem_jax.rl import policy


@pytest.fixture(scope='module')
def tok():
  return tokenization.load_tokenizer(paths.packaged_tokenizer())


def test_rebuild_is_byte_identical_to_the_packaged_model(data_dir, tmp_path):
  with open(paths.packaged_tokenizer(), 'rb') as f:
    packaged = f.read()
  out = tmp_path / 'sp.model'
  assert tokenizer_build.main(['--data_dir', data_dir, '--output', str(out)]) == 0
  rebuilt = out.read_bytes()
  assert rebuilt == packaged, (
      'the packaged tokenizer is stale: run `python -m vermem_jax.tokenizer_build` and '
      'commit vermem_jax/assets/hotpotqa_sp4k.model')


def test_corpus_has_no_internal_dev_question(data_dir):
  from vermem_jax.envs import episodes  # pylint: disable=g-import-not-at-top
  from vermem_jax.envs import hotpotqa  # pylint: disable=g-import-not-at-top
  construction, dev = episodes.load_pools(
      hotpotqa.DataConfig(hotpotqa_dir=paths.hotpotqa_dir(data_dir)))
  texts = tokenizer_build.pool_texts(construction)
  assert len(texts) == sum(1 + len(ex.context) for ex in construction)
  questions = {t for t in texts}
  assert not [ex.question for ex in dev if ex.question in questions]


def test_special_pieces_and_ids(tok):
  assert tok.vocab_size == tokenizer_build.VOCAB_SIZE
  assert tok.pad_token_id == tokenizer_build.PAD_ID
  assert tok.eos_token_id == tok.token_to_id('<|im_end|>')
  assert tok.stop_token_ids == tuple(sorted({tok.token_to_id('<|im_end|>'),
                                             tok.token_to_id('<|endoftext|>')}))
  for symbol in tokenizer_build.USER_DEFINED_SYMBOLS:
    assert len(tok.encode(symbol)) == 1, symbol
  # A command's first token is its tool (or ∅), whatever follows.
  assert tok.encode('Add(content="x", source_refs=["a:c1"])')[0] == tok.token_to_id('Add(')
  assert tok.encode('∅') == [tok.token_to_id('∅')]
  # The chat template renders markers that encode as single tokens.
  ids = policy.policy_prompt_ids(tok, 'x')
  assert ids[0] == tok.token_to_id('<|im_start|>')
  assert policy.command_target_ids(tok, '∅') == [tok.token_to_id('∅'), tok.eos_token_id]


def test_byte_fallback_and_round_trip(tok):
  text = 'Émile Zola (1840–1902) 😀 ∅ Ω\tx\n\n  y'
  ids = tok.encode(text)
  assert 1 not in ids  # never <unk>
  assert tok.decode(ids) == text
  assert tok.decode(tok.encode('<|im_start|>user\nq<|im_end|>'),
                    skip_special_tokens=True) == 'user\nq'


def test_declares_splits_after_newline(tok):
  assert tok.splits_after_newline
  assert token_count.splits_after_newline(tok.count_tokens)


_ALPHABET = list('ab cdeTh"[]:#019 \t∅éΩ😀\n') + ['<|im_end|>', ' the', 'Add(', 'Filter(']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_ALPHABET), max_size=12),
       st.lists(st.sampled_from(_ALPHABET), max_size=12))
def test_count_identity_behind_splits_after_newline(a, b):
  tok_ = tokenization.load_tokenizer(paths.packaged_tokenizer())
  a, b = ''.join(a), ''.join(b)
  count = tok_.count_tokens
  assert count(a + '\n' + b) == count(a + '\n') + count(b) == count(a) + 1 + count(b)


def test_the_proof_premises_are_checked(tmp_path):
  """A model trained with a dummy prefix (or without the newline piece) is not
  declared."""
  texts = ['the cat sat on the mat\nand the dog\n'] * 20 + [
      'Add(content="x") ∅ <|im_end|>'] * 5
  plain = tokenizer_build.train_model(texts, vocab_size=300)
  assert tokenization.sentencepiece_splits_after_newline(plain)
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=buf,
                                 vocab_size=300, model_type='bpe', byte_fallback=True,
                                 minloglevel=2, num_threads=1)
  assert not tokenization.sentencepiece_splits_after_newline(buf.getvalue())
  assert not tokenization.sentencepiece_splits_after_newline(b'not a model')


def test_g_of_s_fits_its_limit_with_the_declared_counter(tok, data_dir):
  """Serialization sums per-line counts for a declared counter; the rendered x_t still
  counts within the limit when recounted whole."""
  construction, dev = episodes.load_pools(
      hotpotqa.DataConfig(hotpotqa_dir=paths.hotpotqa_dir(data_dir)))
  cfg = sft_config.SFTDataConfig(train_per_target=2, dev_per_target=1, context_budget=320,
                               policy_input_limit=640)
  train, _, _ = sft_build.build_sft_set(construction, dev, count_tokens=tok.count_tokens,
                                       config=cfg, verbose=False)
  rng = random.Random(0)
  for rec in rng.sample(train, 6):
    assert len(tok.encode(rec.policy_input)) <= 640
