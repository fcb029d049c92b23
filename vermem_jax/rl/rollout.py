"""K-group rollout collection for one GRPO update (SPEC §4-6; paper App. D.5, F.1-F.4).

One update (`collect_update`):
  1. Tasks: `tasks_per_update` EpisodeSpecs (SPEC §4: 8), each built ONCE by the phase
     generator; its initial state s_0 is shared (states are immutable) by K =
     `rollouts_per_task` isolated rollouts (SPEC §4: 8), which therefore differ only
     by policy sampling (App. D.5, Eq. 8). `rl.task_selection.select_tasks` gives a
     resumable, seed-determined choice from a pool.
  2. Episodes: all T*K rollouts advance together through `envs.environment.
     run_episodes`: per decision step ONE batched policy call over every live episode
     (`policy.SamplerPolicy`: one `models.generate`, padded to a fixed batch size) and
     ONE batched task-solver call. The loop records x_t, u_t, s̃_t, s_{t+1}, op,
     acceptance, violations, cost and the executor's Transition (parsed command) per
     decision.
  3. Verifiers: ONE `score_local` call over every decision of the update (rejected
     commands are not scored: r^local None, A^local 0) and ONE `score_global` call over
     all trajectories. The global input carries the decisions with their outcomes, the
     budgeted terminal history, and the reference answer and annotated
     supporting facts (training only, App. F.1/F.3; `global_labels=False` drops them);
     the local input never does.
  4. Rewards per task group (rl.rewards, Eq. 12-18): r^task (mean of EM and F1, 0
     without an answer), r^sup (recall of the supporting units among the evidence of
     what the task solver reads at termination: C, or active LTM for Phase A's delayed
     query; decision), r^evid, r^state, online cost (tokens, task steps, non-null tool
     calls; min-max within the group), r^eff, r^global, and the monitors R^local,
     P_aux, m^all, m^ans.
  5. Advantages (rl.advantages.compute_advantages, Eq. 5, 9): A^global per group,
     A^local per op type with the phase RunningStats (consulted before, then updated
     with this batch, per that module's documented rule), A^hier per decision.

A missing global score (verifier fallback 'skip') leaves that rollout's verifier terms
out of r^global (SPEC §5 decision; v^coh, v^state and r^state NaN,
`rewards.group_rewards`), counted in `metrics['rollout/global_unscored']`; a missing
local score gives that decision A^local = 0 (`advantage/num_accepted_unscored`), and
both are counted in `verifier/fallback_skip`. The online cost counts executed
non-null tool calls (EpisodeResult.tool_calls); rejected commands are not calls (their
cost c_{t,k} is in P_aux) and are reported as `rollout/rejected_tool_calls`. The global
verifier reads every decision of the trajectory (∅ included) with its outcome and the
terminal history within `verifier.global_history_tokens` (adapters.global_input).

Determinism: the update's key `rng` (e.g. `task_selection.update_rng(seed, update)`)
is folded with the index of each policy call (`task_selection.BoundPolicy`), so the
same params, tasks and key reproduce the same rollouts, rewards and advantages (the
environment, oracle reader and heuristic verifier are deterministic; RunningStats must
be restored to the same state).

The records it returns are in rl.rollout_records (with the per-stage timings); the
phase-start running statistics come from rl.running_stats_init.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from vermem_jax.envs import environment
from vermem_jax.envs import episode_types
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import task_solvers
from vermem_jax.memory import config as mconfig
from vermem_jax.rl import advantages as adv
from vermem_jax.rl import process_split
from vermem_jax.rl import rewards as rw
from vermem_jax.rl import rollout_records
from vermem_jax.rl import running_stats as running_stats_lib
from vermem_jax.rl import task_selection
from vermem_jax.verifiers import adapters
from vermem_jax.verifiers import base as vbase


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Group sizes of an update (config section `rl`; field names = its keys).

  Attributes:
    tasks_per_update: tasks q sampled per update (SPEC §4: 8).
    rollouts_per_task: K isolated rollouts per task from one shared s_0 (SPEC §4: 8).
  """
  tasks_per_update: int = 8  # SPEC §4
  rollouts_per_task: int = 8  # SPEC §4: K

  def __post_init__(self):
    if int(self.tasks_per_update) < 1:
      raise ValueError(f'tasks_per_update must be >= 1, got {self.tasks_per_update}')
    if int(self.rollouts_per_task) < 1:
      raise ValueError(f'rollouts_per_task must be >= 1, got {self.rollouts_per_task}')

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> 'RolloutConfig':
    """From config.rl (other keys of that section are ignored)."""
    return cls(tasks_per_update=int(section['tasks_per_update']),
               rollouts_per_task=int(section['rollouts_per_task']))

  @property
  def num_rollouts(self) -> int:
    return int(self.tasks_per_update) * int(self.rollouts_per_task)


