"""Phase-start running statistics of r^local from internal-dev transitions (SPEC §6;
paper App. F.4).

SPEC §6 initializes the per-op-type running statistics from 128 executable dev
transitions per enabled op type (`init_running_stats_from_dev`). Candidate transitions
come from the internal-dev pool only: SFT dev records (their target command executed on
their state; the default source, balanced over the 8 types), the reference command of
dev-pool phase episodes on s_0, or executable decisions of dev episodes run with the
phase's initial policy (`dev_inputs_from_results`). The first `count` accepted
transitions of each enabled type, in the given order, are scored by the local verifier
in one batched call and `RunningStats.init_from` resets the statistics to their mean
and variance.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Optional, Sequence

from vermem_jax.envs import environment
from vermem_jax.envs import episode_types
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.rl import advantages as adv
from vermem_jax.rl import rollout
from vermem_jax.rl import running_stats as running_stats_lib
from vermem_jax.verifiers import adapters
from vermem_jax.verifiers import base as vbase

def dev_inputs_from_sft_records(records: Iterable[Any], *,
                                count_tokens: Callable[[str], int],
                                executor_config: mconfig.ExecutorConfig
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
                             executor_config: mconfig.ExecutorConfig
                             ) -> list[vbase.LocalVerifierInput]:
  """Executable dev transitions: each dev episode's `reference_command` on its s_0
  (envs.scenarios.spec.ScenarioSpec); specs without one or with a rejected one are skipped."""
  out = []
  for spec in specs:
    command = getattr(spec, 'reference_command', '')
    if not command:
      continue
    cfg = environment.executor_config_for(spec, executor_config)
    s0 = spec.initial_state
    x = serialization.render_policy_input(s0, count_tokens, allowed_ops=cfg.ops,
                                          limit=cfg.policy_input_limit,
                                          context_budget=cfg.context_budget,
                                          local_ids=cfg.local_ids)
    tr = mexec.execute(s0, command, cfg, count_tokens)
    if tr.accepted:
      out.append(adapters.local_input(s0, tr, policy_input=x, command_text=command,
                                      allowed_ops=cfg.ops))
  return out


def dev_inputs_from_results(results: Iterable[episode_types.EpisodeResult], *,
                            executor_config: mconfig.ExecutorConfig
                            ) -> list[vbase.LocalVerifierInput]:
  """Executable decisions of dev episodes run through `run_episodes` (e.g. with the
  phase's initial policy), in episode then step order."""
  out = []
  for res in results:
    cfg = environment.executor_config_for(res.spec, executor_config)
    for d in res.decisions:
      if d.accepted:
        out.append(rollout.local_input_from_record(d, cfg.ops))
  return out


def init_running_stats_from_dev(verifier: vbase.Verifier,
                                dev_inputs: Sequence[vbase.LocalVerifierInput], *,
                                ops: Sequence[str], count: int,
                                decay: float = adv.AdvantageConfig.running_stats_decay,
                                running_stats: Optional[running_stats_lib.RunningStats] = None,
                                ) -> tuple[running_stats_lib.RunningStats, dict[str, int]]:
  """Phase-start RunningStats from scored dev transitions (SPEC §6, App. F.4).

  Takes, for each enabled op type in `ops`, the first `count` accepted inputs of that
  type in `dev_inputs` order (SPEC §6: 128; config advantage.running_stats_init_count),
  scores them with ONE `verifier.score_local` call and resets the statistics to their
  mean and (population) variance via `RunningStats.init_from`. Types with no scored
  transition start without statistics: their A^local is 0 in an update with fewer than
  `local_min_count` of them, and their first update's scores initialize them
  (`RunningStats.update`).

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
    if op not in cmds.ALL_OPS:
      raise ValueError(f'unknown op {op!r}; expected one of {cmds.ALL_OPS}')
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
  stats = running_stats if running_stats is not None else running_stats_lib.RunningStats(decay)
  stats.init_from({op: v for op, v in by_op.items() if v})
  return stats, {op: len(v) for op, v in by_op.items()}
