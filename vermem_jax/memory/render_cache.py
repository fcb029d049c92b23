"""Token-cost caches of g(s) (`serialization.render_policy_input`): the cost model of a
counter and the per-counter caches of record lines, short texts and whole sections.

Cost models: ADDITIVE, SPLITS and GENERIC (serialization's module docstring states
what each means and why the declared sums are exact; the declarations are in
vermem_jax/memory/token_count.py).

A declared counter's first renders and then one in `AUDIT_EVERY` are recounted whole;
a mismatch (a false declaration) `demote`s it to GENERIC with a RuntimeWarning.
"""

import collections
import warnings

from vermem_jax.memory import token_count

# Per-counter caches: token costs of short texts (instruction, task block, headers)
# and an LRU of rendered sections (which hold their record tuples and lists of line
# pointers, so they are bounded by count: about `_SECTION_CACHE_MAX` recent M/C/H
# tuples, enough for every live episode of a rollout batch).
_TEXT_CACHE_MAX = 50_000
_SECTION_CACHE_MAX = 2048
# Whole-output counts of undeclared counters, memoized by text (the same g(s) is rendered
# for every rollout that shares a state); each key is a ~20k-character string.
_FULL_CACHE_MAX = 256
# Audits of declared counters (defence in depth; the declaration is what g(s) relies
# on): the first renders of each counter, then one in `AUDIT_EVERY`, are recounted
# whole and a mismatch demotes the counter to the undeclared (recounting) path.
AUDIT_FIRST = 1
AUDIT_EVERY = 4096

# Cost models of a counter (token_count declarations):
ADDITIVE = 'additive'  # cost(line) = count(line); "\n" is free; the sum is exact.
SPLITS = 'splits'  # cost(line) = count(line + "\n") (last line: count(line)); exact.
GENERIC = 'generic'  # estimate count(line) + count("\n") per join; whole text recounted.


def cost_model(count_tokens):
  """The cost model g(s) uses for `count_tokens` (ADDITIVE, SPLITS or GENERIC).

  Declarations are read from the callable, or for a bound method from the object it
  is bound to (so a tokenizer instance can declare for its `count_tokens` method).
  """
  if token_count.is_additive(count_tokens):
    return ADDITIVE
  if token_count.splits_after_newline(count_tokens):
    return SPLITS
  return GENERIC


_next_slot = [0]


def _new_slot():
  """A fresh per-record cache attribute name ('_g<n>'), never reused: a stale
  attribute of a forgotten counter (or of a demoted cost model) can never be read as
  another counter's count."""
  slot = f'_g{_next_slot[0]}'
  _next_slot[0] += 1
  return slot


