"""Tests for vermem_jax.rl.grpo: NumPy reference, masking, accumulation, model step."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import grpo_reference
from vermem_jax.rl import grpo
from vermem_jax.rl import loss_step

RTOL = 1e-5


# ----------------------------------------------------------------- NumPy reference


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _ref_loss(logits, ref_logits, b, eps, beta, est, temp, max_log_ratio=20.0,
              reduction='decision'):
  """Float64 loop over decisions, grouped by (row, id); returns (sum, n, token stats).
  A decision's token losses are averaged ('decision', Eq. 11), summed and divided by
  √L ('sqrt') or summed ('sequence')."""
  lp = _log_softmax(np.asarray(logits, np.float64) / temp)
  lpr = _log_softmax(np.asarray(ref_logits, np.float64) / temp)
  cid = np.asarray(b['command_ids'])
  decisions = {}
  stats = {'kl': [], 'ratio': [], 'clip': [], 'ent': [], 'gap': [], 'active': [],
           'approx_kl': []}
  for r in range(cid.shape[0]):
    for j in range(cid.shape[1]):
      if cid[r, j] == 0:
        continue
      y = int(b['target_ids'][r, j])
      a = float(b['advantages'][r, j])
      logp = lp[r, j, y]
      ratio = np.exp(np.clip(logp - b['old_logprobs'][r, j], -max_log_ratio,
                             max_log_ratio))
      surr = min(ratio * a, np.clip(ratio, 1 - eps, 1 + eps) * a)
      p = np.exp(lp[r, j])
      if est == 'exact':
        kl = float(np.sum(p * (lp[r, j] - lpr[r, j])))
      else:
        d = lpr[r, j, y] - logp
        kl = np.exp(d) - 1 - d
      decisions.setdefault((r, int(cid[r, j])), []).append(-(surr - beta * kl))
      stats['kl'].append(kl)
      stats['ratio'].append(ratio)
      stats['clip'].append(float(abs(ratio - 1) > eps))
      stats['active'].append(float(ratio * a != surr))  # the clipped term won the min
      stats['approx_kl'].append(ratio - 1 - np.log(ratio))
      stats['ent'].append(float(-np.sum(p * lp[r, j])))
      stats['gap'].append(logp - b['old_logprobs'][r, j])
  norm = {'decision': len, 'sqrt': lambda v: np.sqrt(len(v)), 'sequence': lambda v: 1}
  total = sum(np.sum(v) / norm[reduction](v) for v in decisions.values())
  return total, len(decisions), {k: np.array(v) for k, v in stats.items()}


def _random_case(seed, b=3, l=7, v=11):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(b, l, v)) * 2
  ref_logits = logits + rng.normal(size=(b, l, v)) * 0.5
  cid = np.array([[1, 1, 1, 2, 2, 0, 0],
                  [5, 5, 0, 0, 0, 0, 0],
                  [0, 0, 0, 0, 0, 0, 0]], np.int32)[:b, :l]
  target = rng.integers(0, v, size=(b, l)).astype(np.int32)
  # Sampler log-probs near the learner's, so some ratios fall inside and some outside
  # the clip range.
  lp = _log_softmax(logits / 0.7)
  old = np.take_along_axis(lp, target[..., None], -1)[..., 0] + rng.normal(
      size=(b, l)) * 0.3
  adv = np.zeros((b, l))
  for r in range(b):
    for d in np.unique(cid[r][cid[r] > 0]):
      adv[r, cid[r] == d] = rng.normal()
  batch = {'target_ids': target, 'command_ids': cid, 'advantages': adv.astype(np.float32),
           'old_logprobs': old.astype(np.float32)}
  return logits.astype(np.float32), ref_logits.astype(np.float32), batch


@pytest.mark.parametrize('est', ['exact', 'k3'])
def test_loss_matches_numpy_reference(est):
  for seed in range(3):
    logits, ref_logits, batch = _random_case(seed)
    fn = jax.jit(functools.partial(grpo_reference.grpo_loss_from_logits, clip_epsilon=0.2,
                                   kl_beta=0.1, kl_estimator=est, temperature=0.7))
    loss, n, m = fn(logits, ref_logits, batch)
    ref, ref_n, st = _ref_loss(logits, ref_logits, batch, 0.2, 0.1, est, 0.7)
    assert float(n) == ref_n == 3
    np.testing.assert_allclose(float(loss), ref, rtol=RTOL)
    fin = grpo.finalize_metrics(m)
    np.testing.assert_allclose(fin['kl'], st['kl'].mean(), rtol=RTOL)
    np.testing.assert_allclose(fin['ratio'], st['ratio'].mean(), rtol=RTOL)
    np.testing.assert_allclose(fin['ratio_min'], st['ratio'].min(), rtol=RTOL)
    np.testing.assert_allclose(fin['ratio_max'], st['ratio'].max(), rtol=RTOL)
    np.testing.assert_allclose(fin['entropy'], st['ent'].mean(), rtol=RTOL)
    np.testing.assert_allclose(fin['logprob_gap'], st['gap'].mean(), rtol=RTOL,
                               atol=1e-6)
    assert fin['clip_fraction'] == pytest.approx(st['clip'].mean())
    assert 0 < st['clip'].mean() < 1  # the case exercises both branches
    assert fin['clip_active_fraction'] == pytest.approx(st['active'].mean())
    np.testing.assert_allclose(fin['approx_kl'], st['approx_kl'].mean(), rtol=RTOL)


@pytest.mark.parametrize('reduction', ['sqrt', 'sequence'])
def test_other_reductions_match_numpy_reference(reduction):
  for seed in range(2):
    logits, ref_logits, batch = _random_case(seed)
    loss, n, m = jax.jit(functools.partial(
        grpo_reference.grpo_loss_from_logits, clip_epsilon=0.2, kl_beta=0.1,
        kl_estimator='exact', temperature=0.7, reduction=reduction))(
            logits, ref_logits, batch)
    ref, ref_n, _ = _ref_loss(logits, ref_logits, batch, 0.2, 0.1, 'exact', 0.7,
                              reduction=reduction)
    assert float(n) == ref_n == 3
    np.testing.assert_allclose(float(loss), ref, rtol=RTOL)
    assert float(m['policy_loss'][1]) == 3.0


def test_reductions_at_identical_policies_by_hand():
  """ρ = 1, KL = 0: loss = −Σ_d A_d L_d / norm(L_d); case 5's decisions have L = 3, 2, 2."""
  logits, _, batch = _random_case(5)
  batch = dict(batch)
  batch['old_logprobs'] = np.asarray(grpo_reference.token_logprobs_from_logits(
      logits, batch['target_ids'], temperature=0.7))
  a = [float(batch['advantages'][0, 0]), float(batch['advantages'][0, 3]),
       float(batch['advantages'][1, 0])]
  want = {'decision': -(a[0] + a[1] + a[2]),
          'sqrt': -(a[0] * 3 / np.sqrt(3) + a[1] * 2 / np.sqrt(2) + a[2] * 2 / np.sqrt(2)),
          'sequence': -(3 * a[0] + 2 * a[1] + 2 * a[2])}
  for reduction, value in want.items():
    loss, n, _ = grpo_reference.grpo_loss_from_logits(
        logits, logits, batch, temperature=0.7, reduction=reduction)
    assert float(n) == 3
    np.testing.assert_allclose(float(loss), value, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match='reduction'):
    grpo_reference.grpo_loss_from_logits(logits, logits, batch, temperature=0.7,
                                         reduction='token')


