"""K-group rollout collection for one GRPO update (SPEC §4-6; paper App. D.5, F.1-F.4).

One update (`collect_update`):
  1. Tasks: `tasks_per_update` EpisodeSpecs (SPEC §4: 8), each built ONCE by the phase
     generator; its initial state s_0 is shared (states are immutable) by K =
     `rollouts_per_task` isolated rollouts (SPEC §4: 8), which therefore differ only
     by policy sampling (App. D.5, Eq. 8). `select_tasks` gives a resumable,
     seed-determined choice from a pool.
  2. Episodes: all T*K rollouts advance together through `envs.environment.
     run_episodes`: per decision step ONE batched policy call over every live episode
     (`policy.SamplerPolicy`: one `models.generate`, padded to a fixed batch size) and
     ONE batched task-solver call. The loop records x_t, u_t, s̃_t, s_{t+1}, op,
     acceptance, violations, cost and the executor's Transition (parsed command) per
     decision.
  3. Verifiers: ONE `score_local` call over every decision of the update (rejected
     commands are not scored: r^local None, A^local 0) and ONE `score_global` call over
     all trajectories. The global input carries the reference answer and annotated
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

A missing global score (verifier fallback 'skip') counts as the midpoint 0.5 for v^coh
and v^state (decision; counted in `metrics['rollout/global_unscored']`).

Determinism: the update's key `rng` (e.g. `update_rng(seed, update)`) is folded with
the index of each policy call, so the same params, tasks and key reproduce the same
rollouts, rewards and advantages (the environment, oracle reader and heuristic
verifier are deterministic; RunningStats must be restored to the same state).

Timing (`RolloutResult.timings`, seconds): 'sampling' (generate incl. device sync),
'policy_tokenization' (chat template, encode, decode), 'solver' (task-solver calls),
'environment' (executor, interaction, serialization g(s): the rest of the episode
loop), 'verifier_local', 'verifier_global' (input building + scoring),
'rewards_advantages', 'total'. `RolloutResult.profile()` gives their shares.

Running statistics at phase start (`init_running_stats_from_dev`): SPEC §6 initializes
them from 128 executable dev transitions per enabled op type. Candidate transitions
come from the internal-dev pool only: SFT dev records (their target command executed on
their state; the default source, balanced over the 8 types), the reference command of
dev-pool phase episodes on s_0, or executable decisions of dev episodes run with the
phase's initial policy (`dev_inputs_from_results`). The first `count` accepted
transitions of each enabled type, in the given order, are scored by the local verifier
in one batched call and `RunningStats.init_from` resets the statistics to their mean
and variance.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import jax
import numpy as np

from vermem_jax.envs import environment
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import task_solvers
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.rl import advantages as adv
from vermem_jax.rl import batching
from vermem_jax.rl import rewards as rw
from vermem_jax.verifiers import adapters
from vermem_jax.verifiers import base as vbase

# v^coh / v^state used when the global verifier returned no score (fallback 'skip').
UNSCORED_GLOBAL_VALUE = 0.5
# Columns of an advantage-table row (train.metrics.ADVANTAGE_COLUMNS; rl does not
# import train).
ADVANTAGE_COLUMNS = ('phase', 'update', 'task', 'rollout', 'step', 'operation',
                     'accepted', 'violations', 'cost', 'r_local', 'A_local', 'A_global',
                     'A_hier', 'command_tokens')
TIMING_KEYS = ('sampling', 'policy_tokenization', 'solver', 'environment',
               'verifier_local', 'verifier_global', 'rewards_advantages', 'total')

# A rollout policy: (x_t of every live episode, PRNG key) -> one PolicyOutput (or plain
# command string, for scripted policies) per input. `policy.SamplerPolicy` is one.
RolloutPolicy = Callable[[Sequence[str], Any], Sequence[Any]]


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


# ------------------------------------------------------------------------ records


@dataclasses.dataclass(frozen=True)
class RolloutDecision:
  """One memory decision u_{t,k} of an update (DESIGN.md rollout-record contract).

  Attributes:
    index: position in the update's decision list (0-based; learner command id - 1).
    task: index q of the task within the update (its GRPO group).
    rollout: index k within the task's group (0..K-1).
    trajectory: flat trajectory index q*K + k.
    step: decision index t within the rollout.
    prompt_ids: policy prompt token ids [T_in] (chat-templated x_t), None for a
      scripted policy.
    command_ids: generated command token ids [L] (stop token included when generated).
    logprobs: sampler logprobs of command_ids [L] (float) under the sampling
      distribution (temperature / top-p), i.e. log π_θold.
    command: u_t text.
    op: op name ('Invalid' for text naming no tool).
    accepted: T_m committed the command (∅ included).
    violations: violation kinds (SPEC §3), in the order the environment recorded them.
    cost: c_{t,k} in [0, 1].
    is_tool_call: the command named a non-null tool.
    r_local: r^local_{t,k} in [0, 1], None when not scored (rejected / skipped).
    local_scores: the verifier's LocalScores, or None.
    a_local, a_global, a_hier: clipped A^local, A^global and A^hier (SPEC §6).
    record: the environment's DecisionRecord (x_t, s_t, s̃_t, s_{t+1}, b_t, z_{t+1},
      the executor's Transition).
  """
  index: int
  task: int
  rollout: int
  trajectory: int
  step: int
  prompt_ids: Optional[tuple[int, ...]]
  command_ids: Optional[tuple[int, ...]]
  logprobs: Optional[tuple[float, ...]]
  command: str
  op: str
  accepted: bool
  violations: tuple[str, ...]
  cost: float
  is_tool_call: bool
  r_local: Optional[float]
  local_scores: Optional[vbase.LocalScores]
  a_local: float
  a_global: float
  a_hier: float
  record: environment.DecisionRecord

  @property
  def policy_input(self) -> str:
    """x_t = g(s_t)."""
    return self.record.policy_input

  @property
  def command_tokens(self) -> int:
    """L_{t,k}: generated command tokens (0 for a scripted policy without ids)."""
    return len(self.command_ids) if self.command_ids is not None else 0


@dataclasses.dataclass(frozen=True)
class TrajectoryRewards:
  """Reward terms of one trajectory τ_k (SPEC §5; Eq. 12-18). All floats in [0, 1].

  Attributes:
    r_task, r_sup, v_coh, v_state, r_evid, r_state: Eq. 13-14 terms.
    cost_tokens, cost_task_steps, cost_tool_calls: the three online-cost components
      min-max normalized within the task's K rollouts (App. F.3).
    c_bar_online: their mean C̄^online; r_eff = 1[r^task >= δ](1 - C̄); r_global (Eq. 13).
    r_local_return: R^local (Eq. 12, monitoring), p_aux: P_aux (Eq. 16),
    m_all, m_ans: monitors (Eq. 17-18).
  """
  r_task: float
  r_sup: float
  v_coh: float
  v_state: float
  r_evid: float
  r_state: float
  cost_tokens: float
  cost_task_steps: float
  cost_tool_calls: float
  c_bar_online: float
  r_eff: float
  r_global: float
  r_local_return: float
  p_aux: float
  m_all: float
  m_ans: float

  def as_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RolloutTrajectory:
  """One rollout τ_k of a task's group.

  Attributes:
    index: flat trajectory index q*K + k.
    task, rollout: q and k.
    result: the environment's EpisodeResult (terminal state, answer, termination,
      online tokens, task steps, tool calls; its decisions keep x_t/u_t/s̃_t/s_{t+1}).
    rewards: TrajectoryRewards.
    global_scores: the verifier's GlobalScores, or None (fallback 'skip').
    a_global: clipped A^global_k; a_task: clipped group-normalized r^task (noVerify).
    decisions: (start, stop) slice of its decisions in RolloutResult.decisions.
  """
  index: int
  task: int
  rollout: int
  result: environment.EpisodeResult
  rewards: TrajectoryRewards
  global_scores: Optional[vbase.GlobalScores]
  a_global: float
  a_task: float
  decisions: tuple[int, int]

  @property
  def terminated_by(self) -> str:
    return self.result.terminated_by

  @property
  def final_state(self):
    return self.result.final_state

  @property
  def final_answer(self) -> Optional[str]:
    return self.result.final_answer


@dataclasses.dataclass(frozen=True)
class RolloutResult:
  """Everything one update collected (the lead's `train/rl_phase.py` input).

  Attributes:
    phase: phase name stored in table rows (e.g. 'phase_b').
    update: 1-based update index (advantage-table `update` column).
    tasks: the T EpisodeSpecs (group q = tasks[q]).
    rollouts_per_task: K.
    decisions: every decision, grouped by trajectory (q-major, then k, then t).
    trajectories: T*K RolloutTrajectory, index q*K + k.
    advantages: the rl.advantages.Advantages of the batch ([N] arrays in decision
      order).
    timings: seconds per stage (TIMING_KEYS).
    metrics: flat {name: float} summary for logging.
  """
  phase: str
  update: int
  tasks: tuple
  rollouts_per_task: int
  decisions: tuple[RolloutDecision, ...]
  trajectories: tuple[RolloutTrajectory, ...]
  advantages: adv.Advantages
  timings: dict
  metrics: dict

  @property
  def num_decisions(self) -> int:
    return len(self.decisions)

  def trajectory_decisions(self, index: int) -> tuple[RolloutDecision, ...]:
    start, stop = self.trajectories[index].decisions
    return self.decisions[start:stop]

  def advantage_rows(self) -> list[dict]:
    """One advantage-table row per decision (ADVANTAGE_COLUMNS, train.metrics)."""
    return [{
        'phase': self.phase, 'update': int(self.update), 'task': d.task,
        'rollout': d.rollout, 'step': d.step, 'operation': d.op,
        'accepted': bool(d.accepted), 'violations': list(d.violations),
        'cost': float(d.cost), 'r_local': d.r_local, 'A_local': float(d.a_local),
        'A_global': float(d.a_global), 'A_hier': float(d.a_hier),
        'command_tokens': d.command_tokens} for d in self.decisions]

  def decision_tokens(self) -> list[batching.DecisionTokens]:
    """Learner inputs (rl.batching) in decision order, every decision included (∅ and
    rejected commands are trained too, SPEC §6).

    Raises:
      ValueError: a decision without token ids or logprobs (scripted policy).
    """
    out = []
    for d in self.decisions:
      if d.prompt_ids is None or d.command_ids is None or d.logprobs is None:
        raise ValueError(f'decision {d.index} (task {d.task}, rollout {d.rollout}, '
                         f'step {d.step}) has no token ids/logprobs: was the update '
                         'collected with a scripted policy?')
      out.append(batching.DecisionTokens(prompt_tokens=d.prompt_ids,
                                         command_tokens=d.command_ids,
                                         old_logprobs=d.logprobs,
                                         advantage=float(d.a_hier)))
    return out

  def profile(self) -> dict[str, float]:
    """Share of the update's collection time per stage (fractions of 'total'):
    sampling (generate + policy tokenization), solver, environment (executor,
    interaction, g(s)), verifiers (local + global), rewards_advantages, and other
    (record building, bookkeeping); the shares sum to 1."""
    t = self.timings
    total = max(t.get('total', 0.0), 1e-12)
    shares = {
        'sampling': (t['sampling'] + t['policy_tokenization']) / total,
        'solver': t['solver'] / total,
        'environment': t['environment'] / total,
        'verifiers': (t['verifier_local'] + t['verifier_global']) / total,
        'rewards_advantages': t['rewards_advantages'] / total,
    }
    shares['other'] = 1.0 - sum(shares.values())
    return shares


# ------------------------------------------------------------------------ tasks / keys


def update_rng(seed: int, update: int) -> jax.Array:
  """The PRNG key of update `update` (1-based) of a run seeded with `seed`."""
  return jax.random.fold_in(jax.random.PRNGKey(int(seed)), int(update))


def select_tasks(num_tasks_in_pool: int, update: int, tasks_per_update: int, *,
                 seed: int) -> list[int]:
  """Pool indices of the tasks of update `update` (1-based); resumable by construction.

  The pool is walked in epochs; epoch e is a permutation of range(pool) drawn from
  NumPy's PCG64 seeded with (seed, e). Update u takes positions
  [(u-1)*T, u*T) of the concatenated epochs, so the data position is the update index
  itself (a resumed run needs no iterator state).

  Raises:
    ValueError: an empty pool or update < 1.
  """
  if num_tasks_in_pool < 1:
    raise ValueError('select_tasks: the task pool is empty')
  if update < 1:
    raise ValueError(f'select_tasks: update is 1-based, got {update}')
  n = int(num_tasks_in_pool)
  out = []
  perms = {}
  for pos in range((update - 1) * tasks_per_update, update * tasks_per_update):
    epoch, i = divmod(pos, n)
    if epoch not in perms:
      perms[epoch] = np.random.default_rng([int(seed), epoch]).permutation(n)
    out.append(int(perms[epoch][i]))
  return out


class BoundPolicy:
  """A RolloutPolicy bound to a key: the `environment.Policy` run_episodes calls.

  Call i (0-based) passes jax.random.fold_in(rng, i) to the policy, so a run with the
  same key, params and inputs repeats exactly. Attributes: `calls` (policy calls so
  far) and `seconds` (wall time inside the policy).

  Args:
    policy: RolloutPolicy, `(inputs, rng) -> outputs`.
    rng: a jax PRNG key or an int seed.
  """

  def __init__(self, policy: RolloutPolicy, rng: Any):
    if isinstance(rng, (int, np.integer)):
      rng = jax.random.PRNGKey(int(rng))
    self.policy = policy
    self.rng = rng
    self.calls = 0
    self.seconds = 0.0

  def __call__(self, inputs: Sequence[str]) -> Sequence[Any]:
    t0 = time.perf_counter()
    key = jax.random.fold_in(self.rng, self.calls)
    self.calls += 1
    try:
      return self.policy(inputs, key)
    finally:
      self.seconds += time.perf_counter() - t0


# ------------------------------------------------------------------------ helpers


def _local_input_from_record(d: environment.DecisionRecord,
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


def trajectory_evidence(result: environment.EpisodeResult) -> frozenset[str]:
  """Evidence units S_pred for r^sup: those behind what the task solver reads at
  termination (C, or active LTM for an 'ltm' answer context) (decision, module doc)."""
  return environment.context_evidence(result.final_state, result.spec.answer_context)


# ------------------------------------------------------------------------ collection


def collect_update(tasks: Sequence[environment.EpisodeSpec], policy: RolloutPolicy,
                   solver: task_solvers.TaskSolver, verifier: vbase.Verifier, *,
                   rng: Any, count_tokens: Callable[[str], int],
                   rollouts_per_task: int,
                   running_stats: Optional[adv.RunningStats],
                   executor_config: mexec.ExecutorConfig = mexec.ExecutorConfig(),
                   env_config: environment.EnvConfig = environment.EnvConfig(),
                   advantage_config: adv.AdvantageConfig = adv.AdvantageConfig(),
                   reward_config: rw.RewardConfig = rw.RewardConfig(),
                   phase: str = '', update: int = 0, global_labels: bool = True,
                   update_running_stats: bool = True) -> RolloutResult:
  """Collects T tasks x K rollouts, scores them and computes A^hier (module docstring).

  Args:
    tasks: the T EpisodeSpecs of this update (each built once; its s_0 is shared by
      its K rollouts).
    policy: `(inputs, rng) -> outputs` batched policy (`policy.SamplerPolicy`, or a
      scripted callable returning command strings / PolicyOutputs).
    solver: the batched task solver π_task.
    verifier: local + global verifier (verifiers.make_verifier).
    rng: the update's PRNG key (`update_rng`) or an int seed; policy call i gets
      fold_in(rng, i) (`BoundPolicy`).
    count_tokens: backbone `str -> int` token counter.
    rollouts_per_task: K.
    running_stats: the phase RunningStats (required by advantage modes using A^local;
      updated in place after use when update_running_stats).
    executor_config, env_config: memory executor and episode-loop settings.
    advantage_config, reward_config: SPEC §5-6 settings.
    phase: phase name for the advantage-table rows (e.g. 'phase_b').
    update: 1-based update index for the rows.
    global_labels: give the global verifier the reference answer and supporting facts
      (training, App. F.1/F.3).
    update_running_stats: fold this batch into running_stats (False for diagnostics).

  Returns:
    RolloutResult.

  Raises:
    ValueError: no tasks, K < 1, or errors of the environment / advantages (bad
      policy output counts, out-of-range rewards).
  """
  tasks = list(tasks)
  if not tasks:
    raise ValueError('collect_update: no tasks')
  k_group = int(rollouts_per_task)
  if k_group < 1:
    raise ValueError(f'collect_update: rollouts_per_task must be >= 1, got {k_group}')
  timings = dict.fromkeys(TIMING_KEYS, 0.0)
  t_start = time.perf_counter()
  policy_timings0 = dict(getattr(policy, 'timings', {}) or {})
  counters = getattr(verifier, 'counters', None)
  counters0 = counters.snapshot() if counters is not None else {}

  specs = [task for task in tasks for _ in range(k_group)]
  step_policy = BoundPolicy(policy, rng)

  solver_time = [0.0]

  class _TimedSolver(task_solvers.TaskSolver):

    def solve(self, inputs):
      t0 = time.perf_counter()
      out = solver.solve(inputs)
      solver_time[0] += time.perf_counter() - t0
      return out

  t0 = time.perf_counter()
  results = environment.run_episodes(specs, step_policy, _TimedSolver(),
                                     count_tokens=count_tokens,
                                     executor_config=executor_config,
                                     env_config=env_config)
  loop_time = time.perf_counter() - t0
  policy_timings1 = dict(getattr(policy, 'timings', {}) or {})
  tok_time = (policy_timings1.get('tokenization', 0.0)
              - policy_timings0.get('tokenization', 0.0))
  timings['policy_tokenization'] = tok_time
  timings['sampling'] = step_policy.seconds - tok_time
  timings['solver'] = solver_time[0]
  timings['environment'] = loop_time - step_policy.seconds - solver_time[0]

  # ---- local verifier: one batched call over every decision of the update.
  t0 = time.perf_counter()
  flat = []  # (trajectory index, DecisionRecord)
  for j, res in enumerate(results):
    for d in res.decisions:
      flat.append((j, d))
  local_inputs = []
  for j, d in flat:
    cfg = environment.executor_config_for(results[j].spec, executor_config)
    local_inputs.append(_local_input_from_record(d, cfg.ops))
  local_scores = verifier.score_local(local_inputs) if local_inputs else []
  timings['verifier_local'] = time.perf_counter() - t0

  # ---- global verifier: one batched call over all trajectories.
  t0 = time.perf_counter()
  global_inputs = []
  for res in results:
    ex = res.spec.example
    if global_labels:
      global_inputs.append(adapters.global_input(
          res.final_state, res.final_answer, reference_answer=ex.answer,
          supporting_facts=supporting_fact_views(ex)))
    else:
      global_inputs.append(adapters.global_input(res.final_state, res.final_answer))
  global_scores = verifier.score_global(global_inputs)
  timings['verifier_global'] = time.perf_counter() - t0

  # ---- rewards and advantages.
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
  v_coh = np.array([g.v_coh if g is not None else UNSCORED_GLOBAL_VALUE
                    for g in global_scores], np.float64)
  v_state = np.array([g.v_state if g is not None else UNSCORED_GLOBAL_VALUE
                      for g in global_scores], np.float64)
  tokens = np.array([res.online_tokens for res in results], np.float64)
  steps = np.array([res.task_steps for res in results], np.float64)
  tool_calls = np.array([res.tool_calls for res in results], np.float64)

  fields = collections.defaultdict(lambda: np.zeros(n_traj, np.float64))
  for q in range(len(tasks)):
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

  group_ids = np.repeat(np.arange(len(tasks)), k_group)
  advantages = adv.compute_advantages(
      group_ids=group_ids, trajectory_index=traj_of,
      ops=[d.op for _, d in flat], accepted=[bool(d.accepted) for _, d in flat],
      costs=costs, r_local=r_local, r_global=fields['r_global'], r_task=r_task,
      config=advantage_config, running_stats=running_stats,
      update_running_stats=update_running_stats)
  timings['rewards_advantages'] = time.perf_counter() - t0

  # ---- records.
  decisions = []
  for i, ((j, d), s) in enumerate(zip(flat, local_scores)):
    out = d.policy_output
    decisions.append(RolloutDecision(
        index=i, task=j // k_group, rollout=j % k_group, trajectory=j, step=d.step,
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
    rewards = TrajectoryRewards(
        r_task=float(r_task[j]), r_sup=float(r_sup[j]), v_coh=float(v_coh[j]),
        v_state=float(v_state[j]),
        **{name: float(fields[name][j]) for name in (
            'r_evid', 'r_state', 'cost_tokens', 'cost_task_steps', 'cost_tool_calls',
            'c_bar_online', 'r_eff', 'r_global', 'r_local_return', 'p_aux', 'm_all',
            'm_ans')})
    trajectories.append(RolloutTrajectory(
        index=j, task=j // k_group, rollout=j % k_group, result=res, rewards=rewards,
        global_scores=global_scores[j], a_global=float(advantages.traj_a_global[j]),
        a_task=float(advantages.traj_a_task[j]), decisions=(start, stop)))
    start = stop

  timings['total'] = time.perf_counter() - t_start
  metrics = _metrics(decisions, trajectories, advantages, timings, step_policy.calls,
                     unscored_global)
  if counters is not None:  # this update's verifier events (counters accumulate)
    for key, value in counters.snapshot().items():
      metrics[f'verifier/{key}'] = float(value - counters0.get(key, 0))
  return RolloutResult(phase=phase, update=int(update), tasks=tuple(tasks),
                       rollouts_per_task=k_group, decisions=tuple(decisions),
                       trajectories=tuple(trajectories), advantages=advantages,
                       timings=timings, metrics=metrics)


def _metrics(decisions, trajectories, advantages, timings, policy_calls,
             unscored_global) -> dict[str, float]:
  n = max(len(decisions), 1)
  m = {
      'rollout/num_trajectories': float(len(trajectories)),
      'rollout/num_decisions': float(len(decisions)),
      'rollout/policy_calls': float(policy_calls),
      'rollout/rejected_rate': sum(not d.accepted for d in decisions) / n,
      'rollout/mean_cost': sum(d.cost for d in decisions) / n,
      'rollout/mean_command_tokens': sum(d.command_tokens for d in decisions) / n,
      'rollout/global_unscored': float(unscored_global),
  }
  for name in ('r_task', 'r_sup', 'r_evid', 'r_state', 'r_eff', 'r_global',
               'r_local_return', 'p_aux', 'm_all', 'm_ans'):
    vals = [getattr(t.rewards, name) for t in trajectories]
    m[f'reward/{name}'] = float(np.mean(vals)) if vals else 0.0
  ops = collections.Counter(d.op for d in decisions)
  for op, c in sorted(ops.items()):
    m[f'rollout/op_share_{op}'] = c / n
  ends = collections.Counter(t.terminated_by for t in trajectories)
  for reason in environment.TERMINATION_REASONS:
    m[f'rollout/terminated_{reason}'] = ends.get(reason, 0) / max(len(trajectories), 1)
  for key, value in timings.items():
    m[f'time/{key}_s'] = float(value)
  m.update(advantages.metrics)
  return m


# ------------------------------------------------------------------------ dev init


def dev_inputs_from_sft_records(records: Iterable[Any], *,
                                count_tokens: Callable[[str], int],
                                executor_config: mexec.ExecutorConfig
                                ) -> list[vbase.LocalVerifierInput]:
  """Executable dev transitions from SFT dev records (`envs.sft_data.records.SFTRecord`).

  Each record's target command is executed on its state with `executor_config` in the
  record's phase subspace; rejected ones are skipped.
  """
  out = []
  for r in records:
    cfg = dataclasses.replace(executor_config, phase=r.phase, allowed_ops=None)
    tr = mexec.execute(r.state, r.target, cfg, count_tokens)
    if tr.accepted:
      out.append(adapters.local_input(r.state, tr, policy_input=r.policy_input,
                                      command_text=r.target, allowed_ops=cfg.ops))
  return out


def dev_inputs_from_episodes(specs: Iterable[Any], *,
                             count_tokens: Callable[[str], int],
                             executor_config: mexec.ExecutorConfig
                             ) -> list[vbase.LocalVerifierInput]:
  """Executable dev transitions: each dev episode's `reference_command` on its s_0
  (envs.scenarios.spec.ScenarioSpec); specs without one or with a rejected one are
  skipped."""
  out = []
  for spec in specs:
    command = getattr(spec, 'reference_command', '')
    if not command:
      continue
    cfg = environment.executor_config_for(spec, executor_config)
    s0 = spec.initial_state
    x = serialization.render_policy_input(s0, count_tokens, allowed_ops=cfg.ops,
                                          limit=cfg.policy_input_limit,
                                          context_budget=cfg.context_budget)
    tr = mexec.execute(s0, command, cfg, count_tokens)
    if tr.accepted:
      out.append(adapters.local_input(s0, tr, policy_input=x, command_text=command,
                                      allowed_ops=cfg.ops))
  return out


def dev_inputs_from_results(results: Iterable[environment.EpisodeResult], *,
                            executor_config: mexec.ExecutorConfig
                            ) -> list[vbase.LocalVerifierInput]:
  """Executable decisions of dev episodes run through `run_episodes` (e.g. with the
  phase's initial policy), in episode then step order."""
  out = []
  for res in results:
    cfg = environment.executor_config_for(res.spec, executor_config)
    for d in res.decisions:
      if d.accepted:
        out.append(_local_input_from_record(d, cfg.ops))
  return out


def init_running_stats_from_dev(verifier: vbase.Verifier,
                                dev_inputs: Sequence[vbase.LocalVerifierInput], *,
                                ops: Sequence[str], count: int,
                                decay: float = adv.AdvantageConfig.running_stats_decay,
                                running_stats: Optional[adv.RunningStats] = None,
                                ) -> tuple[adv.RunningStats, dict[str, int]]:
  """Phase-start RunningStats from scored dev transitions (SPEC §6, App. F.4).

  Takes, for each enabled op type in `ops`, the first `count` accepted inputs of that
  type in `dev_inputs` order (SPEC §6: 128; config advantage.running_stats_init_count),
  scores them with ONE `verifier.score_local` call and resets the statistics to their
  mean and (population) variance via `RunningStats.init_from`. Types with no scored
  transition stay uninitialized (their A^local is 0 until the batch has >= 8).

  Args:
    verifier: the phase's local verifier.
    dev_inputs: candidate LocalVerifierInputs from the internal-dev pool
      (`dev_inputs_from_sft_records` / `_from_episodes` / `_from_results`).
    ops: op types enabled in the phase (memory.PHASE_OPS[op_space]).
    count: transitions per type.
    decay: EMA decay (SPEC §6: 0.99) for a new RunningStats.
    running_stats: an existing RunningStats to reset and fill instead.

  Returns:
    (RunningStats, {op: number of scored transitions used}).

  Raises:
    ValueError: count < 1 or an unknown op.
  """
  if int(count) < 1:
    raise ValueError(f'init_running_stats_from_dev: count must be >= 1, got {count}')
  ops = tuple(ops)
  for op in ops:
    if op not in adv.ALL_OPS:
      raise ValueError(f'unknown op {op!r}; expected one of {adv.ALL_OPS}')
  chosen = {op: [] for op in ops}
  for inp in dev_inputs:
    if inp.accepted and inp.op in chosen and len(chosen[inp.op]) < count:
      chosen[inp.op].append(inp)
  flat = [(op, inp) for op in ops for inp in chosen[op]]
  scores = verifier.score_local([inp for _, inp in flat]) if flat else []
  by_op = {op: [] for op in ops}
  for (op, _), s in zip(flat, scores):
    if s is not None:
      by_op[op].append(s.r_local)
  stats = running_stats if running_stats is not None else adv.RunningStats(decay)
  stats.init_from({op: v for op, v in by_op.items() if v})
  return stats, {op: len(v) for op, v in by_op.items()}