# ------------------------------------------------------------------------ helpers


def local_input_from_record(d: episode_types.DecisionRecord,
                            allowed_ops: Sequence[str]) -> vbase.LocalVerifierInput:
  """LocalVerifierInput of a recorded decision (scope: s_t, u_t, s̃_t; App. F.1), from
  the executor's Transition the environment kept (parsed command, op, s̃_t).

  Raises:
    ValueError: a record without its Transition (built by hand, not by run_episodes).
  """
  if d.transition is None:
    raise ValueError(f'decision record at step {d.step} has no executor Transition; '
                     'build records with environment.run_episodes')
  return adapters.local_input(d.state, d.transition, policy_input=d.policy_input,
                              command_text=d.command, allowed_ops=allowed_ops)


def supporting_fact_views(example: hotpotqa.Example) -> tuple[vbase.ItemView, ...]:
  """The annotated supporting facts of `example` as ItemViews (unit id + sentence)."""
  units = {u.id: u for u in hotpotqa.evidence_units(example)}
  views = []
  for uid in hotpotqa.supporting_unit_ids(example):
    u = units.get(uid)
    views.append(vbase.ItemView(uid, getattr(u, 'text', '') if u is not None else ''))
  return tuple(views)


def trajectory_evidence(result: episode_types.EpisodeResult) -> frozenset[str]:
  """Evidence units S_pred for r^sup: those behind what the task solver reads at
  termination (C, or active LTM for an 'ltm' answer context) (decision, module doc)."""
  return environment.context_evidence(result.final_state, result.spec.answer_context)


# ------------------------------------------------------------------------ scoring


@dataclasses.dataclass
class _Scored:
  """Verifier scores and group rewards of one process's trajectories."""
  flat: list  # (trajectory index, DecisionRecord)
  local_scores: list
  global_scores: list
  r_local: np.ndarray
  r_task: np.ndarray
  r_sup: np.ndarray
  v_coh: np.ndarray
  v_state: np.ndarray
  fields: dict
  unscored_global: int
  advantage_inputs: dict  # keyword arguments of adv.compute_advantages
  seconds: float  # rewards (the verifier seconds are in `timings`)


