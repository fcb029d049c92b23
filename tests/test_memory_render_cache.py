"""Caches of g(s) never change its output (vermem_jax/memory/serialization.py,
token_count.py).

The cached `render_policy_input` (per-record line costs, section LRU, summed costs of
declared counters, memoized whole-text counts) is compared with the uncached
`memory_reference.render_policy_input_reference` on hypothesis-generated states and on chains of states
that share records, for an additive counter, a non-additive black-box counter and a
non-additive counter that (truthfully) declares `splits_after_newline`. Also: the
declarations themselves, the demotion of a false declaration, and MemoCounter.
"""
import copy
import json
import re
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import memory_reference
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import interaction
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import render_cache
from vermem_jax.memory import serialization as ser
from vermem_jax.memory import state as st
from vermem_jax.memory import token_count as tc

W = tc.count_whitespace_tokens


def chars_counter(text):
  """ceil(chars / 4): non-additive (ceil of a sum), declares nothing."""
  return (len(text) + 3) // 4


# Pieces of a toy pre-tokenizer shaped like Qwen's: a punctuation run takes the newlines
# after it, other newlines (with the spaces before them) form their own piece.
_PIECES = re.compile(r'[^\w\s]+\n*|\w+|\s*\n+|\s+')


def _piece_count(text):
  return sum(1 + len(p) // 2 for p in _PIECES.findall(text))


def bpe_like_counter(text):
  """Non-additive ('x\\ny' is 3 pieces, 'x' and 'y' one each) but splits after every
  newline that a non-space follows (no piece crosses it), so it declares that."""
  return _piece_count(text)


bpe_like_counter.splits_after_newline = True


def bpe_like_undeclared(text):
  """The same counts as a black box (GENERIC path)."""
  return _piece_count(text)


# A demotion warning here means the cached sums were wrong: fail on it.
pytestmark = pytest.mark.filterwarnings('error::RuntimeWarning')

COUNTERS = [W, chars_counter, bpe_like_counter, bpe_like_undeclared]
IDS = ['additive', 'generic_chars', 'splits', 'generic_bpe_like']

TEXT = hs.one_of(
    hs.lists(hs.sampled_from(['alpha', 'Beta', '1950', '."', ')', '!!!', '\n', ' ',
                              '  ', '"', '\\', 'é', '∅', 'Add(x="y")', 'STATE END',
                              '[c1]', '\t', '...', 'word']),
             max_size=12).map(''.join),
    hs.text(max_size=40))


@hs.composite
def states(draw, count_tokens):
  """A random state (records built directly: any mix of kinds, flags and texts)."""
  s = st.new_state(draw(hs.sampled_from(['t1', 't2'])), draw(TEXT), count_tokens,
                   task_state=draw(TEXT))
  ns = s.ns
  m = []
  for i in range(draw(hs.integers(0, 8))):
    versions = tuple(
        st.LTMVersion(version=k, content=c, tokens=count_tokens(c))
        for k, c in enumerate(draw(hs.lists(TEXT, min_size=1, max_size=3))))
    status = draw(hs.sampled_from([st.ACTIVE, st.ACTIVE, st.DELETED]))
    m.append(st.LTMEntry(st.make_id(ns, 'm', i + 1), versions, status))
  c = []
  for i in range(draw(hs.integers(0, 8))):
    text = draw(TEXT)
    c.append(st.ContextItem(st.make_id(ns, 'c', i + 1),
                            draw(hs.sampled_from(st.CONTEXT_KINDS)), text,
                            protected=draw(hs.booleans()),
                            tokens=count_tokens(text)))
  h = []
  for i in range(draw(hs.integers(0, 10))):
    text = draw(TEXT)
    h.append(st.HistoryEvent(st.make_id(ns, 'h', i + 1), draw(hs.integers(0, 5)),
                             draw(hs.sampled_from(st.HISTORY_KINDS)), text,
                             tokens=count_tokens(text)))
  env = draw(hs.sampled_from([None] + [it.id for it in c]))
  return s.evolve(M=tuple(m), C=tuple(c), H=tuple(h), next_c=len(c) + 1,
                  env_item_id=env)


def both(s, counter, **kw):
  """Cached and reference renders; asserts they agree and respect the limit."""
  try:
    ref = memory_reference.render_policy_input_reference(s, counter, **kw)
  except ValueError as e:
    with pytest.raises(ValueError, match=re.escape(str(e))):
      ser.render_policy_input(s, counter, **kw)
    return None
  fast = ser.render_policy_input(s, counter, **kw)
  assert fast == ref
  assert counter(fast) <= kw['limit']
  assert ser.render_policy_input(s, counter, **kw) == fast  # cached second call
  # A true declaration is never demoted by the audits (the sums are exact).
  counter_state = render_cache.counter_for(counter)
  assert counter_state.model == render_cache.cost_model(counter)
  return fast


@pytest.mark.parametrize('counter', COUNTERS, ids=IDS)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.function_scoped_fixture])
@given(data=hs.data())
def test_cached_render_equals_reference_on_random_states(counter, data):
  s = data.draw(states(counter))
  ops = data.draw(hs.sampled_from(list(cmds.PHASE_OPS.values())))
  shares = data.draw(hs.sampled_from([ser.DEFAULT_SHARES, (0.1, 0.1, 0.8),
                                      (0.5, 0.5, 0.0)]))
  for limit in data.draw(hs.lists(hs.integers(60, 700), min_size=1, max_size=3)):
    both(s, counter, allowed_ops=ops, limit=limit, shares=shares, context_budget=99)
  # States sharing records with s (the cached sections and lines get reused).
  text = data.draw(TEXT)
  ev = st.HistoryEvent(st.make_id(s.ns, 'h', len(s.H) + 1), 9, st.EV_CONCLUSION, text,
                       tokens=counter(text))
  grown = s.evolve(H=s.H + (ev,))
  limit = data.draw(hs.integers(60, 700))
  both(grown, counter, allowed_ops=ops, limit=limit, shares=shares, context_budget=99)
  if s.M:
    e = s.M[0]
    deleted = st.LTMEntry(e.id, e.versions, st.DELETED, 'r', 1)
    both(grown.evolve(M=(deleted,) + s.M[1:]), counter, allowed_ops=ops,
         limit=limit, shares=shares, context_budget=99)
  if s.C:
    both(grown.evolve(C=s.C[1:]), counter, allowed_ops=ops, limit=limit,
         shares=shares, context_budget=99)


