"""Builds verifier inputs from `vermem_jax.memory` states and transitions.

The verifier core works on plain dataclasses (`base.LocalVerifierInput`,
`base.GlobalVerifierInput`); this module is the only place that reads memory's API.
Scopes follow SPEC §5 / Appendix F.1: the local input is built from s_t, u_t and the
realized s~_t only (never s_{t+1} or anything later, never labels); the global input
from the terminal state and the solver's final answer, plus, at training time, the
reference answer and annotated supporting facts (Appendix F.1/F.3) when the caller
passes them.
"""

from __future__ import annotations

from typing import Sequence

from vermem_jax.memory import state as mstate
from vermem_jax.verifiers import base

# History kinds that are evidence: environment output and the solver's conclusions
# (task actions are requests, memory decisions are the policy's own words).
_EVIDENCE_EVENTS = (mstate.EV_OBSERVATION, mstate.EV_TOOL_OUTPUT, mstate.EV_CONCLUSION)
# Memory-decision records in H (accepted and rejected commands with outcomes).
_DECISION_EVENTS = (mstate.EV_MEMORY_DECISION, mstate.EV_REJECTED)
# Most recent history events shown to the local verifier as visible evidence; the
# paper forbids an unbounded concatenation of H (Appendix F.1). Project decision.
MAX_HISTORY_EVENTS = 64


def _context_view(item) -> base.ItemView:
  return base.ItemView(item.id, item.text, tuple(item.source_refs), item.kind)


def _entry_view(entry) -> base.ItemView:
  kind = "ltm" if entry.active else f"deleted ltm (reason: {entry.deletion_reason})"
  return base.ItemView(entry.id, entry.content, tuple(entry.current.source_refs), kind)


def _event_view(event) -> base.ItemView:
  return base.ItemView(event.id, event.text, tuple(event.source_refs), event.kind)


def transition_delta(before: mstate.MemoryState,
                     after: mstate.MemoryState) -> base.TransitionDelta:
  """What changed in M and C between s_t and s~_t (history is not compared)."""
  old_m = {e.id: e for e in before.M}
  added, updated, deleted = [], [], []
  for e in after.M:
    prev = old_m.get(e.id)
    if prev is None:
      if e.active:
        added.append(_entry_view(e))
      continue
    if prev.active and not e.active:
      deleted.append(_entry_view(prev))
    elif len(e.versions) > len(prev.versions):
      updated.append(base.ItemUpdate(_entry_view(prev), _entry_view(e)))
  old_c = {it.id for it in before.C}
  new_c = {it.id for it in after.C}
  return base.TransitionDelta(
      ltm_added=tuple(added), ltm_updated=tuple(updated), ltm_deleted=tuple(deleted),
      context_added=tuple(_context_view(it) for it in after.C if it.id not in old_c),
      context_removed=tuple(_context_view(it) for it in before.C if it.id not in new_c),
      context_tokens_before=before.context_tokens(),
      context_tokens_after=after.context_tokens())


def local_input(state: mstate.MemoryState, transition, *, policy_input: str,
                command_text: str,
                allowed_ops: Sequence[str] = base.ALL_OPS,
                max_history_events: int = MAX_HISTORY_EVENTS) -> base.LocalVerifierInput:
  """The local verifier's input for decision t.

  Args:
    state: s_t, the state the policy saw.
    transition: `memory.Transition` returned by `execute(state, command_text, ...)`.
    policy_input: x_t = g(s_t) as rendered for the policy.
    command_text: u_t as generated.
    allowed_ops: the phase's operations (memory.PHASE_OPS[phase]).
    max_history_events: most recent evidence events of H_t given as visible evidence.

  Returns:
    LocalVerifierInput (accepted=False for rejected commands, which are not scored).
  """
  cmd = transition.command
  events = [e for e in state.H if e.kind in _EVIDENCE_EVENTS]
  events = events[-max_history_events:] if max_history_events > 0 else []
  delta = (transition_delta(state, transition.state_after) if transition.accepted
           else base.TransitionDelta())
  return base.LocalVerifierInput(
      question=state.q, policy_input=policy_input, command=command_text,
      op=transition.op, accepted=bool(transition.accepted), transition=delta,
      context_before=tuple(_context_view(it) for it in state.C),
      memory_before=tuple(_entry_view(e) for e in state.active_entries()),
      visible_evidence=tuple(_event_view(e) for e in events),
      arguments=dict(cmd.args) if cmd is not None else {},
      allowed_ops=tuple(allowed_ops))