def _score(results, num_tasks: int, k_group: int, verifier: vbase.Verifier,
           executor_config: mconfig.ExecutorConfig, reward_config: rw.RewardConfig,
           global_labels: bool, global_history_tokens: Optional[int],
           timings: dict) -> _Scored:
  """Local and global verifier calls (one batched call each) and the rewards of the
  `num_tasks` groups of K trajectories in `results` (module docstring, steps 3-4;
  `global_history_tokens` as in `collect_update`)."""
  # ---- local verifier: one batched call over every decision of the update.
  t0 = time.perf_counter()
  flat = []  # (trajectory index, DecisionRecord)
  for j, res in enumerate(results):
    for d in res.decisions:
      flat.append((j, d))
  local_inputs = []
  for j, d in flat:
    cfg = environment.executor_config_for(results[j].spec, executor_config)
    local_inputs.append(local_input_from_record(d, cfg.ops))
  local_scores = verifier.score_local(local_inputs) if local_inputs else []
  timings['verifier_local'] = time.perf_counter() - t0

  # ---- global verifier: one batched call over all trajectories.
  t0 = time.perf_counter()
  if global_history_tokens is None:
    global_history_tokens = getattr(getattr(verifier, 'config', None),
                                    'global_history_tokens', None)
  global_inputs = []
  for res in results:
    ex = res.spec.example
    labels = (dict(reference_answer=ex.answer, supporting_facts=supporting_fact_views(ex))
              if global_labels else {})
    global_inputs.append(adapters.global_input(
        res.final_state, res.final_answer, decisions=res.decisions,
        history_token_budget=global_history_tokens, **labels))
  global_scores = verifier.score_global(global_inputs)
  timings['verifier_global'] = time.perf_counter() - t0

  # ---- rewards.
  t0 = time.perf_counter()
  n_traj = len(results)
  r_local = np.array([s.r_local if s is not None else math.nan for s in local_scores],
                     np.float64)
  traj_of = np.array([j for j, _ in flat], np.int64)
  costs = np.array([float(d.cost) for _, d in flat], np.float64)
  r_task = np.array([rw.r_task(res.final_answer, res.spec.example.answer)
                     for res in results], np.float64)
  r_sup = np.array([rw.r_sup(trajectory_evidence(res),
                             hotpotqa.supporting_unit_ids(res.spec.example))
                    for res in results], np.float64)
  unscored_global = sum(1 for g in global_scores if g is None)
  v_coh = np.array([g.v_coh if g is not None else math.nan
                    for g in global_scores], np.float64)
  v_state = np.array([g.v_state if g is not None else math.nan
                      for g in global_scores], np.float64)
  tokens = np.array([res.online_tokens for res in results], np.float64)
  steps = np.array([res.task_steps for res in results], np.float64)
  tool_calls = np.array([res.tool_calls for res in results], np.float64)

  fields = collections.defaultdict(lambda: np.zeros(n_traj, np.float64))
  for q in range(num_tasks):
    sl = slice(q * k_group, (q + 1) * k_group)
    g = rw.group_rewards(r_task_values=r_task[sl], r_sup_values=r_sup[sl],
                         v_coh=v_coh[sl], v_state=v_state[sl], num_tokens=tokens[sl],
                         num_task_steps=steps[sl], num_tool_calls=tool_calls[sl],
                         config=reward_config)
    for name in ('r_evid', 'r_state', 'c_bar_online', 'r_eff', 'r_global'):
      fields[name][sl] = getattr(g, name)
    fields['cost_tokens'][sl] = rw.minmax_normalize_group(tokens[sl])
    fields['cost_task_steps'][sl] = rw.minmax_normalize_group(steps[sl])
    fields['cost_tool_calls'][sl] = rw.minmax_normalize_group(tool_calls[sl])
  for j in range(n_traj):
    sel = traj_of == j
    fields['r_local_return'][j] = rw.r_local_return(r_local[sel])
    fields['p_aux'][j] = rw.p_aux(costs[sel])
  fields['m_all'] = np.asarray(rw.m_all(fields['r_local_return'], fields['r_global'],
                                        fields['p_aux']), np.float64)
  fields['m_ans'] = np.asarray(rw.m_ans(r_task, fields['p_aux']), np.float64)
  advantage_inputs = dict(
      group_ids=np.repeat(np.arange(num_tasks), k_group), trajectory_index=traj_of,
      ops=[d.op for _, d in flat], accepted=[bool(d.accepted) for _, d in flat],
      costs=costs, r_local=r_local, r_global=fields['r_global'], r_task=r_task)
  return _Scored(flat=flat, local_scores=local_scores, global_scores=global_scores,
                 r_local=r_local, r_task=r_task, r_sup=r_sup, v_coh=v_coh,
                 v_state=v_state, fields=fields, unscored_global=unscored_global,
                 advantage_inputs=advantage_inputs, seconds=time.perf_counter() - t0)


# ------------------------------------------------------------------------ collection


@dataclasses.dataclass(frozen=True)
class CollectConfig:
  """How an update's rollouts are run and scored (config sections `rl`, `memory`,
  `episodes`, `advantage`, `reward`, `verifier`).

  Attributes:
    rollouts_per_task: K isolated rollouts per task (SPEC §4: 8).
    executor_config, env_config: memory executor and episode-loop settings.
    advantage_config, reward_config: SPEC §5-6 settings.
    global_labels: give the global verifier the reference answer and supporting facts
      (training, App. F.1/F.3).
    global_history_tokens: token budget of the terminal history in the global input;
      None = the verifier config's `global_history_tokens` (unbounded without one).
  """
  rollouts_per_task: int
  executor_config: mconfig.ExecutorConfig = mconfig.ExecutorConfig()
  env_config: episode_types.EnvConfig = episode_types.EnvConfig()
  advantage_config: adv.AdvantageConfig = adv.AdvantageConfig()
  reward_config: rw.RewardConfig = rw.RewardConfig()
  global_labels: bool = True
  global_history_tokens: Optional[int] = None


