r"""Builds the small-vocabulary SentencePiece tokenizer of the CPU default (DESIGN.md).

    python -m vermem_jax.tokenizer_build                 # rewrites the packaged model
    python -m vermem_jax.tokenizer_build --output=/tmp/sp.model --data_dir=/data

The packaged file `vermem_jax/assets/hotpotqa_sp4k.model` (`paths.packaged_tokenizer`)
is derived data: this module rebuilds it byte for byte from the HotpotQA train split
under the data root (tests/test_tokenizer_build.py checks that). It holds a vocabulary
and merge scores, never HotpotQA text itself.

Corpus (in this order, nothing sampled):
  1. the construction pool (SPEC §4: 90% of the train question ids, the same split the
     trainers use): each question, then each context paragraph as `title: sentences`;
  2. SFT train records of the construction pool (`envs.sft_data`, templates only, seed
     0, CORPUS_RECORDS_PER_TARGET per target), each rendered as the policy sees it: the
     ChatML prompt of x_i, the target command and `<|im_end|>`. They teach the merges of
     the instruction block, the headers, record ids (`<ns>:m3`), `Title#k` evidence refs
     and the command grammar. They are rendered with the whitespace counter
     (`memory.token_count.count_whitespace_tokens`), so the corpus does not depend on
     the tokenizer being built.
The internal-dev pool never enters the corpus.

Model (google/sentencepiece `SentencePieceTrainer`, BPE, VOCAB_SIZE pieces):
  * byte fallback: every UTF-8 byte has a piece, so nothing is ever unknown;
  * digits split into single-digit pieces (numbers and dates copy digit by digit);
  * identity normalization, no dummy prefix, whitespace kept as is: decode(encode(s))
    == s for every string, and a text encodes the same wherever it appears;
  * single pieces for the chat markers `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`,
    the null command `∅`, the newline, the double quote (so a quoted id or text
    tokenizes identically in the state and in a command) and the seven tool names with their parenthesis
    (`Add(`, ..., `Summarize(`): user-defined symbols, never merged with a neighbour
    (what makes `SentencePieceTokenizer.splits_after_newline` true), so a command's
    first token is its tool;
  * pieces may cross spaces and script boundaries (the fixed instruction block and the
    command grammar become a few pieces each);
  * ids: 0 `<pad>`, 1 `<unk>`, no BOS/EOS pieces: `<|im_end|>` ends a turn (the
    tokenizer wrapper's eos), as in the Qwen instruct models.
Training is single-threaded on an in-memory corpus and written through `model_writer`,
so the model bytes depend only on the corpus and these options (the trainer records
no file paths).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import Iterable, Sequence

from vermem_jax.envs.sft_data import records as sft_records
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax import paths
from vermem_jax import tokenization
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import commands
from vermem_jax.memory import token_count

VOCAB_SIZE = 4096
# SFT records per target rendered into the corpus (construction pool only).
CORPUS_RECORDS_PER_TARGET = 48
# Budgets the corpus records are rendered with, in whitespace tokens (the counter of the
# corpus; about the tiny scale's x_t).
CORPUS_CONTEXT_BUDGET = 384
CORPUS_POLICY_INPUT_LIMIT = 768
CORPUS_SEED = 0
NEWLINE = '\n'
# A piece of its own, so whatever stands inside quotes (a record id, an evidence ref, a
# copied sentence) encodes the same in the state, where g(s) quotes it, and in a
# command, where it is quoted too (`source_refs=["c2"]`).
QUOTE = '"'
# Single pieces that BPE never merges with their neighbours: chat markers, the null
# command, the newline and each tool's name with its parenthesis, so the choice of tool
# is the first command token.
USER_DEFINED_SYMBOLS = (('<|im_start|>', '<|im_end|>', '<|endoftext|>', '∅', NEWLINE, QUOTE)
                        + tuple(f'{op}(' for op in commands.LTM_OPS + commands.STM_OPS))
PAD_ID = 0
UNK_ID = 1
# Longest corpus item in bytes (a rendered record is ~5 kB); longer items would be
# skipped silently by the trainer, so `train_model` refuses them instead.
MAX_ITEM_BYTES = 1 << 16


def pool_texts(construction: Sequence[hotpotqa.Example]) -> list[str]:
  """Questions and `title: sentences` paragraphs of the construction pool, in order."""
  out = []
  for ex in construction:
    out.append(ex.question)
    for para in ex.context:
      out.append(f'{para.title}: ' + ' '.join(s.strip() for s in para.sentences))
  return out


def record_texts(records: Iterable[sft_records.SFTRecord]) -> list[str]:
  """Each record as the policy sees it: ChatML prompt of x_i + target + `<|im_end|>`."""
  return [tokenization.render_chatml([{'role': 'user', 'content': r.policy_input}])
          + r.target + '<|im_end|>\n' for r in records]


def corpus(construction: Sequence[hotpotqa.Example],
           dev_pool: Sequence[hotpotqa.Example]) -> list[str]:
  """The training corpus (module docstring); `dev_pool` only satisfies the SFT builder
  (its records are built with dev_per_target=0 and never read)."""
  cfg = sft_config.SFTDataConfig(
      train_per_target=CORPUS_RECORDS_PER_TARGET, dev_per_target=0,
      context_budget=CORPUS_CONTEXT_BUDGET, policy_input_limit=CORPUS_POLICY_INPUT_LIMIT,
      seed=CORPUS_SEED)
  train, _, _ = sft_build.build_sft_set(
      construction, dev_pool, count_tokens=token_count.count_whitespace_tokens,
      config=cfg, verbose=False)
  return pool_texts(construction) + record_texts(train)


def train_model(texts: Sequence[str], vocab_size: int = VOCAB_SIZE) -> bytes:
  """Trains the SentencePiece BPE model on `texts` (module docstring); returns its bytes.

  Raises:
    ValueError: an item longer than MAX_ITEM_BYTES, or an empty corpus.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  if not texts:
    raise ValueError('empty tokenizer corpus')
  for i, t in enumerate(texts):
    if len(t.encode('utf-8')) > MAX_ITEM_BYTES:
      raise ValueError(f'corpus item {i} has {len(t.encode())} bytes > {MAX_ITEM_BYTES}')
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=buf, model_type='bpe',
      vocab_size=int(vocab_size), byte_fallback=True, split_digits=True,
      normalization_rule_name='identity', add_dummy_prefix=False,
      remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
      split_by_whitespace=False, split_by_unicode_script=False,
      user_defined_symbols=list(USER_DEFINED_SYMBOLS), pad_id=PAD_ID, unk_id=UNK_ID,
      bos_id=-1, eos_id=-1, character_coverage=0.9995, num_threads=1,
      input_sentence_size=0, shuffle_input_sentence=False,
      max_sentence_length=MAX_ITEM_BYTES, minloglevel=2)
  return buf.getvalue()


