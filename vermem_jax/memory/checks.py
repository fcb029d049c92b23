"""Deterministic text checks used by the executor (SPEC §2–3 decisions).

Every check first puts text in a canonical form (`canonical`): Unicode NFKC (fullwidth
and circled digits, ligatures, ...), invisible format characters removed (zero-width
spaces, bidi marks, tag characters: category Cf), and decimal digits of any script
written as ASCII digits. So an invisible character, a fullwidth letter or an
Arabic-Indic digit can neither hide a duplicate, a number or a forbidden string from a
check nor make a written text non-empty.

- `control_markup`: a chat-control or tool tag ("<|im_end|>", "<tool_call>") in a text
  the policy writes into M or C; the task solver reads C and M as plain prompt text, so
  such a tag would end its chat turn (executor: bad_argument).
- `is_blank`: a written text with no visible character (only whitespace, control and
  format characters) counts as empty.
- `same_text`: duplicate test for Add/Update — canonical form, casefold, collapse
  whitespace, strip surrounding whitespace and trailing sentence punctuation
  (`.!?;:,`), then equality.
- `unsupported_facts`: faithfulness of policy-written text (Summarize summary; also
  Add/Update content when ExecutorConfig.check_numbers_on_write). A *fact token* is
  * a number/date/time: `\\d+` runs joined by `. , : / -` (thousands commas removed);
  * a number written in words: a run of English number words ("twenty-five", "one
    million", "nineteen fifty one"), as the decimal value of the run (standard
    units/tens/scales reading); a run that is only "one" is not a number (pronoun);
  * a month or weekday name, in any case ("may" only capitalized: the modal verb),
    month abbreviations (Jan, Feb, Mar, Apr, Jun, Jul, Aug, Sep(t), Oct, Nov, Dec)
    read as the full name.
  Each fact token of the written text must occur in the sources: as a whole token, or
  as one of the digit groups of a source token ("1972" is supported by "1972-09-06"),
  except that a decimal number is one value ("3.5" supports neither "3" nor "5").
  Number words and digits meet through their value ("two" is supported by "2", and
  "1,000,000" by "one million"). Anything else is unsupported. Roman numerals and
  ordinals are not read (documented limitation).
- `leaked`: leakage in no-reference settings. Texts are normalized like HotpotQA
  answers, more strictly (`normalize_answer_like`: canonical form, accents dropped,
  casefold, every non-alphanumeric character -> space, articles a/an/the dropped,
  whitespace collapsed). A forbidden string occurs in a text when its normalized form
  occurs as a whole-word sequence, or (forbidden strings of at least
  `JOINED_MIN_CHARS` letters) when consecutive words of the text spell it with the
  spaces removed ("JaneRoe", "J a n e Roe"). It leaks when it occurs in the written text
  but in none of the grounding texts (the cited sources and q): copying evidence that
  happens to contain the answer is not leakage; writing the answer or a label the
  policy could not have read is. A string check cannot see meaning: an answer spread
  over two writes ("first name Jane", later "surname Roe") is not detected.
"""

import functools
import re
import unicodedata

_NUMBER = re.compile(r'\d+(?:[.,:/\-]\d+)*')
_MONTHS = ('January', 'February', 'March', 'April', 'May', 'June', 'July', 'August',
           'September', 'October', 'November', 'December')
_WEEKDAYS = ('Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday',
             'Sunday')
_ABBREV = {'Jan': 'January', 'Feb': 'February', 'Mar': 'March', 'Apr': 'April',
           'Jun': 'June', 'Jul': 'July', 'Aug': 'August', 'Sep': 'September',
           'Sept': 'September', 'Oct': 'October', 'Nov': 'November',
           'Dec': 'December'}
_CASELESS_NAMES = {n.casefold(): n for n in _MONTHS + _WEEKDAYS if n != 'May'}
_NAME = re.compile(
    r'\b(?:(May)|(' + '|'.join(sorted(_ABBREV, key=len, reverse=True)) + r')\b\.?|'
    r'((?i:' + '|'.join(_CASELESS_NAMES) + r')))\b')