@pytest.mark.parametrize('counter', COUNTERS, ids=IDS)
def test_episode_chain_renders_equal_reference(counter):
  """A real command sequence: each s_{t+1} shares most records with s_t."""
  cfg = mconfig.ExecutorConfig(context_budget=400)
  s = st.new_state('chain', 'Who founded Leeds?', counter, instruction='Answer.')
  for i in range(6):
    s, _ = interaction.interact(s, f'read doc {i}', f'Doc {i}: Leeds, founded in 12{i}0.\n"q"',
                       counter, cfg, observation_refs=(f'D{i}#0',))
  s, _ = st.add_entry(s, 'Leeds is a city.', counter)
  ns = s.ns
  script = [f'Add(content="Leeds founded in 1200", source_refs=["{ns}:c2"])',
            'Retrieve(query="Leeds city")', f'Filter(drop_refs=["{ns}:c3"])',
            f'SelectEpisode(selected_refs=["{ns}:h4"])',
            f'Update(memory_id="{ns}:m1", new_content="Leeds is a big city", '
            f'source_refs=["{ns}:c4"])',
            f'Summarize(source_refs=["{ns}:c5"], summary="Doc 3: Leeds")',
            f'Delete(memory_id="{ns}:m2", reason="old")', '∅', 'Add(content="bad']
  accepted = []
  for text in script:
    t = mexec.execute(s, text, cfg, counter)
    accepted.append(t.accepted)
    s = t.state_after
    for limit in (150, 260, 8192):
      both(s, counter, allowed_ops=cfg.ops, limit=limit, shares=ser.DEFAULT_SHARES,
           context_budget=cfg.context_budget)
  assert accepted == [True] * 8 + [False]