def test_decision_segments_are_runs_within_rows():
  cid = jnp.array([[3, 3, 5, 5, 5, 0], [3, 3, 0, 0, 0, 0], [7, 0, 7, 0, 0, 0]])
  seg, nseg = grpo.decision_segments(cid)
  assert nseg == 19
  np.testing.assert_array_equal(
      np.asarray(seg).reshape(3, 6),
      [[0, 0, 1, 1, 1, 18], [2, 2, 18, 18, 18, 18], [3, 18, 4, 18, 18, 18]])
  # Per-decision mean: decisions of lengths 2 and 3 get equal weight.
  vals = jnp.array([[1., 1., 4., 4., 4., 9.], [2., 2., 0, 0, 0, 0], [0] * 6])
  total, n = grpo._decision_reduce(vals, cid)
  assert float(n) == 5 and float(total) == 1 + 4 + 2 + 0 + 0  # masked 9 excluded
  total, n = grpo._decision_reduce(vals, cid, length_norm=None)
  assert float(n) == 5 and float(total) == 2 + 12 + 4
  # 'sqrt': each decision's sum over √(its tokens).
  total, n = grpo._decision_reduce(vals, cid, length_norm=jnp.sqrt)
  np.testing.assert_allclose(float(total), 2 / 2**.5 + 12 / 3**.5 + 4 / 2**.5, rtol=1e-6)


