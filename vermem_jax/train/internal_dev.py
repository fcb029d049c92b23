"""Greedy internal-dev episodes of a policy: the figures a phase summary reports.

`run_dev_episodes(specs, policy, solver, ...)` runs each internal-dev EpisodeSpec
once (SPEC §7 protocol for the episode: greedy policy decoding, temperature 0, no
verifier) through the batched episode loop (`envs.environment.run_episodes`) and
scores every trajectory with the reward functions of `rl.rewards`:

  r_task   = (EM + F1)/2 of the final answer (Eq. 13; 0 without an answer)
  r_sup    = supporting-fact recall of the evidence the trajectory held (Eq. 14)
  p_aux    = mean constraint cost over the trajectory's decisions (Eq. 16)
  m_ans    = clip(r_task − p_aux, 0, 1) (Eq. 18)

plus the rejected-command rate with its two commonest parts (text that is not a
command, a tool outside the phase's set), the operation mix (share of decisions per
`episode_types.decision_kind`: a tool call under its tool, text that is not a command
as Unparseable, as in the evaluation's tables) and the mean decisions / tool calls per
episode. No verifier is called, so r^global and m^all are not part of it (they need
v^coh, v^state).

The internal-dev episodes come from the 10% internal-dev pool (SPEC §4, §7: checkpoint
selection and monitoring only; never the held-out evaluation). At the tiny scale the
task solver is the oracle-evidence reader, a CPU stand-in: r_task then measures whether
the memory policy put the supporting facts where the reader looks, not a model's
answer. `STAND_IN_NOTE` says so wherever the figures are printed.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vermem_jax.envs import environment
from vermem_jax.envs import answer_metrics
from vermem_jax.envs import episode_types
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory import config as mconfig
from vermem_jax.rl import process_split
from vermem_jax.rl import rewards as rw
from vermem_jax.rl import rollout
from vermem_jax.rl import task_selection

# Printed beside figures that the CPU stand-ins produce (GUIDE: label them).
STAND_IN_NOTE = ('CPU stand-ins: oracle-evidence reader as task solver, heuristic '
                 'verifier; not a model judge')
# Keys of `summary`'s result that are means over episodes.
EPISODE_METRICS = ('r_task', 'r_sup', 'p_aux', 'm_ans', 'rejected_rate',
                   'unparseable_rate', 'not_allowed_rate', 'decisions_per_episode',
                   'tool_calls_per_episode')


def run_dev_episodes(specs: Sequence[episode_types.EpisodeSpec],
                     policy: Callable[[Sequence[str], Any], Sequence[Any]], solver: Any, *,
                     count_tokens: Callable[[str], int], executor_config: Any,
                     env_config: episode_types.EnvConfig = episode_types.EnvConfig(),
                     rng: Any = 0, group: Any = None) -> list[dict[str, Any]]:
  """The internal-dev evaluation: runs every spec once with `policy` and scores it.

  Both readings of it come from these records: `summary` (the phase summary's
  `internal_dev/*` figures) and `selection_figures` (checkpoint selection's `dev/*`,
  train/rl_selection.py).

  Args:
    specs: internal-dev EpisodeSpecs (`envs.episodes.build_phase_episodes(...)[1]`).
    policy: a batched `(inputs, rng) -> PolicyOutputs` callable, normally
      `rl.policy.SamplerPolicy(..., greedy=True)` (greedy, so `rng` does not matter).
    solver: the task solver π_task (tiny scale: `task_solvers.OracleEvidenceReader`).
    count_tokens: the backbone token counter.
    executor_config: `memory.ExecutorConfig` (budgets, costs; phase from each spec).
    env_config: rollout limit and token budget.
    rng: key or int seed passed to the policy (call i gets fold_in(rng, i)).
    group: multi-process run (train/distributed.py ProcessGroup; `policy` in
      collective mode): each process runs its contiguous block of `specs` and the
      records are gathered, so every process returns what one process would.
  Returns:
    One record per episode, in spec order: 'r_task', 'em', 'f1', 'sf_recall', 'm_ans',
    'r_sup', 'p_aux' (floats), 'decisions', 'tool_calls', 'rejected' (ints), of the
    rejected ones 'unparseable' and 'not_allowed' (ints; memory.config.REJECTION_PARTS:
    a decision rejected for another check is in neither), 'ops' (Counter
    episode_types.decision_kind -> decisions).
  Raises:
    ValueError: no specs.
  """
  if not specs:
    raise ValueError('the internal-dev evaluation needs at least one episode spec '
                     '(config.episodes.num_dev >= 1)')
  bound = task_selection.BoundPolicy(policy, rng)

  def run_mine():
    try:
      results = environment.run_episodes(
          process_split.split_tasks(list(specs), group), bound, solver,
          count_tokens=count_tokens, executor_config=executor_config,
          env_config=env_config)
    finally:
      bound.drain()  # a collective policy keeps joining the other processes' rounds
    return [episode_record(r) for r in results]

  if group is None:
    return run_mine()
  _, parts = process_split.run_and_share(run_mine, group.allgather, group.index)
  return [row for part in parts for row in part]


def episode_record(result: episode_types.EpisodeResult) -> dict[str, Any]:
  """The scores and counts of one finished dev episode (`run_dev_episodes`)."""
  example = result.spec.example
  gold, answer = example.answer, result.final_answer
  r_task = rw.r_task(answer, gold)
  p_aux = rw.p_aux(result.constraint_costs)
  seen = answer_metrics.solver_seen_evidence(result)
  return {'r_task': r_task,
          'em': answer_metrics.exact_match(answer, gold) if answer is not None else 0.0,
          'f1': answer_metrics.f1_score(answer, gold) if answer is not None else 0.0,
          'sf_recall': answer_metrics.supporting_fact_recall(seen, example),
          'm_ans': float(rw.m_ans(r_task, p_aux)),
          'r_sup': rw.r_sup(rollout.trajectory_evidence(result), example.supporting_facts),
          'p_aux': p_aux, 'decisions': result.num_decisions,
          'tool_calls': result.tool_calls,
          'rejected': sum(not d.accepted for d in result.decisions),
          **mconfig.rejection_parts(d.violations[0].kind for d in result.decisions
                                    if not d.accepted and d.violations),
          'ops': collections.Counter(episode_types.decision_kind(d)
                                     for d in result.decisions)}


def summary(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """The phase summary's figures of `run_dev_episodes` records.

  Returns:
    {'num_episodes', each of EPISODE_METRICS (mean over episodes; rejected_rate,
    unparseable_rate and not_allowed_rate: shares of all decisions), 'op_share/<op>'
    for every kind that occurred (share of decisions, episode_types.decision_kind)}.
  """
  n = len(records)
  decisions = sum(r['decisions'] for r in records)
  out = {'num_episodes': float(n)}
  for key in ('r_task', 'r_sup', 'p_aux', 'm_ans'):
    out[key] = float(np.mean([r[key] for r in records]))
  for key in ('rejected', 'unparseable', 'not_allowed'):
    out[f'{key}_rate'] = sum(r[key] for r in records) / max(decisions, 1)
  out.update({'decisions_per_episode': decisions / n,
              'tool_calls_per_episode': sum(r['tool_calls'] for r in records) / n})
  out.update(op_shares(sum((r['ops'] for r in records), collections.Counter())))
  return out


def op_shares(ops: Mapping[str, int]) -> dict[str, float]:
  """{'op_share/<op>': count / total} for every kind counted in `ops` (decision kind ->
  number of decisions, episode_types.decision_kind), in ALL_OPS order, Unparseable
  last; {} without decisions.
  The shares sum to 1."""
  total = sum(ops.values())
  return {f'op_share/{op}': ops[op] / total
          for op in sorted(ops, key=op_order)} if total else {}


def op_order(op: str) -> tuple[int, str]:
  """The order of ops in a mix and between tied shares: the paper's tool order
  (`commands.ALL_OPS`, ∅ included), then any other name (Unparseable) alphabetically."""
  order = mcommands.ALL_OPS
  return (order.index(op) if op in order else len(order), op)


def op_mix(metrics: Mapping[str, float], prefix: str = 'op_share/') -> str:
  """'Add 40%, ∅ 35%, Unparseable 25%' from a metrics dict's `<prefix><op>` shares
  (largest first); '-' when there are none."""
  shares = [(k[len(prefix):], float(v)) for k, v in metrics.items()
            if k.startswith(prefix) and v is not None and float(v) > 0]
  if not shares:
    return '-'
  shares.sort(key=lambda kv: (-kv[1], op_order(kv[0])))
  return ', '.join(f'{op_label(op)} {100 * s:.0f}%' for op, s in shares)


def op_label(op: str) -> str:
  """How summaries print an op or decision kind: ∅ for Null, `episode_types.UNPARSEABLE`
  for the executor's 'Invalid' (the SFT metrics of runs written before SFT recorded
  unparseable predictions as 'Unparseable'), any other name as it is."""
  if op == mcommands.NULL:
    return '∅'
  return episode_types.UNPARSEABLE if op == mcommands.INVALID_OP else op