@given(a=TEXT, b=TEXT.filter(lambda t: t[:1].strip() != ''))
@settings(max_examples=200, deadline=None)
def test_bpe_like_counter_keeps_its_declaration(a, b):
  assert bpe_like_counter(a + '\n' + b) == bpe_like_counter(a + '\n') + bpe_like_counter(b)


def test_declared_sum_is_exact_not_an_estimate():
  s = st.new_state('t', 'Who?', bpe_like_counter, task_state='ts')
  s, _ = interaction.interact(s, 'read', 'Leeds is a city', bpe_like_counter, mconfig.ExecutorConfig())
  x = ser.render_policy_input(s, bpe_like_counter, allowed_ops=cmds.ALL_OPS)
  lines = x.split('\n')
  naive = sum(bpe_like_counter(l) for l in lines)
  assert bpe_like_counter(x) > naive  # newlines after words cost a piece here
  assert render_cache.cost_model(bpe_like_counter) == render_cache.SPLITS
  # The limit is met exactly at the real count: one token less truncates.
  full = bpe_like_counter(x)
  assert ser.render_policy_input(s, bpe_like_counter, allowed_ops=cmds.ALL_OPS,
                                limit=full) == x
  y = ser.render_policy_input(s, bpe_like_counter, allowed_ops=cmds.ALL_OPS,
                             limit=full - 1)
  assert y != x and bpe_like_counter(y) <= full - 1


@pytest.mark.filterwarnings('default::RuntimeWarning')
def test_false_declaration_is_demoted_and_limit_still_holds():
  def liar(text):  # newlines cost 3 tokens: not additive at all
    return len(text.split()) + 3 * text.count('\n')
  liar.additive_over_lines = True

  s = st.new_state('t', 'Who?', liar, instruction='Answer.')
  for i in range(30):
    s, _ = st.add_entry(s, f'fact {i}', liar)
  with pytest.warns(RuntimeWarning, match='declares'):
    x = ser.render_policy_input(s, liar, allowed_ops=cmds.ALL_OPS, limit=300)
  assert liar(x) <= 300
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    for limit in (260, 280, 500):
      assert liar(ser.render_policy_input(s, liar, allowed_ops=cmds.ALL_OPS,
                                         limit=limit)) <= limit
  assert render_cache.counter_for(liar).model == render_cache.GENERIC


class _Tok:
  """A tokenizer-like object declaring for its bound method (tokenization style)."""
  splits_after_newline = True

  def count_tokens(self, text):
    return _piece_count(text)


def test_cost_model_reads_declarations_of_callable_or_bound_object():
  assert render_cache.cost_model(W) == render_cache.ADDITIVE
  assert render_cache.cost_model(chars_counter) == render_cache.GENERIC
  assert render_cache.cost_model(bpe_like_counter) == render_cache.SPLITS
  tok = _Tok()
  assert render_cache.cost_model(tok.count_tokens) == render_cache.SPLITS
  assert render_cache.cost_model(tc.declare(chars_counter, additive_over_lines=True)) == (
      render_cache.ADDITIVE)
  assert render_cache.cost_model(tc.memoize(bpe_like_counter)) == render_cache.SPLITS
  assert render_cache.cost_model(tc.memoize(tok.count_tokens)) == render_cache.SPLITS
  assert tc.splits_after_newline(W) and not tc.splits_after_newline(chars_counter)
  s = st.new_state('t', 'q', tok.count_tokens, instruction='i')
  kw = dict(allowed_ops=cmds.ALL_OPS, limit=1000, shares=ser.DEFAULT_SHARES,
            context_budget=2048)
  assert both(s, tok.count_tokens, **kw) is not None


