"""Deterministic text checks used by the executor (SPEC §2–3 decisions).

- `same_text`: duplicate test for Add/Update — casefold, collapse whitespace, strip
  surrounding whitespace and trailing sentence punctuation (`.!?;:,`), then equality.
- `unsupported_facts`: faithfulness of policy-written text (Summarize summary; also
  Add/Update content when ExecutorConfig.check_numbers_on_write). A *fact token* is a
  number/date/time (`\\d+` runs joined by `. , : / -`, thousands commas removed) or a
  capitalized month or weekday name. Each fact token of the written text must occur in
  the sources: as a whole token, or as one of the digit groups of a source token
  ("1972" is supported by "1972-09-06"). Anything else is unsupported.
- `leaked`: leakage in no-reference settings. Texts are normalized like HotpotQA
  answers (lowercase, punctuation -> space, articles a/an/the dropped, whitespace
  collapsed). A forbidden string leaks when its normalized form occurs as a whole-word
  sequence in the written text but in none of the grounding texts (the cited sources and
  q): copying evidence that happens to contain the answer is not leakage; writing the
  answer or a label the policy could not have read is.
"""

import functools
import re
import string

_NUMBER = re.compile(r'\d+(?:[.,:/\-]\d+)*')
_NAMES = ('January', 'February', 'March', 'April', 'May', 'June', 'July', 'August',
          'September', 'October', 'November', 'December', 'Monday', 'Tuesday',
          'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday')
_NAME = re.compile(r'\b(' + '|'.join(_NAMES) + r')\b')
_TRAIL = ' \t\n\r.!?;:,'
_PUNCT = re.compile('[' + re.escape(string.punctuation) + ']')
_ARTICLES = re.compile(r'\b(a|an|the)\b')


def same_text(a, b):
  return normalize_entry(a) == normalize_entry(b)


@functools.lru_cache(maxsize=65536)
def normalize_entry(text):
  return ' '.join(text.casefold().split()).strip(_TRAIL)


@functools.lru_cache(maxsize=65536)
def fact_tokens(text):
  """Numbers/dates/times and month/weekday names of `text` (normalized strings)."""
  nums = [t.replace(',', '') for t in _NUMBER.findall(text)]
  return tuple(nums + _NAME.findall(text))


def _supported_set(sources):
  out = set()
  for src in sources:
    for t in fact_tokens(src):
      out.add(t)
      out.update(re.split(r'[.:/\-]', t))
  return out


def unsupported_facts(text, sources):
  """Fact tokens of `text` not supported by the `sources` texts (sorted, unique)."""
  tokens = fact_tokens(text)
  if not tokens:
    return []
  supported = _supported_set(sources)
  return sorted({t for t in tokens if t not in supported})


@functools.lru_cache(maxsize=65536)
def normalize_answer_like(text):
  text = _PUNCT.sub(' ', text.lower())
  text = _ARTICLES.sub(' ', text)
  return ' '.join(text.split())


def leaked(written, grounding, forbidden):
  """Forbidden strings present in `written` texts but absent from `grounding` texts."""
  if not forbidden:
    return []
  w = ' ' + ' '.join(normalize_answer_like(t) for t in written) + ' '
  g = ' ' + ' | '.join(normalize_answer_like(t) for t in grounding) + ' '
  out = []
  for f in forbidden:
    nf = normalize_answer_like(f)
    if nf and f' {nf} ' in w and f' {nf} ' not in g:
      out.append(f)
  return out
