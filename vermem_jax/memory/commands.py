"""Surface grammar of memory commands u_t = (v_t, xi_t) (paper Eq. 2, 6; SPEC §2).

One command per generation, one of:

    Add(content="...", source_refs=["<id>", ...])
    Update(memory_id="<id>", new_content="...", source_refs=["<id>", ...])
    Delete(memory_id="<id>", reason="...")
    Retrieve(query="...")
    Filter(drop_refs=["<id>", ...])
    SelectEpisode(selected_refs=["<id>", ...])
    Summarize(source_refs=["<id>", ...], summary="...")
    ∅                      (the null command; `Null()` is accepted too)

Grammar (whitespace allowed between tokens and around the command):

    command := "∅" | NAME "(" [kwarg ("," kwarg)* [","]] ")"
    kwarg   := NAME "=" value
    value   := STRING | "[" [STRING ("," STRING)* [","]] "]"
    STRING  := JSON string literal: double quotes, escapes \\" \\\\ \\/ \\b \\f \\n \\r \\t
               \\uXXXX (raw control characters inside a literal are tolerated)

Keyword arguments may come in any order; a `Command` always holds them in the tool's
schema order (unknown names after, sorted), so `format_command` is canonical and
`parse_command(format_command(c)) == c` for every `Command` whose argument names are
identifiers and whose values are strings (or tuples of strings) of Unicode text (no
unpaired surrogates).

`parse_command` never raises: it returns a `Command` or a `ParseError` whose `kind` is
`'parse'` (syntax: unterminated or badly escaped strings, a string holding an unpaired
UTF-16 surrogate such as `"\\ud800"` (not Unicode text: no tokenizer or UTF-8 file
accepts it), positional arguments, duplicate keywords, nested lists, trailing text,
text longer than `max_chars`, ...) or
`'unknown_tool'` (a well-formed call whose name is not one of the eight op names; names
are case-sensitive). Schema problems of a well-formed call (missing, unknown or
ill-typed arguments) are not syntax errors: the executor rejects them as
`'bad_argument'`.

Input bound: text longer than `max_chars` characters (default `DEFAULT_MAX_CHARS`,
`ExecutorConfig.max_command_chars` in the executor) is rejected in O(1) before any
scanning; below it the scanner is linear in the text length.
"""

import dataclasses
import json
import re
from typing import Union

from vermem_jax.memory import checks

# Op names are shared by records, advantages and metrics across the project.
ADD = 'Add'
UPDATE = 'Update'
DELETE = 'Delete'
RETRIEVE = 'Retrieve'
FILTER = 'Filter'
SELECT_EPISODE = 'SelectEpisode'
SUMMARIZE = 'Summarize'
NULL = 'Null'

LTM_OPS = (ADD, UPDATE, DELETE)
STM_OPS = (RETRIEVE, FILTER, SELECT_EPISODE, SUMMARIZE)
ALL_OPS = LTM_OPS + STM_OPS + (NULL,)
# Operation subspaces of the curriculum phases (SPEC §4).
PHASE_OPS = {'A': LTM_OPS + (NULL,), 'B': STM_OPS + (NULL,), 'C': ALL_OPS}
# The subspace each phase of the curriculum trains in (SPEC §4): SFT covers all eight
# targets, Phase A the long-term tools, Phase B the short-term ones, Phase C all.
PHASE_OP_SPACE = {'sft': 'C', 'phase_a': 'A', 'phase_b': 'B', 'phase_c': 'C'}

# Op recorded for text that does not parse into a known tool (documented addition to
# the op names above; never a valid command).
INVALID_OP = 'Invalid'

NULL_SYMBOL = '\u2205'  # ∅

# Argument schema per op: name -> 'str' | 'list' (list of strings). Order = canonical.
SCHEMAS = {
    ADD: (('content', 'str'), ('source_refs', 'list')),
    UPDATE: (('memory_id', 'str'), ('new_content', 'str'), ('source_refs', 'list')),
    DELETE: (('memory_id', 'str'), ('reason', 'str')),
    RETRIEVE: (('query', 'str'),),
    FILTER: (('drop_refs', 'list'),),
    SELECT_EPISODE: (('selected_refs', 'list'),),
    SUMMARIZE: (('source_refs', 'list'), ('summary', 'str')),
    NULL: (),
}

