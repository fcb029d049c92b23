"""The next token and its log-probability from one pass over the vocabulary.

A decode step needs, per row, the picked token and its log-probability. Projecting to
[B, V] logits and then running a top-k, a log-sum-exp and the sampling over them reads
the vocabulary several times; at batch 64 and V = 151,936 those passes cost more than
the projection itself on CPU. Here the vocabulary is folded in chunks of
`vocab_chunk(V)` columns: each chunk's logits are computed (projected from the final
hidden state, or sliced from given logits) and reduced into per-row running
statistics while they are in cache.

Running statistics (online softmax, as in flash attention): per row the running maximum
m of the scaled logits x = logits / temperature and the sum s = sum(exp(x - m)),
rescaled whenever m grows; then per mode:

* Greedy: the first index of the maximal logit (ties go to the lower id, as top_k);
  its log-probability at temperature 1 is x_max - (m + log s) = -log s. No [B, V]
  array is formed.
* Sampled, whole distribution (top_p >= 1): weighted reservoir sampling. Each chunk
  draws one token j in proportion to exp(x_j - m) (inverse CDF with one uniform, over
  groups of SAMPLE_GROUP tokens, then inside the group) and replaces the running token
  with probability (chunk mass) / (mass so far), a second uniform. The token is then
  drawn from softmax(x) exactly: P(j) = exp(x_j) / sum_v exp(x_v).
* Sampled with a nucleus (top_p < 1): the chunks' x are written once into a [B, V]
  buffer (the only full-vocabulary array), and the `candidates` largest
  (`top_candidates`) give the nucleus when every token outside them is strictly less
  probable than the nucleus cutoff, the usual case (a trained policy's nucleus at
  temperature 0.7 holds far fewer than 256 tokens): the token is drawn from them by
  inverse CDF. Rows whose nucleus may reach past the candidates take the exact path
  over the buffer: the cutoff is bisected (`nucleus_cutoff`) and the token drawn by
  inverse CDF over the vocabulary; a `lax.cond` skips it on steps where every row is
  resolved. Both sampled modes are computed and `top_p` (traced) selects one, so
  changing top_p never recompiles.

Log-probabilities (what PPO/GRPO importance ratios need, SPEC §4): greedy, log_softmax
of the token at temperature 1; sampled, the token's log-probability under the
distribution it was drawn from, softmax(logits / temperature) restricted to the top-p
nucleus and renormalized. The nucleus is the smallest set of most-probable tokens
whose mass reaches top_p; tokens tied with the least probable kept token are kept too.

Randomness: the uniforms come from the step's key, 2 per row per chunk plus one per row
for the nucleus draw, so a fixed key reproduces a batch exactly; the stream depends on
the batch shape and on the chunking.

Chunking: XLA:CPU runs the folded head faster than one [B, V] projection followed by
its reductions when the head weight is cast to the compute dtype (float32 parameters,
bfloat16 compute: the cast is fused with each chunk; bench_model.py's decode
profile); a weight already in the compute dtype, and other backends, which fuse the
reductions into the projection's pass themselves, get one chunk.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from vermem_jax.models.layers import project_vocab

Array = jax.Array

# Vocabulary columns per chunk on CPU: a chunk's [64, C] float32 logits stay in the L2
# cache and its projection is still one efficient matmul. Greedy head, batch 64,
# V = 151,936, float32 weight, bfloat16 compute, 2 shared cores: 94 / 80 / 90 ms per
# step for 4,096 / 8,192 / 16,384 columns (one interleaved run, load average ~5).
VOCAB_CHUNK = 8192
# Candidate tokens of the nucleus (top-p) path; rows whose nucleus may be larger take
# the exact full-vocabulary path.
NUCLEUS_CANDIDATES = 256
# Tokens per group of `top_candidates`' two-level top-k (16 measured fastest of 8, 16,
# 32 for [64, 151936] on XLA:CPU: 17 ms against 29 ms for one top_k).
CANDIDATE_GROUP = 16
# Tokens per group of the two-level inverse-CDF draw inside a chunk (a cumsum over the
# groups' masses, then one over the chosen group): no cumsum over a whole chunk.
SAMPLE_GROUP = 128

ChunkLogits = Callable[[int | Array, int], Array]


def vocab_chunk(vocab: int) -> int:
  """Vocabulary columns per chunk for a vocabulary of `vocab` tokens: VOCAB_CHUNK on
  CPU, the whole vocabulary on other backends (module docstring)."""
  if jax.default_backend() != 'cpu':
    return vocab
  return min(vocab, VOCAB_CHUNK)


def _bits(x):
  return jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)


def nucleus_cutoff(probs: Array, top_p: Array, lo: Array | None = None,
                   hi: Array | None = None) -> Array:
  """Smallest probability inside the top-p nucleus, float32 [B] for probs [B, V].

  The nucleus is {v : probs[v] >= cutoff} with cutoff = the largest q such that
  sum(probs[probs >= q]) >= top_p; this equals walking the tokens in decreasing
  probability until the mass reaches top_p (ties with the last kept token kept).
  Found without a full-vocabulary sort (slow on CPU) by bisecting over the int32 bit
  patterns of q (non-negative floats order like their bits): at most 32 masked sums,
  and none for rows whose bracket [lo, hi) (int32 bit patterns, [B]) is already one
  wide.
  """
  probs = probs.astype(jnp.float32)
  if lo is None:
    lo = jnp.zeros(probs.shape[:-1], jnp.int32)  # mass(probs >= 0) = 1 >= top_p
  if hi is None:
    hi = _bits(jnp.max(probs, axis=-1)) + 1

  def cond(bounds):
    lo, hi = bounds
    return jnp.any(hi - lo > 1)

  def body(bounds):
    lo, hi = bounds
    active = hi - lo > 1
    mid = lo + (hi - lo) // 2
    q = jax.lax.bitcast_convert_type(mid, jnp.float32)[..., None]
    ok = jnp.sum(jnp.where(probs >= q, probs, 0.0), axis=-1) >= top_p
    return (jnp.where(active & ok, mid, lo), jnp.where(active & ~ok, mid, hi))

  lo, _ = jax.lax.while_loop(cond, body, (lo, hi))
  return jax.lax.bitcast_convert_type(lo, jnp.float32)


def nucleus_mask(logprobs: Array, top_p: Array) -> Array:
  """Top-p (nucleus) membership, bool [B, V], for normalized logprobs [B, V].

  See `nucleus_cutoff`; top_p >= 1 keeps everything (guards float32 round-off).
  """
  probs = jnp.exp(logprobs.astype(jnp.float32))
  cutoff = nucleus_cutoff(probs, top_p)
  return (probs >= cutoff[..., None]) | (top_p >= 1.0)


def _fold(chunk_logits: ChunkLogits, vocab: int, chunk: int, carry, update):
  """update(carry, logits [B, c] float32, start, chunk number) over the vocabulary in
  chunks of `chunk` columns (a last, shorter chunk holds the remainder)."""
  full, tail = divmod(vocab, chunk)
  if full == 1:
    carry = update(carry, chunk_logits(0, chunk), 0, 0)
  elif full:
    carry = jax.lax.fori_loop(
        0, full, lambda i, c: update(c, chunk_logits(i * chunk, chunk), i * chunk, i),
        carry)
  if tail:
    carry = update(carry, chunk_logits(full * chunk, tail), full * chunk, full)
  return carry


def _num_chunks(vocab: int, chunk: int) -> int:
  return -(-vocab // chunk)


def _first_max(x: Array) -> tuple[Array, Array]:
  """(max [B], first index of it [B] int32) of x [B, C]; two plain reductions, which
  XLA:CPU runs faster than argmax's variadic one."""
  top = jnp.max(x, axis=-1)
  iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
  return top, jnp.min(jnp.where(x == top[:, None], iota, x.shape[-1]), axis=-1)


