"""Tests of the SFT loss, optimizer and step (vermem_jax/train/sft_step.py) on real SFT
records with the tiny random Qwen and one learner shape (few compiles)."""

import jax
import numpy as np
import pytest

import float_tolerance  # tests/ helper  # pylint: disable=g-bad-import-order
from test_sft_examples import examples  # pylint: disable=g-bad-import-order,unused-import
from test_sft_examples import records  # pylint: disable=unused-import
from test_sft_examples import tok  # pylint: disable=unused-import
from vermem_jax.models import qwen
from vermem_jax.models import qwen_config
from vermem_jax.rl import batching
from vermem_jax.train import optim
from vermem_jax.train import sft_step

# Learner shape (each one is a compilation; the Qwen vocabulary makes every command
# token cost a 151,936-way projection, so commands are kept short): B=4 rows, T=64 (the
# last prompt tokens of real records), L=32.
UNIT = batching.BatchingConfig(micro_batch_size=4, length_buckets=(64,),
                               command_buckets=(32,))
MODEL = qwen_config.QwenConfig.preset('tiny')
PAD = 151643


@pytest.fixture(scope='module')
def short(examples):
  """Learner rows of the records with commands <= 24 tokens: the command and the last
  prompt tokens (T = 64), so the unit tests share one small shape."""
  rows = []
  for e in sorted(examples, key=lambda e: len(e.command_tokens)):
    c = len(e.command_tokens)
    if c <= 24:
      rows.append(batching.DecisionTokens(e.prompt_tokens[-(64 - c):], e.command_tokens,
                                          (0.0,) * c, 1.0))
  assert len(rows) >= 4
  return rows


@pytest.fixture(scope='module')
def params():
  return qwen.init_params(MODEL, jax.random.PRNGKey(0))


def _loss(params, batches):
  acc = sft_step.zero_accumulator(params)
  for mb in batches:
    acc = sft_step.accumulate_micro_batch(params, acc, mb, model_config=MODEL)
  return acc


# ----------------------------------------------------------------------------- loss
def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_is_command_token_cross_entropy(params, short):
  dec = short[:3]
  mb = batching.build_batch(dec, UNIT, num_decisions=3, pad_id=PAD, batch_size=4)
  acc = _loss(params, [mb])
  assert float(acc['count']) == 3.0
  # NumPy reference on the model's full-sequence logits (no gather, no lm_head shortcut).
  full_logits = jax.jit(lambda p, ids, mask: qwen.Qwen(MODEL).apply(
      {'params': p}, ids, attention_mask=mask))
  logits = np.asarray(full_logits(params, mb['input_ids'], mb['attention_mask']))
  per_cmd, per_seq = [], []
  for row, d in enumerate(dec):
    p, c = len(d.prompt_tokens), len(d.command_tokens)
    logp = _log_softmax(logits[row, :p + c - 1].astype(np.float64))
    ids = mb['input_ids'][row]
    nll = np.array([-logp[t - 1, ids[t]] for t in range(1, p + c)])
    per_cmd.append(nll[p - 1:].mean())   # predictions of tokens p .. p+c-1 (the command)
    per_seq.append(nll.mean())           # prompt tokens included
  want = float(np.mean(per_cmd))
  np.testing.assert_allclose(float(acc['loss_sum'] / acc['count']), want, rtol=1e-5)
  # A loss that also counted prompt tokens would be outside the tolerance above (the
  # random model's NLLs all sit near log V, so the gap is small but far from rtol).
  assert abs(float(np.mean(per_seq)) - want) > 20 * 1e-5 * want
  assert float(acc['tokens']) == sum(len(d.command_tokens) for d in dec)

  # Padding columns and padding rows carry no loss, whatever their token ids.
  noisy = dict(mb)
  noisy['input_ids'] = mb['input_ids'].copy()
  for row, d in enumerate(dec):
    noisy['input_ids'][row, len(d.prompt_tokens) + len(d.command_tokens):] = 777
  noisy['input_ids'][3, :] = 4242
  acc2 = _loss(params, [noisy])
  np.testing.assert_allclose(float(acc2['loss_sum']), float(acc['loss_sum']), rtol=1e-6)
  assert float(acc2['count']) == 3.0


def test_loss_is_mean_per_command_then_over_commands(params, short):
  # The shortest and the longest command weigh equally in the step loss.
  pair = (short[0], short[-1])
  assert len(pair[1].command_tokens) >= 4 * len(pair[0].command_tokens)
  each = [float(_loss(params, [batching.build_batch([d], UNIT, num_decisions=1,
                                                    pad_id=PAD)])['loss_sum'])
          for d in pair]
  acc = _loss(params, [batching.build_batch(list(pair), UNIT, num_decisions=2,
                                            pad_id=PAD)])
  np.testing.assert_allclose(float(acc['loss_sum'] / acc['count']), np.mean(each),
                             rtol=1e-5)
  token_mean = (each[0] * len(pair[0].command_tokens) +
                each[1] * len(pair[1].command_tokens)) / sum(
                    len(d.command_tokens) for d in pair)
  assert abs(np.mean(each) - token_mean) > 1e-3  # not a per-token mean


