"""Tests for vermem_jax.rl.rewards: NumPy references on random inputs + hand cases."""
import math

import numpy as np
import pytest

from vermem_jax.rl import rewards as R

RTOL = 1e-5


# ----------------------------------------------------------------- independent references


def _ref_minmax(x):
  x = [float(v) for v in x]
  lo, hi = min(x), max(x)
  return [0.0 if hi == lo else (v - lo) / (hi - lo) for v in x]


def _ref_group(rt, rs, coh, st, tok, steps, calls, delta):
  k = len(rt)
  nt, ns, nc = _ref_minmax(tok), _ref_minmax(steps), _ref_minmax(calls)
  out = []
  for i in range(k):
    evid = (rs[i] + coh[i]) / 2
    cbar = (nt[i] + ns[i] + nc[i]) / 3
    eff = (1 - cbar) if rt[i] >= delta else 0.0
    glob = (rt[i] + evid + st[i] + eff) / 4
    out.append((evid, cbar, eff, glob))
  return np.array(out)


def test_group_rewards_match_reference_on_random_inputs():
  rng = np.random.default_rng(0)
  for trial in range(20):
    k = int(rng.integers(1, 10))
    rt = rng.uniform(size=k)
    rt[rng.uniform(size=k) < 0.3] = 0.5  # exercise the δ boundary (≥ includes 0.5)
    rs, coh, st = rng.uniform(size=(3, k))
    tok = rng.integers(100, 5000, size=k)
    steps = rng.integers(1, 4, size=k)  # often tied
    calls = np.full(k, 3) if trial % 3 == 0 else rng.integers(0, 6, size=k)
    g = R.group_rewards(r_task_values=rt, r_sup_values=rs, v_coh=coh, v_state=st,
                        num_tokens=tok, num_task_steps=steps, num_tool_calls=calls)
    ref = _ref_group(rt, rs, coh, st, tok, steps, calls, 0.5)
    np.testing.assert_allclose(g.r_evid, ref[:, 0], rtol=RTOL)
    np.testing.assert_allclose(g.c_bar_online, ref[:, 1], rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(g.r_eff, ref[:, 2], rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(g.r_global, ref[:, 3], rtol=RTOL)
    np.testing.assert_allclose(g.r_state, st, rtol=RTOL)
    assert np.all((g.r_global >= 0) & (g.r_global <= 1))


def test_scalar_formulas_match_reference_on_random_inputs():
  rng = np.random.default_rng(1)
  for _ in range(50):
    a, b, c, d = rng.uniform(size=4)
    assert R.r_evid(a, b) == pytest.approx((a + b) / 2, rel=RTOL)
    assert R.r_state(c) == pytest.approx(c, rel=RTOL)
    assert R.r_global(a, b, c, d) == pytest.approx((a + b + c + d) / 4, rel=RTOL)
    assert R.r_eff(a, b, 0.5) == pytest.approx((1 - b) if a >= 0.5 else 0.0, rel=RTOL)
    rl, rg, pa = rng.uniform(size=3)
    assert R.m_all(rl, rg, pa) == pytest.approx(min(max((rl + rg - pa) / 2, 0), 1),
                                                rel=RTOL, abs=1e-12)
    assert R.m_ans(a, pa) == pytest.approx(min(max(a - pa, 0), 1), rel=RTOL,
                                           abs=1e-12)
    t = int(rng.integers(1, 12))
    local = rng.uniform(size=t)
    local[rng.uniform(size=t) < 0.4] = np.nan
    costs = rng.choice([0.0, 0.5, 1.0], size=t)
    ref_local = sum(v for v in local if not math.isnan(v)) / t
    assert R.r_local_return(local) == pytest.approx(ref_local, rel=RTOL, abs=1e-12)
    assert R.p_aux(costs) == pytest.approx(sum(costs) / t, rel=RTOL, abs=1e-12)


def test_r_task_hand_cases():
  assert R.r_task(None, "Paris") == 0.0
  assert R.r_task("Paris", "paris") == 1.0
  # EM 0, F1 2/3 -> 1/3.
  assert R.r_task("the cat sat", "cat sat on the mat") == pytest.approx(1 / 3)
  assert R.r_task("no", "yes") == 0.0
  assert R.r_task("", "Paris") == 0.0


def test_r_sup_recall_hand_cases():
  gold = [["Alan Turing", 0], ["Enigma", 2]]
  assert R.r_sup(["Alan Turing#0", "Other#1"], gold) == 0.5
  assert R.r_sup([("Alan Turing", 0), ("Enigma", 2), ("X", 1)], gold) == 1.0
  assert R.r_sup([], gold) == 0.0
  assert R.r_sup(["Enigma#2"], []) == 0.0
  with pytest.raises(ValueError, match="evidence unit"):
    R.r_sup([("Enigma", "two")], gold)


def test_online_cost_hand_case_and_ties():
  # tokens [100, 200, 300] -> [0, .5, 1]; steps all 2 -> 0; calls [0, 4, 2] -> [0,1,.5]
  c = R.online_cost([100, 200, 300], [2, 2, 2], [0, 4, 2])
  np.testing.assert_allclose(c, [0.0, 0.5, 0.5])
  np.testing.assert_array_equal(R.online_cost([5, 5], [1, 1], [0, 0]), [0.0, 0.0])
  with pytest.raises(ValueError, match="non-negative"):
    R.online_cost([1, -1], [1, 1], [1, 1])
  with pytest.raises(ValueError, match="equal length"):
    R.online_cost([1, 2], [1], [1, 1])


def test_r_eff_gate():
  assert R.r_eff(0.5, 0.2) == pytest.approx(0.8)  # δ is inclusive
  assert R.r_eff(0.4999, 0.0) == 0.0  # a cheap failure gets nothing
  assert R.r_eff(1.0, 0.2, delta=1.0) == pytest.approx(0.8)
  np.testing.assert_allclose(R.r_eff(np.array([0.2, 0.9]), np.array([0.0, 1.0])),
                             [0.0, 0.0])


def test_monitors_clip():
  assert R.m_all(1.0, 1.0, 0.0) == 1.0
  assert R.m_all(0.0, 0.1, 1.0) == 0.0
  assert R.m_all(0.4, 0.6, 0.2) == pytest.approx(0.4)
  assert R.m_ans(0.3, 0.5) == 0.0
  assert R.m_ans(0.9, 0.25) == pytest.approx(0.65)


def test_local_return_and_p_aux_edge_cases():
  assert R.r_local_return([]) == 0.0
  assert R.r_local_return([np.nan, np.nan]) == 0.0
  assert R.r_local_return([0.5, np.nan, 1.0, np.nan]) == pytest.approx(0.375)
  assert R.p_aux([]) == 0.0
  assert R.p_aux([0.0, 1.0, 0.5]) == pytest.approx(0.5)
  with pytest.raises(ValueError, match="constraint_costs"):
    R.p_aux([1.5])
  with pytest.raises(ValueError, match="r_local"):
    R.r_local_return([2.0])


def test_out_of_range_inputs_raise():
  with pytest.raises(ValueError, match="v_coh"):
    R.r_evid(0.5, 1.25)
  with pytest.raises(ValueError, match="v_state"):
    R.r_state(float("nan"))
  with pytest.raises(ValueError, match="shape"):
    R.group_rewards(r_task_values=[0.1, 0.2], r_sup_values=[0.1], v_coh=[0, 0],
                    v_state=[0, 0], num_tokens=[1, 2], num_task_steps=[1, 1],
                    num_tool_calls=[0, 0])
  with pytest.raises(ValueError, match="delta"):
    R.RewardConfig(delta=1.5)


def test_config_delta_is_used():
  g = R.group_rewards(r_task_values=[0.6, 0.6], r_sup_values=[0, 0], v_coh=[0, 0],
                      v_state=[0, 0], num_tokens=[1, 2], num_task_steps=[1, 1],
                      num_tool_calls=[0, 0], config=R.RewardConfig(delta=0.7))
  np.testing.assert_array_equal(g.r_eff, [0.0, 0.0])


def test_unscored_global_verifier_terms_are_left_out_of_r_global():
  # SPEC §5 decision (fallback 'skip'): rollout 1 has no global score. By hand, δ 0.5,
  # online costs all equal (C̄ 0, r^eff = 1 where r^task >= 0.5):
  #   rollout 0: r^evid (0.5 + 0.75)/2 = 0.625, r^global (1 + 0.625 + 0.25 + 1)/4
  #              = 0.71875
  #   rollout 1: r^evid = r^sup = 0.5, no r^state, r^global (0.5 + 0.5 + 1)/3 = 2/3
  #   rollout 2: r^task 0, r^evid = r^sup = 0, r^global (0 + 0 + 0)/3 = 0
  g = R.group_rewards(r_task_values=[1.0, 0.5, 0.0], r_sup_values=[0.5, 0.5, 0.0],
                      v_coh=[0.75, np.nan, np.nan], v_state=[0.25, np.nan, np.nan],
                      num_tokens=[3, 3, 3], num_task_steps=[1, 1, 1],
                      num_tool_calls=[0, 0, 0])
  np.testing.assert_allclose(g.r_evid, [0.625, 0.5, 0.0], rtol=0, atol=1e-15)
  np.testing.assert_allclose(g.r_global, [0.71875, 2 / 3, 0.0], rtol=1e-15, atol=1e-15)
  assert g.r_state[0] == 0.25 and np.isnan(g.r_state[1:]).all()
  # A made-up midpoint would have given rollout 1 (0.5 + 0.5 + 0.5 + 1)/4 = 0.625.
  with pytest.raises(ValueError, match="r_sup"):
    R.group_rewards(r_task_values=[0.5], r_sup_values=[np.nan], v_coh=[np.nan],
                    v_state=[np.nan], num_tokens=[1], num_task_steps=[1],
                    num_tool_calls=[0])