# Default bound on command text (characters); a generation longer than this is not a
# plausible command. The executor passes ExecutorConfig.max_command_chars.
DEFAULT_MAX_CHARS = 16384

ArgValue = Union[str, tuple]


def shorten(name, limit=40):
  """A name for an error message, shortened so messages stay small."""
  name = name if isinstance(name, str) else repr(name)
  return repr(name if len(name) <= limit else name[:limit] + '...')


_ORDER = {op: {name: i for i, (name, _) in enumerate(schema)}
          for op, schema in SCHEMAS.items()}


def _canonical_args(op, args):
  if len(args) < 2:
    return args
  order = _ORDER.get(op, {})
  n = len(order)
  return tuple(sorted(args, key=lambda kv: (order.get(kv[0], n), kv[0])))


@dataclasses.dataclass(frozen=True)
class Command:
  """A parsed memory command u_t = (v_t, xi_t).

  Attributes:
    op: one of `ALL_OPS` (a hand-built Command may carry another name; the executor
      rejects it as 'unknown_tool').
    args: tuple of (name, value) pairs in canonical order; a value is a `str` or a
      tuple of `str`. Pass a dict or pairs in any order; they are canonicalized.
  """
  op: str
  args: tuple = ()

  def __post_init__(self):
    items = self.args.items() if isinstance(self.args, dict) else self.args
    pairs = tuple(
        (k, tuple(v) if isinstance(v, list) else v) for k, v in items)
    object.__setattr__(self, 'args', _canonical_args(self.op, pairs))

  @classmethod
  def _trusted(cls, op, args):
    """Builds from canonical (name, str | tuple) pairs without re-checking them."""
    cmd = object.__new__(cls)
    object.__setattr__(cmd, 'op', op)
    object.__setattr__(cmd, 'args', _canonical_args(op, args))
    return cmd

  def get(self, name, default=None):
    """Value of argument `name`, or `default` when absent."""
    for k, v in self.args:
      if k == name:
        return v
    return default

  @property
  def arg_dict(self):
    return dict(self.args)


@dataclasses.dataclass(frozen=True)
class ParseError:
  """Why a text is not a command.

  Attributes:
    kind: 'parse' (syntax) or 'unknown_tool'.
    message: human-readable reason.
    op: the tool name when one could be read before the error, else None.
  """
  kind: str
  message: str
  op: Union[str, None] = None


_WS = re.compile(r'\s*')
_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
# Possessive quantifiers keep the scan linear even on an unterminated literal.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_HEAD = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)')

# Whole-command regex for the common, well-formed case (possessive quantifiers keep it
# linear). Text it does not match goes to the scanner below, which names the error.
_STR_RE = r'"(?:[^"\\]++|\\.)*+"'
_LIST_RE = rf'\[\s*+(?:{_STR_RE}(?:\s*+,\s*+{_STR_RE})*+\s*+,?)?\s*+\]'
_KW_RE = rf'[A-Za-z_][A-Za-z0-9_]*+\s*+=\s*+(?:{_STR_RE}|{_LIST_RE})'
_FULL = re.compile(
    rf'\s*+([A-Za-z_][A-Za-z0-9_]*+)\s*+\(\s*+((?:{_KW_RE}(?:\s*+,\s*+{_KW_RE})*+'
    rf'\s*+,?)?)\s*+\)\s*+\Z', re.DOTALL)
_KW_CAP = re.compile(rf'\s*+,?\s*+([A-Za-z_][A-Za-z0-9_]*+)\s*+=\s*+({_STR_RE}|{_LIST_RE})',
                     re.DOTALL)
_STR_ALL = re.compile(_STR_RE, re.DOTALL)


def _decode(literal):
  if '\\' not in literal:
    return literal[1:-1]
  return _DECODER.decode(literal)