def test_masked_slots_do_not_matter():
  logits, ref_logits, batch = _random_case(4)
  masked = np.asarray(batch['command_ids']) == 0
  fn = jax.jit(jax.value_and_grad(
      lambda lg, b: grpo_reference.grpo_loss_from_logits(lg, ref_logits, b, temperature=0.7)[0]))
  loss0, g0 = fn(logits, batch)
  bad = dict(batch)
  bad['advantages'] = np.where(masked, 1e6, batch['advantages']).astype(np.float32)
  bad['old_logprobs'] = np.where(masked, np.nan, batch['old_logprobs']).astype(
      np.float32)
  bad['target_ids'] = np.where(masked, 3, batch['target_ids']).astype(np.int32)
  loss1, g1 = fn(logits, bad)
  assert float(loss0) == float(loss1)
  np.testing.assert_array_equal(np.asarray(g0), np.asarray(g1))
  assert np.all(np.asarray(g0)[masked] == 0.0)


def _full_sequence_case(seed=0, t=24, v=13):
  """A [B, T] learner batch with prompt, command, observation and padding tokens."""
  rng = np.random.default_rng(seed)
  b = 2
  input_ids = rng.integers(0, v, size=(b, t)).astype(np.int32)
  attention_mask = np.ones((b, t), np.int32)
  attention_mask[1, :5] = 0  # left padding
  cid = np.zeros((b, t), np.int32)
  cid[0, 6:10] = 1   # command 1 after a prompt
  cid[0, 14:16] = 2  # command 2 after an observation
  cid[1, 12:19] = 3
  adv = np.where(cid > 0, rng.normal(size=(b, t)), 0.0).astype(np.float32)
  for d in (1, 2, 3):
    adv[cid == d] = adv[cid == d][0]
  old = (np.log(1.0 / v) + rng.normal(size=(b, t)) * 0.1).astype(np.float32)
  lb = dict(input_ids=input_ids, attention_mask=attention_mask, command_ids=cid,
            advantages=adv, old_logprobs=old)
  return lb, rng.normal(size=(b, t, v)).astype(np.float32)


def test_select_command_tokens_layout_and_errors():
  lb, _ = _full_sequence_case()
  sb = grpo.select_command_tokens(lb, 8)
  np.testing.assert_array_equal(sb['command_positions'][0], [5, 6, 7, 8, 13, 14, 0, 0])
  np.testing.assert_array_equal(sb['command_ids'][0], [1, 1, 1, 1, 2, 2, 0, 0])
  np.testing.assert_array_equal(sb['target_ids'][0, :6],
                                lb['input_ids'][0, [6, 7, 8, 9, 14, 15]])
  np.testing.assert_array_equal(sb['command_positions'][1, :7], np.arange(11, 18))
  assert sb['advantages'][1, 7] == 0.0
  with pytest.raises(ValueError, match="num_command_tokens"):
    grpo.select_command_tokens(lb, 6)
  bad = dict(lb, command_ids=lb['command_ids'].copy())
  bad['command_ids'][0, 0] = 4
  with pytest.raises(ValueError, match="position 0"):
    grpo.select_command_tokens(bad, 8)
  bad = dict(lb, command_ids=lb['command_ids'].copy())
  bad['command_ids'][1, 2] = 4
  with pytest.raises(ValueError, match="padding"):
    grpo.select_command_tokens(bad, 8)
  with pytest.raises(ValueError, match="missing"):
    grpo.select_command_tokens({'input_ids': lb['input_ids']}, 8)


