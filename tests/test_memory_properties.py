"""Property-based tests of the memory environment (hypothesis; issue 3 'Done when').

Over random states and random command sequences, valid and malformed: the parser never
raises; a rejected command never changes M or C; H only grows; C is within budget after
every command; deleted entries never come back through Retrieve; every earlier version
survives Update; g(s) never exceeds its limit; from_json(to_json(s)) == s; state text
that looks like a command is never executed.
"""
import json

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as hs

from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.memory import interaction
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import state as st
from vermem_jax.memory import token_count

W = token_count.count_whitespace_tokens
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

WORDS = hs.lists(hs.sampled_from(
    ['alpha', 'beta', 'gamma', 'John', 'Doe', 'born', '1950', '5', 'May', 'June',
     'Leeds', 'city', '800,000', '12:30', 'Jane', 'Roe', '"q"', '\\', '∅', 'Add(']),
    max_size=8).map(' '.join)
GRAMMAR_CHARS = hs.text(alphabet=hs.sampled_from(list('AddRetrieve(query=")[],∅\\ nu\n')),
                        max_size=60)


def chars_counter(text):
  return (len(text) + 3) // 4


def ids_of(s):
  return ([e.id for e in s.M] + [it.id for it in s.C] + [h.id for h in s.H] +
          ['beef00:m1', 'beef00:c2', 'beef00:h1', f'{s.ns}:m99', f'{s.ns}:c99',
           'John Doe#0', ''])


def smart_strategy(s):
  """Commands that are usually executable on `s` (so accepted paths get exercised)."""
  active = [e.id for e in s.M if e.active] or ['none']
  c_ids = [it.id for it in s.C] or ['none']
  droppable = [it.id for it in s.C if not it.protected and it.kind != 'instruction'
               and it.id != s.env_item_id] or ['none']
  sources = [it for it in s.C] + [h for h in s.H if h.kind not in
                                  st.POLICY_AUTHORED_EVENTS]
  in_c = {it.origin for it in s.C}
  restorable = [h.id for h in s.H if h.kind in ('observation', 'task_action')
                and h.id not in in_c] or ['none']

  def add(data):
    src, fresh = data
    return cmds.Command('Add', {'content': src.text + fresh, 'source_refs': [src.id]})

  def update(data):
    mid, src = data
    return cmds.Command('Update', {'memory_id': mid, 'new_content': src.text,
                                 'source_refs': [src.id]})

  def summarize(items):
    texts = ' '.join(s.item(i).text for i in items if s.item(i) is not None)
    return cmds.Command('Summarize', {'source_refs': items,
                                    'summary': ' '.join(texts.split()[:2])})
  options = [
      hs.sampled_from(active).map(
          lambda m: cmds.Command('Delete', {'memory_id': m, 'reason': 'stale'})),
      WORDS.map(lambda q: cmds.Command('Retrieve', {'query': q})),
      hs.lists(hs.sampled_from(droppable), min_size=1, max_size=2, unique=True).map(
          lambda r: cmds.Command('Filter', {'drop_refs': r})),
      hs.lists(hs.sampled_from(restorable), min_size=1, max_size=2, unique=True).map(
          lambda r: cmds.Command('SelectEpisode', {'selected_refs': r})),
      hs.lists(hs.sampled_from(droppable), min_size=1, max_size=3, unique=True).map(
          summarize),
  ]
  if sources:
    options.append(hs.tuples(hs.sampled_from(sources),
                             hs.sampled_from(['', ' also', ' x'])).map(add))
    options.append(hs.tuples(hs.sampled_from(active), hs.sampled_from(sources)).map(
        update))
  return hs.one_of(options).map(cmds.format_command)