def build(data_dir: str | None = None, vocab_size: int = VOCAB_SIZE) -> bytes:
  """The tokenizer model bytes from the HotpotQA train split under `data_dir`.

  Uses the default split of the trainers (`hotpotqa.DataConfig` defaults: 10% internal
  dev, split seed 0).

  Raises:
    FileNotFoundError / ValueError: what `episodes.load_pools` raises for missing or
      malformed data.
  """
  data = hotpotqa.DataConfig(hotpotqa_dir=paths.hotpotqa_dir(data_dir))
  construction, dev_pool = episodes.load_pools(data)
  return train_model(corpus(construction, dev_pool), vocab_size)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', default=None,
                      help=f'data root (default: ${paths.DATA_DIR_ENV}, ../shared/data, or the '
                           'packaged samples; docs/data.md)')
  parser.add_argument('--output', default=paths.packaged_tokenizer(),
                      help='where to write the .model file')
  parser.add_argument('--vocab_size', type=int, default=VOCAB_SIZE)
  args = parser.parse_args(argv)
  try:
    model = build(args.data_dir, args.vocab_size)
  except (OSError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, 'wb') as f:
    f.write(model)
  print(f'wrote {args.output} ({len(model)} bytes, vocab {args.vocab_size})')
  return 0


if __name__ == '__main__':
  sys.exit(main())
