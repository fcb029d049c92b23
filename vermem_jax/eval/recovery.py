"""How often an evaluation state offers a recovery SelectEpisode (issue 23; SPEC §7).

Phase B's `select_episode` and Phase C's `delete_select` training states hold needed
evidence only in the history H, with room in C to restore it. `recovery_counts`
measures how often the states an evaluated policy actually visited look like that:
for every decision state s_t (before the memory command) it finds the observation
events of H that no C item holds ("H-only"), and asks the executor whether a
SelectEpisode of the newest one would be accepted on s_t. The same is done for the
events carrying a supporting fact (label; diagnostic only, never shown to a policy).
It also notes whether that event is visible in the policy input x_t (g(s) may leave
old history out under its token limit).

Counts per episode (`COUNT_FIELDS`):
  states              decision states
  h_only              states with at least one H-only observation
  h_only_shown        ... whose newest H-only observation is visible in x_t
  select_accepted     ... where SelectEpisode(newest H-only observation) is accepted
  gold_h_only         states with an H-only observation carrying a supporting fact
  gold_select_accepted  ... where SelectEpisode(newest such observation) is accepted
"""

from __future__ import annotations

from typing import Callable, Optional

from vermem_jax.envs import environment
from vermem_jax.envs import episode_types
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.memory import state as mstate

COUNT_FIELDS = ('states', 'h_only', 'h_only_shown', 'select_accepted', 'gold_h_only',
                'gold_select_accepted')


def h_only_observations(state: mstate.MemoryState) -> list[mstate.HistoryEvent]:
  """Observation events of H that no C item copies (origin), oldest first."""
  in_c = {it.origin for it in state.C}
  return [ev for ev in state.H
          if ev.kind == mstate.EV_OBSERVATION and ev.id not in in_c]


def restore_accepted(state: mstate.MemoryState, event_id: str,
                     config: mconfig.ExecutorConfig,
                     count_tokens: Callable[[str], int]) -> bool:
  """Whether T_m accepts SelectEpisode(selected_refs=[event_id]) on `state` (the
  executor's own checks: op allowed, id, already in C, budget)."""
  cmd = mcommands.Command(mcommands.SELECT_EPISODE, {'selected_refs': [event_id]})
  return mexec.execute(state, cmd, config, count_tokens).accepted


def _shown(event: mstate.HistoryEvent, state: mstate.MemoryState, x: str) -> bool:
  local = serialization.localize_ids(event.id, state.ns)
  return (f'[{serialization.ref(event.id)} ' in x
          or f'[{serialization.ref(local)} ' in x)


def recovery_counts(result: episode_types.EpisodeResult,
                    count_tokens: Callable[[str], int],
                    executor_config: mconfig.ExecutorConfig,
                    gold_units: Optional[frozenset] = None) -> dict[str, int]:
  """The module docstring's counts for one finished episode.

  Args:
    result: an EpisodeResult (its decisions keep s_t and x_t).
    count_tokens: the backbone token counter.
    executor_config: the run's memory settings; the episode's phase / op subspace
      is applied (`environment.executor_config_for`), so a policy evaluated with
      Phase A's tools never counts as able to restore.
    gold_units: supporting-fact unit ids (default: the episode example's, if any).

  Returns:
    {field: count} for COUNT_FIELDS.
  """
  config = environment.executor_config_for(result.spec, executor_config)
  if gold_units is None:
    ex = result.spec.example
    gold_units = (frozenset(hotpotqa.supporting_unit_ids(ex)) if ex is not None
                  else frozenset())
  out = dict.fromkeys(COUNT_FIELDS, 0)
  for d in result.decisions:
    state = d.state
    out['states'] += 1
    held = h_only_observations(state)
    if held:
      newest = held[-1]
      out['h_only'] += 1
      out['h_only_shown'] += _shown(newest, state, d.policy_input)
      out['select_accepted'] += restore_accepted(state, newest.id, config,
                                                 count_tokens)
    gold = [ev for ev in held if set(ev.evidence) & gold_units]
    if gold:
      out['gold_h_only'] += 1
      out['gold_select_accepted'] += restore_accepted(state, gold[-1].id, config,
                                                      count_tokens)
  return out