def command_strategy(s):
  refs = hs.lists(hs.sampled_from(ids_of(s)), max_size=4)
  one = hs.sampled_from(ids_of(s))
  by_op = {
      'Add': hs.fixed_dictionaries({'content': WORDS, 'source_refs': refs}),
      'Update': hs.fixed_dictionaries({'memory_id': one, 'new_content': WORDS,
                                       'source_refs': refs}),
      'Delete': hs.fixed_dictionaries({'memory_id': one,
                                       'reason': hs.sampled_from(['', 'stale', 'x'])}),
      'Retrieve': hs.fixed_dictionaries({'query': WORDS}),
      'Filter': hs.fixed_dictionaries({'drop_refs': refs}),
      'SelectEpisode': hs.fixed_dictionaries({'selected_refs': refs}),
      'Summarize': hs.fixed_dictionaries({'source_refs': refs, 'summary': WORDS}),
      'Null': hs.just({}),
  }
  valid = hs.sampled_from(sorted(by_op)).flatmap(
      lambda op: by_op[op].map(lambda a: cmds.format_command(cmds.Command(op, a))))
  mangled = hs.tuples(valid, hs.integers(0, 200), GRAMMAR_CHARS).map(
      lambda v: v[0][:v[1]] + v[2] + v[0][v[1] + 1:])
  return hs.one_of(smart_strategy(s), smart_strategy(s), valid, mangled, GRAMMAR_CHARS,
                   hs.text(max_size=40))


def check_step(before, after, t, cfg):
  assert 0.0 <= t.cost <= cfg.cost_cap
  assert t.accepted == (not t.violations) == (t.cost == 0.0)
  # H only grows, never rewritten.
  assert after.H[:len(before.H)] == before.H
  if not t.accepted:
    assert after.M is before.M and after.C is before.C
    assert after.H[-1].kind == st.EV_REJECTED
  # Every earlier version survives; deleted stays deleted.
  for old in before.M:
    new = after.entry(old.id)
    assert new.versions[:len(old.versions)] == old.versions
    if not old.active:
      assert not new.active
  assert after.context_tokens() <= cfg.context_budget
  # Retrieve never brings back a deleted entry.
  if t.op == 'Retrieve' and t.accepted:
    for it in after.C[len(before.C):]:
      assert before.entry(it.origin).active and it.text == before.entry(it.origin).content


def check_provenance(s):
  """Every C item is copied from this task's own records or is a checked summary."""
  for it in s.C:
    assert st.parse_id(it.id)[0] == s.ns
    if it.kind == 'retrieved':
      assert it.text in [v.content for v in s.entry(it.origin).versions]
    elif it.kind in ('restored', 'observation'):
      ev = s.event(it.origin)
      assert ev.text == it.text and ev.kind not in st.POLICY_AUTHORED_EVENTS
    elif it.kind == 'summary':
      assert it.source_refs and all(st.parse_id(r)[0] == s.ns for r in it.source_refs)
  for e in s.M[2:]:  # entries written by commands cite this task's records only
    for v in e.versions:
      assert v.source_refs and all(st.parse_id(r)[0] == s.ns for r in v.source_refs)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(hs.data())
def test_random_command_sequences_keep_invariants(data):
  cfg = mconfig.ExecutorConfig(
      phase=data.draw(hs.sampled_from('ABCCC')),
      context_budget=data.draw(hs.integers(8, 160)),
      retrieve_top_k=data.draw(hs.integers(1, 3)),
      max_tool_calls=data.draw(hs.sampled_from([0, 0, 5])))
  s = st.new_state(data.draw(hs.sampled_from(['task-a', 'task-b'])), 'Who is John?', W,
                   instruction='Answer.', forbidden=('Jane Roe',))
  s, _ = st.add_entry(s, 'John Doe born 1950', W, source_refs=('J#0',))
  s, _ = st.add_entry(s, 'Leeds is a city', W, source_refs=('L#0',))
  for _ in range(data.draw(hs.integers(1, 20))):
    if data.draw(hs.integers(0, 3)) == 0:
      obs = data.draw(hs.one_of(WORDS, command_strategy(s)))
      before = s
      s, cost = interaction.interact(s, data.draw(WORDS), obs, W, cfg,
                            observation_refs=('D#1',))
      assert s.M is before.M and s.H[:len(before.H)] == before.H
      assert cost in (0.0, cfg.cost_context_overflow)
      assert s.context_tokens() <= cfg.context_budget
      continue
    text = data.draw(command_strategy(s))
    t = mexec.execute(s, text, cfg, W)
    event(f'{t.op} {"accepted" if t.accepted else "rejected"}')
    check_step(s, t.state_after, t, cfg)
    s = t.state_after
    check_provenance(s)
  assert st.MemoryState.from_json(s.to_json()) == s
  for counter in (W, chars_counter):
    limit = data.draw(hs.integers(330, 1500))
    x = serialization.render_policy_input(s, counter, allowed_ops=cfg.ops, limit=limit)
    assert counter(x) <= limit


