"""Token counters for the memory package (which never imports a tokenizer).

The memory code takes any `count_tokens(str) -> int`. A counter may declare, as
attributes of the callable (or, for a bound method such as `Tokenizer.count_tokens`,
of the object it is bound to), one of two promises that let g(s) (serialization) sum
cached per-line counts instead of recounting its whole ~20k-character output on every
call:

- `additive_over_lines = True`: `count(a + "\\n" + b) == count(a) + count(b)` for all
  strings a, b (the whitespace counter).
- `splits_after_newline = True`: `count(a + "\\n" + b) == count(a + "\\n") + count(b)`
  for every string a and every string b whose first character is not whitespace (and
  not a combining mark). Additivity implies it (take b = "" to get
  `count(a + "\\n") == count(a)`). Byte-level BPE tokenizers that pre-tokenize with the
  GPT-2/Qwen split regex and normalize with NFC (Qwen2.5, Qwen3) satisfy it:
    * NFC never composes across "\\n" followed by a starter character, and no added
      (special) token contains "\\n", so both sides are normalized and split for
      special tokens independently;
    * every alternative of the Qwen regex that can match "\\n" ends there when the next
      character is not whitespace (` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*`, `\\s*[\\r\\n]+`,
      `\\s+(?!\\S)`, `\\s+`; the letter/number/contraction alternatives never match
      "\\n"), and the regex has no look-behind, so the pieces after the "\\n" are the
      pieces of b alone and the pieces up to it are the pieces of a + "\\n" (the
      Qwen2.5 added tokens have lstrip = rstrip = false, so none takes the "\\n");
    * BPE runs inside each piece, so the token count is the sum over pieces.
  A SentencePiece model with a dummy prefix does NOT satisfy it (b alone gets a "▁"
  that it does not get after "\\n"); declare nothing for such counters.

Every undeclared counter is treated as a black box: g(s) then recounts its whole output
(memoized by text, see serialization). A declaration is trusted, not proven at run
time; g(s) audits a few whole-text counts per counter (`render_cache.AUDIT_*`) and
treats a counter whose declaration failed an audit as undeclared from then on.

`tokenizer_json_splits_after_newline(config)` checks, on the parsed `tokenizer.json`
of a Hugging Face fast tokenizer (plain dict; nothing is imported), exactly the premises
of the proof above, so the owner of a tokenizer can declare `splits_after_newline` only
where it is proven.

`memoize(count_tokens)` wraps a counter in a bounded memo (the same C items and H events
are counted again across decisions and rollouts) and keeps its declarations.
"""

import collections

# Memo bounds (decision): entries, and the longest text that enters the memo (longer
# texts are counted every time), so a memo holds at most ~MAX_ENTRIES * MAX_CHARS chars.
MEMO_MAX_ENTRIES = 16384
MEMO_MAX_CHARS = 4096


def count_whitespace_tokens(text):
  """Number of whitespace-separated words of `text` (a tokenizer-free stand-in).

  Additive over newline-joined lines, so it carries `additive_over_lines = True`.
  """
  return len(text.split())


count_whitespace_tokens.additive_over_lines = True


def _declares(count_tokens, name):
  if getattr(count_tokens, name, False):
    return True
  owner = getattr(count_tokens, '__self__', None)  # a bound method's object
  return owner is not None and bool(getattr(owner, name, False))


def is_additive(count_tokens):
  """Whether `count_tokens` declares `additive_over_lines` (see module docstring)."""
  return _declares(count_tokens, 'additive_over_lines')


def splits_after_newline(count_tokens):
  """Whether `count_tokens` declares `splits_after_newline` (or additivity)."""
  return (_declares(count_tokens, 'splits_after_newline') or
          is_additive(count_tokens))


