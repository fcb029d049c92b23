"""Caches of the BM25 ranking (vermem_jax/memory/bm25_index.py) never change results."""
from vermem_jax.memory import bm25_index
from vermem_jax.memory import state as mstate
from vermem_jax.memory import token_count

W = token_count.count_whitespace_tokens

DOCS = ['John Doe was born in Leeds in 1950', 'Leeds is a city in England',
        'Jane Roe lives in York', 'The city of York is old', 'Doe and Roe met in 1970',
        'alpha beta gamma']
QUERIES = ['Leeds city', 'York', 'Doe Roe 1970', 'nothing matches', 'the of in',
           'city city Leeds', 'Leeds city']


def _entries():
  s = mstate.new_state('bm25', 'q', W)
  for d in DOCS:
    s, _ = mstate.add_entry(s, d, W)
  return s.M


def _fresh(entries, query, top_k):
  bm25_index._cache.clear()  # pylint: disable=protected-access
  return bm25_index.rank(entries, query, top_k)


def test_memoized_rankings_equal_fresh_index_rankings():
  entries = _entries()
  expected = {(q, k): _fresh(entries, q, k) for q in QUERIES for k in (1, 2, 5)}
  bm25_index._cache.clear()  # pylint: disable=protected-access
  for _ in range(2):  # second pass: index and rankings come from the caches
    for (q, k), want in expected.items():
      got = bm25_index.rank(entries, q, k)
      assert [(e.id, sc) for e, sc in got] == [(e.id, sc) for e, sc in want], (q, k)
  assert expected[('Leeds city', 1)][0][0].content == DOCS[1]  # has both terms
  assert expected[('nothing matches', 5)] == [] and expected[('the of in', 5)] == []


def test_new_entry_tuple_gets_its_own_index():
  entries = _entries()
  before = [e.id for e, _ in bm25_index.rank(entries, 'York', 5)]
  fewer = entries[:3]  # another set of active entries: different IDF and candidates
  after = [e.id for e, _ in bm25_index.rank(fewer, 'York', 5)]
  assert sorted(before) == [entries[2].id, entries[3].id] and after == [entries[2].id]
  assert [e.id for e, _ in _fresh(fewer, 'York', 5)] == after
