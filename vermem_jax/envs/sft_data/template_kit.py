"""What the SFT state templates share: document caps, the state builder, a seeded pick.

SPEC §4, paper D.2. Every template is `(view, rng, count_tokens, context_budget,
phase) -> (MemoryState, Command) | None` (see `templates.Template`); a document is
usable when it takes at most a quarter of the context budget, so evidence and some
distractors fit C together.
"""

from __future__ import annotations

from vermem_jax.envs.scenarios.initial_state import StateBuilder


def pick(rng, seq):
  """A uniformly drawn element of `seq` (None when empty)."""
  return seq[rng.randrange(len(seq))] if seq else None


def capped_gold(view, count_tokens, budget):
  """The view's gold docs of at most budget // 4 tokens."""
  cap = max(1, budget // 4)
  return [d for d in view.gold_docs if view.tokens(d.text, count_tokens) <= cap]


def capped_distractors(view, count_tokens, budget):
  """The view's related distractor docs (most related first) of at most budget // 4
  tokens."""
  cap = max(1, budget // 4)
  return [d for d in view.related_distractors()
          if view.tokens(d.text, count_tokens) <= cap]


def state_builder(view, count_tokens, task_state=''):
  """A StateBuilder for the view's example with `task_state`."""
  return StateBuilder(view.example, count_tokens, task_state=task_state)
