"""Trajectory rewards, auxiliary constraint cost and monitoring values (SPEC §5).

One function per formula of the paper (arXiv 2608.03137, Section 3.5, Appendix F.1-F.3,
F.5, F.7):

  r_task           r^task = mean(EM, F1), 0 without an answer     (Eq. 13, App. F.3)
  r_sup            supporting-fact recall r^sup                   (Eq. 14, App. F.3)
  r_evid           r^evid = (r^sup + v^coh) / 2                   (Eq. 14)
  r_state          r^state = v^state                              (Eq. 14)
  minmax_normalize_group / online_cost
                   C̄^online: tokens, task steps, non-null tool calls, each min-max
                   normalized within the K rollouts of one task, then averaged
                                                                  (Eq. 15, App. F.3)
  r_eff            r^eff = 1[r^task >= δ] (1 - C̄^online)          (Eq. 15)
  r_global         r^global = (r^task + r^evid + r^state + r^eff)/4 (Eq. 13)
  r_local_return   R^local = (1/T_k) Σ_{t ∈ E_k} r^local_{t,k}    (Eq. 12, monitoring)
  p_aux            P_aux = (1/T_k) Σ_t c_{t,k}                     (Eq. 16)
  m_all            clip((R^local + r^global - P_aux)/2, 0, 1)     (Eq. 17, monitoring)
  m_ans            clip(r^task - P_aux, 0, 1)                     (Eq. 18, monitoring)

`group_rewards` applies Eq. 13-15 to the K rollouts of one task at once. A rollout the
global verifier gave no score (fallback 'skip'; v^coh, v^state NaN) has its verifier
terms left out of r^global (SPEC §5 decision): r^evid = r^sup, r^state = NaN and
r^global = (r^task + r^evid + r^eff) / 3, never a made-up score that would enter the
group normalization of A^global.

Inputs are Python floats or NumPy arrays; outputs are float64 NumPy arrays (or Python
floats for scalar formulas). Verifier scores v^coh, v^state and r^local are already
divided by 4 (Appendix F.1) and must lie in [0, 1]. Pure NumPy, no JAX.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence

import numpy as np

from vermem_jax.envs import answer_metrics


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """Reward constants (SPEC §5).

  Attributes:
    delta: completion threshold δ of the efficiency gate in Eq. 15 (paper: 0.5).
  """
  delta: float = 0.5  # SPEC §5 / paper Eq. 15, Appendix F.3.

  def __post_init__(self):
    if not 0.0 <= self.delta <= 1.0:
      raise ValueError(f"RewardConfig.delta must be in [0, 1], got {self.delta}")


def _unit_interval(x, name: str) -> np.ndarray:
  """float64 array of x; raises ValueError unless every value is finite and in [0,1]."""
  arr = np.asarray(x, dtype=np.float64)
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} must be finite, got {x!r}")
  if np.any(arr < 0.0) or np.any(arr > 1.0):
    raise ValueError(f"{name} must lie in [0, 1], got {x!r}")
  return arr


def _scalar_or_array(arr: np.ndarray):
  return float(arr) if arr.ndim == 0 else arr


# --------------------------------------------------------------------------- Eq. 13-14


def r_task(prediction: Optional[str], gold_answer: str) -> float:
  """HotpotQA task score r^task (paper Eq. 13, Appendix F.3).

  r^task = (EM + F1) / 2 under the official HotpotQA answer normalization
  (`vermem_jax.envs.answer_metrics`). A missing final answer (``None``) scores 0.
  An empty string is an answer (it scores 0 as well unless the gold normalizes to "").

  Args:
    prediction: the trajectory's final answer, or None if it produced none.
    gold_answer: the reference answer.

  Returns:
    A float in [0, 1].

  Raises:
    TypeError: if prediction is neither str nor None, or gold_answer is not a str.
  """
  if prediction is None:
    if not isinstance(gold_answer, str):
      raise TypeError("gold_answer must be a str")
    return 0.0
  em = answer_metrics.exact_match(prediction, gold_answer)
  f1 = answer_metrics.f1_score(prediction, gold_answer)
  return 0.5 * (em + f1)


def _evidence_key(item) -> str:
  """Canonical evidence-unit id "{title}#{sent_id}" (SPEC §4)."""
  if isinstance(item, str):
    return item
  if isinstance(item, (tuple, list)) and len(item) == 2:
    title, sent_id = item
    if isinstance(title, str) and isinstance(sent_id, (int, np.integer)):
      return f"{title}#{int(sent_id)}"
  raise ValueError(
      f"evidence unit must be 'title#sent_id' or (title, sent_id), got {item!r}")


def r_sup(retrieved_evidence: Iterable, gold_supporting_facts: Iterable) -> float:
  """Supporting-fact recall r^sup (paper Eq. 14, Appendix F.3).

  r^sup = |S_gold ∩ S_pred| / |S_gold| over evidence units, as the recall of the
  official HotpotQA supporting-fact metric. Which units count as the trajectory's
  evidence (S_pred) is the caller's protocol (e.g. units cited by the terminal active
  LTM and context); this function only scores sets.

  Args:
    retrieved_evidence: iterable of evidence ids "title#sent_id" or (title, sent_id).
    gold_supporting_facts: the annotated supporting facts, same formats
      (HotpotQA rows store them as [title, sent_id] pairs).

  Returns:
    A float in [0, 1]; 0.0 when there are no gold facts (as the official script).

  Raises:
    ValueError: if an item is not a recognizable evidence id.
  """
  gold = {_evidence_key(x) for x in gold_supporting_facts}
  pred = {_evidence_key(x) for x in retrieved_evidence}
  if not gold:
    return 0.0
  return len(gold & pred) / len(gold)


def r_evid(r_sup_value, v_coh):
  """Evidence reward r^evid = (r^sup + v^coh) / 2 (paper Eq. 14).

  Args:
    r_sup_value: supporting-fact recall, float or array in [0, 1].
    v_coh: global-verifier evidence coherence (score/4), float or array in [0, 1].

  Returns:
    float or float64 array of the broadcast shape.

  Raises:
    ValueError: if an input is non-finite or outside [0, 1].
  """
  out = 0.5 * (_unit_interval(r_sup_value, "r_sup") + _unit_interval(v_coh, "v_coh"))
  return _scalar_or_array(out)


def r_state(v_state):
  """State reward r^state = v^state (paper Eq. 14): terminal-memory consistency.

  Raises:
    ValueError: if v_state is non-finite or outside [0, 1].
  """
  return _scalar_or_array(_unit_interval(v_state, "v_state"))


# --------------------------------------------------------------------------- Eq. 15


def minmax_normalize_group(values) -> np.ndarray:
  """Min-max normalization within one task's K rollouts (Appendix F.3).

  (x - min) / (max - min); all zeros when every rollout has the same value.

  Args:
    values: [K] non-negative costs of one component (tokens, steps or tool calls).

  Returns:
    [K] float64 in [0, 1].

  Raises:
    ValueError: if values is not a non-empty finite 1-D array.
  """
  x = np.asarray(values, dtype=np.float64)
  if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
    raise ValueError(f"expected a non-empty finite [K] array, got {values!r}")
  lo, hi = x.min(), x.max()
  if hi == lo:
    return np.zeros_like(x)
  return (x - lo) / (hi - lo)


def online_cost(num_tokens, num_task_steps, num_tool_calls) -> np.ndarray:
  """Normalized online cost C̄^online of each rollout in one task group (Eq. 15, F.3).

  Each component is min-max normalized within the K rollouts of the task (0 when all
  rollouts share the value) and the three are averaged with equal weight.

  Args:
    num_tokens: [K] online tokens (policy and task-solver input + output tokens).
    num_task_steps: [K] task-solver steps.
    num_tool_calls: [K] executed non-null memory-tool calls (∅ is not a call).

  Returns:
    [K] float64 in [0, 1].

  Raises:
    ValueError: on mismatched lengths, negative or non-finite values.
  """
  comps = [np.asarray(c, dtype=np.float64)
           for c in (num_tokens, num_task_steps, num_tool_calls)]
  if len({c.shape for c in comps}) != 1 or comps[0].ndim != 1:
    raise ValueError("online cost components must be [K] arrays of equal length, got "
                     f"shapes {[c.shape for c in comps]}")
  for name, c in zip(("num_tokens", "num_task_steps", "num_tool_calls"), comps):
    if np.any(c < 0):
      raise ValueError(f"{name} must be non-negative, got {c}")
  return sum(minmax_normalize_group(c) for c in comps) / 3.0


def r_eff(r_task_value, c_bar_online, delta: float = RewardConfig.delta):
  """Efficiency reward r^eff = 1[r^task >= δ] · (1 - C̄^online) (paper Eq. 15).

  Args:
    r_task_value: float or [K] task score in [0, 1].
    c_bar_online: float or [K] normalized online cost in [0, 1] (`online_cost`).
    delta: completion threshold δ (RewardConfig.delta).

  Returns:
    float or [K] float64 in [0, 1].

  Raises:
    ValueError: if an input is non-finite or outside [0, 1].
  """
  rt = _unit_interval(r_task_value, "r_task")
  cb = _unit_interval(c_bar_online, "c_bar_online")
  return _scalar_or_array(np.where(rt >= delta, 1.0 - cb, 0.0))


def r_global(r_task_value, r_evid_value, r_state_value, r_eff_value):
  """Composite global reward r^global = (r^task + r^evid + r^state + r^eff)/4 (Eq. 13).

  Raises:
    ValueError: if an input is non-finite or outside [0, 1].
  """
  terms = [_unit_interval(v, n) for v, n in ((r_task_value, "r_task"),
                                             (r_evid_value, "r_evid"),
                                             (r_state_value, "r_state"),
                                             (r_eff_value, "r_eff"))]
  return _scalar_or_array(0.25 * (terms[0] + terms[1] + terms[2] + terms[3]))


@dataclasses.dataclass(frozen=True)
class GroupRewards:
  """Eq. 13-15 terms for the K rollouts of one task; every field is [K] float64
  (r_state NaN for a rollout the global verifier gave no score, `group_rewards`)."""
  r_task: np.ndarray
  r_sup: np.ndarray
  r_evid: np.ndarray
  r_state: np.ndarray
  c_bar_online: np.ndarray
  r_eff: np.ndarray
  r_global: np.ndarray


def group_rewards(*, r_task_values, r_sup_values, v_coh, v_state, num_tokens,
                  num_task_steps, num_tool_calls,
                  config: RewardConfig = RewardConfig()) -> GroupRewards:
  """All global-branch rewards of one task group (Eq. 13-15, Appendix F.3).

  Args:
    r_task_values: [K] r^task per rollout (`r_task`).
    r_sup_values: [K] supporting-fact recall per rollout (`r_sup`).
    v_coh: [K] global-verifier evidence coherence in [0, 1]; NaN where the global
      verifier gave no score (fallback 'skip').
    v_state: [K] global-verifier terminal-memory consistency in [0, 1]; NaN as v_coh.
    num_tokens, num_task_steps, num_tool_calls: [K] online cost components.
    config: RewardConfig.

  Returns:
    GroupRewards with [K] arrays. Where v^coh is NaN, r^evid = r^sup; where v^state is
    NaN, r^state is NaN and r^global is the mean of the three other terms (SPEC §5
    decision: an unscored rollout's verifier terms are left out of r^global).

  Raises:
    ValueError: on shape mismatches or out-of-range values (NaN allowed in v_coh and
      v_state only).
  """
  rt = _unit_interval(r_task_values, "r_task")
  if rt.ndim != 1:
    raise ValueError(f"r_task_values must be [K], got shape {rt.shape}")
  k = rt.shape[0]
  arrays = {n: np.asarray(v, np.float64) for n, v in (
      ("r_sup", r_sup_values), ("v_coh", v_coh), ("v_state", v_state),
      ("num_tokens", num_tokens), ("num_task_steps", num_task_steps),
      ("num_tool_calls", num_tool_calls))}
  for n, v in arrays.items():
    if v.shape != (k,):
      raise ValueError(f"{n} must have shape ({k},), got {v.shape}")
  rs = _unit_interval(arrays["r_sup"], "r_sup")
  coh_scored = ~np.isnan(arrays["v_coh"])
  state_scored = ~np.isnan(arrays["v_state"])
  evid = np.where(coh_scored, r_evid(rs, np.where(coh_scored, arrays["v_coh"], 0.0)),
                  rs)
  state = np.asarray(r_state(np.where(state_scored, arrays["v_state"], 0.0)), np.float64)
  cbar = online_cost(arrays["num_tokens"], arrays["num_task_steps"],
                     arrays["num_tool_calls"])
  eff = np.asarray(r_eff(rt, cbar, config.delta), np.float64)
  glob = np.where(state_scored, r_global(rt, evid, state, eff),
                  (rt + evid + eff) / 3.0)
  state = np.where(state_scored, state, np.nan)
  return GroupRewards(r_task=rt, r_sup=rs, r_evid=evid, r_state=state,
                      c_bar_online=cbar, r_eff=eff, r_global=glob)


# --------------------------------------------------------------------------- Eq. 12, 16-18


def r_local_return(local_scores: Sequence[float]) -> float:
  """Trajectory local return R^local(τ_k) (paper Eq. 12); monitoring only.

  R^local = (1/T_k) Σ_{t ∈ E_k} r^local_{t,k}: executable decisions' scores summed,
  divided by the full horizon T_k (null and rejected decisions included).

  Args:
    local_scores: [T_k] r^local per decision, NaN for decisions that were not scored
      (rejected commands, E_k excludes them).

  Returns:
    float in [0, 1]; 0.0 for an empty trajectory or when no decision was scored.

  Raises:
    ValueError: if a scored value is outside [0, 1] or infinite.
  """
  x = np.asarray(local_scores, dtype=np.float64).reshape(-1)
  if x.size == 0:
    return 0.0
  scored = x[~np.isnan(x)]
  _unit_interval(scored, "r_local")
  return float(scored.sum() / x.size)


def p_aux(constraint_costs: Sequence[float]) -> float:
  """Auxiliary constraint cost P_aux(τ_k) = (1/T_k) Σ_t c_{t,k} (paper Eq. 16).

  Args:
    constraint_costs: [T_k] per-decision costs c_{t,k} in [0, 1] (already capped at
      1.0 by the executor, Appendix F.5), one per decision including ∅ and rejected.

  Returns:
    float in [0, 1]; 0.0 for an empty trajectory.

  Raises:
    ValueError: if a cost is non-finite or outside [0, 1].
  """
  c = _unit_interval(np.asarray(constraint_costs, np.float64).reshape(-1),
                     "constraint_costs")
  return float(c.mean()) if c.size else 0.0


def m_all(r_local_return_value, r_global_value, p_aux_value):
  """All-Returns monitor m^all = clip((R^local + r^global - P_aux)/2, 0, 1) (Eq. 17).

  Monitoring only; never an advantage. Accepts floats or broadcastable arrays.
  """
  out = np.clip((np.asarray(r_local_return_value, np.float64)
                 + np.asarray(r_global_value, np.float64)
                 - np.asarray(p_aux_value, np.float64)) / 2.0, 0.0, 1.0)
  return _scalar_or_array(out)


def m_ans(r_task_value, p_aux_value):
  """Answer-Only monitor m^ans = clip(r^task - P_aux, 0, 1) (Eq. 18); monitoring only."""
  out = np.clip(np.asarray(r_task_value, np.float64)
                - np.asarray(p_aux_value, np.float64), 0.0, 1.0)
  return _scalar_or_array(out)