@pytest.mark.parametrize('est', ['exact', 'k3'])
def test_gradient_wrt_full_sequence_logits_is_zero_off_commands(est):
  lb, full_logits = _full_sequence_case()
  sb = grpo.select_command_tokens(lb, 8)
  rng = np.random.default_rng(1)
  full_ref = full_logits + rng.normal(size=full_logits.shape).astype(np.float32)

  def loss(full, full_ref):
    lg = grpo.gather_positions(full, sb['command_positions'])
    rf = grpo.gather_positions(full_ref, sb['command_positions'])
    return grpo_reference.grpo_loss_from_logits(lg, rf, sb, kl_estimator=est, temperature=0.7)[0]

  g = np.asarray(jax.jit(jax.grad(loss))(full_logits, full_ref))
  predicting = np.zeros(lb['input_ids'].shape, bool)
  t = np.nonzero(lb['command_ids'] > 0)
  predicting[t[0], t[1] - 1] = True  # hidden state t-1 predicts command token t
  assert np.all(g[~predicting] == 0.0)  # prompt, observation, padding: exactly 0
  assert np.all(np.abs(g[predicting]).sum(-1) > 0)


def test_identical_policies_give_minus_mean_advantage_and_zero_kl():
  logits, _, batch = _random_case(5)
  batch = dict(batch)
  batch['old_logprobs'] = np.asarray(
      grpo_reference.token_logprobs_from_logits(logits, batch['target_ids'], temperature=0.7))
  for est in ('exact', 'k3'):
    loss, n, m = grpo_reference.grpo_loss_from_logits(logits, logits, batch, kl_estimator=est,
                                            temperature=0.7)
    per_decision = [batch['advantages'][0, 0], batch['advantages'][0, 3],
                    batch['advantages'][1, 0]]
    np.testing.assert_allclose(float(loss) / float(n), -np.mean(per_decision),
                               rtol=1e-6, atol=1e-7)
    assert float(m['kl'][0]) == 0.0
    fin = grpo.finalize_metrics(m)
    assert fin['ratio_min'] == fin['ratio_max'] == 1.0
    assert fin['clip_fraction'] == 0.0