def _fast_parse(text):
  """Command for well-formed text, or None (then the scanner decides)."""
  m = _FULL.match(text)
  if m is None:
    return None
  name, body = m.group(1), m.group(2)
  if name not in SCHEMAS:
    return None
  args = []
  seen = set()
  pos = 0
  while pos < len(body):
    km = _KW_CAP.match(body, pos)
    if km is None:
      break
    key, raw = km.group(1), km.group(2)
    if key in seen:
      return None
    seen.add(key)
    try:
      if raw[0] == '"':
        value = _decode(raw)
      else:
        value = tuple(_decode(x) for x in _STR_ALL.findall(raw))
    except ValueError:
      return None  # bad escape: the scanner reports it
    args.append((key, value))
    pos = km.end()
  return Command._trusted(name, tuple(args))  # pylint: disable=protected-access


class _Fail(Exception):
  pass


_DECODER = json.JSONDecoder(strict=False)


def _parse_string(text, pos):
  m = _STRING.match(text, pos)
  if m is None:
    raise _Fail(f'expected a double-quoted string at offset {pos}')
  literal = m.group(0)
  if '\\' not in literal:  # no escapes: the literal's inside is the value
    return literal[1:-1], m.end()
  try:
    value = _DECODER.decode(literal)
  except (ValueError, RecursionError) as e:
    raise _Fail(f'bad escape in string at offset {pos}: {e}') from None
  return value, m.end()


def _skip(text, pos):
  return _WS.match(text, pos).end()


def _parse_value(text, pos):
  if pos < len(text) and text[pos] == '[':
    pos = _skip(text, pos + 1)
    items = []
    if pos < len(text) and text[pos] == ']':
      return tuple(items), pos + 1
    while True:
      value, pos = _parse_string(text, pos)
      items.append(value)
      pos = _skip(text, pos)
      if pos < len(text) and text[pos] == ',':
        pos = _skip(text, pos + 1)
        if pos < len(text) and text[pos] == ']':
          return tuple(items), pos + 1
        continue
      if pos < len(text) and text[pos] == ']':
        return tuple(items), pos + 1
      raise _Fail(f"expected ',' or ']' in list at offset {pos}")
  return _parse_string(text, pos)


def _parse_call(text, name, pos):
  """Parses `(kwargs...)` starting at the '(' at `pos`; returns (args, end)."""
  pos = _skip(text, pos + 1)
  args = []
  seen = set()
  if pos < len(text) and text[pos] == ')':
    return args, pos + 1
  while True:
    m = _NAME.match(text, pos)
    if m is None:
      raise _Fail(f'expected a keyword argument name at offset {pos} in '
                  f'{shorten(name)}(...)')
    key = m.group(0)
    pos = _skip(text, m.end())
    if pos >= len(text) or text[pos] != '=':
      raise _Fail(f"expected '=' after argument {shorten(key)} (arguments are "
                  'keywords)')
    if key in seen:
      raise _Fail(f'duplicate argument {shorten(key)}')
    seen.add(key)
    pos = _skip(text, pos + 1)
    value, pos = _parse_value(text, pos)
    args.append((key, value))
    pos = _skip(text, pos)
    if pos < len(text) and text[pos] == ',':
      pos = _skip(text, pos + 1)
      if pos < len(text) and text[pos] == ')':
        return args, pos + 1
      continue
    if pos < len(text) and text[pos] == ')':
      return args, pos + 1
    raise _Fail(f"expected ',' or ')' at offset {pos} in {shorten(name)}(...)")


def parse_command(text, max_chars=DEFAULT_MAX_CHARS):
  """Parses one command; never raises.

  Args:
    text: the generated command text (any object; non-strings are a ParseError).
    max_chars: longer texts are rejected without scanning.

  Returns:
    `Command`, or `ParseError(kind='parse'|'unknown_tool', message, op)`.
  """
  try:
    return _parse(text, max_chars)
  except Exception as e:  # pylint: disable=broad-except  # never raise on policy text
    return ParseError('parse', f'unparseable command ({type(e).__name__})')


