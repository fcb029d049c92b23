"""Supervised warm start θ_SFT on the balanced command set (SPEC §4; App. D.3, Eq. 7).

`run_sft(config, workdir)` trains θ_SFT into `workdir/sft`. This module holds the
training loop, resume and checkpoint selection; its parts live in train/sft_examples.py
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
from vermem_jax.envs import hotpotqa
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.rl import batching
from vermem_jax.rl import policy
from vermem_jax.train import checkpoint_selection
from vermem_jax.train import checkpoints
from vermem_jax.train import distributed
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import nonfinite
from vermem_jax.train import setup as setup_lib
from vermem_jax.train import sft_eval
from vermem_jax.train import sft_examples
from vermem_jax.train import sft_step

PHASE = 'sft'
COUNTS_FILE = 'sft_data_counts.txt'


# ----------------------------------------------------------------------------- config glue
def _executor_config(config: ml_collections.ConfigDict) -> ExecutorConfig:
  names = {f.name for f in dataclasses.fields(ExecutorConfig)}
  values = {k: v for k, v in config.memory.to_dict().items() if k in names}
  return ExecutorConfig(**values, phase=config.episodes.op_space)


def _sft_data_config(config: ml_collections.ConfigDict) -> sft_config.SFTDataConfig:
  # The construction seed is the episode seed: the data set does not change with the
  # run seed (config.seed drives init and shuffling).
  return sft_config.SFTDataConfig.from_config(
      config.sft.to_dict(), seed=config.episodes.seed,
      context_budget=config.memory.context_budget,
      policy_input_limit=config.memory.policy_input_limit,
      local_ids=bool(config.memory.get('local_ids', False)),
      max_doc_sentences=config.episodes.max_doc_sentences,
      max_doc_tokens=config.episodes.max_doc_tokens)


def trajectory_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Config fields that determine the training trajectory (checked on resume)."""
  s = config.sft
  return {'seed': config.seed, 'model': setup_lib.model_identity(config),
          'train_per_target': s.train_per_target, 'dev_per_target': s.dev_per_target,
          'learning_rate': s.learning_rate, 'warmup_ratio': s.warmup_ratio,
          'weight_decay': s.weight_decay, 'max_grad_norm': s.max_grad_norm,
          'batch_size': s.batch_size, 'num_epochs': s.num_epochs,
          'max_steps': s.max_steps, 'episodes_seed': config.episodes.seed,
          'loss_reduction': s.loss_reduction, 'lr_schedule': s.lr_schedule,
          'adam': [s.adam_b1, s.adam_b2, s.adam_eps],
          'template_fraction': s.template_fraction,
          'teacher_backend': s.teacher_backend,
          'policy_input_limit': config.memory.policy_input_limit,
          'context_budget': config.memory.context_budget,
          'local_ids': bool(config.memory.get('local_ids', False)),
          'length_group_batches': int(s.get('length_group_batches', 0)),
          # Records longer than the learner shapes are dropped (see sft_examples.tokenize_records).
          'max_command_tokens': config.sampling.max_command_tokens,
          'max_sequence_tokens': config.batching.length_buckets[-1],
          'max_command_bucket': config.batching.command_buckets[-1]}


def _check_resume(meta: Mapping[str, Any], fingerprint: Mapping[str, Any],
                  directory: str) -> None:
  setup_lib.check_resume(meta.get('metadata'), fingerprint, directory, what='an SFT run')


def _completed_metrics(directory: str, fingerprint: Mapping[str, Any]) -> dict | None:
  """Stored final metrics when the newest checkpoint is the completed last step."""
  if not checkpoints.has_checkpoint(directory):
    return None
  with checkpoints.PhaseCheckpointManager(directory) as mgr:
    latest = mgr.latest_step()
    try:
      meta = mgr.read_meta(latest)
    except Exception:  # pylint: disable=broad-except
      return None  # the normal path restores with fallback and reports it
  _check_resume(meta, fingerprint, directory)
  md = meta.get('metadata') or {}
  if md.get('complete') and md.get('final_metrics'):
    return dict(md['final_metrics'])
  return None


