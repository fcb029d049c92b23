"""Tests for vermem_jax.eval.frontier (paper C.7) against hand-computed cases."""
import math

import pytest

from vermem_jax.eval import frontier

B = [1000, 1500, 2000, 2500, 3000]


def test_tn_at_target_first_point_reaches():
  assert frontier.tn_at_target(B, [45.0, 50, 60, 70, 80], 40.0) == 1000.0
  assert frontier.tn_at_target(B, [40.0, 50, 60, 70, 80], 40.0) == 1000.0


def test_tn_at_target_never_reached():
  assert frontier.tn_at_target(B, [0.0, 10, 20, 30, 39.9], 40.0) is None


def test_tn_at_target_interpolates_between_bracketing_budgets():
  # 30 at 1500, 50 at 2000: 40 is halfway -> 1750.
  assert frontier.tn_at_target(B, [10.0, 30, 50, 60, 70], 40.0) == pytest.approx(1750.0)
  # 20 at 2000, 45 at 2500: (40-20)/(45-20) = 0.8 of 500 -> 2400.
  assert frontier.tn_at_target(B, [0.0, 10, 20, 45, 50], 40.0) == pytest.approx(2400.0)


def test_tn_at_target_exact_hit_is_the_budget():
  assert frontier.tn_at_target(B, [10.0, 20, 40, 40, 90], 40.0) == 2000.0


def test_tn_at_target_non_monotone_keeps_the_first_crossing():
  # Crosses between 1000 and 1500 (30 -> 50), dips to 20, crosses again later.
  curve = [30.0, 50, 20, 35, 60]
  assert frontier.tn_at_target(B, curve, 40.0) == pytest.approx(1250.0)
  # Crossing only after a dip: 35 -> 10 -> 60 crosses between 2000 and 2500.
  curve = [35.0, 38, 10, 60, 30]
  assert frontier.tn_at_target(B, curve, 40.0) == pytest.approx(2000 + 30 / 50 * 500)


def test_sr_at_budget_interpolates_and_hits_points():
  curve = [10.0, 30, 50, 60, 70]
  assert frontier.sr_at_budget(B, curve, 2500) == 60.0
  assert frontier.sr_at_budget(B, curve, 1000) == 10.0
  assert frontier.sr_at_budget(B, curve, 3000) == 70.0
  assert frontier.sr_at_budget(B, curve, 1750) == pytest.approx(40.0)
  assert frontier.sr_at_budget(B, curve, 2100) == pytest.approx(52.0)


def test_sr_at_budget_outside_range_raises():
  with pytest.raises(ValueError, match='outside'):
    frontier.sr_at_budget(B, [0.0] * 5, 999)
  with pytest.raises(ValueError, match='outside'):
    frontier.sr_at_budget(B, [0.0] * 5, 3001)


def test_bad_curves_raise():
  with pytest.raises(ValueError, match='equal length'):
    frontier.tn_at_target(B, [1.0, 2.0], 1.0)
  with pytest.raises(ValueError, match='increasing'):
    frontier.sr_at_budget([1000, 1000], [1.0, 2.0], 1000)


def test_success_curve_applies_hard_budgets():
  # (success, TN): a success over a budget is a failure under it.
  eps = [(True, 900), (True, 1600), (False, 100), (True, 2600)]
  assert frontier.success_curve(eps, B) == [25.0, 25.0, 50.0, 50.0, 75.0]
  assert frontier.success_within_budget(True, 1000, 1000)
  assert not frontier.success_within_budget(True, 1001, 1000)
  assert frontier.success_within_budget(True, 10**9, None)
  assert not frontier.success_within_budget(False, 1, None)


def test_mean_std_and_macro_average():
  mean, std = frontier.mean_std([[0.0, 10.0], [20.0, 10.0], [40.0, 10.0]])
  assert mean == [20.0, 10.0]
  assert std[0] == pytest.approx(20.0) and std[1] == 0.0  # sample std (ddof=1)
  assert frontier.mean_std([[1.0, 2.0]])[1] == [0.0, 0.0]
  assert frontier.macro_average([[0.0, 30.0], [60.0, 90.0], [30.0, 0.0]]) == [30.0, 40.0]


def test_summarize_curve():
  s = frontier.summarize_curve(B, [10.0, 30, 50, 60, 70], target_success=40.0,
                               target_budget=2500)
  assert s['tn_at_target'] == pytest.approx(1750.0) and s['sr_at_budget'] == 60.0
  assert not math.isnan(s['sr_at_budget'])
