"""RL checkpoint selection on the internal-dev set (paper C.8; SPEC §7).

Every `rl.eval_every` updates (and after the last one) an RL phase runs its internal-dev
episodes (the phase's dev scenarios, built from the 10% internal-dev pool of the train
split, SPEC §4) with the current parameters: greedy decoding (temperature 0, top-p 1),
no verifier, the phase's own task solver. The score is the mean over those episodes of
the metric `rl.selection_metric`:

  r_task    mean of EM and token F1 of the final answer (0 without one; SPEC §5)
  em, f1    each alone
  sf_recall supporting-fact recall of what the solver read at its last call
  m_ans     clip(r_task − P_aux, 0, 1): the task score less the mean constraint cost
            of the episode's decisions (SPEC §5 monitor)

The checkpoint of that update is saved with selection metrics {'dev_score', 'step'};
the phase's selected checkpoint — what the next phase starts from and what evaluation
loads — is the best score, ties to the later step (`checkpoints.rl_selection_key`).
Held-out data and the evaluation judges never take part.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Sequence

import numpy as np

from vermem_jax.envs import answer_metrics
from vermem_jax.envs import environment
from vermem_jax.envs import episode_types
from vermem_jax.rl import process_split
from vermem_jax.rl import rewards
from vermem_jax.rl import task_selection
from vermem_jax.train import checkpoint_selection
from vermem_jax.train import internal_dev

SELECTION_METRICS = ('r_task', 'em', 'f1', 'sf_recall', 'm_ans')
DEFAULT_METRIC = 'r_task'


def episode_scores(result: episode_types.EpisodeResult) -> dict[str, float]:
  """Every selection metric of one finished dev episode."""
  gold = result.spec.example.answer
  answer = result.final_answer
  em = answer_metrics.exact_match(answer, gold) if answer is not None else 0.0
  f1 = answer_metrics.f1_score(answer, gold) if answer is not None else 0.0
  r_task = rewards.r_task(answer, gold)
  p_aux = rewards.p_aux(result.constraint_costs)
  seen = answer_metrics.solver_seen_evidence(result)
  return {'r_task': r_task, 'em': em, 'f1': f1,
          'sf_recall': answer_metrics.supporting_fact_recall(seen, result.spec.example),
          'm_ans': float(rewards.m_ans(r_task, p_aux))}


def check_metric(metric: str) -> str:
  if metric not in SELECTION_METRICS:
    raise ValueError(f'config.rl.selection_metric={metric!r}; expected one of '
                     f'{SELECTION_METRICS}')
  return metric


def dev_evaluation(specs: Sequence[episode_types.EpisodeSpec], policy: Any, solver: Any, *,
                   count_tokens: Callable[[str], int], executor_config: Any,
                   env_config: episode_types.EnvConfig, seed: int, metric: str,
                   group: Any = None) -> dict[str, float]:
  """Runs the dev episodes greedily and scores them.

  Args:
    specs: the phase's internal-dev EpisodeSpecs.
    policy: a greedy `(inputs, rng) -> outputs` sampler (`rl.policy.SamplerPolicy`
      with greedy=True) holding the parameters to score.
    solver: the phase's task solver.
    count_tokens, executor_config, env_config: as in training rollouts.
    seed: key of the (unused when greedy) sampler randomness.
    metric: one of SELECTION_METRICS.
    group: multi-process run (train/distributed.py ProcessGroup; `policy` in
      collective mode): each process runs its contiguous block of `specs` and the
      per-episode numbers are gathered, so every process returns the same values a
      single process would.

  Returns:
    {'dev/score': mean of `metric`, 'dev/<metric>' for every metric,
     'dev/tool_calls', 'dev/invalid_rate' (rejected decisions / decisions, unparseable
     text included), 'dev/episodes', 'dev/op_share/<op>' for every op that occurred
     (share of all decisions, `internal_dev.op_shares`)}.

  Raises:
    ValueError: an unknown metric or no dev episodes.
  """
  check_metric(metric)
  if not specs:
    raise ValueError('RL checkpoint selection needs internal-dev episodes '
                     '(config.episodes.num_dev >= 1)')
  bound = task_selection.BoundPolicy(policy, seed)

  def run_mine():
    try:
      results = environment.run_episodes(
          process_split.split_tasks(specs, group), bound, solver,
          count_tokens=count_tokens, executor_config=executor_config,
          env_config=env_config)
    finally:
      bound.drain()  # a collective policy keeps joining the other processes' rounds
    return [(episode_scores(r), r.num_decisions, r.tool_calls,
             sum(not d.accepted for d in r.decisions),
             collections.Counter(d.op for d in r.decisions)) for r in results]
  if group is None:
    per = run_mine()
  else:
    _, parts = process_split.run_and_share(run_mine, group.allgather, group.index)
    per = [row for part in parts for row in part]
  out = {f'dev/{k}': float(np.mean([p[0][k] for p in per])) for k in SELECTION_METRICS}
  decisions = sum(p[1] for p in per)
  out['dev/score'] = out[f'dev/{metric}']
  out['dev/tool_calls'] = float(np.mean([p[2] for p in per]))
  out['dev/invalid_rate'] = sum(p[3] for p in per) / max(decisions, 1)
  out['dev/episodes'] = float(len(per))
  ops = sum((p[4] for p in per), collections.Counter())
  out.update({f'dev/{k}': v for k, v in internal_dev.op_shares(ops).items()})
  return out


def selection_metrics(dev: dict[str, float], step: int) -> dict[str, float]:
  """The checkpoint's selection metrics (`checkpoints.rl_selection_key`)."""
  return {checkpoint_selection.RL_SELECTION_SCORE: float(dev['dev/score']),
          checkpoint_selection.RL_SELECTION_STEP: int(step)}


def is_eval_step(update: int, total: int, eval_every: int) -> bool:
  """Whether update `update` (1-based) of `total` is scored: every `eval_every`
  updates and the last one."""
  return update == total or (eval_every > 0 and update % eval_every == 0)