class _Softmax(NamedTuple):
  max: Array      # [B] running max of x
  sum_exp: Array  # [B] sum exp(x - max) over the columns seen


def _softmax_update(stats: _Softmax, x: Array) -> tuple[_Softmax, Array, Array]:
  """Online log-sum-exp step -> (new stats, exp(x - new max) [B, C], chunk max [B])."""
  chunk_max = jnp.max(x, axis=-1)
  new_max = jnp.maximum(stats.max, chunk_max)
  e = jnp.exp(x - new_max[:, None])
  sum_exp = stats.sum_exp * jnp.exp(stats.max - new_max) + jnp.sum(e, axis=-1)
  return _Softmax(new_max, sum_exp), e, chunk_max


def _softmax_init(rows: int) -> _Softmax:
  # The lowest finite float, not -inf: exp(-inf - (-inf)) would be nan.
  return _Softmax(jnp.full((rows,), jnp.finfo(jnp.float32).min, jnp.float32),
                  jnp.zeros((rows,), jnp.float32))


def greedy_pick(chunk_logits: ChunkLogits, rows: int, vocab: int, chunk: int
                ) -> tuple[Array, Array]:
  """Greedy token and its log-probability from one pass over the vocabulary.

  Args:
    chunk_logits: (start, size) -> float32 logits [B, size] of columns
      [start, start + size) (`projected_chunks`, `sliced_chunks`).
    rows: B; vocab: V; chunk: columns per chunk (`vocab_chunk`).
  Returns:
    (tokens [B] int32, the first maximal logit's id; logprobs [B] float32,
    log_softmax(logits) of that token at temperature 1).
  """
  def update(carry, x, start, _):
    before, token = carry
    _, index = _first_max(x)
    stats, _, chunk_max = _softmax_update(before, x)
    # Strictly greater: an earlier chunk keeps a tie (the lower id, as top_k).
    token = jnp.where(chunk_max > before.max, index + start, token)
    return stats, token

  stats, token = _fold(chunk_logits, vocab, chunk,
                       (_softmax_init(rows), jnp.zeros((rows,), jnp.int32)), update)
  return token, -jnp.log(stats.sum_exp)


