"""Supervised warm start θ_SFT on the balanced command set (SPEC §4; App. D.3, Eq. 7).

`run_sft(config, workdir)` trains θ_SFT into `workdir/sft`. This module holds the
SFT step, dev evaluation and checkpoint selection; the loop (restore, schedule, metrics,
progress bar, skips, saving) is train/phase_runner.py's; its parts live in train/sft_examples.py
(tokenized records and the data order), train/sft_step.py (loss, optimizer, jitted step
with gradient accumulation) and train/sft_eval.py (dev metrics).

Data. `envs.sft_data.build_sft_set` gives train and dev records (x_i, u*_i) from the
construction and internal-dev pools of the HotpotQA train split; each becomes one
learner row (policy prompt of x_i, command tokens of u*_i + the stop token;
sft_examples). Records that do not fit the learner shapes are dropped and counted
(logged; `num_dropped_*` in the returned metrics). Loss on command tokens only, AdamW with
linear warmup then linear decay (sft_step), `sft.loss_reduction` (Eq. 7's sequence NLL
at paper scale). A step with a non-finite loss or gradient is skipped (not applied,
counted in `train/skipped` and the progress line); `sft.max_consecutive_skips` in a row
stop the run (NonFiniteError naming the step). Epoch e visits the train records in a
seeded order that is a pure function of the step (sft_examples).

Evaluation (dev set) every `sft.eval_every` steps, after every epoch when
`sft.eval_each_epoch` (greedy decoding of the dev set is not free) and at the last
step: greedy decoding of each dev prompt with the RL sampler policy, then tool
accuracy, invalid-operation rate, executable rate, exact command match (sft_eval), and
the teacher-forced dev loss (`sft_step.command_loss`).

Devices (`train/setup.py`). The model config and tokenizer are built once and checked
against each other (`tokenization.check_tokenizer_model_compat`). Parameters and the
AdamW state live on the ('data', 'fsdp', 'tensor') mesh of `config.model.mesh_*`
(FSDP / tensor sharding per models/sharding.py; the optimizer state sharded like the
parameters), micro-batch rows are split over ('data', 'fsdp'), and the jitted steps and
dev greedy decoding run under `sharding.use_sharding` so the model's activation
constraints apply. On one device all of this is the single-device computation.
Multi-host (train/distributed.py): every process builds the same seeded SFT set
(compared across processes by digest) and the same micro-batch plan, and places only
the rows its devices hold; process 0 alone writes metrics, TensorBoard, the counts
table and the progress bar; all processes save checkpoints together (Orbax).

Checkpoints (`workdir/sft`, one `PhaseCheckpointManager`): after every evaluation, with
selection metrics {tool_accuracy, invalid_rate} (best = higher dev tool accuracy, ties
by lower invalid rate, SPEC §4; a full tie goes to the later step), and every
`checkpoint.save_every` steps. Each holds params, optimizer state, RNG key and the
data position, so a killed run resumes from
its newest restorable checkpoint and ends with params bit-identical to an uninterrupted
run. A run whose newest checkpoint is the completed last step returns its stored final
metrics without work. Metrics go to `workdir/sft/metrics.jsonl` + TensorBoard; the
SFT counts table to stdout (once) and `workdir/sft/sft_data_counts.txt`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Mapping

from absl import logging
import jax
import ml_collections

from vermem_jax.envs import episodes
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.rl import batching
from vermem_jax.train import checkpoint_selection
from vermem_jax.train import checkpoints
from vermem_jax.train import distributed
from vermem_jax.train import optim
from vermem_jax.train import phase_runner
from vermem_jax.train import run_setup
from vermem_jax.train import setup as setup_lib
from vermem_jax.train import sft_eval
from vermem_jax.train import sft_examples
from vermem_jax.train import sft_step

PHASE = 'sft'
COUNTS_FILE = 'sft_data_counts.txt'


def trajectory_fingerprint(run: run_setup.RunSetup) -> dict[str, Any]:
  """The settings that determine the training trajectory (checked on resume; the keys
  name the config fields as stored by every earlier run)."""
  s, opt = run.sft, run.sft.opt
  return {'seed': run.seed, 'model': run.model.identity,
          'train_per_target': s.data.train_per_target,
          'dev_per_target': s.data.dev_per_target,
          'learning_rate': opt.learning_rate, 'warmup_ratio': opt.warmup_ratio,
          'weight_decay': opt.weight_decay, 'max_grad_norm': opt.max_grad_norm,
          'batch_size': s.batch_size, 'num_epochs': s.num_epochs,
          'max_steps': s.max_steps, 'episodes_seed': s.data.seed,
          'loss_reduction': s.loss_reduction, 'lr_schedule': opt.lr_schedule,
          'adam': [opt.adam_b1, opt.adam_b2, opt.adam_eps],
          'template_fraction': s.data.template_fraction,
          'teacher_backend': s.data.teacher_backend,
          'policy_input_limit': s.data.policy_input_limit,
          'context_budget': s.data.context_budget,
          'local_ids': bool(s.data.local_ids),
          'length_group_batches': s.length_group_batches,
          # Records longer than the learner shapes are dropped (see sft_examples.tokenize_records).
          'max_command_tokens': run.sampling.max_command_tokens,
          'max_sequence_tokens': run.batching.length_buckets[-1],
          'max_command_bucket': run.batching.command_buckets[-1]}


def _check_resume(meta: Mapping[str, Any], fingerprint: Mapping[str, Any],
                  directory: str, hf_checkpoint: str) -> None:
  setup_lib.check_resume(meta.get('metadata'), fingerprint, directory, what='an SFT run',
                         older_forms=setup_lib.older_identity_forms(hf_checkpoint))


def _completed_metrics(directory: str, fingerprint: Mapping[str, Any],
                       hf_checkpoint: str) -> dict | None:
  """Stored final metrics when the newest checkpoint is the completed last step."""
  meta = checkpoints.newest_meta(directory)
  if meta is None:
    return None
  _check_resume(meta, fingerprint, directory, hf_checkpoint)
  md = meta.get('metadata') or {}
  if md.get('complete') and md.get('final_metrics'):
    return dict(md['final_metrics'])
  return None


def check_resumable(run: run_setup.RunSetup, workdir: str) -> None:
  """Raises the ValueError `run_sft` raises before training when `workdir/sft` holds a
  run with other settings (each differing fingerprint field named); reads the newest
  checkpoint's metadata only (`run.py --dry_run`)."""
  _completed_metrics(checkpoints.phase_dir(workdir, 'sft'), trajectory_fingerprint(run),
                     run.model.hf_checkpoint)


