"""BM25 ranking of active LTM entries for Retrieve (SPEC §2 decision: BM25, top-k).

Uses the `bm25s` library (Lucene BM25 variant, k1/b from ExecutorConfig). The index is
built over the *active* entries only (so IDF reflects what can be retrieved) and cached
by the identity of those (immutable) entries, so rollouts that share a memory state, or
successive Retrieves without an LTM change, reuse it; each cached index also memoizes
the ranking of the last `_QUERY_MEMO_SIZE` distinct query term sequences (K rollouts of
one state often issue the same Retrieve).

No module of `memory` imports JAX. bm25s does: `bm25s.selection` imports `jax.lax` (and
runs a `top_k` on it) when JAX is installed, for a top-k this module never calls (it
uses `BM25.index` / `get_scores`, NumPy either way). `_bm25s()` therefore imports bm25s
at the first use (a Retrieve, or `tokenize`) rather than with the package: a process
that never ranks or tokenizes loads no JAX, and one that does loads it through bm25s
(the trainers have it loaded already).

Tokenization (documents and query): casefolded `\\w+` runs minus bm25s's English stop
words. Ties are broken by entry order in M (older entry first), so results are
deterministic. Only entries with a positive score (at least one shared term) return;
when no active entry has any term there is nothing to rank (empty result).
"""

import collections
import functools
import logging
import re

_WORD = re.compile(r'\w+')
_CACHE_SIZE = 512
_QUERY_MEMO_SIZE = 64  # rankings kept per index (decision)
_cache = collections.OrderedDict()


@functools.lru_cache(maxsize=1)
def _bm25s():
  import bm25s  # pylint: disable=import-outside-toplevel  (imports jax.lax; docstring)
  # bm25s sets its logger to DEBUG on import and logs every index build; one Retrieve
  # is one build, so a rollout would flood the log.
  logging.getLogger('bm25s').setLevel(logging.WARNING)
  return bm25s


@functools.lru_cache(maxsize=1)
def _stopwords():
  return frozenset(_bm25s().stopwords.STOPWORDS_EN)


def tokenize(text):
  """BM25 terms of `text`: casefolded word runs without English stop words."""
  return list(_terms(text))


@functools.lru_cache(maxsize=65536)
def _terms(text):
  stop = _stopwords()
  return tuple(w for w in _WORD.findall(text.casefold()) if w not in stop)


def _index(entries, k1, b):
  """(retriever, query memo) for `entries`, cached by the identity of the entries."""
  # Entries are immutable: the same objects mean the same texts. The cache value keeps
  # the entries alive, so their ids cannot be reused while the key exists.
  key = (k1, b, tuple(map(id, entries)))
  hit = _cache.get(key)
  if hit is not None:
    _cache.move_to_end(key)
    return hit[1], hit[2]
  corpus = [tokenize(e.content) for e in entries]
  if any(corpus):
    retriever = _bm25s().BM25(k1=k1, b=b)
    retriever.index(corpus, show_progress=False)
  else:
    # No entry has a term (stop words, emoji, invisible text only): nothing can score,
    # and bm25s cannot index an empty vocabulary (it raises ValueError).
    retriever = None
  _cache[key] = (entries, retriever, {})
  if len(_cache) > _CACHE_SIZE:
    _cache.popitem(last=False)
  return retriever, _cache[key][2]


def rank(entries, query, top_k, k1=1.5, b=0.75):
  """Top-`top_k` entries for `query`.

  Args:
    entries: sequence of active `LTMEntry` in M order (deleted ones must be excluded by
      the caller; this function never sees them).
    query: query text.
    top_k: maximum number of results (>= 0).
    k1, b: BM25 parameters.

  Returns:
    list of (entry, score) with score > 0, best first, ties by M order.
  """
  if not entries or top_k <= 0:
    return []
  terms = _terms(query)
  if not terms:
    return []
  entries = tuple(entries)
  retriever, memo = _index(entries, k1, b)
  if retriever is None:
    return []
  # Rollouts that share a memory state often issue the same query: the ranking of an
  # index for given terms never changes, so it is memoized with the index.
  ranked = memo.get(terms)
  if ranked is None:
    scores = retriever.get_scores(list(terms))
    order = sorted((i for i in range(len(entries)) if scores[i] > 0),
                   key=lambda i: (-float(scores[i]), i))
    ranked = memo[terms] = tuple((i, float(scores[i])) for i in order)
    if len(memo) > _QUERY_MEMO_SIZE:
      memo.pop(next(iter(memo)))
  return [(entries[i], score) for i, score in ranked[:top_k]]