def collect_update(tasks: Sequence[episode_types.EpisodeSpec],
                   policy: task_selection.RolloutPolicy,
                   solver: task_solvers.TaskSolver, verifier: vbase.Verifier,
                   settings: CollectConfig, *, rng: Any,
                   count_tokens: Callable[[str], int],
                   running_stats: Optional[running_stats_lib.RunningStats], phase: str = '',
                   update: int = 0, update_running_stats: bool = True, group: Any = None
                   ) -> rollout_records.RolloutResult:
  """Collects T tasks x K rollouts, scores them and computes A^hier (module docstring).

  Args:
    tasks: the T EpisodeSpecs of this update (each built once; its s_0 is shared by
      its K rollouts).
    policy: `(inputs, rng) -> outputs` batched policy (`policy.SamplerPolicy`, or a
      scripted callable returning command strings / PolicyOutputs).
    solver: the batched task solver π_task.
    verifier: local + global verifier (verifiers.make_verifier).
    rng: the update's PRNG key (`task_selection.update_rng`) or an int seed; policy
      call i gets fold_in(rng, i) (`task_selection.BoundPolicy`).
    settings: K, executor / environment / advantage / reward settings, what the
      global verifier sees.
    count_tokens: backbone `str -> int` token counter.
    running_stats: the phase RunningStats (required by advantage modes using A^local;
      updated in place after use when update_running_stats).
    phase: phase name for the advantage-table rows (e.g. 'phase_b').
    update: 1-based update index for the rows.
    update_running_stats: fold this batch into running_stats (False for diagnostics).
    group: multi-process collection (train/distributed.py ProcessGroup; `policy` in
      collective mode): `tasks` are this process's block of the update's tasks, in
      process order. Rewards and A^global stay per process (each group's K rollouts
      are here); A^local's inputs are gathered so every process computes the
      advantages of the whole update, with the same running statistics
      (rl/process_split.py); indices in the records (decision, task, trajectory) are
      positions in the whole update. An error on any process is raised on all.

  Returns:
    rollout_records.RolloutResult (this process's decisions and trajectories).

  Raises:
    ValueError: no tasks, K < 1, or errors of the environment / advantages (bad
      policy output counts, out-of-range rewards).
  """
  executor_config, env_config = settings.executor_config, settings.env_config
  advantage_config, reward_config = settings.advantage_config, settings.reward_config
  global_labels = settings.global_labels
  global_history_tokens = settings.global_history_tokens
  tasks = list(tasks)
  if not tasks:
    raise ValueError('collect_update: no tasks')
  k_group = int(settings.rollouts_per_task)
  if k_group < 1:
    raise ValueError(f'collect_update: rollouts_per_task must be >= 1, got {k_group}')
  timings = dict.fromkeys(rollout_records.TIMING_KEYS, 0.0)
  t_start = time.perf_counter()
  policy_timings0 = dict(getattr(policy, 'timings', {}) or {})
  counters = getattr(verifier, 'counters', None)
  counters0 = counters.snapshot() if counters is not None else {}

  specs = [task for task in tasks for _ in range(k_group)]
  step_policy = task_selection.BoundPolicy(policy, rng)

  solver_time = [0.0]

  class _TimedSolver(task_solvers.TaskSolver):

    def solve(self, inputs):
      t0 = time.perf_counter()
      out = solver.solve(inputs)
      solver_time[0] += time.perf_counter() - t0
      return out

  def collect_local():
    """This process's episodes, verifier scores and group rewards (no collectives
    except the sampler's rounds)."""
    t0 = time.perf_counter()
    try:
      results = environment.run_episodes(specs, step_policy, _TimedSolver(),
                                         count_tokens=count_tokens,
                                         executor_config=executor_config,
                                         env_config=env_config)
    finally:
      if group is not None:  # keep joining the other processes' sampler rounds
        step_policy.drain()
    loop_time = time.perf_counter() - t0
    policy_timings1 = dict(getattr(policy, 'timings', {}) or {})
    tok_time = (policy_timings1.get('tokenization', 0.0)
                - policy_timings0.get('tokenization', 0.0))
    timings['policy_tokenization'] = tok_time
    timings['sampling'] = step_policy.seconds - tok_time
    timings['solver'] = solver_time[0]
    timings['environment'] = loop_time - step_policy.seconds - solver_time[0]
    return results, _score(results, len(tasks), k_group, verifier, executor_config,
                           reward_config, global_labels, global_history_tokens,
                           timings)

  if group is None:
    results, scored = collect_local()
    t0 = time.perf_counter()
    advantages = adv.compute_advantages(
        **scored.advantage_inputs, config=advantage_config,
        running_stats=running_stats, update_running_stats=update_running_stats)
    offsets = process_split.Offsets()
  else:
    (results, scored), advantages, offsets = process_split.collective_advantages(
        group, collect_local, lambda local: local[1].advantage_inputs,
        rollouts_per_task=k_group, config=advantage_config,
        running_stats=running_stats, update_running_stats=update_running_stats)
    t0 = time.perf_counter()
  timings['rewards_advantages'] = scored.seconds + time.perf_counter() - t0
  flat, local_scores, global_scores = scored.flat, scored.local_scores, scored.global_scores
  r_local, fields = scored.r_local, scored.fields
  r_task, r_sup, v_coh, v_state = scored.r_task, scored.r_sup, scored.v_coh, scored.v_state

  # ---- records.
  decisions = []
  for i, ((j, d), s) in enumerate(zip(flat, local_scores)):
    out = d.policy_output
    decisions.append(rollout_records.RolloutDecision(
        index=offsets.decision + i, task=offsets.task + j // k_group,
        rollout=j % k_group, trajectory=offsets.trajectory + j, step=d.step,
        prompt_ids=out.prompt_ids, command_ids=out.token_ids, logprobs=out.logprobs,
        command=d.command, op=d.op, accepted=bool(d.accepted),
        violations=tuple(v.kind for v in d.violations), cost=float(d.cost),
        is_tool_call=bool(d.is_tool_call),
        r_local=None if math.isnan(r_local[i]) else float(r_local[i]),
        local_scores=s, a_local=float(advantages.a_local[i]),
        a_global=float(advantages.a_global[i]), a_hier=float(advantages.a_hier[i]),
        record=d))
  trajectories = []
  start = 0
  for j, res in enumerate(results):
    stop = start + len(res.decisions)
    rewards = rollout_records.TrajectoryRewards(
        r_task=float(r_task[j]), r_sup=float(r_sup[j]), v_coh=float(v_coh[j]),
        v_state=float(v_state[j]),
        **{name: float(fields[name][j]) for name in (
            'r_evid', 'r_state', 'cost_tokens', 'cost_task_steps', 'cost_tool_calls',
            'c_bar_online', 'r_eff', 'r_global', 'r_local_return', 'p_aux', 'm_all',
            'm_ans')})
    trajectories.append(rollout_records.RolloutTrajectory(
        index=offsets.trajectory + j, task=offsets.task + j // k_group,
        rollout=j % k_group, result=res, rewards=rewards,
        global_scores=global_scores[j], a_global=float(advantages.traj_a_global[j]),
        a_task=float(advantages.traj_a_task[j]), decisions=(start, stop)))
    start = stop

  timings['total'] = time.perf_counter() - t_start
  metrics = rollout_records.update_metrics(decisions, trajectories, advantages, timings,
                                           step_policy.calls, scored.unscored_global)
  if counters is not None:  # this update's verifier events (counters accumulate)
    for key, value in counters.snapshot().items():
      metrics[f'verifier/{key}'] = float(value - counters0.get(key, 0))
  return rollout_records.RolloutResult(
      phase=phase, update=int(update), tasks=tuple(tasks), rollouts_per_task=k_group,
      decisions=tuple(decisions), trajectories=tuple(trajectories),
      advantages=advantages, timings=timings, metrics=metrics)
