"""What the phase generators share: the skip signal, document caps, observations.

SPEC §4, paper Appendix D.4. The phase generators (`phase_a`, `phase_b`, `phase_c`)
share one contract:

    generate(view, family, rng, count_tokens, cfg)
      view: views.ExampleView; family: one of spec.FAMILIES[phase]; rng: the
        episode's random.Random; count_tokens: `str -> int` backbone token counter
        (tokens); cfg: spec.ScenarioConfig.
      returns (StateBuilder, schedule: list of environment.Observation, reference
        Command, is_recovery: bool, answer context: episode_types.SOLVER_READS_LTM (Phase A)
        or episode_types.SOLVER_READS_CONTEXT (B, C));
      raises `Skip` when the family does not apply to the example (no number to
      correct, too few documents, nothing fits the budget).

`build.build_episode` turns that into a ScenarioSpec.
"""

from __future__ import annotations

import dataclasses

from vermem_jax.envs import episode_types
from vermem_jax.envs.scenarios.initial_state import QUERY_PREFIX, TASK_STATES, fits
from vermem_jax.memory.config import document_chunk_tokens


class Skip(Exception):
  """The family does not apply to this example (e.g. no number to correct)."""


def budget_and_cap(cfg):
  """C's budget and the token cap of one document observation
  (`memory.config.document_chunk_tokens`: the environment's rule, SPEC §7)."""
  budget = cfg.context_budget
  return budget, document_chunk_tokens(budget, cfg.max_doc_tokens)


def capped_docs(view, count_tokens, cap, which):
  """The view's gold docs (`which='gold'`) or related distractors (most related
  first) as they enter the environment: a document over `cap` tokens becomes its
  sentence chunks (`views.Doc.chunks`, `envs.documents`); of a gold document only the
  chunks holding a supporting sentence are kept. A chunk that alone exceeds `cap`
  (one very long sentence) is left out."""
  docs = view.gold_docs if which == 'gold' else view.related_distractors()
  out = []
  for d in docs:
    pieces = ([d] if view.tokens(d.text, count_tokens) <= cap
              else d.chunks(cap, count_tokens))
    out += [p for p in pieces if (p.gold or which != 'gold')
            and view.tokens(p.text, count_tokens) <= cap]
  return out


def fact_obs(fact):
  """One supporting sentence as an observation citing its unit."""
  return episode_types.Observation(text=fact.text, source_refs=(fact.unit_id,))


def doc_obs(doc):
  """A whole document as an observation citing its units."""
  return episode_types.Observation(text=doc.text, source_refs=doc.unit_ids)


def query_obs(example):
  """The delayed query: the last observation of every schedule."""
  return episode_types.Observation(
      text=QUERY_PREFIX + example.question, task_state=TASK_STATES['query'])


def distractor_sentences(view, rng, k):
  """`k` random distractor sentences as observations (Phase A schedules)."""
  pool = [(d, i) for d in view.distractor_docs for i in range(len(d.sentences))]
  rng.shuffle(pool)
  return [episode_types.Observation(text=d.fact_text(i), source_refs=(d.unit_ids[i],))
          for d, i in pool[:k]]


def interleave(rng, main, extra):
  """`main` in order with `extra` inserted at random positions (never first)."""
  out = list(main)
  for ob in extra:
    out.insert(rng.randint(1, len(out)), ob)
  return out


def fill_distractors(b, docs, budget, target_tokens, *, current_last=True):
  """Adds distractor docs to C (and H) until C reaches `target_tokens`."""
  added = []
  for d in docs:
    if b.context_tokens() >= target_tokens:
      break
    if not fits(b, d.text, budget):
      continue
    added.append((d, b.observe(d.text, d.unit_ids)))
  if added and current_last:
    b.state = dataclasses.replace(b.state, env_item_id=added[-1][1][1])
  return added
