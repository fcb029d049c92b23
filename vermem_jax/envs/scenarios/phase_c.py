"""Phase C episodes (all ops): one LTM need paired with one STM need per episode.

SPEC §4, paper Appendix D.4 (Phase C) and F.8. Families `add_retrieve`,
`update_filter`, `delete_select` (a recovery case: the evidence is only in H) and
`add_summarize`; documents arrive sequentially. The solver reads C_t
(`episode_types.SOLVER_READS_CONTEXT`), so a stale M_0 entry matters once retrieved into C.
"""

from __future__ import annotations

from vermem_jax.envs.episode_types import SOLVER_READS_CONTEXT
from vermem_jax.envs.scenarios.generator_parts import (Skip, budget_and_cap,
                                                       capped_docs, doc_obs,
                                                       fill_distractors, interleave)
from vermem_jax.envs.scenarios.initial_state import (CONTINUE_ACTION, TASK_STATES,
                                                     StateBuilder, fits)
from vermem_jax.envs.scenarios.perturbations import stale_version
from vermem_jax.memory import commands as cmds


def generate(view, family, rng, count_tokens, cfg):
  """Phase C s_0 and schedule of `family` (contract: `generator_parts` docstring)."""
  ex = view.example
  budget, cap = budget_and_cap(cfg)
  gold = capped_docs(view, count_tokens, cap, 'gold')
  related = capped_docs(view, count_tokens, cap, 'distractor')
  b = StateBuilder(ex, count_tokens, task_state=TASK_STATES['phase_c'])
  recovery = False
  if not gold:
    raise Skip
  order = gold[:]
  rng.shuffle(order)
  if family == 'add_retrieve':
    if len(order) < 2:
      raise Skip
    stored, new = order[0], order[1:]
    for i, g in enumerate(stored.gold_mask):
      if g:
        b.entry(stored.fact_text(i), (stored.unit_ids[i],))
    d0 = related[0] if related else None
    if d0 is not None:
      b.observe(d0.text, d0.unit_ids, current=True)
    # Retrieve first (the stored doc is not in C); the new docs need Add later.
    ref = cmds.Command(cmds.RETRIEVE, {'query': ex.question})
    schedule = interleave(rng, [doc_obs(g) for g in new],
                          [doc_obs(d) for d in related[1:3]])
  elif family == 'update_filter':
    stale = None
    for f in view.facts:
      v = stale_version(f, rng)
      if v is not None and f.doc in order:
        stale = (f, v[1])
        break
    if stale is None:
      raise Skip
    f, text = stale
    eid = b.entry(text, stale=True)
    n_distractors = 0
    for d in related[:2]:
      if fits(b, d.text, budget - count_tokens(f.doc.text)):
        b.observe(d.text, d.unit_ids)
        n_distractors += 1
    if not n_distractors or not fits(b, f.doc.text, budget):
      raise Skip
    _, cid = b.observe(f.doc.text, f.doc.unit_ids, current=True)
    ref = cmds.Command(cmds.UPDATE, {'memory_id': eid, 'new_content': f.text,
                                     'source_refs': [cid]})
    schedule = [doc_obs(g) for g in order if g is not f.doc] + [
        doc_obs(d) for d in related[2:3]]
  elif family == 'delete_select':
    if len(order) < len(view.gold_docs):
      raise Skip  # every gold doc must be recoverable from H
    target = order[0]
    i = target.gold_mask.index(True)
    good = b.entry(target.fact_text(i), (target.unit_ids[i],))
    dup = b.entry(target.fact_text(i), (target.unit_ids[i],))
    for g in order:  # the evidence left C earlier: it is only in H
      b.observe(g.text, g.unit_ids, in_context=False)
    b.task_action(CONTINUE_ACTION)
    added = fill_distractors(b, related, budget,
                             int(budget * cfg.fill_min) -
                             sum(count_tokens(g.text) for g in order))
    if not added:
      raise Skip
    if sum(count_tokens(g.text) for g in order) + b.context_tokens() > budget:
      raise Skip
    ref = cmds.Command(cmds.DELETE, {'memory_id': dup,
                                     'reason': f'duplicate of {good}'})
    recovery = True
    schedule = [doc_obs(d) for d in related if d not in [a for a, _ in added]][:1]
  elif family == 'add_summarize':
    longs = [g for g in order if not all(g.gold_mask)]
    if not longs:
      raise Skip
    g = longs[0]
    for k, d in enumerate(order):
      if not fits(b, d.text, budget):
        raise Skip
      b.observe(d.text, d.unit_ids, current=k == len(order) - 1 and d is not g)
    cid = next(it.id for it in b.state.C if it.text == g.text)
    i = g.gold_mask.index(True)
    ref = cmds.Command(cmds.ADD, {'content': g.fact_text(i), 'source_refs': [cid]})
    schedule = [doc_obs(d) for d in related[:2]]
  else:
    raise ValueError(f'unknown Phase C family {family!r}')
  return b, schedule, ref, recovery, SOLVER_READS_CONTEXT
