"""Budget-controlled efficiency frontier (paper Appendix C.7; SPEC §7).

Each evaluated budget B (config `eval.budgets`: 1,000 ... 5,000 online tokens in steps
of 500) is a hard episode budget: an episode whose online tokens (TN: every input and
output token of the policy and task-solver calls, a re-sent prompt counted again)
exceed B is stopped and counts as unsuccessful. The success rate at B is the share of
successful episodes, in percent. Benchmarks are macro-averaged with equal weight, and
the curve of a method is the mean over seeds with a ±1 std band.

Two summary numbers, with S* = `eval.target_success` (40.0) and B* =
`eval.target_budget` (2,500):
  TN@S* = `tn_at_target`: the budget where the curve first reaches S*, linearly
          interpolated between the two evaluated budgets that bracket it;
  SR@B* = `sr_at_budget`: the curve's value at B*, linearly interpolated.

Hard budgets from one unbudgeted run: evaluation is deterministic (greedy decoding)
and nothing an episode sees depends on its budget, so an episode run under budget B
is the unbudgeted episode cut at B. It succeeds under B exactly when it succeeds
unbudgeted with TN <= B (every earlier call had fewer tokens), which
`success_within_budget` applies. `eval.frontier_reruns=True` runs every budget as its
own hard-budget evaluation instead (tests check that both agree).

Everything takes plain per-episode (success, TN) pairs, so any benchmark with a
success flag (HotpotQA's rule, ALFWorld/SciWorld/BabyAI success, ...) uses it as is.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np


def _check_curve(budgets: Sequence[float], success_rates: Sequence[float]) -> None:
  if len(budgets) != len(success_rates) or not budgets:
    raise ValueError(f'budgets ({len(budgets)}) and success_rates '
                     f'({len(success_rates)}) must be non-empty and of equal length')
  if any(b1 <= b0 for b0, b1 in zip(budgets, budgets[1:])):
    raise ValueError(f'budgets must be strictly increasing, got {list(budgets)}')


def tn_at_target(budgets: Sequence[float], success_rates: Sequence[float],
                 target: float) -> float | None:
  """TN@S*: the budget at which the success curve first reaches `target`.

  Args:
    budgets: evaluated budgets, strictly increasing (tokens).
    success_rates: the curve's value at each budget (same unit as `target`, e.g.
      percent).
    target: S*.

  Returns:
    budgets[0] when the first point already reaches the target; otherwise, for the
    first i with success_rates[i] >= target, the linear interpolation between
    (budgets[i-1], success_rates[i-1]) and (budgets[i], success_rates[i]) (exactly
    budgets[i] on an exact hit); None when the curve never reaches it. A curve that
    dips after reaching the target keeps the first crossing (paper C.7 "first
    reaches").

  Raises:
    ValueError: empty or unequal sequences, budgets not strictly increasing.
  """
  _check_curve(budgets, success_rates)
  if success_rates[0] >= target:
    return float(budgets[0])
  for i in range(1, len(budgets)):
    s0, s1 = float(success_rates[i - 1]), float(success_rates[i])
    if s1 >= target:
      if s1 == target:
        return float(budgets[i])
      b0, b1 = float(budgets[i - 1]), float(budgets[i])
      return b0 + (target - s0) * (b1 - b0) / (s1 - s0)
  return None


def sr_at_budget(budgets: Sequence[float], success_rates: Sequence[float],
                 budget: float) -> float:
  """SR@B*: the success curve at `budget`, linearly interpolated between the two
  evaluated budgets around it (the value itself at an evaluated budget).

  Raises:
    ValueError: `budget` outside [budgets[0], budgets[-1]]; bad sequences.
  """
  _check_curve(budgets, success_rates)
  if not budgets[0] <= budget <= budgets[-1]:
    raise ValueError(f'budget {budget} is outside the evaluated range '
                     f'[{budgets[0]}, {budgets[-1]}]')
  for i in range(1, len(budgets)):
    if budget <= budgets[i]:
      b0, b1 = float(budgets[i - 1]), float(budgets[i])
      s0, s1 = float(success_rates[i - 1]), float(success_rates[i])
      return s0 + (budget - b0) * (s1 - s0) / (b1 - b0)
  return float(success_rates[0])  # a single evaluated budget equal to `budget`


def success_within_budget(success: bool, online_tokens: int, budget: Optional[int]
                          ) -> bool:
  """Whether an unbudgeted episode (success, TN) succeeds under hard budget `budget`
  (None: no budget) — module docstring."""
  return bool(success) and (budget is None or int(online_tokens) <= int(budget))


def success_curve(episodes: Iterable[tuple[bool, int]], budgets: Sequence[int]
                  ) -> list[float]:
  """Success rate in percent at each budget from unbudgeted (success, TN) pairs.

  Raises:
    ValueError: no episodes.
  """
  eps = list(episodes)
  if not eps:
    raise ValueError('success_curve: no episodes')
  return [100.0 * sum(success_within_budget(s, tn, b) for s, tn in eps) / len(eps)
          for b in budgets]


def macro_average(curves: Sequence[Sequence[float]]) -> list[float]:
  """Equal-weight mean of several benchmarks' curves over the same budgets."""
  if not curves or len({len(c) for c in curves}) != 1:
    raise ValueError('macro_average: curves must be non-empty and of equal length')
  return [float(v) for v in np.mean(np.asarray(curves, np.float64), axis=0)]


def mean_std(curves: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
  """Pointwise mean and std over seeds (sample std, ddof=1; 0 for one seed)."""
  arr = np.asarray(curves, np.float64)
  if arr.ndim != 2 or arr.shape[0] == 0:
    raise ValueError('mean_std: expected [seeds, budgets] curves')
  std = arr.std(axis=0, ddof=1) if arr.shape[0] > 1 else np.zeros(arr.shape[1])
  return [float(v) for v in arr.mean(axis=0)], [float(v) for v in std]


def summarize_curve(budgets: Sequence[int], success_rates: Sequence[float], *,
                    target_success: float, target_budget: float) -> dict:
  """{'budgets', 'success_rates', 'tn_at_target', 'sr_at_budget'} of one curve."""
  return {'budgets': [int(b) for b in budgets],
          'success_rates': [float(s) for s in success_rates],
          'tn_at_target': tn_at_target(budgets, success_rates, target_success),
          'sr_at_budget': sr_at_budget(budgets, success_rates, target_budget)}