class CounterCache:
  """Cached token costs for one counter under one cost model.

  Records are immutable and shared between states, so a record's rendered line and
  its token cost are computed once and kept on the record itself (in its instance
  `__dict__` under a per-counter name; not a dataclass field, so equality, hashing,
  JSON and pickling — see state._Record — ignore it). Sections (the M, C and H tuples)
  are cached by identity. Pass the same counter object (or bound method) each call; a
  fresh closure per call gets no caching.
  """

  def __init__(self, count_tokens, model):
    self.count = count_tokens
    self.model = model
    self.exact = model != GENERIC
    self.texts = {}
    self.sections = collections.OrderedDict()
    self.full = collections.OrderedDict()
    self.slot = _new_slot()
    self.renders = 0
    if model == SPLITS:
      self.cost = self._cost_with_newline
    else:
      self.cost = count_tokens
    self.sep = self.count('\n') if model == GENERIC else 0

  def _cost_with_newline(self, line):
    return self.count(line + '\n')

  def context_tokens(self, state):
    """Tokens of C_t (cached per C tuple)."""
    key = ('ctx', id(state.C))
    hit = self.sections.get(key)
    if hit is None or hit[0] is not state.C:
      hit = (state.C, state.context_tokens())
      self.sections[key] = hit
    return hit[1]

  def text(self, text):
    """Cost of a piece of g(s) that a newline follows."""
    hit = self.texts.get(text)
    if hit is None:
      if len(self.texts) > _TEXT_CACHE_MAX:
        self.texts.clear()
      hit = self.texts[text] = self.cost(text)
    return hit

  def last(self, text):
    """Cost of the final piece of g(s) (no newline after it)."""
    key = ('last', text)
    hit = self.texts.get(key)
    if hit is None:
      hit = self.texts[key] = self.count(text)
    return hit

  def total(self, text):
    """count_tokens of a whole g(s) text (undeclared counters), memoized by text."""
    full = self.full
    hit = full.get(text)
    if hit is None:
      hit = full[text] = self.count(text)
      if len(full) > _FULL_CACHE_MAX:
        full.popitem(last=False)
    else:
      full.move_to_end(text)
    return hit

  def section(self, records, variant, make_line, keep=None, newest_first=False):
    """Cached view of one section (the M, C or H tuple).

    Returns:
      (lines, total, strs): [(line, tokens)] in record order, their token sum, and
      the line strings in output order (newest first when `newest_first`). Only
      pointers are cached (the line strings live on the records), so the cache stays
      small however long the sections grow.
    """
    key = ('s', variant, id(records))
    hit = self.sections.get(key)
    if hit is not None and hit[0] is records:
      self.sections.move_to_end(key)
      return hit[1], hit[2], hit[3]
    slot = self.slot
    if keep is None and len(records) > 1:
      # An append-only section (H) usually extends a cached tuple by one record.
      prev = self.sections.get(('p', variant, id(records[-2])))
      if (prev is not None and len(prev[0]) == len(records) - 1 and
          prev[0] == records[:-1]):
        line = self._line(records[-1], slot, make_line)
        lines = prev[1] + [line]
        total = prev[2] + line[1]
        strs = [line[0]] + prev[3] if newest_first else prev[3] + [line[0]]
        return self._store(key, variant, records, lines, total, strs)
    if keep is None:
      lines = [r.__dict__.get(slot) or self._line(r, slot, make_line)
               for r in records]
    else:  # keep is a status: only records with that status are shown
      lines = [r.__dict__.get(slot) or self._line(r, slot, make_line)
               for r in records if r.status == keep]
    total = sum([t for _, t in lines])
    strs = [l for l, _ in lines]
    if newest_first:
      strs.reverse()
    return self._store(key, variant, records, lines, total, strs)

  def _line(self, r, slot, make_line):
    line = r.__dict__.get(slot)
    if line is None:
      text = make_line(r)
      line = r.__dict__[slot] = (text, self.cost(text))
    return line

  def _store(self, key, variant, records, lines, total, strs):
    value = (records, lines, total, strs)
    sections = self.sections
    sections[key] = value
    if records:
      sections[('p', variant, id(records[-1]))] = value
    while len(sections) > _SECTION_CACHE_MAX:
      sections.popitem(last=False)
    return lines, total, strs

  def audit_due(self):
    self.renders += 1
    return self.exact and (self.renders <= AUDIT_FIRST or
                           self.renders % AUDIT_EVERY == 0)


_counters = {}
_demoted = set()


def counter_for(count_tokens):
  """The `CounterCache` of `count_tokens` (created on first use, under its cost model
  or GENERIC once demoted). Pass the same callable each call: a fresh closure gets a
  fresh, empty cache."""
  counter = _counters.get(count_tokens)
  if counter is None:
    if len(_counters) > 16:
      _counters.clear()
    model = GENERIC if count_tokens in _demoted else cost_model(count_tokens)
    counter = _counters[count_tokens] = CounterCache(count_tokens, model)
  return counter


def demote(count_tokens, estimate, actual):
  """A declared counter miscounted g(s): use the recounting path from now on."""
  warnings.warn(
      f'token counter {count_tokens!r} declares additive_over_lines or '
      f'splits_after_newline, but a policy input summed to {estimate} tokens and '
      f'counts {actual}; g(s) now recounts every output of this counter',
      RuntimeWarning, stacklevel=3)
  if len(_demoted) > 64:
    _demoted.clear()
  _demoted.add(count_tokens)
  counter = _counters[count_tokens] = CounterCache(count_tokens, GENERIC)
  return counter
