"""One GRPO phase of the curriculum: Phase A, B or C (SPEC §4-6; paper App. B, D.5, F.4,
F.6, F.7).

`run_rl_phase(config, workdir)` trains θ_p for p = config.phase ('phase_a' | 'phase_b' |
'phase_c') into `workdir/<phase>/`. This module holds the phase's update, its
internal-dev evaluation and summaries; the loop (restore, schedule, metrics, progress
bar, skips, saving) is train/phase_runner.py's. The config is read once, into
`run_setup.RunSetup`; the parts live in train/rl_setup.py (episodes, solver, verifier,
learner batching, phase-start running statistics), train/rl_learner.py and
train/rl_optimizer.py (the jitted GRPO update; its optimizer is
train/optim.py), train/rl_resume.py
(trajectory fingerprint, data position, π_ref record) and rl/rollout.py (K-group
collection).

Initialization (SPEC §4, App. B/F.6). π_θ starts from the previous phase's parameters and
the reference policy π_ref IS those parameters, frozen for the whole phase: θ_SFT (the
best SFT checkpoint by dev tool accuracy) for A, θ_A for B, θ_B for C. Both are read with
`checkpoints.restore_params_only` from `workdir/<previous phase>/`; only policy
parameters pass between phases (a fresh optimizer state, fresh running statistics).
`<phase dir>/reference.json` records which checkpoint step was loaded and a SHA-256 of
the reference parameters (`rl_resume.params_fingerprint`), so anyone can check that
π_ref is exactly the previous phase's parameters.

Running local statistics (SPEC §6, App. F.4): a fresh `RunningStats` at phase start,
initialized from internal-dev transitions (`rl_setup.init_running_stats`), updated after
every update batch by the rollout collector and saved in every checkpoint.

One update n (1-based; a checkpoint's step = completed updates):
  1. θ_old := the current parameters, frozen for the update. Tasks: `tasks_per_update`
     train episodes chosen by `task_selection.select_tasks(pool, n, ...)` (a pure
     function of (seed, n): the data position is the update index). Key:
     `task_selection.update_rng(seed, n)`. `rollout.collect_update` runs the T x K
     rollouts with the sampler at temperature 0.7 / top-p 0.95, scores them and
     returns A^hier per decision.
  2. Learner: `rl_learner.learner_update`, rl.num_iterations passes of
     rl.mini_batches_per_iteration shuffled mini-batches over the N decisions of the
     update (∅ and rejected commands included), one optimizer step per mini-batch
     (SPEC §6: per-command token mean, then mean over the mini-batch's decisions; by
     default one step over all N). θ_old's log-probabilities come from the learner at
     θ_old by default (`rl.old_logprobs`; rl_learner). A step with a non-finite loss
     or gradient is skipped (`train/skipped_steps`, the progress line's `skipped`);
     rl.max_consecutive_skips in a row stop the run (NonFiniteError naming the update).
  3. Checkpoint selection (paper C.8; train/rl_selection.py): every `rl.eval_every`
     updates and after the last, the new parameters run the phase's internal-dev
     episodes greedily (no verifier) and score `rl.selection_metric`; that update's
     checkpoint is saved with selection metrics {'dev_score', 'dev_invalid_rate',
     'step'}. The phase's selected checkpoint — what the next phase starts from and
     regularizes towards, and what evaluation loads — is the best score, ties to the
     fewer rejected dev decisions, then to the later step.
  4. Logging (`dev/*` at scored updates), then a checkpoint every
     `checkpoint.save_every` updates, at every scored update and at the end.

Monitors (paper App. F.7): m^all and m^ans are averaged over the update's T x K
trajectories of the rollout batch collected BEFORE update n's optimizer step; they are
logged as `monitor/m_all`, `monitor/m_ans` at `monitor/point` = n - 1 (completed updates;
point 0 is the batch collected before the first update) whenever (n - 1) is a multiple
of `rl.monitor_every`, and for the last update. (The per-update reward means, including
`reward/m_all` / `reward/m_ans`, are logged with every row.)

Files in `workdir/<phase>/`: Orbax steps (params, optimizer state, next update's key,
running statistics, data position), `metrics.jsonl` + TensorBoard events (one row per
logged update: `train/*` learner, `reward/*`, `rollout/*`, `advantage/*`, `tokens/*`,
`time/*` stage seconds, `monitor/*`), `advantages.jsonl` (one row per decision,
`metrics.ADVANTAGE_COLUMNS`), `reference.json`.

Resume. On start the newest restorable checkpoint is restored (a corrupt newest step is
skipped with a logged warning naming it, and moved aside — never deleted — when that
step is saved again); the JSONL logs are cut back to the restored step, so they match an
uninterrupted run row for row (except wall-clock fields). Because tasks, keys and the
running statistics are functions of (seed, update, checkpoint), a run killed at any
moment and resumed ends with parameters bit-identical to an uninterrupted run with the
same seed. A run whose newest restorable checkpoint is the last update returns its
stored final metrics without work. A workdir holding a run with other settings, or whose
previous phase changed since this phase started, is refused (ValueError; rl_resume).

Devices (`train/setup.py`). θ, π_ref and the AdamW state are placed on the
('data', 'fsdp', 'tensor') mesh of `config.model.mesh_*` (restore templates carry the
shardings, so checkpoints load directly into that layout); the learner splits its
micro-batch rows over ('data', 'fsdp') (rl_learner). The rollout sampler runs under the
same rules (`setup.generate_fn_for`); an 'llm' solver checkpoint is loaded onto the same
mesh (rl_setup).

Multi-host (train/distributed.py). Every process runs this function; the mesh spans all
processes' devices. Update n's tasks are split into contiguous blocks, one per process
(rl/process_split.py); the sampler's calls of all processes form one collective
generate call per decision step; A^local's batch and running statistics are computed
from every process's decisions; the learner trains on the gathered decisions as global
arrays. The running statistics are initialized once (process 0) and broadcast; an
'llm' solver is loaded onto each process's own devices. Checkpoints are saved by all
processes (Orbax); metrics.jsonl, TensorBoard, advantages.jsonl, reference.json and
the progress bar are written by process 0 only.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import Any, Mapping

from absl import logging
import jax
import ml_collections
import numpy as np

from vermem_jax.models import sampling
from vermem_jax.rl import policy as policy_lib
from vermem_jax.rl import process_split
from vermem_jax.rl import rollout
from vermem_jax.rl import rollout_records
from vermem_jax.rl import running_stats
from vermem_jax.rl import task_selection
from vermem_jax.train import checkpoints
from vermem_jax.train import distributed
from vermem_jax.train import internal_dev
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import optim
from vermem_jax.train import phase_runner
from vermem_jax.train import rl_learner
from vermem_jax.train import rl_resume
from vermem_jax.train import rl_selection
from vermem_jax.train import rl_setup
from vermem_jax.train import run_setup
from vermem_jax.train import setup as setup_lib


def _numeric(values: Mapping[str, Any]) -> dict[str, float]:
  out = {}
  for k, v in values.items():
    if isinstance(v, (bool, np.bool_)):
      out[k] = float(v)
    elif isinstance(v, (int, float, np.integer, np.floating)):
      out[k] = float(v)
  return out


@contextlib.contextmanager
def decoding_with(policy: policy_lib.SamplerPolicy, params: Any, mesh: Any = None):
  """`policy` samples from θ's rollout copy (`sampling.rollout_copy`: matrices in the
  compute dtype, laid out for decoding) inside the block; the copy is dropped on exit
  so the learner step has its memory (train/memory_plan.py's rollout stage)."""
  policy.params = sampling.rollout_copy(policy.model_config, params, mesh)
  try:
    yield policy
  finally:
    policy.params = None


# Prefix of the greedy internal-dev figures in metrics rows and the phase result.
DEV_PREFIX = 'internal_dev/'


def internal_dev_figures(setup: rl_setup.PhaseSetup, params: Any, count: int,
                         mesh: Any = None) -> dict[str, float]:
  """The phase summary's reading (`internal_dev.summary`) of the internal-dev
  evaluation of `params` on the phase's first `count` dev episodes; {} when count is 0."""
  specs = list(setup.dev_specs)[:max(0, int(count))]
  if not specs:
    return {}
  run = setup.run
  greedy = policy_lib.SamplerPolicy(
      run.model.config, None, setup.tokenizer, sampling_config=run.sampling,
      greedy=True, batch_buckets=(dev_batch(run, len(specs)),),
      generate_fn=setup_lib.generate_fn_for(mesh))
  with decoding_with(greedy, params, mesh):
    records = internal_dev.run_dev_episodes(
        specs, greedy, setup.solver, count_tokens=setup.tokenizer.count_tokens,
        executor_config=run.executor, env_config=run.env)
  return internal_dev.summary(records)


def dev_batch(run: run_setup.RunSetup, num_episodes: int) -> int:
  """Rows of every internal-dev sampler call: the rollout batch, or all the dev
  episodes when they are fewer (no padding beyond them); more episodes run in chunks
  of it (models/batch_chunks.py)."""
  return max(1, min(run.rl.rollout.num_rollouts, int(num_episodes)))


def _dev_row(when: str, figures: Mapping[str, float]) -> dict[str, float]:
  return {f'{DEV_PREFIX}{when}/{k}': float(v) for k, v in figures.items()}


def rollout_summary(result: rollout_records.RolloutResult) -> dict[str, float]:
  """Token, tool-call and monitor means of an update's trajectories (SPEC §5, §7)."""
  trajs = result.trajectories
  n = max(len(trajs), 1)
  return {
      'tokens/online_mean': sum(t.result.online_tokens for t in trajs) / n,
      'tokens/policy_input_mean': sum(t.result.policy_input_tokens for t in trajs) / n,
      'tokens/command_total': float(sum(d.command_tokens for d in result.decisions)),
      'rollout/tool_calls_mean': sum(t.result.tool_calls for t in trajs) / n,
      'rollout/rejected_tool_calls_mean': sum(t.result.rejected_tool_calls
                                              for t in trajs) / n,
      'rollout/task_steps_mean': sum(t.result.task_steps for t in trajs) / n,
      'rollout/decisions_per_trajectory': result.num_decisions / n,
      'rollout/rejected_share': (sum(not d.accepted for d in result.decisions)
                                 / max(result.num_decisions, 1)),
  }


# ----------------------------------------------------------------------------- driver
class _RLPhase:
  """One GRPO update, the internal-dev evaluation, rows and checkpoint of an RL phase
  for `phase_runner.PhaseRunner` (module docstring, steps 1-4)."""

  def __init__(self, runner, setup, *, mesh, params, ref_params, opt_state, running,
               reference, fingerprint, dev_start):
    run, rl = setup.run, setup.run.rl
    self.runner, self.setup, self.phase, self.mesh = runner, setup, run.phase, mesh
    self.params, self.ref_params, self.opt_state = params, ref_params, opt_state
    self.running, self.reference, self.fingerprint = running, reference, fingerprint
    self.dev_start, self.resumed_from = dev_start, runner.step
    self.seed, self.total = run.seed, runner.config.total
    self.group = distributed.process_group()
    self.dev_count, self.monitor_every = rl.internal_dev_episodes, rl.monitor_every
    self.dev_specs = (setup.dev_specs[:rl.eval_episodes] if rl.eval_episodes
                      else setup.dev_specs)
    self.metric = rl.selection_metric
    tok, gen = setup.tokenizer, setup_lib.generate_fn_for(mesh)
    self.policy = policy_lib.SamplerPolicy(
        run.model.config, None, tok, sampling_config=run.sampling,
        batch_buckets=(rl.rollout.num_rollouts,), generate_fn=gen, group=self.group)
    # Greedy internal-dev scoring of the current θ (checkpoint selection, paper C.8),
    # in chunks of the rollout batch: one batch shape for the phase, and the KV cache
    # of one chunk instead of all dev episodes (rl.eval_episodes=0: 800 at paper scale).
    self.dev_policy = policy_lib.SamplerPolicy(
        run.model.config, None, tok, sampling_config=run.sampling, greedy=True,
        batch_buckets=(dev_batch(run, len(self.dev_specs)),), generate_fn=gen,
        group=self.group)
    bound = self.policy.program_bound()
    logging.info('%s sampler: at most %d programs per decoding mode (%d prompt buckets x '
                 '%d prefill shapes of the %d-row batch; docs/compilation.md)',
                 run.phase, bound['programs'], bound['prompt_buckets'],
                 bound['prefill_shapes'], rl.rollout.num_rollouts)
    self.table = (metrics_lib.AdvantageTable(runner.directory, run.phase,
                                             resume_update=runner.step,
                                             enabled=runner.primary)
                  if rl.advantage_table else None)
    self.last: dict[str, float] = {}
    self.end_row: dict[str, float] = {}
    # Summary figures of every update scored in this process, when the selection's dev
    # episodes are the summary's: the end column then reads the selected update's
    # records instead of running the dev episodes again.
    # (Both are prefixes of setup.dev_specs.)
    self.same_dev_set = (self.dev_count > 0 and len(self.dev_specs)
                         == min(self.dev_count, len(setup.dev_specs)))
    self.scored: dict[int, dict[str, float]] = {}

  def step(self, n: int) -> phase_runner.StepResult:
    setup, tok, t0 = self.setup, self.setup.tokenizer, time.perf_counter()
    task_ids = task_selection.select_tasks(len(setup.train_specs), n,
                                           setup.run.rl.rollout.tasks_per_update,
                                           seed=self.seed)
    # Each process collects its block of the tasks; `result` is then the whole
    # update's (process_split.gather_result; itself with one process).
    # θ_old := θ: the sampler reads its rollout copy for the whole collection.
    with decoding_with(self.policy, self.params, self.mesh):
      result = rollout.collect_update(
          [setup.train_specs[i] for i in process_split.split_tasks(task_ids, self.group)],
          self.policy, setup.solver, setup.verifier, setup.collect,
          rng=task_selection.update_rng(self.seed, n), count_tokens=tok.count_tokens,
          running_stats=self.running, phase=self.phase, update=n, group=self.group)
    result = process_split.gather_result(result, self.group)
    t1 = time.perf_counter()
    self.params, self.opt_state, learn = rl_learner.learner_update(
        self.params, self.ref_params, self.opt_state, result.decision_tokens(),
        setup.learner, mesh=self.mesh, shuffle_seed=(self.seed, n),
        skip_counter=self.runner.skips, label=f'{self.phase} update {n}')
    jax.block_until_ready(self.params)
    t2 = time.perf_counter()
    row = dict(_numeric(result.metrics))
    row.update(rollout_summary(result))
    row.update(learn)
    row['time/learner_s'] = t2 - t1
    row['time/update_s'] = t2 - t0
    row['rollout/task_ids_first'] = float(task_ids[0])
    row['train/skipped_steps_total'] = float(self.runner.skips.total)
    if self.table is not None:
      self.table.add_rows(result.advantage_rows())
    postfix = dict(loss=f'{learn["train/loss"]:.3f}', kl=f'{learn["train/kl"]:.2e}',
                   clip=f'{learn["train/clip_fraction"]:.3f}',
                   r_global=f'{row.get("reward/r_global", math.nan):.3f}')
    return phase_runner.StepResult(row, postfix, log=self._is_monitor(n))

  def _is_monitor(self, n: int) -> bool:
    return (n - 1) % self.monitor_every == 0 or n == self.total

  def evaluate(self, n: int) -> phase_runner.Evaluation:
    """Selection figures of θ_n on the dev episodes; at the last update also the
    summary's `internal_dev/end/*`: the figures of the update the phase selects
    (`internal_dev/end/step`, `checkpoints.PhaseCheckpointManager.selected_with`),
    from the records its selection scored, or by running the summary's dev episodes
    on that update's parameters when those records are not at hand (a different
    episode set, or an update scored before a restart)."""
    t0 = time.perf_counter()
    records = self._dev_records(self.params)
    dev = rl_selection.selection_figures(records, self.metric)
    dev['time/dev_eval_s'] = time.perf_counter() - t0
    selection = rl_selection.selection_metrics(dev, n)
    if self.same_dev_set:
      self.scored[n] = internal_dev.summary(records)
    if n == self.total and self.dev_count > 0:
      selected = self.runner.manager.selected_with(n, selection)
      step = n if selected is None else selected
      self.end_row = _dev_row('end', {**self._summary_figures(step), 'step': float(step)})
    return phase_runner.Evaluation(dev, selection)

  def _dev_records(self, params: Any) -> list[Any]:
    """The greedy internal-dev episodes of `params` that checkpoint selection scores."""
    with decoding_with(self.dev_policy, params, self.mesh):
      return internal_dev.run_dev_episodes(
          self.dev_specs, self.dev_policy, self.setup.solver,
          count_tokens=self.setup.tokenizer.count_tokens,
          executor_config=self.setup.run.executor, env_config=self.setup.run.env,
          rng=self.seed, group=self.group)

  def _summary_figures(self, step: int) -> dict[str, float]:
    """The phase summary's reading of update `step`: from the records its selection
    scored in this process, else by running the dev episodes again on its parameters
    (θ_n, or a step selected before a restart, read back from its checkpoint)."""
    if step in self.scored:
      return self.scored[step]
    params = self.params  # θ_n: the summary is made after the last update
    if step != self.total:
      self.runner.manager.wait_until_finished()
      params, _ = checkpoints.restore_params_only(self.runner.directory, self.params,
                                                  prefer_best=False, step=step)
    if self.same_dev_set:
      return internal_dev.summary(self._dev_records(params))
    return internal_dev_figures(self.setup, params, self.dev_count, self.mesh)

  def rows(self, n, result, evaluation, log_due):
    row = result.row
    if evaluation is not None:
      row.update(evaluation.row)
    if self._is_monitor(n):
      row['monitor/point'] = float(n - 1)
      row['monitor/m_all'] = row.get('reward/m_all', math.nan)
      row['monitor/m_ans'] = row.get('reward/m_ans', math.nan)
    if n == self.total:
      row.update(self.end_row)
    self.last = row
    return [row] if log_due else []

  def final_metrics(self, n: int, wall: float) -> dict[str, Any]:
    return _final_metrics(self.phase, n, self.total, wall, self.reference, self.params,
                          self.resumed_from, {**self.dev_start, **self.last})

  def train_state(self, n, metadata, selection) -> checkpoints.TrainState:
    del selection
    metadata.update({'fingerprint': self.fingerprint, 'reference': self.reference,
                     'num_updates': self.total, 'internal_dev_start': self.dev_start})
    if n >= self.total:
      metadata['final_metrics'] = self.final_metrics(n, metadata['cumulative_wall_time_s'])
    return checkpoints.TrainState(
        step=n, params=self.params, opt_state=self.opt_state,
        rng=task_selection.update_rng(self.seed, n + 1),
        running_stats=self.running.to_dict(),
        data_position=rl_resume.data_position(n, self.setup, self.seed), metadata=metadata)

  def close(self) -> None:
    if self.table is not None:
      self.table.close()


def run_rl_phase(config: ml_collections.ConfigDict, workdir: str, *,
                 stop_after_update: int | None = None) -> dict[str, Any]:
  """Trains one RL phase into `workdir/<config.phase>` (module docstring).

  Args:
    config: a phase config (experiments/configs/phase_{a,b,c}.py).
    workdir: run directory; reads `workdir/<previous phase>/`, writes
      `workdir/<phase>/`.
    stop_after_update: stop once this many updates are complete (as if killed right
      after that update's checkpoint, if one was due; drills and tests).
  Returns:
    Final metrics (JSON values): 'phase', 'step' (completed updates), 'num_updates',
    'complete', 'selected_step' (the internal-dev selection), 'wall_time_s' (this
    call, seconds), 'cumulative_wall_time_s',
    'reference_phase', 'reference_step', 'reference_params_sha256',
    'params_sha256' (final θ), 'resumed_from' (restored step or 0) and the last logged
    update's metrics (`train/*`, `reward/*`, `rollout/*`, `time/*`, ...).
  Raises:
    ValueError: a bad config field; a workdir holding this phase with other settings or
      a different reference policy.
    checkpoints.CheckpointError: the previous phase has no restorable checkpoint, or
      this phase's checkpoints are all unrestorable.
    nonfinite.NonFiniteError: rl.max_consecutive_skips optimizer steps in a row had a
      non-finite loss or gradient (the last checkpoint holds the last finite θ).
  """
  t_start = time.time()
  if config.phase not in run_setup.RL_PHASES:
    raise ValueError(f'config.phase: run_rl_phase trains {run_setup.RL_PHASES}, got '
                     f'{config.phase!r}')
  run = run_setup.RunSetup.from_config(config)
  phase, total = run.phase, run.rl.num_updates
  prev = run_setup.PREVIOUS_PHASE[phase]
  directory = checkpoints.phase_dir(workdir, phase)
  prev_dir = checkpoints.phase_dir(workdir, prev)
  fingerprint = rl_resume.trajectory_fingerprint(run)
  mesh = setup_lib.make_mesh(run.model.mesh)
  init_opt = optim.make_optimizer(run.rl.opt).init
  # Abstract arrays with the mesh shardings: restores land directly on the layout.
  param_shapes, opt_shapes = setup_lib.abstract_train_state(run.model.config, init_opt,
                                                            mesh)
  runner_config = phase_runner.RunnerConfig(
      name=phase, total=total, eval_every=run.rl.eval_every,
      max_consecutive_skips=run.rl.max_consecutive_skips, loop=run.loop, unit='update')
  primary = distributed.is_primary()
  with phase_runner.PhaseRunner(directory, runner_config, primary=primary,
                                t_start=t_start) as runner:
    restored = runner.restore(checkpoints.TrainState(
        step=0, params=param_shapes, opt_state=opt_shapes,
        rng=task_selection.update_rng(run.seed, 1), running_stats={}, data_position={},
        metadata={}), lambda r: rl_resume.check_resume(r.metadata, fingerprint, directory,
                                                       run.model.hf_checkpoint))
    md = runner.metadata
    if restored is not None and restored.step >= total and md.get('final_metrics'):
      logging.info('%s in %s is complete at update %d; nothing to do', phase, directory,
                   restored.step)
      done = dict(md['final_metrics'])
      done['selected_step'] = runner.manager.best_step()
      done['wall_time_s'] = time.time() - t_start
      return done
    ref_params, reference = _reference(phase, prev, prev_dir, param_shapes, restored,
                                       directory)
    group = distributed.process_group()
    # An 'llm' solver answers each process's own episodes: its model lives on this
    # process's devices, outside the collective programs.
    setup = distributed.agree(lambda: rl_setup.build_setup(
        run, mesh=mesh if group is None else setup_lib.process_local_mesh(run.model.mesh),
        num_processes=distributed.process_count()))
    distributed.check_same(f'{phase} train episodes', distributed.digest(
        [spec.episode_id for spec in setup.train_specs]))
    params, opt_state, running, dev_start = _start_state(
        run, setup, restored, runner.metadata, ref_params=ref_params,
        reference=reference, init_opt=init_opt, mesh=mesh, directory=directory)
    loop = _RLPhase(runner, setup, mesh=mesh, params=params, ref_params=ref_params,
                    opt_state=opt_state, running=running, reference=reference,
                    fingerprint=fingerprint, dev_start=dev_start)
    try:
      runner.run(loop, stop=stop_after_update,
                 first_rows=[dev_start] if dev_start and runner.step == 0 else [])
    finally:
      loop.close()
  selected = runner.manager.best_step()
  if selected is not None:
    logging.info('%s: selected checkpoint step %d on internal dev (%s)', phase,
                 selected, loop.metric)
  out = loop.final_metrics(runner.step, runner.wall_time())
  out['selected_step'] = selected
  out['wall_time_s'] = time.time() - t_start
  out.update(runner.compile_figures())
  return out


def _start_state(run: run_setup.RunSetup, setup: rl_setup.PhaseSetup,
                 restored: checkpoints.TrainState | None, metadata: Mapping[str, Any], *,
                 ref_params: Any, reference: dict[str, Any], init_opt: Any, mesh: Any,
                 directory: str) -> tuple[Any, Any, running_stats.RunningStats,
                                          dict[str, float]]:
  """The state update 1 (fresh) or update `restored.step + 1` (resumed) starts from.

  Fresh: θ_0 = π_ref's parameters (SPEC §4), a new AdamW state, running statistics
  from internal-dev transitions (App. F.4) and the internal-dev figures at θ_0; the
  reference record is written. Resumed: the checkpoint's θ, optimizer state and running
  statistics, after checking its data position.

  Returns:
    (params, opt_state, running statistics, internal-dev row at the phase start).
  Raises:
    ValueError: the restored checkpoint's data position is not this config's.
  """
  phase, primary = run.phase, distributed.is_primary()
  if restored is None:
    params = ref_params  # θ_0 = θ_prev (SPEC §4); arrays are immutable: sharing is safe
    dev_start = _dev_row('start', internal_dev_figures(
        setup, params, run.rl.internal_dev_episodes, mesh))
    opt_state = setup_lib.init_opt_state(init_opt, params, mesh)
    # Once (verifier calls), then the same statistics on every process.
    running, used = distributed.on_primary(lambda: rl_setup.init_running_stats(setup))
    logging.info('%s: running statistics initialized from dev transitions %s', phase,
                 used)
    reference['initial_params_sha256'] = rl_resume.params_fingerprint(params)
    reference['running_stats_init_counts'] = used
    if primary:
      rl_resume.write_reference(directory, reference)
    return params, opt_state, running, dev_start
  expected = rl_resume.data_position(restored.step, setup, run.seed)
  if restored.data_position != expected:
    raise ValueError(f'{directory}: checkpoint step {restored.step} has data '
                     f'position {restored.data_position}, expected {expected} '
                     '(different episodes); use a fresh --workdir')
  running = running_stats.RunningStats.from_dict(restored.running_stats)
  dev_start = dict(metadata.get('internal_dev_start') or {})
  if primary and rl_resume.read_reference(directory) is None:
    rl_resume.write_reference(directory, reference)
  logging.info('%s resumes from update %d of %d in %s', phase, restored.step,
               run.rl.num_updates, directory)
  return restored.params, restored.opt_state, running, dev_start


def check_resumable(run: run_setup.RunSetup, workdir: str) -> None:
  """Raises the ValueError `run_rl_phase` raises before training when
  `workdir/<run.phase>` holds a run with other settings (each differing fingerprint
  field named); reads the newest checkpoint's metadata only (`run.py --dry_run`)."""
  directory = checkpoints.phase_dir(workdir, run.phase)
  meta = checkpoints.newest_meta(directory)
  if meta is not None:
    rl_resume.check_resume(meta.get('metadata') or {}, rl_resume.trajectory_fingerprint(run),
                           directory, run.model.hf_checkpoint)


def _reference(phase: str, prev: str, prev_dir: str, param_shapes: Any,
               restored: checkpoints.TrainState | None,
               directory: str) -> tuple[Any, dict[str, Any]]:
  """π_ref = θ_prev (the previous phase's selected checkpoint) and its record; a
  restored run must have started from the same one."""
  ref_params, ref_step = checkpoints.restore_params_only(prev_dir, param_shapes,
                                                         prefer_best=True)
  ref_sha = rl_resume.params_fingerprint(ref_params)
  reference = {'phase': phase, 'reference_phase': prev, 'reference_dir': prev_dir,
               'reference_step': int(ref_step), 'params_sha256': ref_sha}
  if restored is not None:
    rl_resume.check_reference_unchanged(
        (restored.metadata or {}).get('reference') or {}, ref_step=ref_step,
        ref_sha=ref_sha, prev=prev, prev_dir=prev_dir, directory=directory)
  logging.info('%s: π_ref = %s step %d (params sha256 %s)', phase, prev, ref_step,
               ref_sha[:16])
  return ref_params, reference


def _final_metrics(phase: str, step: int, total: int, wall: float,
                   reference: Mapping[str, Any], params: Any, resumed_from: int,
                   row: Mapping[str, float]) -> dict[str, Any]:
  """The returned / stored summary (JSON values only)."""
  out = {'phase': phase, 'step': int(step), 'num_updates': int(total),
         'complete': step >= total, 'cumulative_wall_time_s': float(wall),
         'reference_phase': reference['reference_phase'],
         'reference_step': int(reference['reference_step']),
         'reference_params_sha256': reference['params_sha256'],
         'params_sha256': rl_resume.params_fingerprint(params),
         'resumed_from': int(resumed_from)}
  for k, v in row.items():
    out[k] = float(v) if math.isfinite(float(v)) else None
  return json.loads(json.dumps(out))
