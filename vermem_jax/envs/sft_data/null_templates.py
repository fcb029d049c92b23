"""SFT state templates of the ∅ target (SPEC §4, paper D.2: an operation vs ∅).

Standard: null_settled (every fact stored, compact evidence in C). Boundary:
null_duplicate (the observed fact is already in M -> ∅, not Add; Phase A only, since
in B/C facts stored but absent from C would call for Retrieve), null_already_retrieved
(M's evidence already sits in C -> ∅, not Retrieve).
"""

from __future__ import annotations

from vermem_jax.envs.scenarios.initial_state import TASK_STATES
from vermem_jax.envs.sft_data.template_kit import pick, state_builder
from vermem_jax.memory import commands as cmds


def t_null_settled(view, rng, count_tokens, budget, phase=None):
  gold = [g.compact() for g in view.gold_docs]
  b = state_builder(view, count_tokens, TASK_STATES['reading'])
  for f in view.facts:
    b.entry(f.text, (f.unit_id,))
  for k, g in enumerate(gold):
    b.observe(g.text, g.unit_ids, current=k == len(gold) - 1)
  if b.context_tokens() > budget:
    return None
  del rng
  return b.finish(), cmds.Command(cmds.NULL)


def t_null_duplicate(view, rng, count_tokens, budget, phase=None):
  del budget
  facts = list(view.facts)
  rng.shuffle(facts)
  k = rng.randint(1, len(facts))
  b = state_builder(view, count_tokens, TASK_STATES['new_document'])
  for f in facts[:k]:
    b.entry(f.text, (f.unit_id,))
  f = pick(rng, facts[:k])
  b.observe(f.text, (f.unit_id,), current=True)
  return b.finish(), cmds.Command(cmds.NULL)


def t_null_already_retrieved(view, rng, count_tokens, budget, phase=None):
  b = state_builder(view, count_tokens, TASK_STATES['needs_stored'])
  eids = [b.entry(f.text, (f.unit_id,)) for f in view.facts]
  rng.shuffle(eids)
  for e in eids:
    b.retrieved(e)
  if b.context_tokens() > budget:
    return None
  return b.finish(), cmds.Command(cmds.NULL)
