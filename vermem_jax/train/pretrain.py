r"""Pretraining of the tiny CPU base: a stand-in for the pretrained Qwen (issue 22).

The paper starts every phase from a pretrained Qwen; the CPU default cannot download
one, and a randomly initialised model cannot copy a sentence or an id out of its input,
which every Add, Update, Summarize and Retrieve command needs. This phase gives the tiny
Qwen-architecture model what pretraining gives: a next-token model of HotpotQA text
that copies from its context. It is a stand-in, labelled as such wherever its base is
used; its output is an ordinary Hugging Face folder (`config.json`,
`model.safetensors`, the tokenizer), loaded through `model.hf_checkpoint` like a real
Qwen checkpoint.

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
its target). Rows of one batch are one task group: 'copy' rows are short (`copy_seq_len`), the other
tasks share `seq_len`, so the jitted step sees two shapes.

Copy probe (printed at the end and by experiments/benchmarks/copy_probe.py): on the
held-out paragraphs, teacher-forced greedy accuracy of the span tokens 2..32 of a
32-token 'span' row (per token), and the share of 'cite' rows whose id is predicted
whole (id-copy accuracy).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vermem_jax import tokenization
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import serialization
from vermem_jax.models import hf_io
from vermem_jax.models import qwen
from vermem_jax.models.qwen_config import QwenConfig
from vermem_jax.train import optim
from vermem_jax.train import setup

TASKS = ('text', 'copy', 'span', 'quote', 'cite')
# Under <workdir>/pretrain/: the Hugging Face folder of the base, and per-step metrics.
BASE_DIR = 'base'
METRICS_FILE = 'metrics.jsonl'
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
    log_every, probe_every: steps between loss lines and probe measurements (0: only
      at the end).
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
      problems.append(f'copy_only_steps must be in [0, steps], got {self.copy_only_steps}')
    for name in ('steps', 'batch_size', 'seq_len', 'copy_seq_len', 'alphabet',
                 'copy_min_len', 'span_min', 'probe_rows'):
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
    if problems:
      raise ValueError('pretrain: ' + '; '.join(problems))


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


def next_token_loss(model_config: QwenConfig, params, tokens: jax.Array,
                    targets: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean next-token cross-entropy over target tokens, and greedy accuracy.

  Args:
    tokens: [B, L] int32 ids.
    targets: [B, L] float32, 1 where token j is predicted from tokens < j.
  Returns:
    (loss, accuracy): float32 scalars (nats per target token; share of targets whose
    argmax prediction is right).
  """
  logits = qwen.Qwen(model_config).apply({'params': params}, tokens[:, :-1])
  labels, w = tokens[:, 1:], targets[:, 1:]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  n = jnp.maximum(w.sum(), 1.0)
  hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return (nll * w).sum() / n, (hit * w).sum() / n


