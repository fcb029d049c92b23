"""SFT state templates of the LTM targets: Add, Update, Delete (SPEC §4, paper D.2).

Standard: add_new_fact, update_correction (a stored fact with a perturbed number),
delete_obsolete (a stale version beside the supported one). Boundary: add_same_topic
(a new fact beside a stored fact of the same page -> Add, not Update), update_partial
(a truncated entry of the observed sentence -> Update, not a second Add),
delete_duplicate (two identical entries -> Delete, not ∅). In Phase C no unrelated
facts are stored in M, so Retrieve never becomes an equally valid target.
"""

from __future__ import annotations

from vermem_jax.envs.scenarios.initial_state import TASK_STATES
from vermem_jax.envs.scenarios.perturbations import (perturb_number, stale_version,
                                                     truncate_partial)
from vermem_jax.envs.sft_data.template_kit import (capped_distractors, pick,
                                                   state_builder)
from vermem_jax.memory import commands as cmds


def _other_fact_entries(b, view, rng, exclude, k, phase):
  """Stores up to `k` other facts in M_0. Not in Phase C, where stored facts absent
  from C would make Retrieve an equally valid choice (the target must be unique)."""
  if phase == 'C':
    return
  others = [f for f in view.facts if f not in exclude]
  rng.shuffle(others)
  for f in others[:k]:
    b.entry(f.text, (f.unit_id,))


def t_add_new_fact(view, rng, count_tokens, budget, phase=None):
  facts = list(view.facts)
  f = pick(rng, facts)
  b = state_builder(view, count_tokens, TASK_STATES['new_document'])
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 2), phase)
  for d in capped_distractors(view, count_tokens, budget)[:rng.randint(0, 1)]:
    b.observe(d.text, d.unit_ids, in_context=False)
  if rng.random() < 0.5:
    _, cid = b.observe(f.text, (f.unit_id,), current=True)
  else:
    _, cid = b.observe(f.doc.text, f.doc.unit_ids, current=True)
  return b.finish(), cmds.Command(cmds.ADD, {'content': f.text, 'source_refs': [cid]})


def t_add_same_topic(view, rng, count_tokens, budget, phase=None):
  cands = [(d, i, j) for d in view.gold_docs for i in range(len(d.sentences))
           for j in range(len(d.sentences)) if i != j and d.gold_mask[i]]
  if not cands:
    return None
  d, i, j = pick(rng, cands)
  b = state_builder(view, count_tokens, TASK_STATES['new_document'])
  b.entry(d.fact_text(j), (d.unit_ids[j],))  # same page, another sentence
  _, cid = b.observe(d.text, d.unit_ids, current=True)
  return b.finish(), cmds.Command(cmds.ADD, {'content': d.fact_text(i),
                                             'source_refs': [cid]})


def _update_state(view, rng, count_tokens, kind, phase):
  cands = []
  for f in view.facts:
    if kind == 'conflicting':
      s = perturb_number(f.sentence, rng)
    else:
      s = truncate_partial(f.sentence)
    if s is not None:
      cands.append((f, f'{f.doc.display_title}: {s}'))
  if not cands:
    return None
  f, stale = pick(rng, cands)
  b = state_builder(view, count_tokens, TASK_STATES['new_document'])
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 1), phase)
  eid = b.entry(stale)  # a stale entry cites no source
  if rng.random() < 0.5:
    _, cid = b.observe(f.text, (f.unit_id,), current=True)
  else:
    _, cid = b.observe(f.doc.text, f.doc.unit_ids, current=True)
  return b.finish(), cmds.Command(cmds.UPDATE, {'memory_id': eid,
                                                'new_content': f.text,
                                                'source_refs': [cid]})


def t_update_correction(view, rng, count_tokens, budget, phase=None):
  del budget
  return _update_state(view, rng, count_tokens, 'conflicting', phase)


def t_update_partial(view, rng, count_tokens, budget, phase=None):
  del budget
  return _update_state(view, rng, count_tokens, 'partial', phase)


def t_delete_obsolete(view, rng, count_tokens, budget, phase=None):
  del budget
  cands = [(f, v) for f in view.facts
           for v in [stale_version(f, rng, prefer_number=rng.random() < 0.5)]
           if v is not None]
  if not cands:
    return None
  f, (_, stale) = pick(rng, cands)
  b = state_builder(view, count_tokens, TASK_STATES['new_document'])
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 1), phase)
  if rng.random() < 0.5:
    good = b.entry(f.text, (f.unit_id,))
    bad = b.entry(stale)
  else:
    bad = b.entry(stale)
    good = b.entry(f.text, (f.unit_id,))
  b.observe(f.text, (f.unit_id,), current=True)
  reason = f'obsolete: {good} holds the version the source supports'
  return b.finish(), cmds.Command(cmds.DELETE, {'memory_id': bad, 'reason': reason})


def t_delete_duplicate(view, rng, count_tokens, budget, phase=None):
  f = pick(rng, list(view.facts))
  b = state_builder(view, count_tokens, TASK_STATES['review'])
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 1), phase)
  first = b.entry(f.text, (f.unit_id,))
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 1), phase)
  second = b.entry(f.text, (f.unit_id,))
  d = pick(rng, capped_distractors(view, count_tokens, budget))
  if d is not None:
    b.observe(d.text, d.unit_ids, current=True)
  return b.finish(), cmds.Command(cmds.DELETE, {'memory_id': second,
                                                'reason': f'duplicate of {first}'})
