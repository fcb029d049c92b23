"""Tests for vermem_jax.models.sampling (KV-cache generation) against full forwards."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vermem_jax.models import decode_head
from vermem_jax.models import qwen
from vermem_jax.models import sampling
from vermem_jax.models.qwen_config import QwenConfig

CFG = QwenConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, rope_theta=10_000.0, max_position_embeddings=512)
REF_LEN = 64  # right-padded length of the reference full forwards (one compile)
N = 8
PROMPT_LENS = (3, 11, 20)


def _params(config, seed=0):
  shapes = jax.eval_shape(lambda: qwen.init_params(config, jax.random.PRNGKey(0)))
  rs = np.random.RandomState(seed)
  fill = lambda s: (1.0 + 0.1 * rs.randn(*s.shape) if len(s.shape) == 1
                    else 0.08 * rs.randn(*s.shape))
  return jax.tree.map(lambda s: jnp.asarray(fill(s), jnp.float32), shapes)


@functools.partial(jax.jit, static_argnames='config')
def _full_logits(config, params, ids):
  # Right padding is invisible to earlier tokens under the causal mask, so position
  # len-1 of a right-padded row equals the unpadded forward's last position.
  return qwen.Qwen(config).apply({'params': params}, ids)


def _reference_logits(params, seqs, config=CFG):
  """Full-forward float32 logits [B, V] at the last token of each sequence."""
  ids = np.zeros((len(seqs), REF_LEN), np.int32)
  for i, s in enumerate(seqs):
    ids[i, :len(s)] = s
  logits = np.asarray(_full_logits(config, params, jnp.asarray(ids)))
  return np.stack([logits[i, len(s) - 1] for i, s in enumerate(seqs)])


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _np_nucleus(logprobs, top_p):
  """NumPy top-p set: most probable tokens until their mass reaches top_p."""
  order = np.argsort(-logprobs)
  p = np.exp(logprobs[order])
  before = np.cumsum(p) - p
  keep = np.zeros(logprobs.shape, bool)
  keep[order[before < top_p]] = True
  return keep


@pytest.fixture(scope='module')
def params():
  return _params(CFG)


@pytest.fixture(scope='module')
def prompts():
  rs = np.random.RandomState(1)
  return [rs.randint(0, CFG.vocab_size, n).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope='module')
def greedy(params, prompts):
  return sampling.generate(CFG, params, prompts, rng=0, max_new_tokens=N,
                           temperature=0.0, top_p=1.0, stop_token_ids=())


def test_greedy_equals_argmax_loop_over_full_forwards(params, prompts, greedy):
  tokens, logprobs = np.asarray(greedy.tokens), np.asarray(greedy.logprobs)
  assert tokens.shape == (3, N) and tokens.dtype == np.int32
  assert logprobs.dtype == np.float32
  np.testing.assert_array_equal(greedy.lengths, [N] * 3)
  seqs = [list(p) for p in prompts]
  for step in range(N):
    ref = _log_softmax(_reference_logits(params, seqs))
    chosen = ref.argmax(-1)
    np.testing.assert_array_equal(tokens[:, step], chosen)
    np.testing.assert_allclose(logprobs[:, step], ref[np.arange(3), chosen], atol=1e-4)
    for s, t in zip(seqs, chosen):
      s.append(int(t))


def test_batch_rows_equal_rows_alone(params, prompts, greedy):
  for i, p in enumerate(prompts):
    alone = sampling.generate(CFG, params, [p], rng=0, max_new_tokens=N,
                              temperature=0.0, top_p=1.0, stop_token_ids=())
    np.testing.assert_array_equal(alone.tokens[0], greedy.tokens[i])
    np.testing.assert_allclose(alone.logprobs[0], greedy.logprobs[i], atol=1e-5)


def test_array_prompts_with_lengths_equal_lists(params, prompts, greedy):
  arr = np.zeros((3, 24), np.int32)
  for i, p in enumerate(prompts):
    arr[i, :len(p)] = p
  out = sampling.generate(CFG, params, arr, prompt_lengths=PROMPT_LENS, rng=0,
                          max_new_tokens=N, temperature=0.0, top_p=1.0,
                          stop_token_ids=())
  np.testing.assert_array_equal(out.tokens, greedy.tokens)


def test_stop_tokens_end_rows_independently(params, prompts, greedy):
  free = np.asarray(greedy.tokens)
  stops = {int(free[0, 2]), int(free[1, 5])}
  pad = 255
  out = sampling.generate(CFG, params, prompts, rng=0, max_new_tokens=N,
                          temperature=0.0, top_p=1.0, stop_token_ids=sorted(stops),
                          pad_token_id=pad)
  tokens, logprobs, lengths = map(np.asarray, out)
  expected = []
  for row in free:
    hits = [j for j, t in enumerate(row) if t in stops]
    expected.append(hits[0] + 1 if hits else N)
  assert len(set(expected)) >= 2 and min(expected) < N  # rows stop at different steps
  np.testing.assert_array_equal(lengths, expected)
  for b, n in enumerate(expected):
    np.testing.assert_array_equal(tokens[b, :n], free[b, :n])  # stop token included
    if n < N:
      assert tokens[b, n - 1] in stops
    np.testing.assert_allclose(logprobs[b, :n], greedy.logprobs[b, :n], atol=1e-5)
    assert np.all(tokens[b, n:] == pad) and np.all(logprobs[b, n:] == 0.0)


def test_sampled_logprobs_are_the_nucleus_distribution(params, prompts):
  temperature, top_p = 0.7, 0.9
  out = sampling.generate(CFG, params, prompts[:2], rng=jax.random.PRNGKey(3),
                          max_new_tokens=N, temperature=temperature, top_p=top_p,
                          stop_token_ids=())
  tokens, logprobs = np.asarray(out.tokens), np.asarray(out.logprobs)
  seqs = [list(p) for p in prompts[:2]]
  for step in range(N):
    ref = _log_softmax(_reference_logits(params, seqs) / temperature)
    for b in range(2):
      keep = _np_nucleus(ref[b], top_p)
      assert 1 < keep.sum() < CFG.vocab_size  # a real restriction
      tok = tokens[b, step]
      assert keep[tok]
      renorm = ref[b][keep] - np.log(np.exp(ref[b][keep]).sum())
      np.testing.assert_allclose(logprobs[b, step],
                                 renorm[np.flatnonzero(keep) == tok][0], atol=1e-4)
      seqs[b].append(int(tok))
  again = sampling.generate(CFG, params, prompts[:2], rng=jax.random.PRNGKey(3),
                            max_new_tokens=N, temperature=temperature, top_p=top_p,
                            stop_token_ids=())
  np.testing.assert_array_equal(again.tokens, tokens)  # deterministic under a key
  other = sampling.generate(CFG, params, prompts[:2], rng=jax.random.PRNGKey(4),
                            max_new_tokens=N, temperature=temperature, top_p=top_p,
                            stop_token_ids=())
  assert not np.array_equal(other.tokens, tokens)


def test_compiles_once_per_bucket(params):
  # max_new_tokens=3 is used by no other test, so every program here is new.
  rs = np.random.RandomState(5)
  prompt = lambda n: rs.randint(0, CFG.vocab_size, n).tolist()
  gen = functools.partial(sampling.generate, CFG, params, max_new_tokens=3,
                          stop_token_ids=(1,))
  start = sampling.compile_count()
  gen([prompt(4), prompt(10)], rng=0, temperature=0.0, top_p=1.0)
  assert sampling.compile_count() == start + 1
  gen([prompt(2), prompt(31)], rng=1, temperature=0.0, top_p=0.5)  # same bucket 32
  assert sampling.compile_count() == start + 1
  gen([prompt(9), prompt(1)], rng=2, temperature=0.7, top_p=0.95)  # sampled
  gen([prompt(30), prompt(5)], rng=3, temperature=1.1, top_p=0.5)
  assert sampling.compile_count() == start + 2
  gen([prompt(33), prompt(5)], rng=4, temperature=1.1, top_p=0.5)  # bucket 64
  assert sampling.compile_count() == start + 3
  assert sampling.trace_counts()[((2, 64), None, 3, (8,), True)] == 1
  assert [sampling.prompt_bucket(n) for n in (1, 32, 33, 64, 65, 1000)] == [
      32, 32, 64, 64, 128, 1024]


@pytest.mark.parametrize('kwargs, match', [
    (dict(prompts=[[1, 2], []]), 'prompt 1 is empty'),
    (dict(prompts=[]), 'no prompts'),
    (dict(prompts=[[1, 256]]), 'outside'),
    (dict(prompts=[[1]], temperature=-1.0), 'temperature'),
    (dict(prompts=[[1]], top_p=0.0), 'top_p'),
    (dict(prompts=[[1]], max_new_tokens=0), 'max_new_tokens'),
    (dict(prompts=[[1] * 500], max_new_tokens=20), 'max_position_embeddings'),
    (dict(prompts=np.zeros((2, 3), np.int32)), 'prompt_lengths'),
])
def test_bad_arguments_raise(kwargs, match):
  args = dict(rng=0, max_new_tokens=4, temperature=0.0, top_p=1.0)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    sampling.generate(CFG, {}, args.pop('prompts'), **args)


def test_explicit_prompt_buckets_pick_padding_and_keep_outputs(params, prompts, greedy):
  # Longest prompt 20 -> P=24 (the default power-of-two bucket is 32); a 33-token
  # prompt -> P=40 (default 64). Padding is masked, so outputs match the default.
  buckets = (16, 24, 40)
  before = sampling.trace_counts()
  out = sampling.generate(CFG, params, prompts, rng=0, max_new_tokens=N,
                          temperature=0.0, top_p=1.0, stop_token_ids=(),
                          prompt_buckets=buckets)
  after = sampling.trace_counts()
  assert after.get(((3, 24), None, N, (8,), False), 0) == before.get(
      ((3, 24), None, N, (8,), False), 0) + 1
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(greedy.tokens))
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(greedy.logprobs),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(greedy.lengths))

  long_prompts = prompts[:2] + [np.random.RandomState(7).randint(
      0, CFG.vocab_size, 33).tolist()]
  kw = dict(rng=jax.random.PRNGKey(3), max_new_tokens=N, temperature=0.9, top_p=0.9,
            stop_token_ids=())
  default = sampling.generate(CFG, params, long_prompts, **kw)
  explicit = sampling.generate(CFG, params, long_prompts, prompt_buckets=buckets, **kw)
  assert sampling.trace_counts().get(((3, 40), None, N, (8,), True), 0) >= 1
  np.testing.assert_array_equal(np.asarray(explicit.tokens), np.asarray(default.tokens))
  np.testing.assert_allclose(np.asarray(explicit.logprobs),
                             np.asarray(default.logprobs), rtol=1e-5, atol=1e-5)
  assert [sampling.prompt_bucket(n, buckets) for n in (1, 16, 17, 24, 25, 40)] == [
      16, 16, 24, 24, 40, 40]


@pytest.mark.parametrize('buckets, length, match', [
    ((16, 24, 40), 41, 'longest prompt has 41 tokens > the largest prompt bucket 40'),
    ((40, 24), 3, 'strictly increasing'),
    ((), 3, 'prompt_buckets'),
    ((0, 8), 3, 'prompt_buckets'),
    ((8.5, 16), 3, 'prompt_buckets'),
])
def test_prompt_buckets_errors(buckets, length, match):
  with pytest.raises(ValueError, match=match):
    sampling.generate(CFG, {}, [[1] * length], rng=0, max_new_tokens=4,
                      prompt_buckets=buckets)


def test_vocabulary_in_chunks_greedy_and_sampled_match_full_forwards(prompts):
  # A vocabulary of two CPU chunks (the second shorter) and an untied lm_head: the
  # fused head inside the decode loop picks what the full forward's logits give.
  config = CFG.replace(vocab_size=decode_head.VOCAB_CHUNK + 808,
                       tie_word_embeddings=False)
  assert decode_head.vocab_chunk(config.vocab_size) == decode_head.VOCAB_CHUNK
  params = _params(config, seed=2)
  steps = 4
  greedy = sampling.generate(config, params, prompts[:2], rng=0, max_new_tokens=steps,
                             temperature=0.0, top_p=1.0, stop_token_ids=())
  temperature, top_p = 0.7, 0.9
  sampled = sampling.generate(config, params, prompts[:2], rng=jax.random.PRNGKey(1),
                              max_new_tokens=steps, temperature=temperature,
                              top_p=top_p, stop_token_ids=())
  for out, t in ((greedy, 0.0), (sampled, temperature)):
    tokens, logprobs = np.asarray(out.tokens), np.asarray(out.logprobs)
    seqs = [list(p) for p in prompts[:2]]
    for step in range(steps):
      logits = _reference_logits(params, seqs, config)
      for b in range(2):
        tok = tokens[b, step]
        if t == 0.0:
          ref = _log_softmax(logits[b])
          assert tok == ref.argmax()
          np.testing.assert_allclose(logprobs[b, step], ref[tok], atol=1e-4)
        else:
          ref = _log_softmax(logits[b] / t)
          keep = _np_nucleus(ref, top_p)
          assert 1 < keep.sum() < config.vocab_size and keep[tok]
          np.testing.assert_allclose(
              logprobs[b, step], ref[tok] - np.log(np.exp(ref[keep]).sum()), atol=1e-4)
        seqs[b].append(int(tok))


@pytest.mark.parametrize('temperature', [0.0, 0.9])
def test_shared_prefill_same_tokens_as_unshared(params, prompts, temperature):
  # 8 rows, 3 distinct prompts in scattered order: one prefill per distinct prompt
  # (4 prefill rows: the next power of two), then the same decode and random stream.
  order = [0, 1, 0, 2, 2, 0, 1, 0]
  rows = [prompts[i] for i in order]
  kw = dict(rng=jax.random.PRNGKey(11), max_new_tokens=N, temperature=temperature,
            top_p=0.9, stop_token_ids=(5,))
  before, counts = dict(sampling.trace_counts()), [sampling.prefill_counts()]
  shared = sampling.generate(CFG, params, rows, **kw)
  counts.append(sampling.prefill_counts())
  unshared = sampling.generate(CFG, params, rows, share_prefill=False, **kw)
  counts.append(sampling.prefill_counts())
  prefilled = [b['prefilled'] - a['prefilled'] for a, b in zip(counts, counts[1:])]
  assert prefilled == [3, 8]
  key = ((4, 32), (8,), N, (8,), temperature > 0)
  assert sampling.trace_counts().get(key, 0) == before.get(key, 0) + 1
  np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(unshared.tokens))
  np.testing.assert_array_equal(np.asarray(shared.lengths),
                                np.asarray(unshared.lengths))
  np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(unshared.logprobs),
                             rtol=1e-6, atol=1e-6)
  # All distinct: nothing to share, the unshared program.
  start = sampling.prefill_counts()
  sampling.generate(CFG, params, prompts, **kw)
  end = sampling.prefill_counts()
  assert (end['rows'] - start['rows'], end['prefilled'] - start['prefilled']) == (3, 3)