def make_train_step(model_config: QwenConfig, tx: optax.GradientTransformation):
  """The jitted step (params, opt_state, tokens [B, L], targets [B, L]) ->
  (params, opt_state, loss, accuracy)."""

  def step(params, opt_state, tokens, targets):
    (loss, acc), grads = jax.value_and_grad(
        lambda p: next_token_loss(model_config, p, tokens, targets), has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, acc

  return jax.jit(step, donate_argnums=(0, 1))


def copy_probe(model_config: QwenConfig, params, rows: RowMaker, n: int,
               seed: int) -> dict[str, float]:
  """The copy probe on held-out paragraphs (module docstring).

  Returns:
    {'span_copy_accuracy': per-token accuracy of 32-token span copies (tokens 2..32),
     'id_copy_accuracy': share of 'cite' rows whose whole id and closing quote are
     predicted, 'text_loss': next-token loss on held-out paragraphs (nats/token)}.
  """
  rng = np.random.default_rng(seed)
  eval_fn = jax.jit(lambda p, t, m: _per_row(model_config, p, t, m))
  out = {}
  for task, key in (('span', 'span_copy_accuracy'), ('cite', 'id_copy_accuracy'),
                    ('text', 'text_loss')):
    tokens, targets = rows.batch(rng, task, 0, probe=True, n=n)
    hits, count, nll = (np.asarray(x) for x in eval_fn(params, tokens, targets))
    if task == 'span':
      out[key] = float(hits.sum() / count.sum())
    elif task == 'cite':
      out[key] = float(np.mean(hits == count))
    else:
      out[key] = float(nll.sum() / count.sum())
  return out


def _per_row(model_config, params, tokens, targets):
  logits = qwen.Qwen(model_config).apply({'params': params}, tokens[:, :-1])
  labels, w = tokens[:, 1:], targets[:, 1:]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return (hit * w).sum(-1), w.sum(-1), (nll * w).sum(-1)


def pretrain(model_config: QwenConfig, config: PretrainConfig,
             construction: Sequence[hotpotqa.Example],
             tokenizer: tokenization.Tokenizer, *, log=print,
             metrics_path: str | None = None,
             on_probe=None) -> tuple[Any, dict[str, float]]:
  """Trains `model_config` from random init on the tasks of the module docstring.

  Args:
    model_config: the model (its vocabulary must hold the tokenizer's).
    config: PretrainConfig.
    construction: the construction pool.
    tokenizer: the policy's tokenizer.
    log: where progress lines go.
    metrics_path: a JSON-lines file for per-step metrics (None: none written).
    on_probe: called as on_probe(step, params, probe) after each probe measurement
      (e.g. to keep intermediate bases); None: nothing.
  Returns:
    (params, the final copy probe).
  Raises:
    ValueError: a vocabulary smaller than the tokenizer's, or what `build_corpus` and
      `RowMaker` raise.
  """
  if tokenizer.vocab_size > model_config.vocab_size:
    raise ValueError(f'tokenizer has {tokenizer.vocab_size} pieces, model vocab_size '
                     f'{model_config.vocab_size}')
  corpus = build_corpus(construction, tokenizer, config.probe_fraction, config.seed)
  rows = RowMaker(corpus, config)
  schedule = optax.join_schedules(
      [optax.linear_schedule(config.learning_rate / max(1, config.warmup_steps),
                             config.learning_rate, max(1, config.warmup_steps)),
       optax.constant_schedule(config.learning_rate)], [max(1, config.warmup_steps)])
  tx = optim.clipped_adamw(schedule, b1=config.adam_b1, b2=config.adam_b2,
                           eps=config.adam_eps, weight_decay=config.weight_decay,
                           max_grad_norm=config.max_grad_norm)
  params = qwen.init_params(model_config, jax.random.PRNGKey(config.seed))
  opt_state = tx.init(params)
  step_fn = make_train_step(model_config, tx)
  rng = np.random.default_rng(config.seed + 1)
  weights = np.asarray(config.task_weights, np.float64)
  sums = {t: [0.0, 0.0, 0] for t in TASKS}
  out = open(metrics_path, 'a') if metrics_path else None
  start = time.time()
  try:
    for step in range(1, config.steps + 1):
      task = ('copy' if step <= config.copy_only_steps
              else TASKS[int(rng.choice(len(TASKS), p=weights))])
      tokens, targets = rows.batch(rng, task, step)
      params, opt_state, loss, acc = step_fn(params, opt_state, tokens, targets)
      s = sums[task]
      s[0] += float(loss); s[1] += float(acc); s[2] += 1
      if step % config.log_every == 0 or step == config.steps:
        record = {'step': step, 'seconds': round(time.time() - start, 1)}
        for t, (l_sum, a_sum, k) in sums.items():
          if k:
            record[f'{t}/loss'] = round(l_sum / k, 4)
            record[f'{t}/accuracy'] = round(a_sum / k, 4)
        sums = {t: [0.0, 0.0, 0] for t in TASKS}
        if (config.probe_every and step % config.probe_every == 0) or step == config.steps:
          probe = copy_probe(model_config, params, rows, config.probe_rows, config.seed + 2)
          record.update({f'probe/{k}': round(v, 4) for k, v in probe.items()})
          if on_probe is not None:
            on_probe(step, params, probe)
        log(json.dumps(record))
        if out:
          out.write(json.dumps(record) + '\n')
          out.flush()
  finally:
    if out:
      out.close()
  probe = copy_probe(model_config, params, rows, config.probe_rows, config.seed + 2)
  return params, probe


def write_base(model_config: QwenConfig, params, tokenizer_path: str, out_dir: str,
               info: Mapping[str, Any]) -> None:
  """Writes the pretrained base as a Hugging Face folder.

  Files: `config.json` and `model.safetensors` (`hf_io.save_hf_checkpoint`, bfloat16
  storage: the tiny default computes in bf16 and keeps float32 master weights, which
  start from these values), the tokenizer model file as `tokenizer.model`, and
  `pretrain_info.json` (`info`: how it was made and its copy probe).
  """
  hf_io.save_hf_checkpoint(model_config, params, out_dir, dtype=jnp.bfloat16)
  shutil.copyfile(tokenizer_path, os.path.join(out_dir, 'tokenizer.model'))
  with open(os.path.join(out_dir, 'pretrain_info.json'), 'w') as f:
    json.dump(dict(info), f, indent=2, sort_keys=True)


def pretrain_config_from(config: ml_collections.ConfigDict) -> PretrainConfig:
  """The `pretrain` section as a PretrainConfig.

  Raises:
    ValueError: `config.pretrain: <problem>` for an unknown key or a bad value.
  """
  values = config.pretrain.to_dict()
  values['task_weights'] = tuple(float(w) for w in values.get('task_weights', ()))
  names = {f.name for f in dataclasses.fields(PretrainConfig)}
  unknown = sorted(set(values) - names)
  if unknown:
    raise ValueError(f'config.pretrain: unknown field(s) {unknown}')
  try:
    return PretrainConfig(**values)
  except (TypeError, ValueError) as e:
    raise ValueError(f'config.pretrain: {e}') from e


def run_pretrain(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Pretrains the tiny base into `<workdir>/pretrain/` (module docstring).

  Writes `metrics.jsonl` (loss and accuracy per task every `log_every` steps, the copy
  probe every `probe_every`) and the Hugging Face folder `base/` (`write_base`), and
  prints the copy probe. A second run into the same folder starts again from random
  initialization (it takes minutes, and its base replaces the first).

  Returns:
    {'base': path of the HF folder, 'probe': the final copy probe, 'seconds': wall
    time}.
  Raises:
    ValueError: a bad `pretrain` section, model or tokenizer (`pretrain`'s errors),
      or a config that loads a checkpoint (the base is made from random weights).
  """
  if config.model.hf_checkpoint:
    raise ValueError('config.model.hf_checkpoint: pretraining starts from random '
                     'weights; leave it unset')
  pc = pretrain_config_from(config)
  model_config = setup.model_config_from(config)
  tok_path = setup.tokenizer_path(config)
  if not os.path.isfile(tok_path):
    raise ValueError(f'config.tokenizer.path: pretraining packages a SentencePiece '
                     f'model file with the base, got {tok_path!r}')
  tokenizer = setup.load_tokenizer_cached(tok_path)
  construction, _ = episodes.load_pools(
      hotpotqa.DataConfig.from_config(config.data.to_dict()))
  out = os.path.join(workdir, 'pretrain')
  os.makedirs(out, exist_ok=True)
  metrics = os.path.join(out, METRICS_FILE)
  if os.path.exists(metrics):
    os.remove(metrics)
  start = time.time()
  params, probe = pretrain(model_config, pc, construction, tokenizer,
                           metrics_path=metrics)
  seconds = time.time() - start
  base = os.path.join(out, BASE_DIR)
  write_base(model_config, params, tok_path, base,
             {'made_by': 'python experiments/run.py --config=pretrain.py',
              'pretrain': dataclasses.asdict(pc), 'probe': probe,
              'seconds': round(seconds, 1),
              'stand_in': 'a CPU stand-in for a pretrained Qwen (issue 22)'})
  print(f'pretrain: {pc.steps} steps in {seconds / 60:.1f} min; copy probe on held-out '
        f'construction-pool paragraphs: span copy {probe["span_copy_accuracy"]:.3f} '
        f'per token ({PROBE_SPAN}-token spans), id copy {probe["id_copy_accuracy"]:.3f}, '
        f'text loss {probe["text_loss"]:.3f} nats/token; base written to {base}')
  return {'base': base, 'probe': probe, 'seconds': seconds}