def _last_positive(x: Array) -> Array:
  """Index [B] int32 of the last positive entry of x [B, C] (0 if none)."""
  width = x.shape[-1]
  return width - 1 - jnp.argmax((x > 0)[:, ::-1], axis=-1).astype(jnp.int32)


def _inverse_cdf(weights: Array, u: Array) -> tuple[Array, Array]:
  """Draws an index [B] int32 of weights [B, C] >= 0 in proportion to them with one
  uniform u [B] per row, over groups of SAMPLE_GROUP columns (module docstring).
  Returns (index, total weight [B])."""
  rows, width = weights.shape
  group = min(SAMPLE_GROUP, width)
  pad = -width % group
  w = jnp.pad(weights, ((0, 0), (0, pad))).reshape(rows, -1, group)
  group_mass = jnp.sum(w, axis=-1)                          # [B, G]
  group_cum = jnp.cumsum(group_mass, axis=-1)
  total = group_cum[:, -1]
  target = u * total
  # Round-off guards: never step past the last group / token with mass.
  g = jnp.minimum(jnp.sum(group_cum <= target[:, None], axis=-1).astype(jnp.int32),
                  _last_positive(group_mass))
  before = jnp.where(g > 0, jnp.take_along_axis(
      group_cum, jnp.maximum(g - 1, 0)[:, None], axis=-1)[:, 0], 0.0)
  inside = jnp.take_along_axis(w, g[:, None, None], axis=1)[:, 0]   # [B, group]
  cum = jnp.cumsum(inside, axis=-1)
  j = jnp.minimum(jnp.sum(cum <= (target - before)[:, None], axis=-1).astype(jnp.int32),
                  _last_positive(inside))
  return g * group + j, total


class _Sampled(NamedTuple):
  softmax: _Softmax
  token: Array        # [B] int32 reservoir token (whole distribution)
  token_x: Array      # [B] its scaled logit x
  x: Array            # [B, V] scaled logits, filled chunk by chunk