# The pre-tokenizer split regex of Qwen2/Qwen2.5/Qwen3 (HF tokenizer.json), the one the
# proof in the module docstring walks through.
QWEN_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizer_json_splits_after_newline(config):
  """Whether a HF `tokenizer.json` (parsed dict) meets the premises of the proof.

  True only for: normalizer None or NFC; pre-tokenizer = Sequence[Split(Qwen regex,
  Isolated, not inverted), ByteLevel(use_regex=False, add_prefix_space=False)]; a BPE
  model; no truncation or padding; no added token that contains a newline or strips
  whitespace (lstrip/rstrip). The counter must encode without added special tokens
  (`add_special_tokens=False`), as vermem_jax.tokenization does.

  Args:
    config: dict of the tokenizer's JSON (`json.loads(backend_tokenizer.to_str())`).

  Returns:
    bool; False for anything else (including malformed input), never raises.
  """
  try:
    norm = config.get('normalizer')
    if norm is not None and norm != {'type': 'NFC'}:
      return False
    pre = config['pre_tokenizer']
    if pre.get('type') != 'Sequence' or len(pre.get('pretokenizers', ())) != 2:
      return False
    split, byte_level = pre['pretokenizers']
    if (split.get('type') != 'Split' or
        split.get('pattern') != {'Regex': QWEN_SPLIT_REGEX} or
        split.get('behavior') != 'Isolated' or split.get('invert')):
      return False
    if (byte_level.get('type') != 'ByteLevel' or byte_level.get('use_regex') or
        byte_level.get('add_prefix_space')):
      return False
    if config['model'].get('type') != 'BPE':
      return False
    if config.get('truncation') is not None or config.get('padding') is not None:
      return False
    for tok in config.get('added_tokens', ()):
      if tok.get('lstrip') or tok.get('rstrip') or '\n' in tok['content']:
        return False
    return True
  except (AttributeError, KeyError, TypeError, ValueError):
    return False


class MemoCounter:
  """`count_tokens` with a bounded memo (least recently used texts are dropped).

  Attributes:
    count_tokens: the wrapped `str -> int` counter.
    additive_over_lines, splits_after_newline: the wrapped counter's declarations
      unless overridden by the constructor arguments (True/False; None inherits).
  """

  def __init__(self, count_tokens, *, max_entries=MEMO_MAX_ENTRIES,
               max_chars=MEMO_MAX_CHARS, additive_over_lines=None,
               splits_after_newline=None):
    if not callable(count_tokens):
      raise TypeError(f'count_tokens must be callable, got {type(count_tokens).__name__}')
    if max_entries <= 0 or max_chars < 0:
      raise ValueError('MemoCounter needs max_entries > 0 and max_chars >= 0, got '
                       f'{max_entries}, {max_chars}')
    self.count_tokens = count_tokens
    self.max_entries = int(max_entries)
    self.max_chars = int(max_chars)
    for name, value in (('additive_over_lines', additive_over_lines),
                        ('splits_after_newline', splits_after_newline)):
      if value is None:
        value = _declares(count_tokens, name)
      setattr(self, name, bool(value))
    self._memo = collections.OrderedDict()

  def __call__(self, text):
    memo = self._memo
    n = memo.get(text)
    if n is not None:
      memo.move_to_end(text)
      return n
    n = self.count_tokens(text)
    if len(text) <= self.max_chars:
      memo[text] = n
      if len(memo) > self.max_entries:
        memo.popitem(last=False)
    return n

  def __len__(self):
    return len(self._memo)


def memoize(count_tokens, **kwargs):
  """A `MemoCounter` around `count_tokens` (returned as is if it already is one)."""
  if isinstance(count_tokens, MemoCounter) and not kwargs:
    return count_tokens
  return MemoCounter(count_tokens, **kwargs)


def declare(count_tokens, *, additive_over_lines=False, splits_after_newline=False):
  """A callable that counts like `count_tokens` and carries the given declarations.

  Only declare what the counter really guarantees (module docstring): g(s) relies on it
  to stay within its limit without recounting.
  """

  def counter(text):
    return count_tokens(text)

  counter.additive_over_lines = bool(additive_over_lines)
  counter.splits_after_newline = bool(splits_after_newline)
  counter.__wrapped__ = count_tokens
  return counter
