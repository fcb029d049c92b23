r"""Pretraining of the tiny CPU base: a stand-in for the pretrained Qwen (issue 22).

The paper starts every phase from a pretrained Qwen; the CPU default cannot download
one, and a randomly initialised model cannot copy a sentence or an id out of its input,
which every Add, Update, Summarize and Retrieve command needs. This phase gives the tiny
Qwen-architecture model what pretraining gives: a next-token model of HotpotQA text
that copies from its context. It is a stand-in, labelled as such wherever its base is
used; its output is an ordinary Hugging Face folder (`config.json`,
`model.safetensors`, the tokenizer), loaded through `model.hf_checkpoint` like a real
Qwen checkpoint.

The tasks, the corpus, the rows and the section's typed config (`PretrainConfig`) are
train/pretrain_data.py's. The loop (restore, schedule, metrics, progress bar, skips,
saving) is train/phase_runner.py's; this module supplies the phase:

  step      step n's task ('copy' while n <= `copy_only_steps`, then drawn with
            `task_weights`) and batch come from one NumPy generator seeded with
            seed + 1 and advanced step after step; one clipped-AdamW step (constant
            rate after a linear warmup) of the next-token loss on the batch's targets.
            A step with a non-finite loss or gradient is skipped (parameters and
            optimizer state unchanged; the progress line's `skipped`), and
            `max_consecutive_skips` in a row stop the run (NonFiniteError).
  evaluate  the copy probe every `probe_every` steps and at the last: on the held-out
            paragraphs, teacher-forced greedy accuracy of the span tokens 2..32 of a
            32-token 'span' row (per token), the share of 'cite' rows whose id is
            predicted whole (id-copy accuracy), and the next-token loss of held-out
            paragraphs. Also printed at the end, and by
            experiments/benchmarks/copy_probe.py for any base.
  rows      every `log_every` steps and at the last, `metrics.jsonl` + TensorBoard:
            `seconds` (wall time of the run), `<task>/loss` and `<task>/accuracy`
            averaged over the applied steps of each task since the previous row, and
            `probe/*` at probed steps (values rounded to 4 decimals).
  checkpoint  `<workdir>/pretrain/` every `checkpoint.save_every` steps, at every
            probe and at the last step: parameters, AdamW state, the data position
            (the batch generator's state and the corpus sizes, `data_position`), and
            the trajectory fingerprint (`trajectory_fingerprint`). A killed run resumes
            from its newest restorable checkpoint and ends with the parameters of an
            uninterrupted run; a checkpoint of other settings is refused with an error
            naming each differing field.

`run_pretrain(config, workdir)` ends by writing the Hugging Face folder
`<workdir>/pretrain/base/` (`write_base`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vermem_jax import tokenization
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.models import hf_io
from vermem_jax.models import qwen
from vermem_jax.models.qwen_config import QwenConfig
from vermem_jax.train import checkpoints
from vermem_jax.train import nonfinite
from vermem_jax.train import optim
from vermem_jax.train import phase_runner
from vermem_jax.train import pretrain_data
from vermem_jax.train import run_setup
from vermem_jax.train import setup

PHASE = 'pretrain'
# Under <workdir>/pretrain/: the Hugging Face folder of the base.
BASE_DIR = 'base'
# PretrainConfig fields that decide when figures are taken or when the run stops, not
# the parameters it reaches: left out of the trajectory fingerprint.
_CADENCE_FIELDS = ('log_every', 'probe_every', 'probe_rows', 'max_consecutive_skips')


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
  """The jitted step (params, opt_state, tokens [B, L] int32, targets [B, L] float32)
  -> (params, opt_state, loss, accuracy, finite).

  `finite` (bool scalar) says whether the loss and every gradient entry are finite;
  the caller keeps the old parameters and optimizer state when it is False (the inputs
  are not donated, so they stay valid).
  """

  def step(params, opt_state, tokens, targets):
    (loss, acc), grads = jax.value_and_grad(
        lambda p: next_token_loss(model_config, p, tokens, targets), has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    finite = jnp.isfinite(loss) & nonfinite.tree_all_finite(grads)
    return optax.apply_updates(params, updates), opt_state, loss, acc, finite

  return jax.jit(step)


def pretrain_optimizer(
    config: pretrain_data.PretrainConfig) -> optax.GradientTransformation:
  """Clipped AdamW (`optim.clipped_adamw`) at `learning_rate` after a linear warmup of
  `warmup_steps` steps from learning_rate / warmup_steps."""
  warmup = max(1, config.warmup_steps)
  schedule = optax.join_schedules(
      [optax.linear_schedule(config.learning_rate / warmup, config.learning_rate, warmup),
       optax.constant_schedule(config.learning_rate)], [warmup])
  return optim.clipped_adamw(schedule, b1=config.adam_b1, b2=config.adam_b2,
                             eps=config.adam_eps, weight_decay=config.weight_decay,
                             max_grad_norm=config.max_grad_norm)


def copy_probe(model_config: QwenConfig, params, rows: pretrain_data.RowMaker, n: int,
               seed: int) -> dict[str, float]:
  """The copy probe on held-out paragraphs (module docstring).

  Returns:
    {'span_copy_accuracy': per-token accuracy of 32-token span copies (tokens 2..32),
     'id_copy_accuracy': share of 'cite' rows whose whole id and closing quote are
     predicted, 'text_loss': next-token loss on held-out paragraphs (nats/token)}.
  """
  rng = np.random.default_rng(seed)
  out = {}
  for task, key in (('span', 'span_copy_accuracy'), ('cite', 'id_copy_accuracy'),
                    ('text', 'text_loss')):
    tokens, targets = rows.batch(rng, task, 0, probe=True, n=n)
    hits, count, nll = (np.asarray(x) for x in _per_row(model_config, params, tokens,
                                                        targets))
    if task == 'span':
      out[key] = float(hits.sum() / count.sum())
    elif task == 'cite':
      out[key] = float(np.mean(hits == count))
    else:
      out[key] = float(nll.sum() / count.sum())
  return out


# Compiled once per model config and row shape (a jit made per call compiled again at
# every probe).
@functools.partial(jax.jit, static_argnums=0)
def _per_row(model_config, params, tokens, targets):
  logits = qwen.Qwen(model_config).apply({'params': params}, tokens[:, :-1])
  labels, w = tokens[:, 1:], targets[:, 1:]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return (hit * w).sum(-1), w.sum(-1), (nll * w).sum(-1)


def trajectory_fingerprint(run: run_setup.RunSetup) -> dict[str, Any]:
  """The settings that decide the parameters a pretraining run reaches (checked on
  resume): every `pretrain` field but the cadences (`_CADENCE_FIELDS`), the model and
  the construction pool's split. JSON values (lists, not tuples), as stored."""
  pc = run.pretrain
  out = {k: v for k, v in dataclasses.asdict(pc).items() if k not in _CADENCE_FIELDS}
  out['task_weights'] = [float(w) for w in pc.task_weights]
  out.update(model=run.model.identity, data_source=run.data.source,
             dev_fraction=run.data.dev_fraction, split_seed=run.data.split_seed)
  return out