def test_microbatches_of_unequal_size_accumulate_to_whole_batch():
  """Deferred (sum, count) normalization: any split gives the same loss and gradient.

  A shared linear head W makes the gradient depend on every row; float64 (x64 context)
  keeps round-off far below the 1e-6 tolerance.
  """
  with jax.enable_x64(True):
    rng = np.random.default_rng(6)
    b, l, d, v = 8, 6, 5, 17
    h = rng.normal(size=(b, l, d))
    w = jnp.asarray(rng.normal(size=(d, v)))
    w_ref = w + 0.1 * jnp.asarray(rng.normal(size=(d, v)))
    cid = np.zeros((b, l), np.int32)
    lengths = [6, 2, 0, 5, 1, 3, 4, 6]
    for r, n in enumerate(lengths):
      cid[r, :n] = 1
      cid[r, n // 2:n] = 2 if n > 2 else cid[r, n // 2:n]
    batch = {'target_ids': rng.integers(0, v, size=(b, l)).astype(np.int32),
             'command_ids': cid,
             'advantages': rng.normal(size=(b, l)),
             'old_logprobs': np.log(1.0 / v) + 0.2 * rng.normal(size=(b, l))}

    @jax.jit
    def step(w, h, batch):
      def f(w):
        loss, n, m = grpo_reference.grpo_loss_from_logits(h @ w, h @ w_ref, batch,
                                                temperature=0.7)
        return loss, (n, m)
      (loss, (n, m)), g = jax.value_and_grad(f, has_aux=True)(w)
      return loss, n, m, g

    loss, n, m, g = step(w, jnp.asarray(h), batch)
    assert loss.dtype == jnp.float64
    total_loss, total_n, total_g, total_m = 0.0, 0.0, 0.0, None
    for lo, hi in ((0, 3), (3, 8)):
      part = {k: x[lo:hi] for k, x in batch.items()}
      pl, pn, pm, pg = step(w, jnp.asarray(h[lo:hi]), part)
      total_loss, total_n, total_g = total_loss + pl, total_n + pn, total_g + pg
      total_m = pm if total_m is None else grpo.combine_metrics(total_m, pm)
    assert float(total_n) == float(n)
    whole, split = float(loss / n), float(total_loss / total_n)
    assert abs(split - whole) <= 1e-6 * abs(whole)
    gw, gs = np.asarray(g / n), np.asarray(total_g / total_n)
    assert np.linalg.norm(gs - gw) <= 1e-6 * np.linalg.norm(gw)
    np.testing.assert_allclose(gs, gw, rtol=1e-6, atol=1e-12)
    fw, fs = grpo.finalize_metrics(m), grpo.finalize_metrics(total_m)
    for k in fw:
      np.testing.assert_allclose(fs[k], fw[k], rtol=1e-6)


@pytest.mark.parametrize('reduction', ['token', 'decision', 'sequence'])
def test_command_nll_matches_reference(reduction):
  logits, _, batch = _random_case(7)
  total, count, m = grpo_reference.command_nll_from_logits(logits, batch, reduction=reduction)
  lp = _log_softmax(logits.astype(np.float64))
  cid = batch['command_ids']
  per = {}
  for r, j in zip(*np.nonzero(cid)):
    per.setdefault((r, cid[r, j]), []).append(-lp[r, j, batch['target_ids'][r, j]])
  if reduction == 'token':
    ref, ref_n = sum(sum(x) for x in per.values()), sum(len(x) for x in per.values())
  elif reduction == 'decision':
    ref, ref_n = sum(np.mean(x) for x in per.values()), len(per)
  else:
    ref, ref_n = sum(sum(x) for x in per.values()), len(per)
  np.testing.assert_allclose(float(total), ref, rtol=RTOL)
  assert float(count) == ref_n
  acc = [float(np.argmax(lp[r, j]) == batch['target_ids'][r, j])
         for r, j in zip(*np.nonzero(cid))]
  assert grpo.finalize_metrics(m)['token_accuracy'] == pytest.approx(np.mean(acc))


def test_bad_arguments_raise():
  logits, ref_logits, batch = _random_case(8)
  with pytest.raises(ValueError, match="kl_estimator"):
    grpo_reference.grpo_loss_from_logits(logits, ref_logits, batch, kl_estimator='k2')
  with pytest.raises(ValueError, match="ref_logits is required"):
    grpo_reference.grpo_loss_from_logits(logits, None, batch)
  with pytest.raises(ValueError, match="missing"):
    grpo_reference.grpo_loss_from_logits(logits, ref_logits, {'target_ids': batch['target_ids']})
  with pytest.raises(ValueError, match="shape"):
    grpo_reference.grpo_loss_from_logits(logits[:, :3], ref_logits[:, :3], batch)
  with pytest.raises(ValueError, match="temperature"):
    grpo_reference.grpo_loss_from_logits(logits, ref_logits, batch, temperature=0.0)
  # kl_beta = 0 needs no reference policy.
  loss, n, _ = grpo_reference.grpo_loss_from_logits(logits, None, batch, kl_beta=0.0)
  assert np.isfinite(float(loss)) and float(n) == 3


# ----------------------------------------------------------------- through the model


@pytest.fixture(scope='module')
def tiny_model():
  from vermem_jax.models import qwen
  cfg = qwen.QwenConfig.preset('tiny', vocab_size=256, num_hidden_layers=1)
  init = jax.jit(qwen.init_params, static_argnums=0)
  params = init(cfg, jax.random.PRNGKey(0))
  ref_params = init(cfg, jax.random.PRNGKey(1))
  return qwen, cfg, params, ref_params


def _model_batch(v, seed=0):
  lb, _ = _full_sequence_case(seed, t=24, v=v)
  return grpo.select_command_tokens(lb, 8)


def test_model_step_matches_full_logits_path(tiny_model):
  qwen, cfg, params, ref_params = tiny_model
  sb = _model_batch(cfg.vocab_size)
  (loss, n, m, _), grads = loss_step.grpo_loss_and_grads(
      params, ref_params, sb, model_config=cfg, temperature=0.7)

  # Independent path: full [B, T, V] logits from Qwen.apply, then gather.
  def full_path(p):
    model = qwen.Qwen(cfg)
    full = model.apply({'params': p}, sb['input_ids'], attention_mask=sb['attention_mask'])
    ref_full = model.apply({'params': ref_params}, sb['input_ids'],
                           attention_mask=sb['attention_mask'])
    lg = grpo.gather_positions(full, sb['command_positions'])
    rf = grpo.gather_positions(ref_full, sb['command_positions'])
    return grpo_reference.grpo_loss_from_logits(lg, rf, sb, temperature=0.7)[0]

  ref_loss, ref_grads = jax.jit(jax.value_and_grad(full_path))(params)
  assert float(n) == 3
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
  assert np.isfinite(grpo.finalize_metrics(m)['kl'])


def test_model_step_with_identical_policies(tiny_model):
  _, cfg, params, _ = tiny_model
  sb = dict(_model_batch(cfg.vocab_size, seed=1))
  old = loss_step.policy_logprobs(params, sb, model_config=cfg, temperature=0.7)
  sb['old_logprobs'] = np.asarray(old)
  (loss, n, m, _), _ = loss_step.grpo_loss_and_grads(params, params, sb, model_config=cfg,
                                             temperature=0.7)
  cid, adv = sb['command_ids'], sb['advantages']
  per_decision = [adv[r, j] for r in range(cid.shape[0]) for j in range(cid.shape[1])
                  if cid[r, j] and (j == 0 or cid[r, j - 1] != cid[r, j])]
  np.testing.assert_allclose(float(loss) / float(n), -np.mean(per_decision), rtol=1e-5)
  assert abs(float(m['kl'][0])) < 1e-6


def test_model_step_microbatches_float32(tiny_model):
  """Unequal micro-batches through the model; float32 so a 1e-5 norm tolerance."""
  _, cfg, params, ref_params = tiny_model
  lb0, _ = _full_sequence_case(2, t=24, v=cfg.vocab_size)
  lb1, _ = _full_sequence_case(3, t=24, v=cfg.vocab_size)
  lb = {k: np.concatenate([lb0[k], lb1[k][:1]]) for k in lb0}
  sb = grpo.select_command_tokens(lb, 8)
  step = functools.partial(loss_step.grpo_loss_and_grads, model_config=cfg, temperature=0.7)
  (loss, n, _, _), g = step(params, ref_params, sb)
  # Rows [0, 2) reuse the [2, T] compilation of the other model tests.
  parts = [{k: x[a:b] for k, x in sb.items()} for a, b in ((0, 2), (2, 3))]
  outs = [step(params, ref_params, p) for p in parts]
  tot_loss = sum(float(o[0][0]) for o in outs)
  tot_n = sum(float(o[0][1]) for o in outs)
  assert tot_n == float(n) == 5
  np.testing.assert_allclose(tot_loss / tot_n, float(loss) / float(n), rtol=1e-6)
  gs = jax.tree_util.tree_map(lambda a, b: (a + b) / tot_n, outs[0][1], outs[1][1])
  gw = jax.tree_util.tree_map(lambda a: a / n, g)
  diff = np.sqrt(sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(
      jax.tree_util.tree_leaves(gs), jax.tree_util.tree_leaves(gw))))
  norm = np.sqrt(sum(float(jnp.sum(a ** 2)) for a in jax.tree_util.tree_leaves(gw)))
  assert diff <= 1e-5 * norm