# ----------------------------------------------------------------------------- driver
def _prefixed(prefix: str, values: Mapping[str, float]) -> dict[str, float]:
  return {f'{prefix}/{k}': v for k, v in values.items()}


@dataclasses.dataclass
class _SFTData:
  """Tokenized SFT records and what the loop reads of them."""
  train: list
  dev: list
  drop_train: dict
  drop_dev: dict
  train_decisions: list
  lengths: list
  dev_batches: list


def _build_data(run: run_setup.RunSetup, tok: Any, directory: str,
                primary: bool) -> _SFTData:
  """Builds the seeded SFT set (same on every process), prints and stores its counts
  table, and tokenizes it within the learner shapes (dropped records are logged)."""
  def build_set():
    construction, dev_pool = episodes.load_pools(run.data)
    return sft_build.build_sft_set(construction, dev_pool, count_tokens=tok.count_tokens,
                                  config=run.sft.data, verbose=False)
  # Every process builds the same seeded set (a failure stops all of them together).
  train_records, dev_records, report = distributed.agree(build_set)
  distributed.check_same('the SFT set', distributed.digest(
      [(r.policy_input, r.target) for r in list(train_records) + list(dev_records)]))
  table = report.format_table()
  if primary:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, COUNTS_FILE), 'w') as f:
      f.write(table + '\n')
    # Printed once (not logged as well, which would show it twice on a terminal).
    print(f'SFT set (also in {os.path.join(directory, COUNTS_FILE)}):\n{table}',
          flush=True)
  bcfg = run.batching
  limits = sft_examples.learner_limits(bcfg.length_buckets, bcfg.command_buckets,
                                       run.sampling.max_command_tokens)
  train, drop_train = sft_examples.tokenize_records(train_records, tok, **limits)
  dev, drop_dev = sft_examples.tokenize_records(dev_records, tok, **limits)
  if any(drop_train.values()) or any(drop_dev.values()):
    logging.warning('SFT records dropped (longer than the learner shapes: command <= %d '
                    'tokens incl. end of turn, sequence <= %d tokens): train %s, dev %s',
                    limits['max_command_tokens'], limits['max_sequence_tokens'], drop_train,
                    drop_dev)
  if not train:
    raise ValueError('no SFT train record fits config.sampling.max_command_tokens / '
                     'config.batching.length_buckets')
  train_decisions = [e.decision() for e in train]
  lengths = [len(d.prompt_tokens) + len(d.command_tokens) for d in train_decisions]
  dev_batches = (batching.micro_batches([e.decision() for e in dev], bcfg,
                                        pad_id=tok.pad_token_id) if dev else [])
  return _SFTData(train, dev, drop_train, drop_dev, train_decisions, lengths, dev_batches)


