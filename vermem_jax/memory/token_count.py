"""Token counters for the memory package (which never imports a tokenizer).

The memory code takes any `count_tokens(str) -> int`. A counter may declare the
attribute `additive_over_lines = True`, promising `count(a + "\\n" + b) == count(a) +
count(b)` for all strings a, b; g(s) then trusts its exact piecewise sum and skips the
final whole-string recount (every other counter gets that recount, see serialization).
"""


def count_whitespace_tokens(text):
  """Number of whitespace-separated words of `text` (a tokenizer-free stand-in).

  Additive over newline-joined lines, so it carries `additive_over_lines = True`.
  """
  return len(text.split())


count_whitespace_tokens.additive_over_lines = True


def is_additive(count_tokens):
  return bool(getattr(count_tokens, 'additive_over_lines', False))
