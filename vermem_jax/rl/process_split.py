"""An update's rollouts split over the processes of a multi-host run (DESIGN.md "Scale").

With P processes, update n's T tasks are split into P contiguous blocks in task order
(`train/distributed.share`); process p runs its block's K-rollout groups. Listing the
processes' trajectories and decisions in process order then gives exactly the order one
process would use (task-major, then rollout, then step), which is what makes a split
run reproduce a single-process run:

- Rewards, group min-max costs, A^global and A^task are per task group, so they need
  nothing from other processes.
- A^local normalizes r^local per op type over the whole update batch when that type has
  >= 8 instances, else with the phase's running statistics, which are then folded with
  the batch in decision order (rl/advantages.py). `collective_advantages` therefore
  gathers every process's per-decision inputs (op, acceptance, cost, r^local, group and
  trajectory ids: a few numbers per decision), and every process computes the same
  advantages and the same running-statistics update; each keeps its own slice.
- `gather_result` gives every process the whole update's records in a light form
  (token ids, logprobs, scalars; no states or verifier inputs): the learner's rows,
  the advantage-table rows and the metrics of the whole update.

`group` is a duck-typed process group (train/distributed.py `ProcessGroup`): `index`,
`count` and `allgather(obj) -> [obj of process 0, ..., obj of process P-1]`, a
collective every process calls in the same order. Errors: `run_and_share` turns an
error on any process into the same error on every process, so no process is left
waiting in a collective.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Callable, Optional, Sequence

from absl import logging
import numpy as np

from vermem_jax.rl import advantages as adv
from vermem_jax.rl import rollout_records
from vermem_jax.rl import running_stats as running_stats_lib

_DECISION_ARRAYS = ('a_hier', 'a_local', 'a_global', 'a_task', 'costs')
_TRAJECTORY_ARRAYS = ('traj_a_global', 'traj_a_task')


@dataclasses.dataclass(frozen=True)
class Offsets:
  """Where this process's block starts in the whole update (0 for one process)."""
  task: int = 0
  trajectory: int = 0
  decision: int = 0


def portable_error(error: BaseException) -> BaseException:
  """`error` itself when it pickles (same type and message on other processes), else
  a RuntimeError carrying its type name and message."""
  try:
    pickle.loads(pickle.dumps(error))
    return error
  except Exception:  # pylint: disable=broad-except
    return RuntimeError(f'{type(error).__name__}: {error}')


def run_and_share(fn: Callable[[], Any], allgather: Callable[[Any], list],
                  index: int, *, share: Callable[[Any], Any] = lambda r: r
                  ) -> tuple[Any, list]:
  """Runs `fn()` here and gathers `share(result)` of every process (one collective).

  Args:
    fn: the work.
    allgather: the group's allgather.
    index: this process's index.
    share: what of the result the other processes get (it must pickle; the result
      itself need not).
  Returns:
    (this process's result, [share(result) of each process]).
  Raises:
    The error of the lowest-index process whose `fn` raised, on every process (the
    original exception object on that process itself).
  """
  own_error, result = None, None
  try:
    result = fn()
  except Exception as e:  # pylint: disable=broad-except
    own_error = e
  parts = allgather((share(result), None) if own_error is None
                    else (None, portable_error(own_error)))
  for i, (_, error) in enumerate(parts):
    if error is not None:
      logging.error('process %d failed (every process stops with its error): %s: %s',
                    i, type(error).__name__, error)
      if i == index and own_error is not None:
        raise own_error
      raise error
  return result, [r for r, _ in parts]


