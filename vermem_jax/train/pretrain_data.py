r"""The pretraining section and its data: tasks, corpus and rows (issue 22).

`PretrainConfig` is the `pretrain` config section typed once (`from_section`;
`run_setup.RunSetup.pretrain`); `build_corpus` and `RowMaker` make the batches that
`train/pretrain.py` trains on and probes with.

Data (construction pool only, SPEC §4: never internal dev, never validation). The
construction pool's paragraphs are split by question: `probe_fraction` of the questions
are held out and serve only the copy probe. The first `copy_only_steps` steps train
'copy' alone; then each batch is one of these tasks (`TASKS`), drawn with the weights
`task_weights`; the loss is the next-token loss on the row's target tokens:

  'text'    a paragraph `title: sentences`; target: every token (language modelling).
  'copy'    `<|endoftext|> noise x \n " x`, x of `copy_min_len..copy_max_len` random
            pieces from the first `alphabet` ids of the vocabulary, the noise prefix of
            0..`copy_max_noise` pieces so the copy's offset varies (no positional
            shortcut); target: the copy's tokens 2..n (its first token can't be known).
            `alphabet` and `copy_max_len` grow linearly from `curriculum_start` of their
            final values to the full values over the first `curriculum_steps` steps.
  'span'    a paragraph, then `\n"` and a span of `span_min..span_max` of its tokens
            from a random offset; target: the span's tokens 2..n.
  'quote'   2..4 records `["<id>" observation] "<sentence>"` as g(s) shows C or H,
            then `quote "<id>": "` and that record's sentence; target: the sentence
            and its closing quote (copy the text cited by an id).
  'cite'    the same records, then `cite "<first words of one sentence>": "` and the
            record's id; target: the id and its closing quote (copy the id of a text).
A row longer than its length is cut at the end (a long 'quote' row loses the end of
its target). Rows of one batch are one task group: 'copy' rows are short
(`copy_seq_len`), the other tasks share `seq_len`, so the jitted step sees two shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from vermem_jax import tokenization
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import serialization

TASKS = ('text', 'copy', 'span', 'quote', 'cite')
# Tokens of the copy probe's spans (`RowMaker.batch(..., probe=True)`).
PROBE_SPAN = 32
# The id kinds and numbers of g(s) records (`c2`, `h11`, `m3`).
_ID_KINDS = ('c', 'h', 'm')
_ID_MAX = 24
_KIND_WORD = {'c': 'observation', 'h': 'observation', 'm': 'v0'}
# Records per 'quote' / 'cite' row and the tokens of each record's text: four records
# of 20 tokens fit a 160-token row with the question.
_RECORDS = (2, 4)
_RECORD_TOKENS = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainConfig:
  """Pretraining settings (the `pretrain` config section; module docstring).

  Attributes:
    steps: optimizer steps.
    batch_size: rows per step.
    seq_len: tokens per row of the text tasks ('text', 'span', 'quote', 'cite').
    copy_seq_len: tokens per row of 'copy'.
    copy_only_steps: the first steps draw only 'copy' (a curriculum: the copy
      mechanism forms there, in a phase change after ~1,000 steps at batch 32).
    task_weights: probability of each task in `TASKS` order (summing to 1) after
      `copy_only_steps`; a step draws one task for its whole batch.
    learning_rate, warmup_steps, weight_decay, adam_b1, adam_b2, adam_eps,
    max_grad_norm: the clipped AdamW (`optim.clipped_adamw`), constant after a linear
      warmup.
    alphabet, copy_min_len, copy_max_len, copy_max_noise: the 'copy' task.
    curriculum_start, curriculum_steps: 'copy' starts at this share of `alphabet` and
      `copy_max_len` and reaches them after `curriculum_steps` steps.
    span_min, span_max: span lengths of the 'span' task (tokens).
    probe_fraction: share of construction-pool questions whose paragraphs are held
      out for the probe.
    probe_rows: rows of each probe measurement.
    max_consecutive_skips: non-finite steps in a row that stop the run.
    log_every, probe_every: steps between metrics rows and probe measurements (0: only
      at the end; `phase_runner.itstime`).
    seed: data and initialization seed.
  """
  steps: int
  batch_size: int
  seq_len: int
  copy_seq_len: int
  copy_only_steps: int
  task_weights: tuple[float, ...]
  learning_rate: float
  warmup_steps: int
  weight_decay: float
  adam_b1: float
  adam_b2: float
  adam_eps: float
  max_grad_norm: float
  alphabet: int
  copy_min_len: int
  copy_max_len: int
  copy_max_noise: int
  curriculum_start: float
  curriculum_steps: int
  span_min: int
  span_max: int
  probe_fraction: float
  probe_rows: int
  max_consecutive_skips: int
  log_every: int
  probe_every: int
  seed: int

  def __post_init__(self):
    problems = []
    if len(self.task_weights) != len(TASKS) or any(w < 0 for w in self.task_weights):
      problems.append(f'task_weights must be {len(TASKS)} non-negative weights for '
                      f'{TASKS}, got {self.task_weights}')
    elif abs(sum(self.task_weights) - 1.0) > 1e-6:
      problems.append(f'task_weights must sum to 1, got {sum(self.task_weights)}')
    if not 0 <= self.copy_only_steps <= self.steps:
      problems.append(f'copy_only_steps must be in [0, steps] = [0, {self.steps}], got '
                      f'{self.copy_only_steps}')
    for name in ('steps', 'batch_size', 'seq_len', 'copy_seq_len', 'alphabet',
                 'copy_min_len', 'span_min', 'probe_rows', 'max_consecutive_skips'):
      if getattr(self, name) < 1:
        problems.append(f'{name} must be >= 1, got {getattr(self, name)}')
    if self.copy_max_len < self.copy_min_len:
      problems.append('copy_max_len must be >= copy_min_len')
    if 2 * self.copy_max_len + self.copy_max_noise + 3 > self.copy_seq_len:
      problems.append(f'copy_seq_len {self.copy_seq_len} cannot hold two copies of '
                      f'{self.copy_max_len} tokens and {self.copy_max_noise} of noise')
    if not self.span_min <= self.span_max or self.span_max < PROBE_SPAN:
      problems.append(f'span_min <= span_max and span_max >= {PROBE_SPAN} needed')
    if not 0.0 < self.probe_fraction < 1.0:
      problems.append(f'probe_fraction must be in (0, 1), got {self.probe_fraction}')
    if not (self.learning_rate > 0 and np.isfinite(self.learning_rate)):
      problems.append(f'learning_rate must be finite and > 0, got {self.learning_rate}')
    if not 0.0 < self.curriculum_start <= 1.0:
      problems.append(f'curriculum_start must be in (0, 1], got {self.curriculum_start}')
    if problems:  # from_section puts `config.pretrain: ` in front
      raise ValueError('; '.join(problems))

  @classmethod
  def from_section(cls, section: Mapping[str, Any]) -> 'PretrainConfig':
    """The `pretrain` config section (a mapping: `config.pretrain.to_dict()`) typed.

    Raises:
      ValueError: `config.pretrain: <problem>` for an unknown key or a bad value.
    """
    values = dict(section)
    values['task_weights'] = tuple(float(w) for w in values.get('task_weights', ()))
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      raise ValueError(f'config.pretrain: unknown field(s) {unknown}')
    try:
      return cls(**values)
    except (TypeError, ValueError) as e:
      raise ValueError(f'config.pretrain: {e}') from e


@dataclasses.dataclass
class Corpus:
  """Tokenized construction-pool text.

  Attributes:
    train_paragraphs: token ids of each training paragraph (`title: sentences`).
    train_sentences: (title ids, sentence ids) of each training sentence.
    probe_paragraphs, probe_sentences: the same for the held-out questions.
    special: ids of `<|endoftext|>`, the newline and the double quote.
  """
  train_paragraphs: list[np.ndarray]
  train_sentences: list[np.ndarray]
  probe_paragraphs: list[np.ndarray]
  probe_sentences: list[np.ndarray]
  tokenizer: tokenization.Tokenizer


def build_corpus(construction: Sequence[hotpotqa.Example],
                 tokenizer: tokenization.Tokenizer, probe_fraction: float,
                 seed: int) -> Corpus:
  """Tokenizes the construction pool's paragraphs and splits off the probe questions.

  Args:
    construction: the construction pool (`episodes.load_pools(...)[0]`); never the
      internal-dev pool.
    tokenizer: the policy's tokenizer.
    probe_fraction: share of the questions held out for the probe.
    seed: the split's seed.
  Raises:
    ValueError: an empty pool, or one too small to hold out a question.
  """
  if len(construction) < 2:
    raise ValueError(f'pretraining needs >= 2 construction-pool questions, got '
                     f'{len(construction)}')
  order = np.random.default_rng(seed).permutation(len(construction))
  n_probe = max(1, int(round(probe_fraction * len(construction))))
  probe_ids = set(order[:n_probe].tolist())
  parts = {True: ([], []), False: ([], [])}
  seen = set()
  for i, ex in enumerate(construction):
    paragraphs, sentences = parts[i in probe_ids]
    for para in ex.context:
      text = f'{para.title}: ' + ' '.join(s.strip() for s in para.sentences)
      if text in seen:  # a paragraph shared by two questions is trained or held out once
        continue
      seen.add(text)
      paragraphs.append(np.asarray(tokenizer.encode(text), np.int32))
      sentences.extend(np.asarray(tokenizer.encode(s.strip()), np.int32)
                       for s in para.sentences if len(s.strip()) > 20)
  return Corpus(parts[False][0], parts[False][1], parts[True][0], parts[True][1],
                tokenizer)


class RowMaker:
  """Builds the rows of each task (module docstring) from a corpus.

  Every row is (tokens [L] int32, target [L] float32): target[j] = 1 where token j is
  a training target (predicted from tokens < j); padding is `pad_token_id` with target
  0.
  """

  def __init__(self, corpus: Corpus, config: PretrainConfig):
    tok = corpus.tokenizer
    self.corpus, self.config = corpus, config
    self.eot = _single_id(tok, '<|endoftext|>')
    self.newline = _single_id(tok, '\n')
    self.quote = _single_id(tok, '"')
    self.pad = tok.pad_token_id
    self._piece_cache: dict[str, np.ndarray] = {}
    # 'copy' draws from ordinary pieces: past the specials and the 256 byte pieces.
    self.first_plain = 2 + 256 + 16
    if self.first_plain + config.alphabet > tok.vocab_size:
      raise ValueError(f'pretrain.alphabet {config.alphabet} exceeds the vocabulary '
                       f'({tok.vocab_size} pieces)')

  def _enc(self, text: str) -> np.ndarray:
    if text not in self._piece_cache:
      self._piece_cache[text] = np.asarray(self.corpus.tokenizer.encode(text), np.int32)
    return self._piece_cache[text]

  def _row(self, pieces: Sequence[np.ndarray], targets: Sequence[bool],
           length: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.concatenate([np.asarray(p, np.int32) for p in pieces])[:length]
    target = np.concatenate([np.full(len(p), t, np.float32)
                             for p, t in zip(pieces, targets)])[:length]
    out_t = np.full(length, self.pad, np.int32)
    out_m = np.zeros(length, np.float32)
    out_t[:len(tokens)], out_m[:len(target)] = tokens, target
    return out_t, out_m

  def text(self, rng, paragraphs):
    p = paragraphs[rng.integers(len(paragraphs))]
    return self._row([[self.eot], p], [False, True], self.config.seq_len)

  def copy(self, rng, step: int):
    c = self.config
    frac = min(1.0, c.curriculum_start + (1.0 - c.curriculum_start) *
               step / max(1, c.curriculum_steps))
    alphabet = max(8, int(c.alphabet * frac))
    max_len = max(c.copy_min_len, int(c.copy_max_len * frac))
    n = int(rng.integers(c.copy_min_len, max_len + 1))
    x = self.first_plain + rng.integers(0, alphabet, n)
    noise = self.first_plain + rng.integers(0, alphabet,
                                            int(rng.integers(0, c.copy_max_noise + 1)))
    return self._row([[self.eot], noise, x, [self.newline, self.quote], x[:1], x[1:]],
                     [False, False, False, False, False, True], c.copy_seq_len)

  def span(self, rng, paragraphs, length: int | None = None):
    c = self.config
    budget = c.seq_len - 3
    for _ in range(64):
      p = paragraphs[rng.integers(len(paragraphs))]
      n = length or int(rng.integers(c.span_min, c.span_max + 1))
      if len(p) >= n + 4:
        break
    else:
      raise ValueError(f'no paragraph holds a {n}-token span')
    p = p[:max(n + 4, budget - n)]
    start = int(rng.integers(0, len(p) - n + 1))
    s = p[start:start + n]
    return self._row([[self.eot], p, [self.newline, self.quote], s[:1], s[1:]],
                     [False, False, False, False, True], c.seq_len)

  def _records(self, rng, sentences, k):
    kinds = rng.choice(_ID_KINDS)
    nums = rng.choice(np.arange(1, _ID_MAX + 1), size=k, replace=False)
    ids = [f'{kinds}{n}' for n in nums]
    texts = [sentences[rng.integers(len(sentences))][:_RECORD_TOKENS] for _ in range(k)]
    lines = []
    for rid, t in zip(ids, texts):
      head = self._enc(f'[{serialization.ref(rid)} {_KIND_WORD[kinds]}] ')
      lines += [head, [self.quote], t, [self.quote, self.newline]]
    return ids, texts, lines

  def quote_row(self, rng, sentences):
    k = int(rng.integers(_RECORDS[0], _RECORDS[1] + 1))
    ids, texts, lines = self._records(rng, sentences, k)
    j = int(rng.integers(k))
    ask = self._enc(f'quote {serialization.ref(ids[j])}: ')
    pieces = [[self.eot], *lines, ask, [self.quote], texts[j], [self.quote]]
    targets = [False] * (len(lines) + 3) + [True, True]
    return self._row(pieces, targets, self.config.seq_len)

  def cite_row(self, rng, sentences):
    k = int(rng.integers(_RECORDS[0], _RECORDS[1] + 1))
    ids, texts, lines = self._records(rng, sentences, k)
    j = int(rng.integers(k))
    ask = self._enc('cite ')
    rid = self._enc(ids[j])
    pieces = [[self.eot], *lines, ask, [self.quote], texts[j][:8], [self.quote],
              self._enc(': '), [self.quote], rid, [self.quote]]
    targets = [False] * (len(lines) + 7) + [True, True]
    return self._row(pieces, targets, self.config.seq_len)

  def batch(self, rng, task: str, step: int, probe: bool = False,
            n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """[n or batch_size, L] tokens (int32) and targets (float32) of one task."""
    corpus = self.corpus
    paragraphs = corpus.probe_paragraphs if probe else corpus.train_paragraphs
    sentences = corpus.probe_sentences if probe else corpus.train_sentences
    make = {'text': lambda: self.text(rng, paragraphs),
            'copy': lambda: self.copy(rng, step),
            'span': lambda: self.span(rng, paragraphs,
                                      PROBE_SPAN if probe else None),
            'quote': lambda: self.quote_row(rng, sentences),
            'cite': lambda: self.cite_row(rng, sentences)}[task]
    rows = [make() for _ in range(n or self.config.batch_size)]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def _single_id(tok: tokenization.Tokenizer, text: str) -> int:
  ids = tok.encode(text)
  if len(ids) != 1:
    raise ValueError(f'the tokenizer must encode {text!r} as one piece, got {ids}')
  return int(ids[0])