def data_position(step: int, steps_per_epoch: int, seed: int,
                  num_train: int) -> dict[str, int]:
  """Where step `step` stands in the seeded data order (stored in every checkpoint and
  checked on resume)."""
  epoch, b = divmod(step, steps_per_epoch)
  return {'epoch': epoch, 'batch': b, 'shuffle_seed': seed,
          'steps_per_epoch': steps_per_epoch, 'num_train': num_train}


class _SFTPhase:
  """SFT's step, dev evaluation, rows and checkpoint for `phase_runner.PhaseRunner`."""

  def __init__(self, run: run_setup.RunSetup, runner, data: _SFTData, *, model_cfg, tok,
               mesh, opt, params, opt_state, rng, fingerprint):
    self.runner, self.data, self.tok, self.mesh = runner, data, tok, mesh
    self.bcfg = run.batching
    self.model_cfg, self.opt, self.fingerprint = model_cfg, opt, fingerprint
    self.params, self.opt_state, self.rng = params, opt_state, rng
    self.seed = run.seed
    self.batch_size = run.sft.batch_size
    self.groups = run.sft.length_group_batches
    self.reduction = run.sft.loss_reduction
    self.schedule = optim.learning_rate_fn(opt)
    self.exec_cfg = run.executor
    self.sampling_cfg = run.sampling
    self.spe = sft_examples.steps_per_epoch(len(data.train), self.batch_size)
    md = runner.metadata
    self.last_dev = dict(md.get('dev_metrics') or {})
    self.train_loss = float(md.get('train_loss', float('nan')))

  def step(self, n: int) -> phase_runner.StepResult:
    t0 = time.time()
    skips = self.runner.skips
    idx, _, _ = sft_examples.batch_indices(n - 1, len(self.data.train), self.batch_size,
                                           self.seed, lengths=self.data.lengths,
                                           group_batches=self.groups)
    decisions = [self.data.train_decisions[i] for i in idx]
    mbs = batching.micro_batches(decisions, self.bcfg, pad_id=self.tok.pad_token_id)
    # The schedule counts applied updates: skipped (non-finite) steps do not move it.
    m_lr = float(self.schedule(n - 1 - skips.total))
    self.params, self.opt_state, m = sft_step.train_step(
        self.params, self.opt_state, mbs, model_config=self.model_cfg, opt=self.opt,
        mesh=self.mesh, reduction=self.reduction,
        loss_chunk_size=self.bcfg.loss_chunk_size)
    m['lr'] = m_lr
    skips.record(not m['skipped'], f'SFT step {n}')
    dt = time.time() - t0
    self.train_loss = m['loss']
    tokens = sum(len(d.prompt_tokens) + len(d.command_tokens) for d in decisions)
    row = _prefixed('train', {
        'loss': m['loss'], 'lr': m['lr'], 'grad_norm': m['grad_norm'],
        'token_accuracy': m['token_accuracy'], 'token_nll': m['token_nll'],
        'tokens_per_s': tokens / max(dt, 1e-9), 'step_time_s': dt,
        'epoch': n / self.spe, 'skipped': m['skipped'],
        'skipped_total': float(skips.total)})
    return phase_runner.StepResult(row, dict(loss=f'{m["loss"]:.3f}',
                                             lr=f'{m["lr"]:.2e}'))

  def evaluate(self, n: int) -> phase_runner.Evaluation:
    """Greedy dev predictions and the teacher-forced dev loss (module docstring)."""
    dev = self.data.dev
    if not dev:
      return phase_runner.Evaluation({})
    p = self.params
    records = [e.record for e in dev]
    preds = sft_eval.predict_commands(p, self.model_cfg, records, self.tok,
                                      batch_size=self.bcfg.micro_batch_size,
                                      sampling_config=self.sampling_cfg,
                                      rng=jax.random.fold_in(self.rng, 1), mesh=self.mesh)
    outcomes = sft_eval.prediction_outcomes(records, preds, executor_config=self.exec_cfg,
                                            count_tokens=self.tok.count_tokens)
    out = sft_eval.metrics_from_outcomes(outcomes)
    if self.runner.primary:
      sft_eval.write_predictions(os.path.join(self.runner.directory,
                                              sft_eval.PREDICTIONS_FILE),
                                 records, preds, outcomes, n)
    out['dev_loss'] = sft_step.command_loss(p, self.data.dev_batches,
                                            model_config=self.model_cfg, mesh=self.mesh,
                                            reduction=self.reduction,
                                            loss_chunk_size=self.bcfg.loss_chunk_size)
    for e, text in list(zip(dev, preds))[:2]:
      logging.info('SFT dev example: target %r -> predicted %r', e.record.target[:120],
                   text[:120])
    self.last_dev = out
    logging.info('SFT step %d: dev tool accuracy %.3f, invalid rate %.3f, exact '
                 '%.3f, dev loss %.4f', n, out['tool_accuracy'], out['invalid_rate'],
                 out['exact_match'], out['dev_loss'])
    return phase_runner.Evaluation(
        _prefixed('dev', out), {'tool_accuracy': out['tool_accuracy'],
                                'invalid_rate': out['invalid_rate']})

  def rows(self, n, result, evaluation, log_due):
    del n
    rows = [result.row] if log_due else []
    if evaluation is not None and evaluation.row:
      rows.append(evaluation.row)
    return rows

  def final_metrics(self, n: int, wall: float, selection) -> dict[str, Any]:
    d = self.data
    return _final_metrics(n, self.runner.config.total, wall, self.train_loss,
                          self.last_dev, self.runner.manager, selection, len(d.train),
                          len(d.dev), d.drop_train, d.drop_dev)

  def train_state(self, n, metadata, selection) -> checkpoints.TrainState:
    total = self.runner.config.total
    metadata.update({'fingerprint': self.fingerprint, 'total_steps': total,
                     'dev_metrics': self.last_dev, 'train_loss': self.train_loss})
    if n == total:
      metadata['final_metrics'] = self.final_metrics(
          n, metadata['cumulative_wall_time_s'], selection)
    return checkpoints.TrainState(step=n, params=self.params, opt_state=self.opt_state,
                                  rng=self.rng, data_position=data_position(
                                      n, self.spe, self.seed, len(self.data.train)),
                                  metadata=metadata)