def test_sft_step_matches_nll(tiny_model):
  qwen, cfg, params, _ = tiny_model
  sb = _model_batch(cfg.vocab_size, seed=4)
  (total, count, _), grads = loss_step.sft_loss_and_grads(params, sb, model_config=cfg)
  full = jax.jit(qwen.Qwen(cfg).apply)({'params': params}, sb['input_ids'],
                                       attention_mask=sb['attention_mask'])
  lp = jax.nn.log_softmax(full, -1)
  ref = 0.0
  for r, j in zip(*np.nonzero(sb['command_ids'])):
    ref -= float(lp[r, sb['command_positions'][r, j], sb['target_ids'][r, j]])
  np.testing.assert_allclose(float(total), ref, rtol=1e-5)
  assert float(count) == (sb['command_ids'] > 0).sum()


# ----------------------------------------------------------------- PPO pass > 1


def ref_ppo_loss_and_logit_grad(logits, ref_logits, b, eps, beta, temp):
  """Float64 NumPy PPO loss Σ_d (1/L_d) Σ_j -(min(ρA, clip(ρ)A) - β KL) and its exact
  analytic gradient with respect to the logits (exact KL), for old log-probs from
  another policy (ρ != 1). Returns (loss, dloss/dlogits [B, L, V], ratios [n])."""
  z = np.asarray(logits, np.float64)
  lp = _log_softmax(z / temp)
  lq = _log_softmax(np.asarray(ref_logits, np.float64) / temp)
  p = np.exp(lp)
  cid = np.asarray(b['command_ids'])
  lengths = {}
  for r in range(cid.shape[0]):
    for j in range(cid.shape[1]):
      if cid[r, j]:
        lengths[(r, int(cid[r, j]))] = lengths.get((r, int(cid[r, j])), 0) + 1
  loss, grad, ratios = 0.0, np.zeros_like(z), []
  for r in range(cid.shape[0]):
    for j in range(cid.shape[1]):
      if cid[r, j] == 0:
        continue
      w = 1.0 / lengths[(r, int(cid[r, j]))]
      y = int(b['target_ids'][r, j])
      a = float(b['advantages'][r, j])
      rho = np.exp(lp[r, j, y] - float(b['old_logprobs'][r, j]))
      ratios.append(rho)
      unclipped, clipped = rho * a, np.clip(rho, 1 - eps, 1 + eps) * a
      kl = float(np.sum(p[r, j] * (lp[r, j] - lq[r, j])))
      loss += w * -(min(unclipped, clipped) - beta * kl)
      onehot = np.zeros(z.shape[-1])
      onehot[y] = 1.0
      d_surr = a * rho * (onehot - p[r, j]) / temp if unclipped <= clipped else 0.0
      d_kl = p[r, j] * ((lp[r, j] - lq[r, j]) - kl) / temp
      grad[r, j] = w * -(d_surr - beta * d_kl)
  return loss, grad, np.array(ratios)


