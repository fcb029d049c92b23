"""Tests for the command grammar (vermem_jax/memory/commands.py; SPEC §2)."""
import time

import pytest

from vermem_jax.memory import commands as cmds
from vermem_jax.memory.commands import Command, ParseError, format_command, parse_command

EXAMPLES = [
    ('Add(content="Paris is in France", source_refs=["abc123:c2", "abc123:h4"])',
     Command('Add', (('content', 'Paris is in France'),
                     ('source_refs', ('abc123:c2', 'abc123:h4'))))),
    ('Update(memory_id="abc123:m1", new_content="x", source_refs=["abc123:c3"])',
     Command('Update', (('memory_id', 'abc123:m1'), ('new_content', 'x'),
                        ('source_refs', ('abc123:c3',))))),
    ('Delete(memory_id="abc123:m1", reason="obsolete")',
     Command('Delete', (('memory_id', 'abc123:m1'), ('reason', 'obsolete')))),
    ('Retrieve(query="birth year")', Command('Retrieve', (('query', 'birth year'),))),
    ('Filter(drop_refs=["abc123:c4"])', Command('Filter', (('drop_refs', ('abc123:c4',)),))),
    ('SelectEpisode(selected_refs=["abc123:h1", "abc123:h2"])',
     Command('SelectEpisode', (('selected_refs', ('abc123:h1', 'abc123:h2')),))),
    ('Summarize(source_refs=["abc123:c2"], summary="short")',
     Command('Summarize', (('source_refs', ('abc123:c2',)), ('summary', 'short')))),
    ('∅', Command('Null')),
]


@pytest.mark.parametrize('text,expected', EXAMPLES)
def test_parses_each_tool_and_round_trips(text, expected):
  got = parse_command(text)
  assert got == expected
  assert format_command(got) == text  # the examples are written canonically
  assert parse_command(format_command(got)) == got


def test_null_spellings():
  assert parse_command('Null()') == Command('Null')
  assert parse_command('  ∅ \n') == Command('Null')
  assert parse_command('Null( )') == Command('Null')
  assert format_command(Command('Null')) == '∅'


def test_keyword_order_whitespace_and_trailing_comma_are_canonicalized():
  a = parse_command('Summarize( summary = "s" ,\n source_refs = [ "x:c1" , ] , )')
  assert a == Command('Summarize', {'source_refs': ['x:c1'], 'summary': 's'})
  assert format_command(a) == 'Summarize(source_refs=["x:c1"], summary="s")'
  assert parse_command('Filter(drop_refs=[])') == Command('Filter', (('drop_refs', ()),))


def test_escapes_decode_like_json():
  cmd = parse_command(r'Retrieve(query="a \"b\" \\ \n \u00e9 \/")')
  assert cmd.get('query') == 'a "b" \\ \n é /'
  assert parse_command(format_command(cmd)) == cmd
  # Raw control characters inside a literal are tolerated; canonical form escapes them.
  raw = parse_command('Retrieve(query="line1\nline2")')
  assert raw.get('query') == 'line1\nline2'
  assert format_command(raw) == 'Retrieve(query="line1\\nline2")'


@pytest.mark.parametrize('text', [
    'Add(content="unterminated',
    'Add(content="x", source_refs=["a"',
    'Add(content="bad \\x escape", source_refs=[])',
    'Add(content="\\ud83", source_refs=[])',
    'Retrieve(query="a") trailing',
    'Retrieve(query="a")Retrieve(query="b")',
    'Retrieve("positional")',
    'Retrieve(query="a", query="b")',
    'Filter(drop_refs=[["nested"]])',
    'Filter(drop_refs=[1, 2])',
    'Retrieve(query=42)',
    'Retrieve(query=unquoted)',
    "Retrieve(query='single')",
    'Retrieve query="a"',
    'Retrieve(',
    '',
    '   ',
    '∅ ∅',
    '∅()',
    '(content="x")',
    'Retrieve(query="a"',
    'Add(content="x",, source_refs=[])',
])
def test_syntax_errors_are_parse_errors(text):
  got = parse_command(text)
  assert isinstance(got, ParseError)
  assert got.kind == 'parse', got


def test_parse_error_keeps_tool_hint():
  got = parse_command('Add(content="x"')
  assert got.kind == 'parse' and got.op == 'Add'
  assert parse_command('Blah(content="x"').op is None


@pytest.mark.parametrize('text', ['Foo(a="b")', 'add(content="x", source_refs=[])',
                                  'DELETE(memory_id="x:m1", reason="r")', 'Null2()'])
def test_unknown_tool_is_distinguished(text):
  got = parse_command(text)
  assert isinstance(got, ParseError) and got.kind == 'unknown_tool'


def test_non_string_input_is_an_error_not_an_exception():
  for bad in (None, 3, b'Retrieve(query="a")', ['x']):
    got = parse_command(bad)
    assert isinstance(got, ParseError) and got.kind == 'parse'


def test_huge_inputs_are_rejected_quickly():
  big = 'Add(content="' + 'a' * 5_000_000
  t0 = time.perf_counter()
  got = parse_command(big)
  assert isinstance(got, ParseError) and 'limit' in got.message
  # Under a raised limit the scanner still never raises on megabytes.
  got = parse_command(big, max_chars=10_000_000)
  assert isinstance(got, ParseError) and got.kind == 'parse'
  ok = parse_command('Retrieve(query="' + 'b' * 1_000_000 + '")', max_chars=2_000_000)
  assert isinstance(ok, Command) and len(ok.get('query')) == 1_000_000
  deep = 'Filter(drop_refs=' + '[' * 100_000 + ']' * 100_000 + ')'
  assert isinstance(parse_command(deep, max_chars=10**6), ParseError)
  assert time.perf_counter() - t0 < 30  # sanity bound only; speed lives in benchmarks


def test_schema_problems():
  assert cmds.schema_problems(parse_command('Retrieve(query="a")')) == []
  probs = cmds.schema_problems(parse_command('Add(content=["x"], extra="y")'))
  assert "argument 'content' must be a string" in probs
  assert "missing argument 'source_refs'" in probs
  assert "unknown argument 'extra' for Add" in probs
  probs = cmds.schema_problems(parse_command('Filter(drop_refs="x:c1")'))
  assert probs == ["argument 'drop_refs' must be a list of strings"]
  assert cmds.schema_problems(parse_command('Null(x="1")')) == [
      "unknown argument 'x' for Null"]


def test_op_sets():
  assert cmds.LTM_OPS == ('Add', 'Update', 'Delete')
  assert cmds.STM_OPS == ('Retrieve', 'Filter', 'SelectEpisode', 'Summarize')
  assert cmds.ALL_OPS == cmds.LTM_OPS + cmds.STM_OPS + ('Null',)
  assert cmds.PHASE_OPS['A'] == ('Add', 'Update', 'Delete', 'Null')
  assert cmds.PHASE_OPS['B'] == ('Retrieve', 'Filter', 'SelectEpisode', 'Summarize',
                                 'Null')
  assert cmds.PHASE_OPS['C'] == cmds.ALL_OPS


def test_command_accepts_dict_and_lists():
  c = Command('Add', {'source_refs': ['a', 'b'], 'content': 'x'})
  assert c.args == (('content', 'x'), ('source_refs', ('a', 'b')))
  assert c.arg_dict == {'content': 'x', 'source_refs': ('a', 'b')}
  assert hash(c) == hash(Command('Add', (('content', 'x'), ('source_refs', ('a', 'b')))))
