"""Tests for vermem_jax.models.batch_chunks: fixed batch shapes for every generate
call (padding, chunks), with a recording fake sampler and the real one."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vermem_jax.models import batch_chunks
from vermem_jax.models import qwen
from vermem_jax.models import qwen_config
from vermem_jax.models import sampling


class _Recorder:
  """A generate_fn that answers each row with [its first id, its length, 7] and
  records (rows, rng, row lengths) of every call."""

  def __init__(self):
    self.calls = []

  def __call__(self, config, params, rows, *, rng, max_new_tokens, **kwargs):
    del config, params, kwargs
    self.calls.append((len(rows), np.asarray(jax.random.key_data(rng))
                       if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
                       else np.asarray(rng), [len(r) for r in rows]))
    tokens = np.array([[r[0], len(r), 7][:max_new_tokens] for r in rows], np.int32)
    return sampling.GenerationOutput(tokens, tokens.astype(np.float32) / 10,
                                     np.full((len(rows),), 3, np.int32))


@pytest.mark.parametrize('n, buckets, expected', [
    (3, (8,), [(3, 8)]),
    (19, (8,), [(8, 8), (8, 8), (3, 8)]),
    (16, (8,), [(8, 8), (8, 8)]),
    (5, (2, 4, 8), [(5, 8)]),
    (11, (2, 4, 8), [(8, 8), (3, 4)]),
])
def test_chunk_sizes(n, buckets, expected):
  assert batch_chunks.chunk_sizes(n, buckets) == expected


def test_generate_in_chunks_pads_splits_and_keeps_order():
  fake = _Recorder()
  prompts = [[100 + i] * (1 + i % 4) for i in range(19)]
  out = batch_chunks.generate_in_chunks(fake, None, None, prompts, rng=5,
                                        batch_buckets=(8,), max_new_tokens=3)
  assert [rows for rows, _, _ in fake.calls] == [8, 8, 8]
  # Rows go to chunks by prompt length (lengths 1,2,3,4 repeating: 5 ones, 5 twos,
  # 5 threes, 4 fours); the last chunk's 3 rows are padded with its first row.
  assert fake.calls[0][2] == [1] * 5 + [2] * 3
  assert fake.calls[1][2] == [2, 2, 3, 3, 3, 3, 3, 4]
  assert fake.calls[2][2] == [4] * 8
  np.testing.assert_array_equal(out.tokens[:, 0], [100 + i for i in range(19)])
  np.testing.assert_array_equal(out.tokens[:, 1], [1 + i % 4 for i in range(19)])
  assert out.tokens.shape == (19, 3) and out.lengths.shape == (19,)
  np.testing.assert_allclose(out.logprobs, out.tokens / 10)
  key = jax.random.PRNGKey(5)
  np.testing.assert_array_equal(fake.calls[0][1], key)  # chunk 0: the key itself
  np.testing.assert_array_equal(fake.calls[2][1], jax.random.fold_in(key, 2))
  # One chunk: rows in input order.
  batch_chunks.generate_in_chunks(fake, None, None, prompts[:5], rng=5,
                                  batch_buckets=(8,), max_new_tokens=3)
  assert fake.calls[-1][2] == [1, 2, 3, 4, 1, 1, 1, 1]
  with pytest.raises(ValueError, match='no prompts'):
    batch_chunks.generate_in_chunks(fake, None, None, [], rng=0, batch_buckets=(8,),
                                    max_new_tokens=3)


def test_bad_batch_buckets():
  with pytest.raises(ValueError, match='batch_buckets'):
    batch_chunks.check_batch_buckets([0, 4])
  with pytest.raises(ValueError, match='batch_buckets'):
    batch_chunks.check_batch_buckets([])


def test_greedy_chunks_equal_one_call_and_compile_one_batch_shape():
  """Greedy rows do not depend on the batch (models/sampling.py), so 7 prompts in
  chunks of 2 (the last padded) decode exactly what one call of 8 rows decodes, with
  one batch shape."""
  config = qwen_config.QwenConfig.preset('tiny').replace(vocab_size=512)
  shapes = jax.eval_shape(lambda k: qwen.init_params(config, k), jax.random.PRNGKey(0))
  rng = np.random.default_rng(1)
  params = jax.tree.map(
      lambda s: jnp.asarray(rng.normal(0.0, 0.2, s.shape).astype(np.float32)), shapes)
  prompts = [list(rng.integers(1, 512, size=3 + i)) for i in range(7)]
  kw = dict(max_new_tokens=4, prompt_buckets=(16,), share_prefill=False)
  whole = batch_chunks.generate_in_chunks(sampling.generate, config, params, prompts,
                                          rng=0, batch_buckets=(8,), **kw)
  before = dict(sampling.trace_counts())
  chunked = batch_chunks.generate_in_chunks(sampling.generate, config, params, prompts,
                                            rng=0, batch_buckets=(2,), **kw)
  np.testing.assert_array_equal(chunked.tokens, whole.tokens)
  np.testing.assert_array_equal(chunked.lengths, whole.lengths)
  new = {k: v - before.get(k, 0) for k, v in sampling.trace_counts().items()
         if v != before.get(k, 0)}
  assert [k[0] for k in new] == [(2, 16)], new  # one program for 4 calls