def data_position(rng: np.random.Generator,
                  corpus: pretrain_data.Corpus) -> dict[str, Any]:
  """The batch generator's state (its 128-bit integers as decimal strings, which every
  JSON reader keeps exact) and the corpus sizes, stored in every checkpoint."""
  state = rng.bit_generator.state
  return {'bit_generator': state['bit_generator'],
          'state': str(state['state']['state']), 'inc': str(state['state']['inc']),
          'has_uint32': int(state['has_uint32']), 'uinteger': int(state['uinteger']),
          'train_paragraphs': len(corpus.train_paragraphs),
          'train_sentences': len(corpus.train_sentences)}


def _restore_generator(rng: np.random.Generator, position: Mapping[str, Any]) -> None:
  rng.bit_generator.state = {
      'bit_generator': position['bit_generator'],
      'state': {'state': int(position['state']), 'inc': int(position['inc'])},
      'has_uint32': int(position['has_uint32']), 'uinteger': int(position['uinteger'])}


def _empty_window() -> dict[str, list[float]]:
  """Per task: [loss sum, accuracy sum, applied steps] since the last metrics row."""
  return {t: [0.0, 0.0, 0] for t in pretrain_data.TASKS}


class _PretrainPhase:
  """Pretraining's step, copy probe, rows and checkpoint for `phase_runner.PhaseRunner`
  (module docstring)."""

  def __init__(self, model_config: QwenConfig, config: pretrain_data.PretrainConfig,
               rows: pretrain_data.RowMaker, runner: phase_runner.PhaseRunner, *,
               tx: optax.GradientTransformation, params, opt_state,
               rng: np.random.Generator, fingerprint: Mapping[str, Any]):
    self.model_config, self.config, self.runner = model_config, config, runner
    self.row_maker = rows
    self.params, self.opt_state, self.rng = params, opt_state, rng
    self.fingerprint = dict(fingerprint)
    self.step_fn = make_train_step(model_config, tx)
    self.weights = np.asarray(config.task_weights, np.float64)
    md = runner.metadata
    window = md.get('log_window') or _empty_window()
    self.window = {t: list(v) for t, v in window.items()}
    self.probe = dict(md.get('probe') or {})

  def step(self, n: int) -> phase_runner.StepResult:
    c = self.config
    task = ('copy' if n <= c.copy_only_steps
            else pretrain_data.TASKS[int(self.rng.choice(len(pretrain_data.TASKS),
                                                         p=self.weights))])
    tokens, targets = self.row_maker.batch(self.rng, task, n)
    params, opt_state, loss, acc, finite = self.step_fn(self.params, self.opt_state,
                                                        tokens, targets)
    if not self.runner.skips.record(bool(finite), f'pretrain step {n}'):
      self.params, self.opt_state = params, opt_state
      s = self.window[task]
      s[0] += float(loss); s[1] += float(acc); s[2] += 1
    return phase_runner.StepResult({}, dict(task=task, loss=f'{float(loss):.3f}'))

  def evaluate(self, n: int) -> phase_runner.Evaluation:
    del n
    c = self.config
    self.probe = copy_probe(self.model_config, self.params, self.row_maker, c.probe_rows,
                            c.seed + 2)
    return phase_runner.Evaluation({f'probe/{k}': round(v, 4)
                                    for k, v in self.probe.items()})

  def rows(self, n, result, evaluation, log_due):
    del n, result
    row = {}
    if log_due:
      row['seconds'] = round(self.runner.wall_time(), 1)
      for t, (l_sum, a_sum, k) in self.window.items():
        if k:
          row[f'{t}/loss'] = round(l_sum / k, 4)
          row[f'{t}/accuracy'] = round(a_sum / k, 4)
      self.window = _empty_window()
    if evaluation is not None:
      row.update(evaluation.row)
    return [row] if row else []

  def final_metrics(self, n: int, wall: float) -> dict[str, Any]:
    """'step', 'total_steps', 'complete', 'cumulative_wall_time_s', 'skipped_steps' and
    'probe' (the last copy probe, `copy_probe`'s keys; {} before the first)."""
    total = self.runner.config.total
    return {'step': int(n), 'total_steps': int(total), 'complete': n >= total,
            'cumulative_wall_time_s': float(wall),
            'skipped_steps': int(self.runner.skips.total), 'probe': dict(self.probe)}

  def train_state(self, n, metadata, selection) -> checkpoints.TrainState:
    del selection
    metadata.update({'fingerprint': self.fingerprint,
                     'total_steps': self.runner.config.total,
                     'log_window': self.window, 'probe': self.probe})
    if n == self.runner.config.total:
      metadata['final_metrics'] = self.final_metrics(
          n, metadata['cumulative_wall_time_s'])
    return checkpoints.TrainState(
        step=n, params=self.params, opt_state=self.opt_state,
        data_position=data_position(self.rng, self.row_maker.corpus), metadata=metadata)