def _parse(text, max_chars):
  if not isinstance(text, str):
    return ParseError('parse', f'command must be a string, got {type(text).__name__}')
  if len(text) > max_chars:
    return ParseError('parse', f'command text has {len(text)} characters; the limit '
                      f'is {max_chars}')
  cmd = _fast_parse(text)
  if cmd is None:
    cmd = _scan(text)
  if (isinstance(cmd, Command) and ('\\u' in text or not text.isascii())
      and _has_surrogate_value(cmd)):
    return ParseError('parse', 'a string holds an unpaired UTF-16 surrogate (not '
                      'Unicode text)', cmd.op)
  return cmd


def _has_surrogate_value(cmd):
  for _, v in cmd.args:
    for x in (v,) if isinstance(v, str) else v:
      if checks.has_surrogates(x):
        return True
  return False


def _scan(text):
  """The reference scanner: Command or ParseError naming the error."""
  stripped = text.strip()
  if stripped == NULL_SYMBOL:
    return Command(NULL)
  if not stripped:
    return ParseError('parse', 'empty command')
  m = _HEAD.match(text)
  if m is None:
    return ParseError('parse', 'a command starts with a tool name or ∅')
  name = m.group(1)
  op_hint = name if name in SCHEMAS else None
  pos = _skip(text, m.end())
  if pos >= len(text) or text[pos] != '(':
    return ParseError('parse', f"expected '(' after {shorten(name)}", op_hint)
  try:
    args, end = _parse_call(text, name, pos)
  except _Fail as e:
    return ParseError('parse', str(e), op_hint)
  end = _skip(text, end)
  if end != len(text):
    return ParseError('parse', f'trailing text after the command at offset {end}',
                      op_hint)
  if name not in SCHEMAS:
    return ParseError('unknown_tool', f'unknown tool {shorten(name)}; tools are '
                      f'{", ".join(ALL_OPS)}')
  return Command(name, tuple(args))


# json.dumps(ensure_ascii=False) of a str, without a JSONEncoder per call.
_json_str = json.encoder.encode_basestring


def _format_value(value):
  if isinstance(value, str):
    return _json_str(value)
  return '[' + ', '.join(_json_str(v) for v in value) + ']'


def format_command(command):
  """Canonical text of `command`: `∅` for the null command, else `Op(k="v", ...)`.

  Strings are JSON-escaped (non-ASCII kept), lists are `["a", "b"]`, arguments in
  schema order separated by ', '.
  """
  if command.op == NULL and not command.args:
    return NULL_SYMBOL
  inner = ', '.join(f'{k}={_format_value(v)}' for k, v in command.args)
  return f'{command.op}({inner})'




def _well_typed(kind, value):
  if kind == 'str':
    return isinstance(value, str) and not checks.has_surrogates(value)
  return isinstance(value, tuple) and all(
      isinstance(v, str) and not checks.has_surrogates(v) for v in value)


def schema_problems(command):
  """Lists schema problems of a parsed command (missing/unknown/ill-typed arguments).

  Returns:
    list of messages; empty when the arguments match `SCHEMAS[command.op]`.
  """
  schema = SCHEMAS.get(command.op)
  if schema is None:
    return [f'unknown tool {shorten(command.op)}']
  args = command.args
  # Common case: exactly the schema's arguments (args are in canonical order).
  if (len(args) == len(schema) and
      all(a[0] == name and _well_typed(kind, a[1])
          for a, (name, kind) in zip(args, schema))):
    return []
  problems = []
  kinds = dict(schema)
  given = command.arg_dict
  for name, kind in schema:
    if name not in given:
      problems.append(f'missing argument {name!r}')
    elif not _well_typed(kind, given[name]):
      problems.append(f'argument {name!r} must be '
                      + ('a string' if kind == 'str' else 'a list of strings')
                      + _surrogate_note(given[name]))
  for name in given:
    if name not in kinds:
      problems.append(f'unknown argument {shorten(name)} for {command.op}')
  return problems


def _surrogate_note(value):
  values = (value,) if isinstance(value, str) else value
  if isinstance(values, tuple) and any(
      isinstance(v, str) and checks.has_surrogates(v) for v in values):
    return ' of Unicode text (it holds an unpaired surrogate)'
  return ''