def test_gradient_accumulation_over_unequal_micro_batches(params, short):
  dec = short[:4]
  full = batching.build_batch(dec, UNIT, num_decisions=4, pad_id=PAD)
  # 3 rows + 1 row (padding rows fill the fixed shape).
  parts = [batching.build_batch(dec[:3], UNIT, num_decisions=4, pad_id=PAD),
           batching.build_batch(dec[3:], UNIT, num_decisions=4, pad_id=PAD)]
  opt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=10, warmup_ratio=0.0,
                              lr_schedule='linear', section='sft')
  state = optim.init_optimizer(params, opt=opt)
  _, s_full, m_full = sft_step.train_step(params, state, [full], model_config=MODEL,
                                          opt=opt)
  p_parts, s_parts, m_parts = sft_step.train_step(params, state, parts,
                                                  model_config=MODEL, opt=opt)
  # Both splits sum the same token losses in other orders (float_tolerance); the
  # mean cross-entropy has positive terms, so its tolerance is relative.
  n_terms = sum(len(d.prompt_tokens) + len(d.command_tokens) for d in dec)
  rel = float_tolerance.reassociation_atol(n_terms, 1.0)
  np.testing.assert_allclose(m_parts['loss'], m_full['loss'], rtol=rel)
  np.testing.assert_allclose(m_parts['grad_norm'], m_full['grad_norm'], rtol=rel)
  assert m_full['num_commands'] == m_parts['num_commands'] == 4
  float_tolerance.assert_same_adam_moments(s_full, s_parts, n_terms=n_terms)
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                     jax.tree.leaves(p_parts))]
  assert any(moved)


def test_overfits_a_handful_of_records(params, short):
  mbs = [batching.build_batch(short[:4], UNIT, num_decisions=4, pad_id=PAD)]
  opt = optim.OptimizerConfig(learning_rate=3e-2, total_steps=12, warmup_ratio=0.0,
                              lr_schedule='linear', section='sft')
  state = optim.init_optimizer(params, opt=opt)
  p, losses = params, []
  for _ in range(opt.total_steps):
    p, state, m = sft_step.train_step(p, state, mbs, model_config=MODEL, opt=opt)
    losses.append(m['loss'])
  assert losses[0] > 10.0                 # ~log(151936) for a random model
  assert losses[-1] < 0.3 * losses[0], losses


# ----------------------------------------------------------------------------- optimizer
def test_linear_warmup_then_linear_decay():
  opt = optim.OptimizerConfig(learning_rate=2e-5, total_steps=100,
                                 warmup_ratio=0.03, lr_schedule='linear', section='sft')
  assert opt.warmup_steps == 3
  sched = optim.learning_rate_fn(opt)
  # Warmup lr·(k+1)/w: no step runs at lr 0 (issue 9); decay lr·(total−k)/(total−w).
  got = [float(sched(s)) for s in (0, 1, 2, 3, 50, 99, 100)]
  want = [2e-5 / 3, 2 * 2e-5 / 3, 2e-5, 2e-5, 2e-5 * 50 / 97, 2e-5 * 1 / 97, 0.0]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


# ----------------------------------------------------------------------------- reductions
def test_loss_reductions_match_numpy(params, short):
  dec = short[:3]
  mb = batching.build_batch(dec, UNIT, num_decisions=3, pad_id=PAD, batch_size=4)
  full_logits = jax.jit(lambda p, ids, mask: qwen.Qwen(MODEL).apply(
      {'params': p}, ids, attention_mask=mask))
  logits = np.asarray(full_logits(params, mb['input_ids'], mb['attention_mask']))
  nlls = []
  for row, d in enumerate(dec):
    p, c = len(d.prompt_tokens), len(d.command_tokens)
    logp = _log_softmax(logits[row].astype(np.float64))
    ids = mb['input_ids'][row]
    nlls.append(np.array([-logp[t - 1, ids[t]] for t in range(p, p + c)]))
  want = {'sequence': np.mean([x.sum() for x in nlls]),          # Eq. 7: -log π(u*|x)
          'decision': np.mean([x.mean() for x in nlls]),
          'sqrt': np.mean([x.sum() / np.sqrt(len(x)) for x in nlls]),
          'token': np.concatenate(nlls).mean()}
  for reduction, value in want.items():
    acc = sft_step.zero_accumulator(params)
    acc = sft_step.accumulate_micro_batch(params, acc, mb, model_config=MODEL,
                                          reduction=reduction)
    np.testing.assert_allclose(float(acc['loss_sum'] / acc['count']), value, rtol=1e-5)
    assert float(acc['commands']) == 3
    got = sft_step.command_loss(params, [mb], model_config=MODEL, reduction=reduction)
    np.testing.assert_allclose(got, value, rtol=1e-5)
  assert abs(want['sequence'] - want['decision']) > 1.0  # distinct losses
  assert want['decision'] + 0.5 < want['sqrt'] < want['sequence'] - 0.5


def test_non_finite_step_is_not_applied(params, short, monkeypatch):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  mbs = [batching.build_batch(short[:4], UNIT, num_decisions=4, pad_id=PAD)]
  opt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=10, warmup_ratio=0.0,
                              lr_schedule='linear', section='sft')
  state = optim.init_optimizer(params, opt=opt)
  real = sft_step.accumulate_micro_batch
  monkeypatch.setattr(sft_step, 'accumulate_micro_batch', lambda *a, **k: dict(
      real(*a, **k), loss_sum=jnp.float32(jnp.inf)))
  p, s, m = sft_step.train_step(params, state, mbs, model_config=MODEL, opt=opt)
  assert m['skipped'] == 1.0 and not np.isfinite(m['loss'])
  assert p is params and s is state
  monkeypatch.setattr(sft_step, 'accumulate_micro_batch', real)
  _, _, m = sft_step.train_step(params, state, mbs, model_config=MODEL, opt=opt)
  assert m['skipped'] == 0.0 and np.isfinite(m['loss'])
