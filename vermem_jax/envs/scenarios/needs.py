"""The memory needs of an episode, recomputed from its s_0 and schedule (SPEC §4).

Paper Appendix D.4: Phase C pairs one LTM need with one STM need; each family's
defining operation must be a real need of the state it builds. `needs_of` derives
the needs from the state and the observation schedule alone, never from the spec's
metadata.

What "needs" means here: an LTM need is a revealed supporting sentence that M does not
hold (Add), an active entry that a revealed sentence contradicts or completes
(Update), or an obsolete/duplicate active entry (Delete); an STM need is evidence held
in M but not in C (Retrieve), distractor items in C (Filter), evidence present only in
H (SelectEpisode), or a C item with non-evidence sentences around evidence
(Summarize).
"""

from __future__ import annotations

from vermem_jax.memory import commands as cmds
from vermem_jax.memory import state as mstate


def _norm(text):
  return ' '.join(text.casefold().split())


def needs_of(spec, view):
  """The memory needs of a spec, recomputed from s_0 and the schedule.

  Returns:
    sorted tuple of op names whose need is present (defined in the module docstring).
  """
  s = spec.initial_state
  fact_units = {f.unit_id for f in view.facts}
  fact_texts = {_norm(f.text): f for f in view.facts}
  active = s.active_entries()
  held = {_norm(e.content) for e in active}
  revealed_units = set()
  for it in s.C:
    revealed_units.update(it.evidence)
  for ob in spec.observations:
    revealed_units.update(ob.source_refs)
  needs = set()
  # LTM needs.
  if any(f.unit_id in revealed_units and _norm(f.text) not in held
         for f in view.facts):
    needs.add(cmds.ADD)
  for e in active:
    c = _norm(e.content)
    if c in fact_texts:
      continue
    for f in view.facts:
      if _same_sentence(e.content, f):
        if f.unit_id in revealed_units and _norm(f.text) not in held:
          needs.add(cmds.UPDATE)
        elif _norm(f.text) in held:
          needs.add(cmds.DELETE)
  counts = {}
  for e in active:
    counts[_norm(e.content)] = counts.get(_norm(e.content), 0) + 1
  if any(n > 1 for n in counts.values()):
    needs.add(cmds.DELETE)
  # STM needs.
  in_c = set()
  for it in s.C:
    in_c.update(it.evidence)
  in_m = set()
  for e in active:
    in_m.update(set(e.current.evidence) & fact_units)
  if in_m - in_c:
    needs.add(cmds.RETRIEVE)
  if any(it.kind != mstate.INSTRUCTION and it.evidence and
         not set(it.evidence) & fact_units for it in s.C):
    needs.add(cmds.FILTER)
  in_h = set()
  for h in s.H:
    in_h.update(set(h.evidence) & fact_units)
  if (in_h - in_c) - in_m:
    needs.add(cmds.SELECT_EPISODE)
  if any(set(it.evidence) & fact_units and set(it.evidence) - fact_units
         for it in s.C if it.id != s.env_item_id):
    needs.add(cmds.SUMMARIZE)
  return tuple(sorted(needs))


def _same_sentence(content, fact):
  """An entry written about `fact`'s sentence: same title prefix and at least half of
  the entry's words are words of the sentence (partial and conflicting versions)."""
  prefix = f'{fact.doc.display_title}: '
  if not content.startswith(prefix):
    return False
  words = content[len(prefix):].split()
  ref = set(fact.sentence.split())
  return bool(words) and sum(w in ref for w in words) * 2 >= len(words)