def run_sft(config: ml_collections.ConfigDict, workdir: str, *,
            stop_after_step: int | None = None) -> dict[str, Any]:
  """Trains θ_SFT into `workdir/sft` (SPEC §4); resumes from its newest checkpoint.

  Args:
    config: the `sft` experiment config (experiments/configs/sft.py).
    workdir: run directory; the phase writes `workdir/sft/`.
    stop_after_step: stop once this many optimizer steps are complete (as if killed
      after that step; preemption drills and tests). None trains to the end.
  Returns:
    Final metrics: 'step', 'total_steps', 'wall_time_s' (this call, seconds),
    'cumulative_wall_time_s' (all calls of this run), 'train_loss' (last step),
    the last dev metrics (`sft_eval.dev_metrics` keys + 'dev_loss'), 'best_step' and its
    'best_tool_accuracy' / 'best_invalid_rate', 'num_train', 'num_dev', dropped-record
    counts, and 'complete' (bool).
  Raises:
    ValueError: a bad config field, a workdir holding a run with other settings, or no
      trainable record left after the length limits.
  """
  t_start = time.time()
  directory = checkpoints.phase_dir(workdir, PHASE)
  run = run_setup.RunSetup.from_config(config)
  fingerprint = trajectory_fingerprint(run)
  done = _completed_metrics(directory, fingerprint, run.model.hf_checkpoint)
  if done is not None:
    logging.info('SFT in %s is complete at step %s; nothing to do', directory,
                 done.get('step'))
    done['wall_time_s'] = time.time() - t_start
    return done
  # The model config and tokenizer are checked against each other.
  s, model = run.sft, run.model
  tok = setup_lib.load_tokenizer(model.tokenizer_path, model.config)
  mesh = setup_lib.make_mesh(model.mesh)
  primary = distributed.is_primary()
  data = _build_data(run, tok, directory, primary)
  spe = sft_examples.steps_per_epoch(len(data.train), s.batch_size)
  total = int(s.max_steps) if s.max_steps else spe * s.num_epochs
  opt = s.optimizer(total)
  init_key, rng = jax.random.split(jax.random.PRNGKey(run.seed))
  model_cfg, params = setup_lib.init_or_load_params(
      model.config, init_key, mesh, hf_checkpoint=model.hf_checkpoint,
      param_dtype=model.param_dtype)
  # Sharded like the params (AdamW moments mirror them); the template below carries
  # these shardings, so a restore lands on the same layout.
  opt_state = setup_lib.init_opt_state(optim.make_optimizer(opt).init, params, mesh)
  runner_config = phase_runner.RunnerConfig(
      name=PHASE, total=total, eval_every=s.eval_every,
      max_consecutive_skips=s.max_consecutive_skips, loop=run.loop, unit='step',
      epoch_steps=spe if s.eval_each_epoch else 0)
  num_train, seed = len(data.train), run.seed

  def check(restored: checkpoints.TrainState) -> None:
    _check_resume({'metadata': restored.metadata}, fingerprint, directory,
                  model.hf_checkpoint)
    want = data_position(restored.step, spe, seed, num_train)
    if restored.data_position != want:
      raise ValueError(f'{directory}: checkpoint step {restored.step} has data position '
                       f'{restored.data_position}, expected {want} (different SFT '
                       'data); use a fresh --workdir')

  with phase_runner.PhaseRunner(directory, runner_config, primary=primary,
                                t_start=t_start) as runner:
    restored = runner.restore(checkpoints.TrainState(
        step=0, params=params, opt_state=opt_state, rng=rng,
        data_position=data_position(0, spe, seed, num_train), metadata={}), check)
    if restored is not None:
      params, opt_state, rng = restored.params, restored.opt_state, restored.rng
      logging.info('SFT resumes from step %d of %d in %s (epoch %d, batch %d)',
                   runner.step, total, directory, *divmod(runner.step, spe))
    phase = _SFTPhase(run, runner, data, model_cfg=model_cfg, tok=tok, mesh=mesh, opt=opt,
                      params=params, opt_state=opt_state, rng=rng, fingerprint=fingerprint)
    step = runner.run(phase, stop=stop_after_step)
    result = phase.final_metrics(step, runner.wall_time(), None)
    result.update(runner.compile_figures())
  result['wall_time_s'] = time.time() - t_start
  return result