def collective_advantages(group: Any, collect_local: Callable[[], Any],
                          inputs_of: Callable[[Any], dict], *, rollouts_per_task: int,
                          config: adv.AdvantageConfig,
                          running_stats: Optional[running_stats_lib.RunningStats],
                          update_running_stats: bool
                          ) -> tuple[Any, adv.Advantages, Offsets]:
  """Runs this process's collection, then computes the whole update's advantages.

  Args:
    group: the process group.
    collect_local: this process's rollouts and scores (`rollout.collect_update`);
      its result is passed to `inputs_of`.
    inputs_of: result -> `adv.compute_advantages` keyword inputs of this process
      (group_ids 0..T_p-1, trajectory_index 0..M_p-1, ops, accepted, costs, r_local,
      r_global, r_task).
    rollouts_per_task: K.
    config, running_stats, update_running_stats: as for `adv.compute_advantages`; the
      running statistics are updated identically on every process.
  Returns:
    (collect_local's result, this process's slice of the whole update's Advantages
    (its `metrics` and `local_ops` are the whole update's), its Offsets).
  Raises:
    The first process's error (collection or advantages), on every process.
  """
  local, inputs = run_and_share(collect_local, group.allgather, group.index,
                                share=inputs_of)
  tasks = [len(np.asarray(i['group_ids'])) // rollouts_per_task for i in inputs]
  trajs = [len(np.asarray(i['group_ids'])) for i in inputs]
  decisions = [len(np.asarray(i['trajectory_index'])) for i in inputs]
  me = group.index
  offsets = Offsets(task=sum(tasks[:me]), trajectory=sum(trajs[:me]),
                    decision=sum(decisions[:me]))
  merged = {
      'group_ids': np.concatenate([np.asarray(i['group_ids']) + sum(tasks[:p])
                                   for p, i in enumerate(inputs)]),
      'trajectory_index': np.concatenate(
          [np.asarray(i['trajectory_index'], np.int64) + sum(trajs[:p])
           for p, i in enumerate(inputs)]),
      'ops': [op for i in inputs for op in i['ops']],
      'accepted': [a for i in inputs for a in i['accepted']],
  }
  for key in ('costs', 'r_local', 'r_global', 'r_task'):
    merged[key] = np.concatenate([np.asarray(i[key], np.float64) for i in inputs])
  whole = adv.compute_advantages(**merged, config=config, running_stats=running_stats,
                                 update_running_stats=update_running_stats)
  d0, m0 = offsets.decision, offsets.trajectory
  mine = dataclasses.replace(
      whole,
      **{k: getattr(whole, k)[d0:d0 + decisions[me]] for k in _DECISION_ARRAYS},
      **{k: getattr(whole, k)[m0:m0 + trajs[me]] for k in _TRAJECTORY_ARRAYS})
  return local, mine, offsets


# ----------------------------------------------------------------------------- records
def _light_decision(d: rollout_records.RolloutDecision) -> rollout_records.RolloutDecision:
  return dataclasses.replace(d, local_scores=None, record=None)


def _light_trajectory(t: rollout_records.RolloutTrajectory
                      ) -> rollout_records.RolloutTrajectory:
  # Every count of the EpisodeResult survives (tool calls, rejected calls, tokens).
  light = dataclasses.replace(t.result, spec=None, decisions=(), final_state=None)
  return dataclasses.replace(t, result=light)


def gather_result(result: rollout_records.RolloutResult,
                  group: Any) -> rollout_records.RolloutResult:
  """The whole update's RolloutResult on every process, from each process's own.

  Decisions keep their token ids, logprobs and scalars but drop the environment's
  DecisionRecord and the verifier's LocalScores; trajectories keep rewards, global
  scores, termination and token counts but not the episode's states (their
  `result.spec`, `final_state` are None). Timings are the slowest process's per stage;
  metrics are recomputed over all records (`rollout_records.update_metrics`), with
  verifier event counts summed. `tasks` is left empty. Without a group: `result`.
  """
  if group is None:
    return result
  mine = (tuple(_light_decision(d) for d in result.decisions),
          tuple(_light_trajectory(t) for t in result.trajectories),
          {k: getattr(result.advantages, k) for k in _DECISION_ARRAYS + _TRAJECTORY_ARRAYS},
          dict(result.timings),
          {k: v for k, v in result.metrics.items() if k.startswith('verifier/')
           or k in ('rollout/policy_calls', 'rollout/global_unscored')})
  parts = group.allgather(mine)
  decisions, trajectories = [], []
  for p_decisions, p_trajectories, *_ in parts:
    shift = len(decisions)
    decisions.extend(p_decisions)
    trajectories.extend(dataclasses.replace(
        t, decisions=(t.decisions[0] + shift, t.decisions[1] + shift))
                        for t in p_trajectories)
  arrays = {k: np.concatenate([np.asarray(p[2][k]) for p in parts])
            for k in _DECISION_ARRAYS + _TRAJECTORY_ARRAYS}
  advantages = dataclasses.replace(result.advantages, **arrays)
  timings = {k: max(float(p[3].get(k, 0.0)) for p in parts) for k in result.timings}
  counts = [p[4] for p in parts]
  metrics = rollout_records.update_metrics(
      decisions, trajectories, advantages, timings,
      max(int(c.get('rollout/policy_calls', 0)) for c in counts),
      sum(int(c.get('rollout/global_unscored', 0)) for c in counts))
  for key in sorted({k for c in counts for k in c if k.startswith('verifier/')}):
    metrics[key] = float(sum(c.get(key, 0.0) for c in counts))
  return dataclasses.replace(result, tasks=(), decisions=tuple(decisions),
                             trajectories=tuple(trajectories), advantages=advantages,
                             timings=timings, metrics=metrics)


def block(n: int, index: int, count: int) -> tuple[int, int]:
  """[start, stop) of block `index` when n items are split into `count` contiguous
  blocks in order (earlier blocks take one more when count does not divide n)."""
  base, extra = divmod(int(n), int(count))
  start = index * base + min(index, extra)
  return start, start + base + (1 if index < extra else 0)


def split_tasks(task_ids: Sequence[int], group: Any) -> list[int]:
  """This process's contiguous block of an update's task ids (all without a group)."""
  if group is None:
    return list(task_ids)
  start, stop = block(len(task_ids), group.index, group.count)
  return list(task_ids[start:stop])
