"""SFT state templates of the STM targets: Retrieve, SelectEpisode, Filter, Summarize.

SPEC §4, paper D.2. Standard: retrieve_from_ltm, select_from_history,
filter_distractors, summarize_long_evidence. Boundary (the confusable pairs):
retrieve_not_history (earlier observations left C but are distractors; the evidence
is in M -> Retrieve), select_not_ltm (M holds related distractors; the evidence is
only in H -> SelectEpisode), filter_verbose_distractors (long but irrelevant ->
Filter), summarize_all_relevant (every item is evidence, only verbose -> Summarize).
Retrieve templates are kept only when BM25 over M actually returns a stored fact for
the question.
"""

from __future__ import annotations

import dataclasses

from vermem_jax.envs.scenarios.initial_state import CONTINUE_ACTION, TASK_STATES, fits
from vermem_jax.envs.sft_data.template_kit import (capped_distractors, capped_gold,
                                                   pick, state_builder)
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import state as mstate
from vermem_jax.memory.config import ExecutorConfig


def _distractor_context(b, view, rng, count_tokens, budget, k):
  ds = capped_distractors(view, count_tokens, budget)[:k + 1]
  rng.shuffle(ds)
  out = []
  for d in ds[:k]:
    if fits(b, d.text, budget // 2):
      out.append(b.observe(d.text, d.unit_ids)[1])
  if out:
    b.state = dataclasses.replace(b.state, env_item_id=out[-1])
  return out


def t_retrieve_from_ltm(view, rng, count_tokens, budget, phase=None):
  b = state_builder(view, count_tokens, TASK_STATES['needs_stored'])
  for f in view.facts:
    b.entry(f.text, (f.unit_id,))
  if not _distractor_context(b, view, rng, count_tokens, budget, rng.randint(1, 2)):
    return None
  return _retrieve_brings_evidence(view, b.finish(), count_tokens, budget)


def _retrieve_brings_evidence(view, state, count_tokens, budget):
  """(state, Retrieve(q)) when BM25 returns at least one stored fact, else None."""
  cmd = cmds.Command(cmds.RETRIEVE, {'query': view.example.question})
  tr = mexec.execute(state, cmd, ExecutorConfig(context_budget=budget), count_tokens)
  facts = {f.unit_id for f in view.facts}
  got = set()
  for it in tr.state_after.C:
    if it.kind == mstate.RETRIEVED:
      got.update(it.evidence)
  return (state, cmd) if tr.accepted and got & facts else None


def t_retrieve_not_history(view, rng, count_tokens, budget, phase=None):
  ds = capped_distractors(view, count_tokens, budget)
  if len(ds) < 2:
    return None
  b = state_builder(view, count_tokens, TASK_STATES['needs_stored'])
  for f in view.facts:
    b.entry(f.text, (f.unit_id,))
  for d in ds[:rng.randint(1, 2)]:  # related distractors that already left C
    b.observe(d.text, d.unit_ids, in_context=False)
  b.task_action(CONTINUE_ACTION)
  last = ds[-1]
  b.observe(last.text, last.unit_ids, current=True)
  return _retrieve_brings_evidence(view, b.finish(), count_tokens, budget)


def _select_state(view, rng, count_tokens, budget, ltm_distractors):
  gold = capped_gold(view, count_tokens, budget)
  if not gold:
    return None
  gold = gold[:]
  rng.shuffle(gold)
  chosen = gold[:rng.randint(1, len(gold))]
  b = state_builder(view, count_tokens, TASK_STATES['needs_history'])
  hids = [b.observe(g.text, g.unit_ids, in_context=False)[0] for g in chosen]
  b.task_action(CONTINUE_ACTION)
  ds = capped_distractors(view, count_tokens, budget)
  if ltm_distractors:
    if not ds:
      return None
    for d in ds[:2]:
      b.entry(d.fact_text(0), (d.unit_ids[0],))
  if not _distractor_context(b, view, rng, count_tokens, budget, rng.randint(1, 2)):
    return None
  if sum(count_tokens(g.text) for g in chosen) + b.context_tokens() > budget:
    return None
  return b.finish(), cmds.Command(cmds.SELECT_EPISODE, {'selected_refs': hids})


def t_select_from_history(view, rng, count_tokens, budget, phase=None):
  return _select_state(view, rng, count_tokens, budget, False)


def t_select_not_ltm(view, rng, count_tokens, budget, phase=None):
  return _select_state(view, rng, count_tokens, budget, True)


def _filter_state(view, rng, count_tokens, budget, verbose):
  gold = capped_gold(view, count_tokens, budget)
  ds = capped_distractors(view, count_tokens, budget)
  if not gold or not ds:
    return None
  if verbose:
    ds = sorted(ds, key=lambda d: -count_tokens(d.text))[:2]
    gold = [g.compact() for g in gold]
  else:
    ds = ds[:4]
    rng.shuffle(ds)
    ds = ds[:rng.randint(1, len(ds))]
  b = state_builder(view, count_tokens, TASK_STATES['reading'])
  gold_tokens = sum(count_tokens(g.text) for g in gold)
  drops = []
  for d in ds:
    if fits(b, d.text, budget - gold_tokens):
      drops.append(b.observe(d.text, d.unit_ids)[1])
  if not drops:
    return None
  for k, g in enumerate(gold):
    b.observe(g.text, g.unit_ids, current=k == len(gold) - 1)
  if b.context_tokens() > budget:
    return None
  return b.finish(), cmds.Command(cmds.FILTER, {'drop_refs': drops})


def t_filter_distractors(view, rng, count_tokens, budget, phase=None):
  return _filter_state(view, rng, count_tokens, budget, False)


def t_filter_verbose_distractors(view, rng, count_tokens, budget, phase=None):
  return _filter_state(view, rng, count_tokens, budget, True)


def t_summarize_long_evidence(view, rng, count_tokens, budget, phase=None):
  gold = capped_gold(view, count_tokens, budget)
  longs = [g for g in gold if not all(g.gold_mask)]
  if not longs:
    return None
  g = pick(rng, longs)
  others = [o.compact() for o in gold if o is not g]
  b = state_builder(view, count_tokens, TASK_STATES['reading'])
  cid = b.observe(g.text, g.unit_ids)[1]
  for k, o in enumerate(others):
    b.observe(o.text, o.unit_ids, current=k == len(others) - 1)
  if b.context_tokens() > budget:
    return None
  return b.finish(), cmds.Command(cmds.SUMMARIZE, {'source_refs': [cid],
                                                   'summary': g.compact().text})


def t_summarize_all_relevant(view, rng, count_tokens, budget, phase=None):
  gold = capped_gold(view, count_tokens, budget)
  if len(gold) < 2 or all(all(g.gold_mask) for g in gold):
    return None
  gold = gold[:]
  rng.shuffle(gold)
  b = state_builder(view, count_tokens, TASK_STATES['reading'])
  cids = [b.observe(g.text, g.unit_ids)[1] for g in gold]
  if b.context_tokens() > budget:
    return None
  summary = ' '.join(g.compact().text for g in gold)
  return b.finish(), cmds.Command(cmds.SUMMARIZE, {'source_refs': cids,
                                                   'summary': summary})