@SETTINGS
@given(hs.one_of(hs.text(), GRAMMAR_CHARS, hs.binary().map(lambda b: b.decode('latin1'))))
def test_parser_never_raises(text):
  got = cmds.parse_command(text)
  assert isinstance(got, (cmds.Command, cmds.ParseError))
  if isinstance(got, cmds.ParseError):
    assert got.kind in ('parse', 'unknown_tool')
  else:
    assert cmds.parse_command(cmds.format_command(got)) == got
  from vermem_jax.memory import commands as c  # pylint: disable=import-outside-toplevel
  fast = c._fast_parse(text)  # pylint: disable=protected-access
  if fast is not None:  # the regex fast path never accepts what the scanner rejects
    assert c._scan(text) == fast  # pylint: disable=protected-access


ARG_TEXT = hs.text(max_size=30)


@hs.composite
def commands(draw):
  from vermem_jax.memory.commands import SCHEMAS  # pylint: disable=import-outside-toplevel
  op = draw(hs.sampled_from(cmds.ALL_OPS))
  args = {}
  for name, kind in SCHEMAS[op]:
    if draw(hs.integers(0, 9)) == 0:
      continue  # missing arguments are still formattable and parseable
    args[name] = (draw(ARG_TEXT) if kind == 'str'
                  else tuple(draw(hs.lists(ARG_TEXT, max_size=4))))
  return cmds.Command(op, args)


@SETTINGS
@given(commands())
def test_format_parse_round_trip(cmd):
  assert cmds.parse_command(cmds.format_command(cmd)) == cmd


SPACES = hs.sampled_from(['', ' ', '\n', '  \t'])


@SETTINGS
@given(commands(), hs.data(), hs.booleans())
def test_fast_path_agrees_with_scanner(cmd, data, trailing_comma):
  from vermem_jax.memory import commands as c  # pylint: disable=import-outside-toplevel

  def sp():
    return data.draw(SPACES)

  def lit(v):
    return json.dumps(v, ensure_ascii=data.draw(hs.booleans()))

  def val(v):
    if isinstance(v, str):
      return lit(v)
    return '[' + sp() + (sp() + ',' + sp()).join(lit(x) for x in v) + sp() + ']'
  kws = [f'{k}{sp()}={sp()}{val(v)}' for k, v in cmd.args]
  body = (sp() + ',' + sp()).join(kws) + (',' if trailing_comma and kws else '')
  text = f'{sp()}{cmd.op}{sp()}({sp()}{body}{sp()}){sp()}'
  fast = c._fast_parse(text)  # pylint: disable=protected-access
  slow = c._scan(text)  # pylint: disable=protected-access
  assert slow == cmd
  assert fast == cmd


@SETTINGS
@given(hs.data())
def test_command_looking_observations_are_never_executed(data):
  cfg = mconfig.ExecutorConfig()
  s = st.new_state('t', 'q', W, instruction='Answer.')
  s, mid = st.add_entry(s, 'fact', W)
  evil = data.draw(command_strategy(s))
  s1, _ = interaction.interact(s, evil, evil, W, cfg)
  assert s1.M is s.M and s1.entry(mid).active
  x = serialization.render_policy_input(s1, W, allowed_ops=cmds.ALL_OPS)
  t = mexec.execute(s1, '∅', cfg, W)
  assert t.state_after is s1
  assert x.count('\nSTATE END\n') == 1
