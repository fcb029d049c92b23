"""Phase A episodes (LTM ⊂ {Add, Update, Delete, ∅}) and their delayed query.

SPEC §4, paper Appendix D.4 (Phase A) and F.8. Supporting facts arrive one sentence
at a time, interleaved with distractor sentences (and, in `add`, a repeated fact); M_0
holds the family's persistent state: nothing (`add`), stale versions of facts that
later observations correct (`update`), an obsolete or duplicated entry beside the
supported one (`delete`), or every fact already stored (`null`). The delayed query is
answered from what LTM holds (`episode_types.SOLVER_READS_LTM`).
"""

from __future__ import annotations

from vermem_jax.envs.episode_types import SOLVER_READS_LTM
from vermem_jax.envs.scenarios.generator_parts import (Skip, distractor_sentences,
                                                       fact_obs, interleave)
from vermem_jax.envs.scenarios.initial_state import TASK_STATES, StateBuilder
from vermem_jax.envs.scenarios.perturbations import stale_version
from vermem_jax.memory import commands as cmds


def generate(view, family, rng, count_tokens, cfg):
  """Phase A s_0 and schedule of `family` (contract: `generator_parts` docstring)."""
  ex = view.example
  facts = list(view.facts)
  if family == 'delete' and not facts:
    raise Skip
  b = StateBuilder(ex, count_tokens, task_state=TASK_STATES['phase_a'])
  ref = None
  if family == 'add':
    order = facts[:]
    rng.shuffle(order)
    first, rest = order[0], order[1:]
    _, cid = b.observe(first.text, (first.unit_id,), current=True)
    ref = cmds.Command(cmds.ADD, {'content': first.text, 'source_refs': [cid]})
    dup = [fact_obs(first)]  # the first fact comes again later (a duplicate)
    schedule = interleave(rng, [fact_obs(f) for f in rest],
                          distractor_sentences(view, rng, cfg.phase_a_distractors)
                          + dup)
  elif family == 'update':
    order = facts[:]
    rng.shuffle(order)
    stale = []
    for f in order:
      v = stale_version(f, rng)
      if v is not None:
        stale.append((f, v[1]))
      if len(stale) == 2:
        break
    if not stale:
      raise Skip
    # Stale entries cite no source: their provenance is what the update repairs.
    stale_ids = {f.unit_id: b.entry(text, stale=True) for f, text in stale}
    first = stale[0][0]
    _, cid = b.observe(first.text, (first.unit_id,), current=True)
    ref = cmds.Command(cmds.UPDATE, {'memory_id': stale_ids[first.unit_id],
                                     'new_content': first.text,
                                     'source_refs': [cid]})
    rest = [f for f in order if f is not first]
    schedule = interleave(rng, [fact_obs(f) for f in rest],
                          distractor_sentences(view, rng, cfg.phase_a_distractors))
  elif family == 'delete':
    order = facts[:]
    rng.shuffle(order)
    target = order[0]
    v = stale_version(target, rng)
    good_first = rng.random() < 0.5
    if v is None:  # no stale version: an exact duplicate is the obsolete entry
      a = b.entry(target.text, (target.unit_id,))
      dup = b.entry(target.text, (target.unit_id,))
      obsolete, reason = dup, f'duplicate of {a}'
    elif good_first:
      good = b.entry(target.text, (target.unit_id,))
      obsolete = b.entry(v[1], stale=True)
      reason = f'obsolete: {good} holds the version the source supports'
    else:
      obsolete = b.entry(v[1], stale=True)
      good = b.entry(target.text, (target.unit_id,))
      reason = f'obsolete: {good} holds the version the source supports'
    b.observe(target.text, (target.unit_id,), current=True)
    ref = cmds.Command(cmds.DELETE, {'memory_id': obsolete, 'reason': reason})
    schedule = interleave(rng, [fact_obs(f) for f in order[1:]],
                          distractor_sentences(view, rng, cfg.phase_a_distractors)
                          + [fact_obs(target)])
  elif family == 'null':
    for f in facts:
      b.entry(f.text, (f.unit_id,))
    order = facts[:]
    rng.shuffle(order)
    b.observe(order[0].text, (order[0].unit_id,), current=True)
    ref = cmds.Command(cmds.NULL)
    schedule = interleave(rng, [fact_obs(f) for f in order[1:]],
                          distractor_sentences(view, rng, cfg.phase_a_distractors))
  else:
    raise ValueError(f'unknown Phase A family {family!r}')
  return b, schedule, ref, False, SOLVER_READS_LTM