_UNITS = {w: i for i, w in enumerate(
    'zero one two three four five six seven eight nine ten eleven twelve thirteen '
    'fourteen fifteen sixteen seventeen eighteen nineteen'.split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate(
    'twenty thirty forty fifty sixty seventy eighty ninety'.split())}
_SCALES = {'hundred': 100, 'thousand': 10**3, 'million': 10**6, 'billion': 10**9,
           'trillion': 10**12}
_NUM_WORD = '(?:' + '|'.join(sorted(list(_UNITS) + list(_TENS) + list(_SCALES),
                                    key=len, reverse=True)) + ')'
_NUM_RUN = re.compile(rf'(?i)\b{_NUM_WORD}(?:(?:[\s\-]+(?:and[\s\-]+)?){_NUM_WORD})*\b')
_DECIMAL = re.compile(r'\d+\.\d+')
_TRAIL = ' \t\n\r.!?;:,'
_NON_WORD = re.compile(r'[\W_]+')
_ARTICLES = re.compile(r'\b(a|an|the)\b')
# Forbidden strings shorter than this (letters, spaces removed) are matched only as
# whole words: "yes"/"no" spelled across words would match ordinary text (decision).
JOINED_MIN_CHARS = 4
# Invisible characters: format (Cf), line/paragraph separators; removed by `canonical`.
_INVISIBLE = re.compile(
    '[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f'
    '\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd'
    '\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001'
    '\U000e0020-\U000e007f]')
_CONTROL = re.compile('[\x00-\x08\x0e-\x1f\x7f-\x9f]')
_NON_ASCII_DIGIT = re.compile(r'(?![0-9])\d')
_SURROGATE = re.compile('[\ud800-\udfff]')
# The "<" that opens a chat-control or tool tag: Qwen tokenizers read "<|im_end|>",
# "<|im_start|>", "<tool_call>", "</think>", ... in plain text as control tokens.
TAG_OPEN = re.compile(r'<(?=\||/?[A-Za-z_][A-Za-z0-9_\-]*>)')


def control_markup(text, allowed_texts=()):
  """The first chat-control/tool tag in `text` (e.g. '<|im_end|>') that none of
  `allowed_texts` contains, or None.

  Tags copied from a cited source (HotpotQA sentences hold wiki markup such as
  '<nowiki>') are data, not an attempt to write markup; g(s) and solver prompts escape
  them anyway. Only tags the command introduces itself count.
  """
  if '<' not in text:
    return None
  for m in TAG_OPEN.finditer(text):
    end = text.find('>', m.start())
    tag = text[m.start():end + 1 if end >= 0 else m.start() + 12][:40]
    if not any(tag in t for t in allowed_texts):
      return tag
  return None


def has_surrogates(text):
  """Whether `text` holds an unpaired UTF-16 surrogate (not encodable as UTF-8)."""
  return not text.isascii() and _SURROGATE.search(text) is not None


def scrub_surrogates(text):
  """`text` with unpaired surrogates replaced by U+FFFD (tokenizers reject them)."""
  return _SURROGATE.sub('\ufffd', text) if has_surrogates(text) else text


@functools.lru_cache(maxsize=65536)
def canonical(text):
  """NFKC, format characters removed, decimal digits of every script as ASCII."""
  if not text.isascii():
    text = _INVISIBLE.sub('', unicodedata.normalize('NFKC', text))
    text = _NON_ASCII_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group(), 0)), text)
  return text


def is_blank(text):
  """Whether `text` has no visible character (whitespace/control/format only)."""
  if not text or text.isspace():
    return True
  return not _CONTROL.sub('', canonical(text)).strip()


def same_text(a, b):
  return normalize_entry(a) == normalize_entry(b)


@functools.lru_cache(maxsize=65536)
def normalize_entry(text):
  text = _CONTROL.sub('', canonical(text))
  return ' '.join(text.casefold().split()).strip(_TRAIL)


def _run_value(run):
  total = current = 0
  for w in re.split(r'[\s\-]+', run.casefold()):
    if w == 'and':
      continue
    if w in _UNITS:
      current += _UNITS[w]
    elif w in _TENS:
      current += _TENS[w]
    elif w == 'hundred':
      current = max(current, 1) * 100
    else:
      total += max(current, 1) * _SCALES[w]
      current = 0
  return total + current


def _name_token(m):
  if m.group(1):
    return 'May'
  if m.group(2):
    return _ABBREV[m.group(2)]
  return _CASELESS_NAMES[m.group(3).casefold()]


@functools.lru_cache(maxsize=65536)
def fact_tokens(text):
  """Numbers/dates/times and month/weekday names of `text` (normalized strings)."""
  text = canonical(text)
  nums = [t.replace(',', '') for t in _NUMBER.findall(text)]
  words = [str(_run_value(r)) for r in _NUM_RUN.findall(text)
           if r.casefold() != 'one']
  return tuple(nums + words + [_name_token(m) for m in _NAME.finditer(text)])


def _supported_set(sources):
  out = set()
  for src in sources:
    for t in fact_tokens(src):
      out.add(t)
      if not _DECIMAL.fullmatch(t):  # "3.5" does not support "3" (or "5")
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
def _plain_words(text):
  """Canonical form, accents dropped, casefold, non-alphanumerics -> space."""
  text = unicodedata.normalize('NFKD', canonical(text))
  if not text.isascii():
    text = ''.join(ch for ch in text if not unicodedata.combining(ch))
  return ' '.join(_NON_WORD.sub(' ', text.casefold()).split())


@functools.lru_cache(maxsize=65536)
def normalize_answer_like(text):
  """HotpotQA-style answer normalization, Unicode-robust (module docstring)."""
  return ' '.join(_ARTICLES.sub(' ', _plain_words(text)).split())


def _joined(compact, words):
  """Whether consecutive `words` concatenate to `compact`."""
  for i, w in enumerate(words):
    if not compact.startswith(w):
      continue
    acc = w
    j = i + 1
    while len(acc) < len(compact) and j < len(words):
      acc += words[j]
      j += 1
      if not compact.startswith(acc):
        break
    if acc == compact:
      return True
  return False


def _occurs(nf, text):
  """Whether normalized forbidden string `nf` occurs in `text` (module docstring)."""
  if f' {nf} ' in f' {normalize_answer_like(text)} ':
    return True
  compact = nf.replace(' ', '')
  if len(compact) < JOINED_MIN_CHARS:
    return False
  plain, squeezed = _squeezed(text)  # articles kept: "J a n e" spells a name
  return compact in squeezed and _joined(compact, plain.split())


@functools.lru_cache(maxsize=65536)
def _squeezed(text):
  plain = _plain_words(text)
  return plain, plain.replace(' ', '')


def leaked(written, grounding, forbidden):
  """Forbidden strings present in `written` texts but absent from `grounding` texts."""
  if not forbidden:
    return []
  out = []
  for f in forbidden:
    nf = normalize_answer_like(f)
    if nf and any(_occurs(nf, t) for t in written) and not any(
        _occurs(nf, t) for t in grounding):
      out.append(f)
  return out
