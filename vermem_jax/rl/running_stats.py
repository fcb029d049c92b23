"""Phase-specific running statistics of r^local per operation type (SPEC §6, paper
App. F.4): the fallback normalization of A^local for types with fewer than 8 scored
instances in an update (rl/advantages.py). One EMA step per update per type, from that
update's moments (`RunningStats.update`; the decision is documented in advantages.py).
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from vermem_jax.memory import commands

# EMA decay d (SPEC §6, App. F.4: 0.99); AdvantageConfig.running_stats_decay's default.
DEFAULT_DECAY = 0.99


def check_op(op) -> None:
  """Raises ValueError unless `op` is one of the eight decision types (ALL_OPS)."""
  if op not in commands.ALL_OPS:
    raise ValueError(f"unknown operation type {op!r}; expected one of "
                     f"{commands.ALL_OPS}")


class RunningStats:
  """Phase-specific per-operation running statistics of r^local (Appendix F.4).

  Holds, per op type, an exponentially weighted mean and variance with decay d
  (0.99). Lifecycle per phase: `reset()` (or `init_from`, which resets first) at phase
  start, `init_from({op: dev scores})` with ~128 executable dev transitions per
  enabled type, then `update(op, scores)` once per update batch and type (done by
  `compute_advantages`). `to_dict`/`from_dict` give a JSON-compatible state for
  checkpoints.

  Update rule: ONE EMA step per call, from the moments of the call's scores (the
  update's scored instances of the type; rl/advantages.py docstring): m_b = mean, s_b² =
  population variance, then μ ← d μ + (1-d) m_b and E[x²] ← d E[x²] + (1-d)(s_b² +
  m_b²), i.e. σ² ← d σ² + (1-d) s_b² + d (1-d) (m_b - μ_old)² (the same recursion in
  a form that cannot go negative through cancellation). An op without statistics
  (none of its dev transitions at phase start) is initialized by its first non-empty
  update instead: μ = m_b, σ² = s_b², count = n (decision: the EMA's weight on a
  missing prior would be arbitrary; the batch's own moments are what `init_from` would
  have set from that sample).
  """

  def __init__(self, decay: float = DEFAULT_DECAY):
    if not 0.0 <= decay < 1.0:
      raise ValueError(f"RunningStats decay must be in [0, 1), got {decay}")
    self.decay = float(decay)
    self._mean: dict[str, float] = {}
    self._var: dict[str, float] = {}
    self._count: dict[str, int] = {}

  def reset(self) -> None:
    """Forgets all statistics (call at each phase start)."""
    self._mean.clear()
    self._var.clear()
    self._count.clear()

  @staticmethod
  def _check_scores(op: str, scores) -> np.ndarray:
    check_op(op)
    x = np.asarray(scores, np.float64).reshape(-1)
    if not np.all(np.isfinite(x)):
      raise ValueError(f"running-stat scores for {op!r} must be finite, got {scores!r}")
    return x

  def init_from(self, scores_by_op: Mapping[str, Sequence[float]]) -> None:
    """Resets, then sets each op's mean/variance from dev-transition scores.

    Args:
      scores_by_op: {op name: [n] r^local scores of executable dev transitions}, n >= 1
        (the paper uses 128 per type enabled in the phase). Ops absent stay
        uninitialized until an `update` gives them scores.

    Raises:
      ValueError: on an unknown op, an empty or non-finite score list.
    """
    parsed = {}
    for op, scores in scores_by_op.items():
      x = self._check_scores(op, scores)
      if x.size == 0:
        raise ValueError(f"init_from: no scores given for op {op!r}")
      parsed[op] = x
    self.reset()
    for op, x in parsed.items():
      self._mean[op] = float(x.mean())
      self._var[op] = float(x.var())
      self._count[op] = int(x.size)

  def update(self, op: str, scores) -> None:
    """One EMA step of op's statistics from the moments of `scores` (class docstring).

    Args:
      op: operation type (memory.commands.ALL_OPS).
      scores: [n] r^local of op's scored executable decisions in ONE update batch;
        n = 0 is a no-op. An op without statistics takes the batch's moments
        (μ = mean, σ² = population variance, count = n; class docstring).

    Raises:
      ValueError: on an unknown op or non-finite scores.
    """
    x = self._check_scores(op, scores)
    if x.size == 0:
      return
    if op not in self._mean:
      self._mean[op], self._var[op], self._count[op] = (float(x.mean()), float(x.var()),
                                                         int(x.size))
      return
    d = self.decay
    mean, var = self._mean[op], self._var[op]
    batch_mean, batch_var = float(x.mean()), float(x.var())
    delta = batch_mean - mean
    self._mean[op] = d * mean + (1.0 - d) * batch_mean
    self._var[op] = d * var + (1.0 - d) * batch_var + d * (1.0 - d) * delta * delta
    self._count[op] += int(x.size)

  def is_initialized(self, op: str) -> bool:
    return op in self._mean

  def get(self, op: str) -> Optional[tuple[float, float]]:
    """(mean, std) of op, or None when uninitialized."""
    if op not in self._mean:
      return None
    return self._mean[op], math.sqrt(max(self._var[op], 0.0))

  def count(self, op: str) -> int:
    """Samples absorbed by op's statistics (init + updates); 0 if uninitialized."""
    return self._count.get(op, 0)

  def to_dict(self) -> dict:
    """JSON-compatible state: {'decay': d, 'ops': {op: {'mean','var','count'}}}."""
    return {'decay': self.decay,
            'ops': {op: {'mean': self._mean[op], 'var': self._var[op],
                         'count': self._count[op]} for op in sorted(self._mean)}}

  @classmethod
  def from_dict(cls, state: Mapping) -> 'RunningStats':
    """Inverse of to_dict.

    Raises:
      ValueError: if the state is malformed (missing keys, unknown op, bad values).
    """
    try:
      stats = cls(float(state['decay']))
      for op, s in dict(state['ops']).items():
        check_op(op)
        mean, var, count = float(s['mean']), float(s['var']), int(s['count'])
        if not (math.isfinite(mean) and math.isfinite(var) and var >= 0 and count >= 1):
          raise ValueError(f"bad statistics for {op!r}: {dict(s)!r}")
        stats._mean[op], stats._var[op], stats._count[op] = mean, var, count
    except (KeyError, TypeError) as e:
      raise ValueError(f"malformed RunningStats state: {e!r}") from e
    return stats

  def __repr__(self):
    return f"RunningStats(decay={self.decay}, ops={self.to_dict()['ops']})"