def pretrain(run: run_setup.RunSetup, construction: Sequence[hotpotqa.Example],
             tokenizer: tokenization.Tokenizer, directory: str, *,
             stop: Optional[int] = None,
             t_start: Optional[float] = None) -> tuple[Any, dict[str, Any]]:
  """Trains `run.model.config` from random init on the tasks of train/pretrain_data.py
  into `directory`, resuming from its newest checkpoint (module docstring).

  Args:
    run: the typed setup of a `pretrain` config (`run.pretrain` set).
    construction: the construction pool (`episodes.load_pools(run.data)[0]`).
    tokenizer: the policy's tokenizer.
    directory: the phase directory (checkpoints, metrics.jsonl, TensorBoard events).
    stop: stop once this many steps are complete, as a kill after that step would
      (tests, drills); None trains to `run.pretrain.steps`.
    t_start: when this call began (time.time(); default now).
  Returns:
    (params after the last completed step, `_PretrainPhase.final_metrics`).
  Raises:
    ValueError: a vocabulary smaller than the tokenizer's, what `build_corpus` and
      `RowMaker` raise, or a checkpoint in `directory` of other settings (each
      differing field named) or another corpus.
    nonfinite.NonFiniteError: `max_consecutive_skips` non-finite steps in a row.
  """
  pc, model_config = run.pretrain, run.model.config
  if tokenizer.vocab_size > model_config.vocab_size:
    raise ValueError(f'tokenizer has {tokenizer.vocab_size} pieces, model vocab_size '
                     f'{model_config.vocab_size}')
  corpus = pretrain_data.build_corpus(construction, tokenizer, pc.probe_fraction, pc.seed)
  rows = pretrain_data.RowMaker(corpus, pc)
  tx = pretrain_optimizer(pc)
  params = qwen.init_params(model_config, jax.random.PRNGKey(pc.seed))
  opt_state = tx.init(params)
  rng = np.random.default_rng(pc.seed + 1)
  fingerprint = trajectory_fingerprint(run)
  # The section's own cadences: a pretraining row every `log_every` steps.
  loop = dataclasses.replace(run.loop, log_every=pc.log_every)
  runner_config = phase_runner.RunnerConfig(
      name=PHASE, total=pc.steps, eval_every=pc.probe_every,
      max_consecutive_skips=pc.max_consecutive_skips, loop=loop, unit='step')

  def check(restored: checkpoints.TrainState) -> None:
    setup.check_resume(restored.metadata, fingerprint, directory,
                       what='a pretraining run')
    sizes = {k: restored.data_position.get(k)
             for k in ('train_paragraphs', 'train_sentences')}
    want = {'train_paragraphs': len(corpus.train_paragraphs),
            'train_sentences': len(corpus.train_sentences)}
    if sizes != want:
      raise ValueError(f'{directory}: checkpoint step {restored.step} was trained on a '
                       f'corpus of {sizes}, this run builds {want} (another '
                       'construction pool); use a fresh --workdir')

  with phase_runner.PhaseRunner(directory, runner_config, t_start=t_start) as runner:
    restored = runner.restore(checkpoints.TrainState(
        step=0, params=params, opt_state=opt_state,
        data_position=data_position(rng, corpus), metadata={}), check)
    if restored is not None:
      params, opt_state = restored.params, restored.opt_state
      _restore_generator(rng, restored.data_position)
    phase = _PretrainPhase(model_config, pc, rows, runner, tx=tx, params=params,
                           opt_state=opt_state, rng=rng, fingerprint=fingerprint)
    step = runner.run(phase, stop=stop)
    return phase.params, phase.final_metrics(step, runner.wall_time())


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




