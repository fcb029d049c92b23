"""Phase B episodes (STM ⊂ {Retrieve, Filter, SelectEpisode, Summarize, ∅}).

SPEC §4, paper Appendix D.4 (Phase B) and F.8. Prepared M_0, a distractor-rich C_0
filling a `fill_min`–`fill_max` share of the context budget, same-task H_0. Families:
evidence stored only in M (`retrieve`), distractors beside the evidence in C
(`filter`), evidence only in earlier history with related distractors more recent
(`select_episode`, the recovery case), long evidence documents (`summarize`),
evidence already compact in C (`null`). The solver reads C_t
(`episode_types.SOLVER_READS_CONTEXT`).
"""

from __future__ import annotations

import dataclasses

from vermem_jax.envs.episode_types import SOLVER_READS_CONTEXT
from vermem_jax.envs.scenarios.generator_parts import (Skip, budget_and_cap,
                                                       capped_docs, doc_obs,
                                                       fill_distractors)
from vermem_jax.envs.scenarios.initial_state import (CONTINUE_ACTION, TASK_STATES,
                                                     StateBuilder, fits)
from vermem_jax.memory import commands as cmds


def generate(view, family, rng, count_tokens, cfg):
  """Phase B s_0 and schedule of `family` (contract: `generator_parts` docstring)."""
  ex = view.example
  budget, cap = budget_and_cap(cfg)
  fill = int(budget * rng.uniform(cfg.fill_min, cfg.fill_max))
  gold = capped_docs(view, count_tokens, cap, 'gold')
  related = capped_docs(view, count_tokens, cap, 'distractor')
  b = StateBuilder(ex, count_tokens, task_state=TASK_STATES['phase_b'])
  ref = None
  recovery = False
  tail = []
  if family == 'retrieve':
    for f in view.facts:
      b.entry(f.text, (f.unit_id,))
    for d in related[-2:]:  # unrelated prepared entries
      b.entry(d.fact_text(0), (d.unit_ids[0],))
    added = fill_distractors(b, related, budget, fill)
    if not added:
      raise Skip
    ref = cmds.Command(cmds.RETRIEVE, {'query': ex.question})
    tail = [doc_obs(d) for d in related if d not in [a for a, _ in added]][:1]
  elif family == 'filter':
    if not gold or len(related) < 2:
      raise Skip
    order = gold[:]
    rng.shuffle(order)
    items = []
    for d in related:  # distractors first, so the current item is evidence
      if b.context_tokens() + sum(count_tokens(g.text) for g in order) >= fill:
        break
      if fits(b, d.text, budget - sum(count_tokens(g.text) for g in order)):
        items.append(('d', d, b.observe(d.text, d.unit_ids)[1]))
    if not items:
      raise Skip
    for k, g in enumerate(order):
      if not fits(b, g.text, budget):
        raise Skip
      items.append(('g', g, b.observe(g.text, g.unit_ids,
                                      current=k == len(order) - 1)[1]))
    drops = [cid for kind, _, cid in items if kind == 'd']
    ref = cmds.Command(cmds.FILTER, {'drop_refs': drops})
  elif family == 'select_episode':
    if not gold:
      raise Skip
    gold_h = []
    for g in gold:
      gold_h.append(b.observe(g.text, g.unit_ids, in_context=False)[0])
    b.task_action(CONTINUE_ACTION)
    for d in related[:2]:  # related distractors stored earlier in LTM
      b.entry(d.fact_text(0), (d.unit_ids[0],))
    added = fill_distractors(b, related, budget, fill)
    if not added:
      raise Skip
    if sum(count_tokens(g.text) for g in gold) + b.context_tokens() > budget:
      raise Skip
    ref = cmds.Command(cmds.SELECT_EPISODE, {'selected_refs': gold_h})
    recovery = True
  elif family == 'summarize':
    longs = [g for g in gold if not all(g.gold_mask)]
    if not longs:
      raise Skip
    added = fill_distractors(b, related, budget,
                             fill - sum(count_tokens(g.text) for g in gold),
                             current_last=False)
    long_ids = []
    for g in gold:
      if not fits(b, g.text, budget):
        raise Skip
      cid = b.observe(g.text, g.unit_ids)[1]
      if g in longs:
        long_ids.append((g, cid))
    # The newest distractor (or none) is the current environment item.
    b.state = dataclasses.replace(
        b.state, env_item_id=added[-1][1][1] if added else None)
    g, cid = long_ids[0]
    ref = cmds.Command(cmds.SUMMARIZE, {'source_refs': [cid],
                                        'summary': g.compact().text})
  elif family == 'null':
    compact = [g.compact() for g in gold]
    for f in view.facts:
      b.entry(f.text, (f.unit_id,))
    for k, g in enumerate(compact):
      if not fits(b, g.text, budget):
        raise Skip
      b.observe(g.text, g.unit_ids, current=k == len(compact) - 1)
    ref = cmds.Command(cmds.NULL)
  else:
    raise ValueError(f'unknown Phase B family {family!r}')
  return b, tail, ref, recovery, SOLVER_READS_CONTEXT