def decision_line(command: str, accepted: bool, message: str) -> str:
  """One memory decision with its realized outcome, as H records it: 'u -> outcome'
  for an executed command (∅: 'no change'), 'u -> rejected: reasons' otherwise."""
  return f"{command} -> {message}" if accepted else f"{command} -> rejected: {message}"


def budget_history(events: Sequence, budget: int | None) -> tuple[list, int]:
  """The newest `events` whose cached token counts (`.tokens`) fit `budget`.

  Events are kept as a contiguous newest suffix in their order: the oldest are
  dropped first. Returns (kept events, number left out); budget None keeps all.
  """
  if budget is None:
    return list(events), 0
  used, start = 0, len(events)
  while start > 0 and used + events[start - 1].tokens <= budget:
    start -= 1
    used += events[start].tokens
  return list(events[start:]), start


def global_input(final_state: mstate.MemoryState,
                 final_answer: str | None, *,
                 reference_answer: str | None = None,
                 supporting_facts: Sequence[str | base.ItemView] = (),
                 decisions: Sequence | None = None,
                 history_token_budget: int | None = None,
                 ) -> base.GlobalVerifierInput:
  """The global verifier's input for a finished trajectory (Appendix F.1/F.3: task,
  labels, final answer, ordered memory commands with their transitions, terminal M, C
  and H).

  Args:
    final_state: the terminal state (its H holds observations, task actions and the
      memory decisions with outcomes; ∅ decisions leave no H record).
    final_answer: the task solver's answer text, None if it gave none.
    reference_answer: training only: the gold answer (Appendix F.1/F.3).
    supporting_facts: training only: the annotated supporting evidence units, as
      unit ids "{title}#{sent_id}" or ItemViews (ref = unit id, text = sentence).
    decisions: the episode's decision records in order (anything with `command`,
      `accepted` and `transition_message`, e.g. envs.environment.DecisionRecord):
      every decision, ∅ included, becomes a `memory_commands` line. None: the decision
      records of H (no ∅).
    history_token_budget: tokens of H events (their cached counts) kept in
      `terminal_history`, newest first; None keeps all.

  Returns:
    `base.GlobalVerifierInput`, or `base.LabeledGlobalVerifierInput` when a reference
    answer or supporting facts are given.

  Raises:
    TypeError: a supporting fact that is neither a str nor an ItemView.
  """
  facts = []
  for f in supporting_facts:
    if isinstance(f, str):
      facts.append(base.ItemView(f, ""))
    elif isinstance(f, base.ItemView):
      facts.append(f)
    else:
      raise TypeError("supporting_facts must be unit ids (str) or ItemViews, got "
                      f"{type(f).__name__}")
  observed, seen = [], set()
  for ev in final_state.H:
    if ev.kind in _EVIDENCE_EVENTS and ev.text not in seen:
      seen.add(ev.text)
      observed.append(_event_view(ev))
  for it in final_state.C:  # initial observations may never have entered H
    if it.kind == mstate.OBSERVATION and it.text not in seen:
      seen.add(it.text)
      observed.append(_context_view(it))
  labels = {}
  cls = base.GlobalVerifierInput
  if reference_answer is not None or facts:
    cls = base.LabeledGlobalVerifierInput
    labels = dict(reference_answer=reference_answer, supporting_facts=tuple(facts))
  if decisions is None:
    commands = tuple(ev.text for ev in final_state.H if ev.kind in _DECISION_EVENTS)
  else:
    commands = tuple(decision_line(d.command, d.accepted, d.transition_message)
                     for d in decisions)
  history, omitted = budget_history(
      [ev for ev in final_state.H if ev.kind not in _DECISION_EVENTS],
      history_token_budget)
  return cls(
      **labels,
      question=final_state.q, final_answer=final_answer,
      observed_evidence=tuple(observed),
      memory_commands=commands,
      terminal_ltm=tuple(_entry_view(e) for e in final_state.active_entries()),
      terminal_context=tuple(_context_view(it) for it in final_state.C),
      deleted_ltm=tuple(_entry_view(e) for e in final_state.M if not e.active),
      terminal_history=tuple(_event_view(ev) for ev in history),
      history_omitted=omitted)
