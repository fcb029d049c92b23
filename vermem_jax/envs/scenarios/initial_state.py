"""Trusted construction of initial states s_0 = (q, M_0, C_0, H_0) and their checks.

SPEC §1 (state) and §4, paper Appendix D.4. `StateBuilder` assembles M_0, C_0 and H_0
with the trusted builders of `memory.state` (ids assigned there, token counts cached
from the backbone counter); `validate_initial_state` checks what the executor relies
on. The fixed texts below are the only texts a constructed state may show besides the
example's own (tests check that a policy input holds nothing else). The answer goes
into `MemoryState.forbidden` (the executor's leakage check) and is never rendered.
"""

from __future__ import annotations

import dataclasses

from vermem_jax.envs import hotpotqa
from vermem_jax.memory import state as mstate

# Our wording of the task instruction placed (protected) at the head of C_0.
INSTRUCTION_TEXT = (
    'Task: answer the question below from the notes in this context. Documents and '
    'feedback arrive step by step; long-term memory and the episode history can '
    'bring earlier material back.')

# Fixed texts the constructed states may show besides the example's own text (task
# states, the solver's continue action, the query prefix). Tests check that a policy
# input holds nothing else.
TASK_STATES = {
    'phase_a': 'reading documents; the question will be asked after the last one',
    'phase_b': 'documents are being read',
    'phase_c': 'documents arrive one at a time',
    'query': 'the delayed query is posed: reply with the final answer',
    'progress': '{k} of {n} further documents revealed',
    'new_document': 'a new document arrived',
    'review': 'reviewing long-term memory',
    'needs_stored': 'the question needs earlier facts',
    'needs_history': 'the question needs an earlier document',
    'reading': 'reading documents',
}
CONTINUE_ACTION = 'Continue'
QUERY_PREFIX = 'Question (delayed): '


def forbidden_strings(example):
  """Leakage strings of a no-reference setting: the answer (never rendered)."""
  return (example.answer,) if example.answer.strip() else ()


class StateBuilder:
  """Builds s_0 with the trusted builders of `memory.state` (ids assigned there)."""

  def __init__(self, example, count_tokens, *, task_state=''):
    self.count_tokens = count_tokens
    self.state = mstate.new_state(example.id, example.question, count_tokens,
                                  instruction=INSTRUCTION_TEXT, task_state=task_state,
                                  forbidden=forbidden_strings(example))
    self.step = 0
    self.stale_texts = []

  def entry(self, content, refs=(), *, stale=False):
    """Adds an active LTM entry (prepared M_0); returns its id.

    `stale` marks an outdated/obsolete version (a perturbed number or an incomplete
    sentence): its text becomes a private label of the episode
    (`EpisodeSpec.stale_texts`) so the oracle reader refuses to answer while it stays
    active.
    """
    self.state, eid = mstate.add_entry(self.state, content, self.count_tokens,
                                       source_refs=tuple(refs))
    if stale:
      self.stale_texts.append(content)
    return eid

  def observe(self, text, refs, *, in_context=True, current=False):
    """Records an observation in H (and C unless `in_context` is False).

    Returns (event_id, item_id or None). `current` makes the C item the current
    environment item (undroppable by Filter/Summarize).
    """
    self.state, hid = mstate.add_history(self.state, mstate.EV_OBSERVATION, text,
                                         self.count_tokens, source_refs=tuple(refs),
                                         step=self.step)
    self.step += 1
    cid = None
    if in_context:
      self.state, cid = mstate.add_context(self.state, mstate.OBSERVATION, text,
                                           self.count_tokens, source_refs=tuple(refs),
                                           origin=hid)
      if current:
        self.state = dataclasses.replace(self.state, env_item_id=cid)
    return hid, cid

  def task_action(self, text):
    self.state, hid = mstate.add_history(self.state, mstate.EV_TASK_ACTION, text,
                                         self.count_tokens, step=self.step)
    return hid

  def retrieved(self, entry_id):
    """Puts a copy of LTM entry `entry_id` in C as a retrieved item."""
    e = self.state.entry(entry_id)
    self.state, cid = mstate.add_context(
        self.state, mstate.RETRIEVED, e.content, self.count_tokens,
        source_refs=(e.id,), evidence=e.current.evidence, origin=e.id)
    return cid

  def finish(self, task_state=None):
    s = self.state
    if task_state is not None:
      s = mstate.set_task_state(s, task_state)
    return dataclasses.replace(s, step=max(self.step - 1, 0))

  def context_tokens(self):
    return self.state.context_tokens()


def fits(builder, text, budget):
  return builder.context_tokens() + builder.count_tokens(text) <= budget


def validate_initial_state(state, count_tokens, context_budget, *, example=None):
  """Structural checks of a constructed s_0 (what the executor relies on).

  Checks: C within `context_budget`; cached token counts equal `count_tokens`; every
  id has this task's namespace, M/H ids are consecutive, C ids unique and below
  `next_c`; `env_item_id` (if any) is in C; C items copying H events or M entries
  name existing records with the same text; exactly one instruction item, protected;
  with `example`, every evidence ref is an evidence unit of that example.

  Returns:
    list of problem strings (empty when valid).
  """
  problems = []
  ns = state.ns
  if state.context_tokens() > context_budget:
    problems.append(f'C holds {state.context_tokens()} tokens > budget '
                    f'{context_budget}')
  units = ({u.id for u in hotpotqa.evidence_units(example)}
           if example is not None else None)
  for n, e in enumerate(state.M, 1):
    if e.id != mstate.make_id(ns, 'm', n):
      problems.append(f'M[{n - 1}] has id {e.id}')
    for v in e.versions:
      if v.tokens != count_tokens(v.content):
        problems.append(f'{e.id} v{v.version} caches {v.tokens} tokens')
      if units is not None and not set(v.evidence) <= units:
        problems.append(f'{e.id} cites evidence outside the example')
  for n, h in enumerate(state.H, 1):
    if h.id != mstate.make_id(ns, 'h', n):
      problems.append(f'H[{n - 1}] has id {h.id}')
    if h.tokens != count_tokens(h.text):
      problems.append(f'{h.id} caches {h.tokens} tokens')
    if units is not None and not set(h.evidence) <= units:
      problems.append(f'{h.id} cites evidence outside the example')
  seen = set()
  instructions = 0
  for it in state.C:
    p = mstate.parse_id(it.id)
    if p is None or p[0] != ns or p[1] != 'c' or p[2] >= state.next_c:
      problems.append(f'bad context id {it.id}')
    if it.id in seen:
      problems.append(f'duplicate context id {it.id}')
    seen.add(it.id)
    if it.tokens != count_tokens(it.text):
      problems.append(f'{it.id} caches {it.tokens} tokens')
    if it.kind == mstate.INSTRUCTION:
      instructions += 1
      if not it.protected:
        problems.append(f'instruction {it.id} is not protected')
    if it.origin is not None:
      src = state.event(it.origin) or state.entry(it.origin)
      if src is None:
        problems.append(f'{it.id} copies missing record {it.origin}')
      elif it.text != (src.text if isinstance(src, mstate.HistoryEvent)
                       else src.content):
        problems.append(f'{it.id} text differs from its origin {it.origin}')
    if units is not None and not set(it.evidence) <= units:
      problems.append(f'{it.id} cites evidence outside the example')
  if instructions != 1:
    problems.append(f'C holds {instructions} instruction items')
  if state.env_item_id is not None and state.item(state.env_item_id) is None:
    problems.append(f'env_item_id {state.env_item_id} is not in C')
  return problems
