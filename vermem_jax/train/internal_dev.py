"""Greedy internal-dev episodes of a policy: the figures a phase summary reports.

`evaluate_dev_episodes(policy, specs, solver, ...)` runs each internal-dev EpisodeSpec
once (SPEC §7 protocol for the episode: greedy policy decoding, temperature 0, no
verifier) through the batched episode loop (`envs.environment.run_episodes`) and
scores every trajectory with the reward functions of `rl.rewards`:

  r_task   = (EM + F1)/2 of the final answer (Eq. 13; 0 without an answer)
  r_sup    = supporting-fact recall of the evidence the trajectory held (Eq. 14)
  p_aux    = mean constraint cost over the trajectory's decisions (Eq. 16)
  m_ans    = clip(r_task − p_aux, 0, 1) (Eq. 18)

plus the rejected-command rate, the operation mix (share of decisions per op) and the
mean decisions / tool calls per episode. No verifier is called, so r^global and m^all
are not part of it (they need v^coh, v^state).

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
from vermem_jax.envs import episode_types
from vermem_jax.memory import commands as mcommands
from vermem_jax.rl import rewards as rw
from vermem_jax.rl import rollout
from vermem_jax.rl import task_selection

# Printed beside figures that the CPU stand-ins produce (GUIDE: label them).
STAND_IN_NOTE = ('CPU stand-ins: oracle-evidence reader as task solver, heuristic '
                 'verifier; not a model judge')
# Keys of `evaluate_dev_episodes`'s result that are means over episodes.
EPISODE_METRICS = ('r_task', 'r_sup', 'p_aux', 'm_ans', 'rejected_rate',
                   'decisions_per_episode', 'tool_calls_per_episode')


def evaluate_dev_episodes(policy: Callable[[Sequence[str], Any], Sequence[Any]],
                          specs: Sequence[episode_types.EpisodeSpec], solver: Any, *,
                          count_tokens: Callable[[str], int],
                          executor_config: Any,
                          env_config: episode_types.EnvConfig = episode_types.EnvConfig(),
                          rng: Any = 0) -> dict[str, float]:
  """Runs every spec once with `policy` and returns the mean episode metrics.

  Args:
    policy: a batched `(inputs, rng) -> PolicyOutputs` callable, normally
      `rl.policy.SamplerPolicy(..., greedy=True)` (greedy, so `rng` does not matter).
    specs: internal-dev EpisodeSpecs (`envs.episodes.build_phase_episodes(...)[1]`).
    solver: the task solver π_task (tiny scale: `task_solvers.OracleEvidenceReader`).
    count_tokens: the backbone token counter.
    executor_config: `memory.ExecutorConfig` (budgets, costs; phase from each spec).
    env_config: rollout limit and token budget.
    rng: key or int seed passed to the policy (call i gets fold_in(rng, i)).
  Returns:
    {'num_episodes', each of EPISODE_METRICS (mean over episodes; rejected_rate over
    decisions), 'op_share/<op>' for every op that occurred (share of decisions,
    'Invalid' = text naming no tool)}.
  Raises:
    ValueError: no specs.
  """
  if not specs:
    raise ValueError('evaluate_dev_episodes needs at least one episode spec')
  results = environment.run_episodes(
      list(specs), task_selection.BoundPolicy(policy, rng), solver,
      count_tokens=count_tokens, executor_config=executor_config, env_config=env_config)
  return summarize_results(results)


def summarize_results(results: Sequence[episode_types.EpisodeResult]) -> dict[str, float]:
  """The `evaluate_dev_episodes` metrics of finished episodes (see there)."""
  r_task, r_sup, p_aux, m_ans = [], [], [], []
  ops: collections.Counter = collections.Counter()
  rejected = decisions = tool_calls = 0
  for res in results:
    example = res.spec.example
    rt = rw.r_task(res.final_answer, example.answer)
    pa = rw.p_aux(res.constraint_costs)
    r_task.append(rt)
    r_sup.append(rw.r_sup(rollout.trajectory_evidence(res), example.supporting_facts))
    p_aux.append(pa)
    m_ans.append(float(rw.m_ans(rt, pa)))
    for d in res.decisions:
      ops[d.op] += 1
      rejected += not d.accepted
    decisions += res.num_decisions
    tool_calls += res.tool_calls
  n = len(results)
  out = {'num_episodes': float(n), 'r_task': float(np.mean(r_task)),
         'r_sup': float(np.mean(r_sup)), 'p_aux': float(np.mean(p_aux)),
         'm_ans': float(np.mean(m_ans)),
         'rejected_rate': rejected / max(decisions, 1),
         'decisions_per_episode': decisions / n, 'tool_calls_per_episode': tool_calls / n}
  out.update(op_shares(ops))
  return out


def op_shares(ops: Mapping[str, int]) -> dict[str, float]:
  """{'op_share/<op>': count / total} for every op counted in `ops` (op -> number of
  decisions; 'Invalid' = text naming no tool), in ALL_OPS order; {} without decisions.
  The shares sum to 1."""
  total = sum(ops.values())
  return {f'op_share/{op}': ops[op] / total
          for op in sorted(ops, key=_op_order)} if total else {}


def _op_order(op: str) -> tuple[int, str]:
  order = mcommands.ALL_OPS
  return (order.index(op) if op in order else len(order), op)


def op_mix(metrics: Mapping[str, float], prefix: str = 'op_share/') -> str:
  """'Add 40%, Null 35%, Invalid 25%' from a metrics dict's `<prefix><op>` shares
  (largest first); '-' when there are none."""
  shares = [(k[len(prefix):], float(v)) for k, v in metrics.items()
            if k.startswith(prefix) and v is not None and float(v) > 0]
  if not shares:
    return '-'
  shares.sort(key=lambda kv: (-kv[1], _op_order(kv[0])))
  return ', '.join(f'{_op_name(op)} {100 * s:.0f}%' for op, s in shares)


def _op_name(op: str) -> str:
  return '∅' if op == mcommands.NULL else op