def top_candidates(x: Array, k: int) -> tuple[Array, Array]:
  """The k largest entries of x [B, V] and their ids, each [B, k], descending
  (`jax.lax.top_k`'s values; among equal values the ids may differ).

  Two-level when V is a multiple of CANDIDATE_GROUP: the k largest entries lie in the
  k groups with the largest group maxima, so a top_k over V / CANDIDATE_GROUP group
  maxima and one over those groups' k * CANDIDATE_GROUP entries replace the top_k over
  V, which XLA:CPU runs slower.
  """
  rows, vocab = x.shape
  g = CANDIDATE_GROUP
  if vocab % g or vocab // g < k:
    return jax.lax.top_k(x, k)
  groups = x.reshape(rows, vocab // g, g)
  _, group_id = jax.lax.top_k(jnp.max(groups, axis=-1), k)
  values = jnp.take_along_axis(groups, group_id[:, :, None], axis=1).reshape(rows, k * g)
  ids = (group_id[:, :, None] * g + jnp.arange(g, dtype=jnp.int32)).reshape(rows, k * g)
  top, pos = jax.lax.top_k(values, k)
  return top, jnp.take_along_axis(ids, pos, axis=-1)


def sample_pick(chunk_logits: ChunkLogits, rows: int, vocab: int, chunk: int,
                rng: Array, temperature: Array, top_p: Array,
                candidates: int = NUCLEUS_CANDIDATES) -> tuple[Array, Array]:
  """Sampled token (temperature + top-p) and its log-probability, one vocabulary pass.

  Args:
    chunk_logits: (start, size) -> float32 logits [B, size] of those columns.
    rows: B; vocab: V; chunk: columns per chunk (`vocab_chunk`).
    rng: this step's PRNG key; temperature: float32 scalar > 0; top_p: float32 scalar
      in (0, 1].
    candidates: K, tokens that resolve the nucleus (module docstring).
  Returns:
    (tokens [B] int32, logprobs [B] float32 under the renormalized nucleus
    distribution of softmax(logits / temperature)).
  """
  k = min(candidates, vocab)
  u_chunks, u_nucleus = jax.random.split(rng)
  uniforms = jax.random.uniform(u_chunks, (_num_chunks(vocab, chunk), 2, rows))

  def update(carry: _Sampled, logits, start, index):
    x = logits / temperature
    stats, e, _ = _softmax_update(carry.softmax, x)
    pick, mass = _inverse_cdf(e, uniforms[index, 0])
    take = uniforms[index, 1] * stats.sum_exp < mass
    token = jnp.where(take, pick + start, carry.token)
    token_x = jnp.where(take, jnp.take_along_axis(x, pick[:, None], axis=-1)[:, 0],
                        carry.token_x)
    return _Sampled(stats, token, token_x,
                    jax.lax.dynamic_update_slice_in_dim(carry.x, x, start, axis=1))

  init = _Sampled(_softmax_init(rows), jnp.zeros((rows,), jnp.int32),
                  jnp.zeros((rows,), jnp.float32),
                  jnp.zeros((rows, vocab), jnp.float32))
  res = _fold(chunk_logits, vocab, chunk, init, update)
  lse = res.softmax.max + jnp.log(res.softmax.sum_exp)
  whole_lp = res.token_x - lse

  cand_x, cand_id = top_candidates(res.x, k)
  cand_lp = cand_x - lse[:, None]
  cand_prob = jnp.exp(cand_lp)
  mass_before = jnp.cumsum(cand_prob, axis=-1) - cand_prob
  num_keep = jnp.maximum(jnp.sum(mass_before < top_p, axis=-1), 1)
  cutoff = jnp.take_along_axis(cand_prob, num_keep[:, None] - 1, axis=-1)[:, 0]
  # Resolved: every token outside the candidates is strictly below the cutoff.
  resolved = jnp.ones(cutoff.shape, bool) if k >= vocab else cand_prob[:, -1] < cutoff
  need_full = ~resolved & (top_p < 1.0)
  u = jax.random.uniform(u_nucleus, (rows,))
  j, total = _inverse_cdf(jnp.where(cand_prob >= cutoff[:, None], cand_prob, 0.0), u)
  nucleus_tok = jnp.take_along_axis(cand_id, j[:, None], axis=-1)[:, 0]
  nucleus_lp = jnp.take_along_axis(cand_lp, j[:, None], axis=-1)[:, 0] - jnp.log(total)

  def exact(_):
    logp = res.x - lse[:, None]
    probs = jnp.exp(logp)
    hi = jnp.where(need_full, _bits(cand_prob[:, 0]) + 1, 1)
    cut = nucleus_cutoff(probs, top_p, jnp.zeros_like(hi), hi)
    tok, tot = _inverse_cdf(jnp.where(probs >= cut[:, None], probs, 0.0), u)
    lp = jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0] - jnp.log(tot)
    return jnp.where(need_full, tok, nucleus_tok), jnp.where(need_full, lp, nucleus_lp)

  nucleus_tok, nucleus_lp = jax.lax.cond(jnp.any(need_full), exact,
                                         lambda _: (nucleus_tok, nucleus_lp), None)
  whole = top_p >= 1.0
  return (jnp.where(whole, res.token, nucleus_tok).astype(jnp.int32),
          jnp.where(whole, whole_lp, nucleus_lp))