def run_pretrain(config: ml_collections.ConfigDict, workdir: str, *,
                 stop_after_step: int | None = None) -> dict[str, Any]:
  """Pretrains the tiny base into `<workdir>/pretrain/` (module docstring).

  Resumes from the newest checkpoint there; once all steps are complete, writes the
  Hugging Face folder `base/` (`write_base`) and prints the copy probe.

  Args:
    config: the `pretrain` experiment config (experiments/configs/pretrain.py).
    workdir: run directory; the phase writes `workdir/pretrain/`.
    stop_after_step: stop once this many steps are complete (as if killed after that
      step); no base is written then. None trains to the end.
  Returns:
    {'base': path of the HF folder (None when stopped early), 'probe': the last copy
    probe, 'step', 'complete', 'seconds': this call's wall time}.
  Raises:
    ValueError: a bad `pretrain` section, model or tokenizer, a config that loads a
      checkpoint (`run_setup.RunSetup.from_config`: the base is made from random
      weights), or a workdir holding a pretraining run of other settings.
  """
  t_start = time.time()
  run = run_setup.RunSetup.from_config(config)
  tok_path = run.model.tokenizer_path
  if not os.path.isfile(tok_path):
    raise ValueError(f'config.tokenizer.path: pretraining packages a SentencePiece '
                     f'model file with the base, got {tok_path!r}')
  tokenizer = setup.load_tokenizer_cached(tok_path)
  construction, _ = episodes.load_pools(run.data)
  directory = checkpoints.phase_dir(workdir, PHASE)
  params, final = pretrain(run, construction, tokenizer, directory,
                           stop=stop_after_step, t_start=t_start)
  result = {'base': None, 'probe': final['probe'], 'step': final['step'],
            'complete': final['complete'], 'seconds': time.time() - t_start}
  if not final['complete']:
    print(f'pretrain: stopped after step {final["step"]} of {final["total_steps"]}; '
          f'the same command resumes from the newest checkpoint in {directory}')
    return result
  pc, probe, wall = run.pretrain, final['probe'], final['cumulative_wall_time_s']
  base = os.path.join(directory, BASE_DIR)
  write_base(run.model.config, params, tok_path, base,
             {'made_by': 'python experiments/run.py --config=pretrain.py',
              'pretrain': dataclasses.asdict(pc), 'probe': probe,
              'seconds': round(wall, 1),
              'stand_in': 'a CPU stand-in for a pretrained Qwen (issue 22)'})
  print(f'pretrain: {pc.steps} steps in {wall / 60:.1f} min; copy probe on held-out '
        f'construction-pool paragraphs: span copy {probe["span_copy_accuracy"]:.3f} '
        f'per token ({pretrain_data.PROBE_SPAN}-token spans), id copy '
        f'{probe["id_copy_accuracy"]:.3f}, text loss {probe["text_loss"]:.3f} '
        f'nats/token; base written to {base}')
  result['base'] = base
  return result