def test_memo_counter_is_bounded_and_exact():
  calls = []

  def counter(text):
    calls.append(text)
    return len(text)

  memo = tc.MemoCounter(counter, max_entries=3, max_chars=10,
                        splits_after_newline=True)
  assert [memo(t) for t in ('a', 'bb', 'a', 'ccc', 'dddd', 'a')] == [1, 2, 1, 3, 4, 1]
  assert calls == ['a', 'bb', 'ccc', 'dddd']  # 'a' stayed (recently used)
  assert len(memo) == 3
  memo('e')  # evicts the least recently used ('ccc')
  memo('ccc')
  assert calls[-1] == 'ccc' and len(memo) == 3
  long = 'x' * 11
  memo(long)
  memo(long)
  assert calls.count(long) == 2  # longer than max_chars: never memoized
  assert memo.splits_after_newline and not memo.additive_over_lines
  assert tc.memoize(memo) is memo
  assert tc.memoize(W).additive_over_lines
  with pytest.raises(TypeError, match='callable'):
    tc.MemoCounter(3)
  with pytest.raises(ValueError, match='max_entries'):
    tc.MemoCounter(counter, max_entries=0)


@pytest.fixture(scope='module')
def qwen_hf(qwen25_tokenizer_dir):
  transformers = pytest.importorskip('transformers')
  return transformers.AutoTokenizer.from_pretrained(qwen25_tokenizer_dir)


def test_qwen_tokenizer_satisfies_splits_after_newline(qwen_hf):
  """Evidence for the proof in token_count.py on the real Qwen2.5 tokenizer, and the
  declared Qwen counter renders exactly what the reference renders."""
  tok = qwen_hf

  def qwen(text):
    return len(tok.encode(text, add_special_tokens=False))

  samples = ['', 'a', 'word.', '."', 'x  ', '  ', '\n', 'a\n\n', 'é', '1950)."',
             '!!!', '[id] "text"', "it's", '\t', 'Add(x="y")', '中文。', 'e\u0301']
  for a in samples:
    for b in ('[', 'word', "'s", '"q"', 'STATE END', '- Add(', '1', '中', '!x', 'é'):
      assert qwen(a + '\n' + b) == qwen(a + '\n') + qwen(b), (a, b)
  declared = tc.declare(qwen, splits_after_newline=True)
  s = st.new_state('t', 'Which city "hosted" it?', declared, instruction='Answer.')
  cfg = mconfig.ExecutorConfig()
  for i in range(12):
    s, _ = interaction.interact(s, f'read {i}', f'Doc {i}: Leeds (1950)... hosted "it".',
                       declared, cfg)
  for limit in (450, 600, 8192):
    x = both(s, declared, allowed_ops=cmds.ALL_OPS, limit=limit,
             shares=ser.DEFAULT_SHARES, context_budget=2048)
    assert x is not None and qwen(x) <= limit


def test_tokenizer_json_check_accepts_qwen_and_rejects_other_pipelines(qwen_hf):
  config = json.loads(qwen_hf.backend_tokenizer.to_str())
  assert tc.tokenizer_json_splits_after_newline(config)
  config['model'] = {'type': config['model']['type']}  # vocab and merges not needed

  def mutated(fn):
    c = copy.deepcopy(config)
    fn(c)
    return tc.tokenizer_json_splits_after_newline(c)

  def other_regex(c):
    c['pre_tokenizer']['pretokenizers'][0]['pattern'] = {'Regex': r'\s+|\S+'}

  def prefix_space(c):
    c['pre_tokenizer']['pretokenizers'][1]['add_prefix_space'] = True

  def nfkc(c):
    c['normalizer'] = {'type': 'NFKC'}

  def lstrip_token(c):
    c['added_tokens'][0]['lstrip'] = True

  def newline_token(c):
    c['added_tokens'][0]['content'] = '<x>\n'

  def truncation(c):
    c['truncation'] = {'max_length': 8}

  def unigram(c):
    c['model'] = {'type': 'Unigram'}

  for fn in (other_regex, prefix_space, nfkc, lstrip_token, newline_token,
             truncation, unigram):
    assert not mutated(fn), fn.__name__
  assert mutated(lambda c: c.update(normalizer=None))
  assert not tc.tokenizer_json_splits_after_newline({})
  assert not tc.tokenizer_json_splits_after_newline({'pre_tokenizer': 3})