def _final_metrics(step, total, wall, train_loss, last_dev, mgr, selection, num_train,
                   num_dev, drop_train, drop_dev) -> dict[str, Any]:
  """The returned / stored summary (JSON values only)."""
  best = mgr.best_step()
  best_metrics = None
  if selection is not None:
    # The step being saved is not yet known to the manager.
    key = checkpoint_selection.sft_selection_key(selection)
    if best is None or key >= checkpoint_selection.sft_selection_key(_best_selection(mgr, best)):
      best, best_metrics = step, selection
  if best is not None and best_metrics is None:
    best_metrics = _best_selection(mgr, best)
  out = {'step': int(step), 'total_steps': int(total), 'complete': step >= total,
         'cumulative_wall_time_s': float(wall), 'train_loss': float(train_loss),
         'num_train': int(num_train), 'num_dev': int(num_dev),
         'num_dropped_train': int(sum(drop_train.values())),
         'num_dropped_dev': int(sum(drop_dev.values())),
         'best_step': None if best is None else int(best)}
  out.update({k: float(v) for k, v in last_dev.items() if k != 'num_dev'})
  if best_metrics:
    out['best_tool_accuracy'] = float(best_metrics['tool_accuracy'])
    out['best_invalid_rate'] = float(best_metrics['invalid_rate'])
  return json.loads(json.dumps(out))


def _best_selection(mgr: checkpoints.PhaseCheckpointManager, step: int) -> dict:
  return dict(mgr.read_meta(step).get('selection_metrics') or {})