def projected_chunks(hidden: Array, weight: Array, *, transposed: bool, dtype
                     ) -> ChunkLogits:
  """Chunk logits projected from final hidden states [B, D] (`project_vocab` on the
  columns [start, start + size) of the lm_head kernel [D, V], or of the tied embedding
  [V, D] when transposed)."""
  axis = 0 if transposed else 1

  def chunk_logits(start, size):
    w = jax.lax.dynamic_slice_in_dim(weight, start, size, axis=axis)
    return project_vocab(hidden, w, transposed=transposed, dtype=dtype)
  return chunk_logits


def sliced_chunks(logits: Array) -> ChunkLogits:
  """Chunk logits sliced from given logits [B, V], as float32."""
  return lambda start, size: jax.lax.dynamic_slice_in_dim(
      logits, start, size, axis=1).astype(jnp.float32)


def _pick(chunk_logits: ChunkLogits, rows: int,
          vocab: int, rng: Array, temperature: Array, top_p: Array, do_sample: bool,
          candidates: int, chunk: int | None) -> tuple[Array, Array]:
  chunk = vocab_chunk(vocab) if chunk is None else int(chunk)
  if not do_sample:
    return greedy_pick(chunk_logits, rows, vocab, chunk)
  return sample_pick(chunk_logits, rows, vocab, chunk, rng, temperature, top_p,
                     candidates)


def sample_tokens(logits: Array, rng: Array, temperature: Array, top_p: Array,
                  do_sample: bool, candidates: int = NUCLEUS_CANDIDATES,
                  chunk: int | None = None) -> tuple[Array, Array]:
  """One token per row from logits [B, V] -> (tokens [B] int32, logprobs [B] float32).

  Greedy (not do_sample): the first maximal logit; logprob = log_softmax at
  temperature 1. Sampled: temperature (float32 scalar > 0) + top-p (float32 scalar in
  (0, 1]), logprob under the renormalized nucleus distribution; rng is the step's key.
  One pass over the logits in chunks of `chunk` columns (default `vocab_chunk(V)`);
  `candidates` tokens resolve the nucleus (module docstring).

  """
  rows, vocab = logits.shape
  return _pick(sliced_chunks(logits), rows, vocab, rng, temperature, top_p,
               do_sample, candidates, chunk)


def head_tokens(hidden: Array, weight: Array, *, transposed: bool, dtype, rng: Array,
                temperature: Array, top_p: Array, do_sample: bool,
                candidates: int = NUCLEUS_CANDIDATES, chunk: int | None = None
                ) -> tuple[Array, Array]:
  """The vocabulary head and the pick fused: `sample_tokens` of the logits of final
  hidden states [B, D] under the lm_head kernel [D, V] (or the tied embedding [V, D],
  transposed=True) in compute dtype `dtype`, projected chunk by chunk so the [B, V]
  logits are formed only by sampling, once (module docstring). Chunks default to
  `vocab_chunk(V)` when the weight is cast to `dtype`, and to one otherwise.

  Returns:
    (tokens [B] int32, logprobs [B] float32), as `sample_tokens` of
    `project_vocab(hidden, weight, ...)` up to float32 summation order.
  """
  rows = hidden.shape[0]
  vocab = weight.shape[0 if transposed else 1]
  if chunk is None and jnp.dtype(weight.dtype) == jnp.dtype(dtype):
    # What chunking gains on CPU is the weight's cast to the compute dtype fused with
    # each chunk's slice; a weight already in that dtype is sliced into a slower dot
    # (batch 64, V = 151,936, bfloat16 weight: 146 ms in 8,192-column chunks, 96 ms
    # in one, 90 ms before the fused head), so it is projected in one chunk.
    chunk = vocab
  return _pick(projected_chunks(hidden, weight, transposed=transposed, dtype=dtype),
               rows, vocab, rng, temperature, top_p, do_sample, candidates, chunk)
