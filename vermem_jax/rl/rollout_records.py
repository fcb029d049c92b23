"""Records of one GRPO update's rollouts (DESIGN.md rollout-record contract; SPEC §4-6).

`rl.rollout.collect_update` returns a `RolloutResult`: every memory decision u_{t,k} as
a `RolloutDecision` (x_t, s̃_t, s_{t+1} through the environment's DecisionRecord, the
command's token ids and sampler logprobs, op, acceptance, violations, cost, r^local and
the clipped A^local, A^global, A^hier), every rollout τ_k as a `RolloutTrajectory` with
its `TrajectoryRewards` (paper Eq. 12-18), the batch's `rl.advantages.Advantages`,
per-stage timings and a flat metric summary. A result becomes learner rows
(`decision_tokens`, rl.batching) and advantage-table rows (`advantage_rows`).

Timing (`RolloutResult.timings`, seconds): 'sampling' (generate incl. device sync),
'policy_tokenization' (chat template, encode, decode), 'solver' (task-solver calls),
'environment' (executor, interaction, serialization g(s): the rest of the episode
loop), 'verifier_local', 'verifier_global' (input building + scoring),
'rewards_advantages', 'total'. `RolloutResult.profile()` gives their shares.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Mapping, Optional, Sequence

import numpy as np

from vermem_jax.envs import episode_types
from vermem_jax.memory import config as mconfig
from vermem_jax.rl import advantages as adv
from vermem_jax.rl import batching
from vermem_jax.verifiers import base as vbase

# Columns of an advantage-table row (train.metrics.ADVANTAGE_COLUMNS; rl does not
# import train).
ADVANTAGE_COLUMNS = ('phase', 'update', 'task', 'rollout', 'step', 'operation',
                     'accepted', 'violations', 'cost', 'r_local', 'A_local', 'A_global',
                     'A_hier', 'command_tokens')
TIMING_KEYS = ('sampling', 'policy_tokenization', 'solver', 'environment',
               'verifier_local', 'verifier_global', 'rewards_advantages', 'total')


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
  record: episode_types.DecisionRecord

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
    r_task, r_sup, v_coh, v_state, r_evid, r_state: Eq. 13-14 terms; v_coh, v_state and
      r_state are NaN when the global verifier gave no score (fallback 'skip': left
      out of r_global, rl.rewards.group_rewards).
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
  result: episode_types.EpisodeResult
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


def update_metrics(decisions: Sequence[RolloutDecision],
                   trajectories: Sequence[RolloutTrajectory], advantages: adv.Advantages,
                   timings: Mapping[str, float], policy_calls: int,
                   unscored_global: int) -> dict[str, float]:
  """The flat metric summary of an update (`RolloutResult.metrics`): counts, rejected
  rate and its parts unparseable and outside the phase's tools (memory.config
  .REJECTION_PARTS; shares of all decisions), mean cost and command length per
  decision, rejected tool calls (summed over trajectories), reward means per
  trajectory, op shares, termination shares, stage seconds and the advantage
  metrics."""
  n = max(len(decisions), 1)
  m = {
      'rollout/num_trajectories': float(len(trajectories)),
      'rollout/num_decisions': float(len(decisions)),
      'rollout/policy_calls': float(policy_calls),
      'rollout/rejected_rate': sum(not d.accepted for d in decisions) / n,
      'rollout/mean_cost': sum(d.cost for d in decisions) / n,
      'rollout/mean_command_tokens': sum(d.command_tokens for d in decisions) / n,
      'rollout/global_unscored': float(unscored_global),
      # Non-null commands the executor rejected: not tool calls of the online cost.
      'rollout/rejected_tool_calls': float(sum(t.result.rejected_tool_calls
                                               for t in trajectories)),
  }
  for name in ('r_task', 'r_sup', 'r_evid', 'r_state', 'r_eff', 'r_global',
               'r_local_return', 'p_aux', 'm_all', 'm_ans'):
    # r_state is NaN for rollouts the global verifier did not score: mean of the rest.
    vals = [v for v in (getattr(t.rewards, name) for t in trajectories)
            if not math.isnan(v)]
    m[f'reward/{name}'] = float(np.mean(vals)) if vals else 0.0
  parts = mconfig.rejection_parts(d.violations[0] for d in decisions
                                  if not d.accepted and d.violations)
  for part, count in parts.items():
    m[f'rollout/{part}_rate'] = count / n
  ops = collections.Counter(episode_types.decision_kind(d) for d in decisions)
  for op, c in sorted(ops.items()):
    m[f'rollout/op_share_{op}'] = c / n
  ends = collections.Counter(t.terminated_by for t in trajectories)
  for reason in episode_types.TERMINATION_REASONS:
    m[f'rollout/terminated_{reason}'] = ends.get(reason, 0) / max(len(trajectories), 1)
  for key, value in timings.items():
    m[f'time/{key}_s'] = float(value)
  m.update(advantages.metrics)
  return m