# ----------------------------------------------------------------------------- driver
def _prefixed(prefix: str, values: Mapping[str, float]) -> dict[str, float]:
  return {f'{prefix}/{k}': v for k, v in values.items()}


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
  fingerprint = trajectory_fingerprint(config)
  done = _completed_metrics(directory, fingerprint)
  if done is not None:
    logging.info('SFT in %s is complete at step %s; nothing to do', directory,
                 done.get('step'))
    done['wall_time_s'] = time.time() - t_start
    return done

  # --- model config, tokenizer (checked against each other), mesh
  model_cfg = setup_lib.model_config_from(config)
  tok = setup_lib.load_tokenizer_for(config, model_cfg)
  mesh = setup_lib.make_mesh_from(config)

  # --- data
  exec_cfg = _executor_config(config)
  bcfg = batching.BatchingConfig(**config.batching.to_dict())
  sampling_cfg = policy.PolicySamplingConfig(**config.sampling.to_dict())
  primary = distributed.is_primary()

  def build_set():
    construction, dev_pool = episodes.load_pools(hotpotqa.DataConfig.from_config(
        config.data.to_dict()))
    return sft_build.build_sft_set(construction, dev_pool, count_tokens=tok.count_tokens,
                                  config=_sft_data_config(config), verbose=False)
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
  max_cmd = min(bcfg.command_buckets[-1], int(config.sampling.max_command_tokens))
  limits = dict(max_sequence_tokens=bcfg.length_buckets[-1], max_command_tokens=max_cmd)
  train, drop_train = sft_examples.tokenize_records(train_records, tok, **limits)
  dev, drop_dev = sft_examples.tokenize_records(dev_records, tok, **limits)
  if any(drop_train.values()) or any(drop_dev.values()):
    logging.warning('SFT records dropped (longer than the learner shapes: command <= %d '
                    'tokens incl. end of turn, sequence <= %d tokens): train %s, dev %s',
                    max_cmd, limits['max_sequence_tokens'], drop_train, drop_dev)
  if not train:
    raise ValueError('no SFT train record fits config.sampling.max_command_tokens / '
                     'config.batching.length_buckets')
  train_decisions = [e.decision() for e in train]
  groups = int(config.sft.get('length_group_batches', 0))
  lengths = [len(d.prompt_tokens) + len(d.command_tokens) for d in train_decisions]
  dev_batches = (batching.micro_batches([e.decision() for e in dev], bcfg,
                                        pad_id=tok.pad_token_id) if dev else [])

  # --- schedule
  seed = int(config.seed)
  batch_size = int(config.sft.batch_size)
  spe = sft_examples.steps_per_epoch(len(train), batch_size)
  total = (int(config.sft.max_steps) if config.sft.max_steps
           else spe * int(config.sft.num_epochs))
  t = config.sft
  opt = sft_step.OptimizerConfig(
      learning_rate=float(t.learning_rate), total_steps=total,
      warmup_ratio=float(t.warmup_ratio), weight_decay=float(t.weight_decay),
      max_grad_norm=float(t.max_grad_norm), adam_b1=float(t.adam_b1),
      adam_b2=float(t.adam_b2), adam_eps=float(t.adam_eps),
      lr_schedule=str(t.lr_schedule))
  reduction = str(t.loss_reduction)
  schedule = sft_step.lr_schedule(opt)
  eval_every = int(config.sft.eval_every)
  eval_each_epoch = bool(config.sft.eval_each_epoch)
  save_every = int(config.checkpoint.save_every)

  def position(step: int) -> dict[str, int]:
    epoch, b = divmod(step, spe)
    return {'epoch': epoch, 'batch': b, 'shuffle_seed': seed, 'steps_per_epoch': spe,
            'num_train': len(train)}

  # --- state
  init_key, rng = jax.random.split(jax.random.PRNGKey(seed))
  model_cfg, params = setup_lib.init_or_load_params(config, model_cfg, init_key, mesh)
  # Sharded like the params (AdamW moments mirror them); the template below carries
  # these shardings, so a restore lands on the same layout.
  opt_state = setup_lib.init_opt_state(sft_step.make_optimizer(opt).init, params, mesh)
  template = checkpoints.TrainState(step=0, params=params, opt_state=opt_state, rng=rng,
                                    data_position=position(0), metadata={})
  with checkpoints.PhaseCheckpointManager(
      directory, max_to_keep=int(config.checkpoint.max_to_keep),
      async_save=bool(config.checkpoint.get('async_save', True))) as mgr:
    step, prior_wall, last_dev, train_loss = 0, 0.0, {}, float('nan')
    skips = nonfinite.SkipCounter(int(config.sft.max_consecutive_skips))
    restored = mgr.restore(template)
    if restored is not None:
      _check_resume({'metadata': restored.metadata}, fingerprint, directory)
      if restored.data_position != position(restored.step):
        raise ValueError(f'{directory}: checkpoint step {restored.step} has data position '
                         f'{restored.data_position}, expected {position(restored.step)} '
                         '(different SFT data); use a fresh --workdir')
      step, params, opt_state, rng = (restored.step, restored.params, restored.opt_state,
                                      restored.rng)
      prior_wall = float(restored.metadata.get('cumulative_wall_time_s', 0.0))
      last_dev = dict(restored.metadata.get('dev_metrics') or {})
      train_loss = float(restored.metadata.get('train_loss', train_loss))
      skips.total = int(restored.metadata.get('skipped_steps', 0))
      logging.info('SFT resumes from step %d of %d in %s (epoch %d, batch %d)', step,
                   total, directory, *divmod(step, spe))
    stop = total if stop_after_step is None else min(total, int(stop_after_step))

    def evaluate(p) -> dict[str, float]:
      preds = sft_eval.predict_commands(p, model_cfg, [e.record for e in dev], tok,
                                        batch_size=bcfg.micro_batch_size,
                                        sampling_config=sampling_cfg,
                                        rng=jax.random.fold_in(rng, 1), mesh=mesh)
      out = sft_eval.dev_metrics([e.record for e in dev], preds,
                                 executor_config=exec_cfg, count_tokens=tok.count_tokens)
      out['dev_loss'] = sft_step.command_loss(p, dev_batches, model_config=model_cfg,
                                              mesh=mesh, reduction=reduction,
                                              loss_chunk_size=bcfg.loss_chunk_size)
      for e, text in list(zip(dev, preds))[:2]:
        logging.info('SFT dev example: target %r -> predicted %r', e.record.target[:120],
                     text[:120])
      return out

    writer = metrics_lib.MetricsWriter(directory, resume_step=step,
                                       tensorboard=bool(config.metrics.tensorboard),
                                       enabled=primary)
    bar = metrics_lib.progress_bar(total, initial=step, desc=PHASE, unit='step',
                                   disable=not (config.metrics.progress_bar and primary))
    try:
      while step < stop:
        t0 = time.time()
        idx, _, _ = sft_examples.batch_indices(step, len(train), batch_size, seed,
                                               lengths=lengths, group_batches=groups)
        decisions = [train_decisions[i] for i in idx]
        mbs = batching.micro_batches(decisions, bcfg, pad_id=tok.pad_token_id)
        # The schedule counts applied updates: skipped (non-finite) steps do not move it.
        m_lr = float(schedule(step - skips.total))
        params, opt_state, m = sft_step.train_step(
            params, opt_state, mbs, model_config=model_cfg, opt=opt, mesh=mesh,
            reduction=reduction, loss_chunk_size=bcfg.loss_chunk_size)
        m['lr'] = m_lr
        step += 1
        skips.record(not m['skipped'], f'SFT step {step}')
        dt = time.time() - t0
        train_loss = m['loss']
        tokens = sum(len(d.prompt_tokens) + len(d.command_tokens) for d in decisions)
        if step % int(config.metrics.log_every) == 0 or step == total:
          writer.write(step, _prefixed('train', {
              'loss': m['loss'], 'lr': m['lr'], 'grad_norm': m['grad_norm'],
              'token_accuracy': m['token_accuracy'], 'token_nll': m['token_nll'],
              'tokens_per_s': tokens / max(dt, 1e-9), 'step_time_s': dt,
              'epoch': step / spe, 'skipped': m['skipped'],
              'skipped_total': float(skips.total)}))
        bar.update(1)
        postfix = dict(loss=f'{m["loss"]:.3f}', lr=f'{m["lr"]:.2e}')
        if skips.total:
          postfix['skipped'] = skips.total  # non-finite steps, not applied
        bar.set_postfix(**postfix)
        is_eval = (step % eval_every == 0 or step == total
                   or (eval_each_epoch and step % spe == 0))
        selection = None
        if is_eval and dev:
          last_dev = evaluate(params)
          writer.write(step, _prefixed('dev', last_dev))
          selection = {'tool_accuracy': last_dev['tool_accuracy'],
                       'invalid_rate': last_dev['invalid_rate']}
          logging.info('SFT step %d: dev tool accuracy %.3f, invalid rate %.3f, exact '
                       '%.3f, dev loss %.4f', step, last_dev['tool_accuracy'],
                       last_dev['invalid_rate'], last_dev['exact_match'],
                       last_dev['dev_loss'])
        # A stop_after_step stop saves nothing extra: it behaves like a kill.
        if is_eval or step % save_every == 0:
          wall = prior_wall + time.time() - t_start
          final = None
          if step == total:
            final = _final_metrics(step, total, wall, train_loss, last_dev, mgr, selection,
                                   len(train), len(dev), drop_train, drop_dev)
          metadata = {'fingerprint': fingerprint, 'total_steps': total,
                      'cumulative_wall_time_s': wall, 'dev_metrics': last_dev,
                      'train_loss': train_loss, 'complete': step == total,
                      'skipped_steps': skips.total}
          if final is not None:
            metadata['final_metrics'] = final
          mgr.save(checkpoints.TrainState(step=step, params=params, opt_state=opt_state,
                                          rng=rng, data_position=position(step),
                                          metadata=metadata),
                   selection_metrics=selection)
    finally:
      bar.close()
      writer.close()
    wall = prior_wall + time.time() - t_start
    result = _final_metrics(step, total, wall, train_loss, last_dev, mgr, None, len(train),
                            len(dev), drop_train, drop_dev)
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
