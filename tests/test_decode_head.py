"""Tests for vermem_jax.models.decode_head (the one-pass next-token head) against NumPy
references: argmax and log_softmax, the temperature distribution, the top-p nucleus."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vermem_jax.models import decode_head
from vermem_jax.models import layers


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _np_nucleus(logprobs, top_p):
  """NumPy top-p set: most probable tokens until their mass reaches top_p."""
  order = np.argsort(-logprobs, kind='stable')
  p = np.exp(logprobs[order])
  before = np.cumsum(p) - p
  keep = np.zeros(logprobs.shape, bool)
  keep[order[before < top_p]] = True
  return keep


def _renormalized(ref, keep):
  """log-probabilities [V] of the nucleus distribution (-inf outside it)."""
  out = np.full(ref.shape, -np.inf)
  out[keep] = ref[keep] - np.log(np.exp(ref[keep]).sum())
  return out


def _total_variation(tokens, logprobs_ref):
  freq = np.bincount(tokens, minlength=logprobs_ref.shape[-1]) / len(tokens)
  return 0.5 * np.abs(freq - np.exp(logprobs_ref)).sum()


# (vocab, chunk): several chunks with a shorter last one, exact chunks, one chunk.
CHUNKINGS = [(64, 24), (96, 32), (64, 64), (50, 7)]


@pytest.mark.parametrize('vocab,chunk', CHUNKINGS)
def test_greedy_is_numpy_argmax_and_log_softmax(vocab, chunk):
  rs = np.random.RandomState(vocab + chunk)
  logits = (3.0 * rs.randn(16, vocab)).astype(np.float32)
  logits[0, [5, vocab - 2]] = logits[0].max() + 1.0  # a tie across chunks: lower id
  logits[1, :] = 0.25  # all equal: id 0, log(1 / V)
  tokens, lps = decode_head.sample_tokens(jnp.asarray(logits), None, None, None,
                                          do_sample=False, chunk=chunk)
  ref = _log_softmax(logits)
  expected = logits.argmax(-1)  # NumPy: first maximal index
  assert expected[0] == 5 and expected[1] == 0
  np.testing.assert_array_equal(np.asarray(tokens), expected)
  np.testing.assert_allclose(np.asarray(lps), ref[np.arange(16), expected],
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('transposed', [True, False])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_fused_head_equals_projection_then_top_k_and_logsumexp(transposed, dtype):
  # Token for token what the sampler computed before the fused head: the [B, V]
  # projection, top_k(logits, 1) and top - logsumexp(logits).
  rs = np.random.RandomState(3)
  vocab, dim = 300, 32
  hidden = jnp.asarray(rs.randn(24, dim), jnp.float32)
  weight = jnp.asarray(0.3 * rs.randn(*((vocab, dim) if transposed else (dim, vocab))),
                       jnp.float32)
  logits = layers.project_vocab(hidden, weight, transposed=transposed, dtype=dtype)
  top, idx = jax.lax.top_k(logits, 1)
  before_lp = top[:, 0] - jax.nn.logsumexp(logits, axis=-1)
  tokens, lps = decode_head.head_tokens(
      hidden, weight, transposed=transposed, dtype=dtype, rng=None, temperature=None,
      top_p=None, do_sample=False, chunk=64)
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(idx[:, 0]))
  np.testing.assert_allclose(np.asarray(lps), np.asarray(before_lp), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(lps), _log_softmax(np.asarray(logits))[
      np.arange(24), np.asarray(tokens)], rtol=1e-5, atol=1e-5)


def _sample_many(logits_row, rows, temperature, top_p, chunk, candidates, seed=0):
  sample = jax.jit(functools.partial(decode_head.sample_tokens, do_sample=True,
                                     chunk=chunk, candidates=candidates))
  tiled = jnp.tile(jnp.asarray(logits_row)[None], (rows, 1))
  tokens, lps = sample(tiled, jax.random.PRNGKey(seed), jnp.float32(temperature),
                       jnp.float32(top_p))
  return np.asarray(tokens), np.asarray(lps)


@pytest.mark.parametrize('vocab,chunk', CHUNKINGS)
def test_whole_distribution_sample_is_exact(vocab, chunk):
  # top_p = 1: the reservoir draw over chunks is softmax(logits / T), every token
  # reachable, and each log-probability is the full log_softmax of the sampled token.
  rs = np.random.RandomState(11)
  logits = (1.5 * rs.randn(vocab)).astype(np.float32)
  temperature = 0.8
  ref = _log_softmax(logits / temperature)
  tokens, lps = _sample_many(logits, 16384, temperature, 1.0, chunk, candidates=8)
  np.testing.assert_allclose(lps, ref[tokens], atol=1e-5)
  assert _total_variation(tokens, ref) < 0.03
  likely = np.exp(ref) > 5e-3
  assert set(np.flatnonzero(likely)) <= set(tokens.tolist())


@pytest.mark.parametrize('candidates', [4, 32, 256])
@pytest.mark.parametrize('vocab,chunk', [(64, 24), (64, 64)])
def test_nucleus_sample_matches_numpy(vocab, chunk, candidates):
  # 4 candidates < nucleus: the exact full-vocabulary path; 32: resolved by the
  # candidates with tokens left outside; 256 >= vocab: the candidates are everything.
  rs = np.random.RandomState(7)
  logits = (2.0 * rs.randn(vocab)).astype(np.float32)
  temperature, top_p = 1.3, 0.8
  ref = _log_softmax(logits / temperature)
  keep = _np_nucleus(ref, top_p)
  assert 4 < keep.sum() < 32
  renorm = _renormalized(ref, keep)
  tokens, lps = _sample_many(logits, 16384, temperature, top_p, chunk, candidates)
  assert keep[tokens].all()  # only nucleus tokens are ever emitted
  np.testing.assert_allclose(lps, renorm[tokens], atol=1e-5)
  assert _total_variation(tokens, renorm) < 0.03
  again, _ = _sample_many(logits, 16384, temperature, top_p, chunk, candidates)
  np.testing.assert_array_equal(again, tokens)  # a fixed key reproduces the batch


def test_rows_resolved_and_not_in_one_batch():
  # Row 0 peaked (nucleus of 2 tokens, inside 4 candidates), row 1 flat (nucleus past
  # them): each row gets its own nucleus distribution in the same step.
  rs = np.random.RandomState(5)
  vocab, temperature, top_p = 48, 1.0, 0.9
  peaked = np.full(vocab, -6.0, np.float32)
  peaked[[3, 30]] = [4.0, 3.5]
  flat = (0.3 * rs.randn(vocab)).astype(np.float32)
  rows = 8192
  logits = jnp.asarray(np.stack([peaked, flat] * (rows // 2)))
  sample = jax.jit(functools.partial(decode_head.sample_tokens, do_sample=True, chunk=16,
                                     candidates=4))
  tokens, lps = map(np.asarray, sample(logits, jax.random.PRNGKey(2),
                                       jnp.float32(temperature), jnp.float32(top_p)))
  for row, row_logits in enumerate([peaked, flat]):
    ref = _log_softmax(row_logits / temperature)
    keep = _np_nucleus(ref, top_p)
    renorm = _renormalized(ref, keep)
    toks = tokens[row::2]
    assert keep[toks].all()
    np.testing.assert_allclose(lps[row::2], renorm[toks], atol=1e-5)
    assert _total_variation(toks, renorm) < 0.05
  assert _np_nucleus(_log_softmax(peaked), top_p).sum() == 2
  assert _np_nucleus(_log_softmax(flat), top_p).sum() > 4


def test_fused_sampled_head_equals_sampling_the_logits():
  # Same chunking and key: projecting chunk by chunk draws what sampling the
  # projected logits draws, with the same log-probabilities.
  rs = np.random.RandomState(9)
  hidden = jnp.asarray(rs.randn(32, 16), jnp.float32)
  weight = jnp.asarray(rs.randn(16, 80), jnp.float32)
  logits = layers.project_vocab(hidden, weight, transposed=False, dtype=jnp.float32)
  for top_p in (0.7, 1.0):
    kw = dict(rng=jax.random.PRNGKey(1), temperature=jnp.float32(0.9),
              top_p=jnp.float32(top_p), do_sample=True, chunk=32, candidates=16)
    fused = decode_head.head_tokens(hidden, weight, transposed=False,
                                    dtype=jnp.float32, **kw)
    plain = decode_head.sample_tokens(logits, **kw)
    np.testing.assert_array_equal(np.asarray(fused[0]), np.asarray(plain[0]))
    np.testing.assert_allclose(np.asarray(fused[1]), np.asarray(plain[1]), atol=1e-5)


@pytest.mark.parametrize('vocab', [160, 157])  # a multiple of the group, and not
def test_top_candidates_are_numpy_top_k(vocab):
  rs = np.random.RandomState(vocab)
  x = rs.randn(6, vocab).astype(np.float32)
  values, ids = decode_head.top_candidates(jnp.asarray(x), 8)
  order = np.argsort(-x, axis=-1)[:, :8]
  np.testing.assert_array_equal(np.asarray(ids), order)
  np.testing.assert_array_equal(np.asarray(values), np.take_along_axis(x, order, -1))


def test_nucleus_mask_matches_numpy():
  rs = np.random.RandomState(7)
  ref = _log_softmax(2.0 * rs.randn(64) / 1.3)
  mask = decode_head.nucleus_mask(jnp.asarray(ref, jnp.float32)[None], jnp.float32(0.8))
  np.testing.assert_array_equal(np.asarray(mask)[0], _np_nucleus(ref, 0.8))
  # top_p = 1 keeps the whole vocabulary.
  assert bool(jnp.all(decode_head.nucleus_mask(jnp.asarray(ref)[None],
                                               jnp.float32(1.0))))


def test_nucleus_cutoff_with_ties():
  probs = jnp.asarray([[0.3, 0.2, 0.2, 0.2, 0.1]], jnp.float32)
  # 0.3 + 0.2 reaches 0.45; the tied 0.2s are kept too.
  np.testing.assert_allclose(decode_head.nucleus_cutoff(probs, jnp.float32(0.45)), [0.2])
  np.testing.assert_allclose(decode_head.nucleus_cutoff(probs, jnp.float32(0.3)), [0.3])
  np.testing.assert_allclose(decode_head.nucleus_cutoff(probs, jnp.float32(0.95)), [0.1])


def test_vocab_chunk_on_cpu():
  assert jax.default_backend() == 'cpu'
  assert decode_head.vocab_chunk(151936) == decode_head.VOCAB_CHUNK
  assert decode_head.vocab_chunk(300) == 300