def test_second_pass_loss_and_logit_gradient_match_numpy_ppo():
  """A later PPO pass: θ moved since θ_old fixed the old log-probs, so ρ != 1 and the
  clip acts; loss and gradient equal the NumPy reference."""
  active = []
  for seed in range(3):
    rng = np.random.default_rng(10 + seed)
    old_logits, ref_logits, batch = _random_case(seed)
    lp_old = _log_softmax(old_logits.astype(np.float64) / 0.7)
    batch['old_logprobs'] = np.take_along_axis(
        lp_old, batch['target_ids'][..., None], -1)[..., 0].astype(np.float32)
    logits = (old_logits + rng.normal(size=old_logits.shape) * 0.6).astype(np.float32)
    fn = jax.jit(jax.value_and_grad(
        lambda lg: grpo_reference.grpo_loss_from_logits(lg, ref_logits, batch, temperature=0.7,
                                              clip_epsilon=0.2, kl_beta=0.1)[0]))
    loss, grad = fn(logits)
    ref, ref_grad, ratios = ref_ppo_loss_and_logit_grad(logits, ref_logits, batch, 0.2,
                                                        0.1, 0.7)
    np.testing.assert_allclose(float(loss), ref, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=RTOL, atol=1e-7)
    assert np.all(np.abs(ratios - 1) > 1e-3)
    m = grpo.finalize_metrics(grpo_reference.grpo_loss_from_logits(
        logits, ref_logits, batch, temperature=0.7)[2])
    assert m['clip_fraction'] == pytest.approx(np.mean(np.abs(ratios - 1) > 0.2))
    assert m['clip_fraction'] > 0
    active.append(m['clip_active_fraction'])
  assert max(active) > 0  # some tokens' gradient is cut by the clip
