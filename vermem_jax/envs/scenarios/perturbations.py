"""Text corruptions for stale / obsolete entries (paper D.1: partial, conflicting,
duplicated and obsolete states; SPEC §4).

A conflicting version changes one number of a supporting sentence; a partial version
keeps the first half of its words. Phase A/C generators and the SFT Update/Delete
templates plant such texts in M_0.
"""

from __future__ import annotations

import re


# Whole-word numbers only (not '82nd', not '3.5'): a perturbed value stays a number.
_YEAR = re.compile(r'(?<![\w.,])(1[5-9]\d\d|20\d\d)(?![\w.,]\w|\w)')
_INT = re.compile(r'(?<![\w.,])(\d{1,6})(?![\w.,]\w|\w)')


def perturb_number(text, rng):
  """`text` with its first year (else integer) changed to a value absent from it.

  Returns None when `text` has no such number.
  """
  m = _YEAR.search(text) or _INT.search(text)
  if m is None:
    return None
  value = int(m.group(1))
  present = set(re.findall(r'\d+', text))
  deltas = [1, 2, 3, -1, -2] if m.re is _YEAR else [1, 2, 3]
  rng.shuffle(deltas)
  for d in deltas:
    new = value + d
    if new >= 0 and str(new) not in present:
      return text[:m.start(1)] + str(new) + text[m.end(1):]
  return None


def truncate_partial(text):
  """The first half of `text`'s words (an incomplete version); None if too short."""
  words = text.split()
  if len(words) < 6:
    return None
  return ' '.join(words[:len(words) // 2])


def stale_version(fact, rng, prefer_number=True):
  """(kind, text) of an outdated entry for `fact`: 'conflicting' or 'partial'."""
  if prefer_number:
    s = perturb_number(fact.sentence, rng)
    if s is not None:
      return 'conflicting', f'{fact.doc.display_title}: {s}'
  s = truncate_partial(fact.sentence)
  if s is not None:
    return 'partial', f'{fact.doc.display_title}: {s}'
  if not prefer_number:
    s = perturb_number(fact.sentence, rng)
    if s is not None:
      return 'conflicting', f'{fact.doc.display_title}: {s}'
  return None
