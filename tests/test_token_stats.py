"""Tests for vermem_jax.rl.token_stats: chunked statistics equal the full-logit ones
(values and gradients), and the chunked loss never holds a [B, L, V] array."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vermem_jax.models import qwen
from vermem_jax.models import qwen_config
from vermem_jax.rl import grpo
from vermem_jax.rl import loss_step
from vermem_jax.rl import token_stats


def _case(seed, b=3, l=5, d=8, v=37):
  rs = np.random.RandomState(seed)
  f = lambda *s: jnp.asarray(rs.randn(*s), jnp.float32)
  return (f(b, l, d), f(b, l, d), {'w': f(d, v)}, {'w': f(d, v) * 0.5 + 0.1},
          jnp.asarray(rs.randint(0, v, (b, l)), jnp.int32), f(b, l), f(b, l))


def _project(head, h):
  return jnp.einsum('...d,dv->...v', h, head['w'], preferred_element_type=jnp.float32)


@pytest.mark.parametrize('kl', [None, 'exact', 'k3'])
@pytest.mark.parametrize('chunk', [1, 4, 7, 100])  # 7 and 4 do not divide B·L = 15
def test_chunked_equals_full_logits_values_and_grads(kl, chunk):
  hidden, ref_hidden, head, ref_head, targets, w1, w2 = _case(0)
  kw = dict(temperature=0.7, kl_estimator=kl, entropy=True, correct=True)
  names = ['logp', 'entropy', 'correct'] + {None: [], 'exact': ['kl'],
                                             'k3': ['ref_logp']}[kl]

  def full(hidden, head):
    return token_stats.stats_from_logits(_project(head, hidden),
                                         _project(ref_head, ref_hidden), targets, **kw)

  def chunked(hidden, head):
    return token_stats.chunked_stats(_project, head, hidden, targets, ref_head=ref_head,
                                     ref_hidden=ref_hidden, chunk_size=chunk, **kw)

  def scalar(fn, hidden, head):  # a loss that mixes every differentiable statistic
    s = fn(hidden, head)
    out = jnp.sum(s['logp'] * w1) + jnp.sum(s['entropy'] * w2)
    if kl == 'exact':
      out = out + jnp.sum(s['kl'] * w1 * w2)
    return out

  want, got = full(hidden, head), jax.jit(chunked)(hidden, head)
  assert sorted(got) == sorted(names)
  for k in names:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
  gw = jax.grad(functools.partial(scalar, full), argnums=(0, 1))(hidden, head)
  gg = jax.jit(jax.grad(functools.partial(scalar, chunked), argnums=(0, 1)))(hidden,
                                                                            head)
  for a, b in zip(jax.tree.leaves(gg), jax.tree.leaves(gw)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_reference_side_gets_no_gradient():
  hidden, ref_hidden, head, ref_head, targets, w1, _ = _case(1)

  def f(ref_hidden, ref_head):
    s = token_stats.chunked_stats(_project, head, hidden, targets, ref_head=ref_head,
                                  ref_hidden=ref_hidden, chunk_size=4,
                                  kl_estimator='exact')
    return jnp.sum(s['kl'] * w1)
  for g in jax.tree.leaves(jax.grad(f, argnums=(0, 1))(ref_hidden, ref_head)):
    assert not np.any(np.asarray(g))


def test_bad_arguments_raise():
  hidden, _, head, _, targets, _, _ = _case(2)
  with pytest.raises(ValueError, match='chunk_size'):
    token_stats.chunked_stats(_project, head, hidden, targets, chunk_size=0)
  with pytest.raises(ValueError, match='ref_head and ref_hidden'):
    token_stats.chunked_stats(_project, head, hidden, targets, chunk_size=2,
                              kl_estimator='exact')
  with pytest.raises(ValueError, match='kl_estimator'):
    token_stats.stats_from_logits(hidden, hidden, targets, kl_estimator='k2')


# ----------------------------------------------------------- through the model


@pytest.fixture(scope='module')
def model():
  cfg = qwen_config.QwenConfig.preset('tiny', vocab_size=300, num_hidden_layers=1,
                               tie_word_embeddings=False)
  init = jax.jit(qwen.init_params, static_argnums=0)
  rs = np.random.RandomState(0)
  b, t, l = 3, 20, 6
  ids = rs.randint(0, cfg.vocab_size, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  mask[2, 15:] = 0
  cid = np.zeros((b, l), np.int32)
  cid[0, :4], cid[1, :2], cid[1, 2:6], cid[2, :3] = 1, 2, 3, 4
  batch = {'input_ids': ids, 'attention_mask': mask,
           'command_positions': np.tile(np.arange(5, 5 + l, dtype=np.int32), (b, 1)),
           'target_ids': rs.randint(0, cfg.vocab_size, (b, l)).astype(np.int32),
           'command_ids': cid, 'advantages': rs.randn(b, l).astype(np.float32),
           'old_logprobs': (rs.randn(b, l) * 0.3 - 5.7).astype(np.float32)}
  return cfg, init(cfg, jax.random.PRNGKey(0)), init(cfg, jax.random.PRNGKey(1)), batch


def _close_trees(a, b, rtol=1e-5, atol=1e-7):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.mark.parametrize('est', ['exact', 'k3'])
def test_grpo_step_chunked_equals_unchunked(model, est):
  cfg, params, ref_params, batch = model
  step = functools.partial(loss_step.grpo_loss_and_grads, params, ref_params, batch,
                           model_config=cfg, kl_estimator=est, temperature=0.7)
  (loss, n, metrics, lp), grads = step(loss_chunk_size=5)
  (ref_loss, ref_n, ref_metrics, ref_lp), ref_grads = step(loss_chunk_size=None)
  assert float(n) == float(ref_n) == 4
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  _close_trees(metrics, ref_metrics, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(lp), np.asarray(ref_lp), rtol=1e-5, atol=1e-6)
  _close_trees(grads, ref_grads)


def test_sft_step_and_policy_logprobs_chunked_equal_unchunked(model):
  cfg, params, _, batch = model
  got = loss_step.sft_loss_and_grads(params, batch, model_config=cfg, reduction='decision',
                                loss_chunk_size=4)
  want = loss_step.sft_loss_and_grads(params, batch, model_config=cfg, reduction='decision',
                                 loss_chunk_size=None)
  _close_trees(got, want)
  np.testing.assert_allclose(
      loss_step.policy_logprobs(params, batch, model_config=cfg, temperature=0.7,
                           loss_chunk_size=7),
      loss_step.policy_logprobs(params, batch, model_config=cfg, temperature=0.7,
                           loss_chunk_size=None), rtol=1e-6, atol=1e-6)


def test_chunked_head_and_loss_hold_no_full_vocabulary_array():
  # Compiled only: B·L·V float32 = 64 MiB; the chunked step must stay far below one
  # such array while the unchunked one needs several.
  b, l, d, v = 4, 64, 64, 65536
  spec = lambda *s, dt=jnp.float32: jax.ShapeDtypeStruct(s, dt)

  def loss(chunk, hidden, ref_hidden, head, ref_head, batch):
    def f(hidden, head):
      if chunk is None:
        stats = token_stats.stats_from_logits(
            _project(head, hidden), _project(ref_head, ref_hidden), batch['target_ids'],
            temperature=0.7, kl_estimator='exact')
      else:
        stats = token_stats.chunked_stats(
            _project, head, hidden, batch['target_ids'], ref_head=ref_head,
            ref_hidden=ref_hidden, chunk_size=chunk, temperature=0.7,
            kl_estimator='exact')
      return grpo.grpo_loss_from_token_stats(stats, batch)[0]
    return jax.grad(f, argnums=(0, 1))(hidden, head)

  batch = {k: spec(b, l, dt=jnp.int32 if k in ('target_ids', 'command_ids')
                   else jnp.float32) for k in grpo.LOSS_BATCH_KEYS}
  args = (spec(b, l, d), spec(b, l, d), {'w': spec(d, v)}, {'w': spec(d, v)}, batch)
  temp = {c: jax.jit(functools.partial(loss, c)).lower(*args).compile()
          .memory_analysis().temp_size_in_bytes for c in (None, 16)}
  one = b * l * v * 4
  assert temp[None] > 3 * one, temp
  assert temp[16] < 0.5 * one, temp
