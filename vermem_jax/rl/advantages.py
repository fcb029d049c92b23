"""Hierarchical advantages A^local, A^global and A^hier (SPEC §6).

Paper (arXiv 2608.03137) Eq. 5 and 9, Appendix F.4:

  A^global_k    = (r^global_k - μ_q) / (σ_q + ε)          over the K rollouts of task q
  A^local_{t,k} = (r^local_{t,k} - μ_v) / (σ_v + ε)       per operation type v
  A^hier_{t,k}  = λ_l A^local_{t,k} + λ_g A^global_k - λ_c c_{t,k}

Normalization conventions (decisions, documented once here):
  * μ and σ are the population mean and standard deviation (ddof = 0).
  * σ is floored at `std_floor` (0.01) and ε (1e-6) is added: (x - μ)/(max(σ, 0.01) + ε).
  * A set whose values are all identical gets advantage exactly 0 (no NaN).
  * Both advantages are clipped to [-advantage_clip, advantage_clip] before combining.
  * A^local is computed only for executable, scored decisions: a rejected command, or an
    accepted one whose r^local is NaN (the verifier gave no score), gets A^local = 0.
  * Local statistics per operation type v (the seven tools and ∅ separately): the current
    update batch when it holds at least `local_min_count` (8) scored instances of v,
    otherwise the phase `RunningStats` for v; if v has no running statistics either, its
    A^local is 0 and the op is reported with source 'none' (and the update below then
    initializes v's statistics from this batch's moments).
  * Running statistics are consulted BEFORE they see the current batch. After the
    advantages of the batch are computed, `compute_advantages` (when
    `update_running_stats=True`) takes ONE EMA step per operation type v that has
    scored executable decisions in the update, from that update's moments of v
    (`RunningStats.update`): with batch mean m_b and population variance s_b²,
      μ ← d μ + (1-d) m_b,   E[x²] ← d E[x²] + (1-d)(s_b² + m_b²),   σ² = E[x²] - μ².
    A type without statistics (no dev transitions at phase start) starts from its
    first update's moments: μ = m_b, σ² = s_b² (`RunningStats.update`).
    So a type's dev initialization fades as d^(updates in which v occurred), whatever
    the number of instances per update (decision: SPEC §6 gives the decay 0.99 but not
    its unit; one step per update keeps frequent and rare types on one clock, where a
    per-sample decay would erase a frequent type's dev initialization within a few
    updates).
    A batch therefore never normalizes against itself through the running statistics.

Modes: the paper's ablation rows (Table 4 and Table 18 captions, App. E; SPEC §6), one
function per formula below. A^task is r^task normalized within the task group exactly
like A^global.
  'full'         Local+Global, VerMem:  A^hier = λ_l A^local + λ_g A^global - λ_c c
                 (Eq. 5)                                          `a_hier_full`
  'no_verify'    VerMem-noVerify:       A^hier = λ_g A^task - λ_c c
                 (task-outcome advantage plus hard constraints)   `a_hier_no_verify`
  'plus_local'   +Local:                A^hier = λ_g A^task + λ_l A^local - λ_c c
                 (noVerify plus the local operation advantage)    `a_hier_plus_local`
  'plus_global'  +Global:               A^hier = λ_g A^global - λ_c c
                 (the composite A^global replaces A^task)         `a_hier_plus_global`
λ_g weights the trajectory-level term, A^task or A^global (decision; all λ are 1 in the
paper). The earlier names 'local_only' (A^local - c, no trajectory term: no paper row)
and 'global_only' are refused with a message naming these.

Rejection preference (ours, not the paper's; SPEC §6 note). A rejected command gets
A^local = 0, so its A^hier is the trajectory term - λ_c c with c <= 1, while an
executable command scored more than c standard deviations below its type's mean gets a
lower A^hier: the update then prefers the rejection. Per update, with R the rejected
and E the executable (accepted, ∅ included) decisions (`rejection_preference`):
  share      = |{e ∈ E : A^hier_e < mean_{r ∈ R} A^hier_r}| / |E|
  mean A^hier over R, and over E.
Convention: a quantity over an empty set is NaN in the function and absent from the
update's metrics (an update with no rejected decision has no share and no rejected
mean; one with no executable decision no share and no executable mean).

`AdvantageConfig.rejection_floor` (ours, not the paper's; the paper config keeps Eq. 5
with 'none'):
  'none'              A^hier as the mode's formula gives it (Eq. 5 in mode 'full').
  'below_executable'  after the mode's formula, every rejected decision r of the update
                      gets  A^hier_r <- min(A^hier_r, min_{e ∈ E} A^hier_e - λ_c c_r)
                      (`floor_rejections`), in every mode: a rejection is then below
                      every executable command of its update, by at least its weighted
                      cost (strictly when λ_c c_r > 0; a zero-cost rejection ties the
                      lowest executable one, never above), a value Eq. 5 already puts
                      lower stays, and among floored rejections the costlier is lower.
                      An update whose decisions are all rejected has nothing to rank
                      against: each keeps the mode's value (trajectory term - λ_c c).
  The share above is computed on the final A^hier, so with 'below_executable' it is 0.
  Why an update-wide floor rather than a fixed A^local for rejections (e.g. the clip
  floor -5) or costs scaled to the advantage range: only a floor taken from the update's
  own executable values guarantees the ordering, because A^global (or A^task) differs
  between rollouts and an executable command may sit at A^local = -5 in a rollout whose
  trajectory term is lower than the rejected one's.

The running statistics themselves are rl/running_stats.py (`RunningStats`). Pure NumPy (float64), no JAX: this runs once per update on host.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from vermem_jax.memory import commands
from vermem_jax.rl import running_stats as running_stats_lib


MODES = ('full', 'no_verify', 'plus_local', 'plus_global')
# AdvantageConfig.rejection_floor values (module docstring; 'none' = the paper's Eq. 5).
REJECTION_FLOORS = ('none', 'below_executable')
# Modes whose A^hier uses A^local (and so need RunningStats), and those using A^task.
LOCAL_MODES = ('full', 'plus_local')
TASK_MODES = ('no_verify', 'plus_local')
# Earlier mode names, refused with a pointer to the paper's rows.
RETIRED_MODES = {
    'local_only': "it computed A^local - c with no trajectory term, which is no row of "
                  "the paper; the paper's +Local is 'plus_local' (A^task + A^local - c)",
    'global_only': "the paper's +Global is now called 'plus_global' (A^global - c)",
}


def check_mode(mode: str) -> None:
  """Raises ValueError unless `mode` is one of MODES, naming them (and why an old
  name was retired)."""
  if mode in MODES:
    return
  why = f' ({RETIRED_MODES[mode]})' if mode in RETIRED_MODES else ''
  raise ValueError(f"AdvantageConfig.mode={mode!r} is not a mode{why}; expected one of "
                   f"{MODES}: the paper's Local+Global, VerMem-noVerify, +Local and "
                   "+Global rows (Table 4)")


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  """Advantage settings; defaults are SPEC §6 / paper Appendix F.4 values.

  Attributes:
    mode: 'full' | 'no_verify' | 'plus_local' | 'plus_global' (module docstring).
    lambda_local: λ_local of Eq. 5 (paper: 1).
    lambda_global: λ_global of Eq. 5 (paper: 1); also weights A^task in 'no_verify'
      and 'plus_local'.
    lambda_constraint: λ_constraint of Eq. 5 (paper: 1).
    std_floor: lower bound on σ in both normalizations (Appendix F.4: 0.01).
    epsilon: ε added to the floored σ (Appendix F.4: 1e-6).
    advantage_clip: A^local and A^global are clipped to [-c, c] (Appendix F.4: 5).
    local_min_count: minimum scored instances of an op type in the update batch for
      batch statistics; fewer falls back to running statistics (Appendix F.4: 8).
    running_stats_decay: EMA decay of the running statistics (Appendix F.4: 0.99).
    running_stats_init_count: executable dev transitions per enabled op type used to
      initialize the running statistics at phase start (Appendix F.4: 128). Read by the
      trainer that draws them; `RunningStats.init_from` accepts any non-empty sample.
    rejection_floor: 'none' (the paper's Eq. 5) or 'below_executable' (ours, not the
      paper's: every rejected decision below every executable one of its update, in
      every mode; module docstring, `floor_rejections`).
  """
  mode: str = 'full'
  lambda_local: float = 1.0  # SPEC §6, Eq. 5.
  lambda_global: float = 1.0  # SPEC §6, Eq. 5.
  lambda_constraint: float = 1.0  # SPEC §6, Eq. 5.
  std_floor: float = 0.01  # SPEC §6, App. F.4.
  epsilon: float = 1e-6  # SPEC §6, App. F.4.
  advantage_clip: float = 5.0  # SPEC §6, App. F.4.
  local_min_count: int = 8  # SPEC §6, App. F.4.
  running_stats_decay: float = running_stats_lib.DEFAULT_DECAY  # SPEC §6, App. F.4.
  running_stats_init_count: int = 128  # SPEC §6, App. F.4.
  rejection_floor: str = 'none'  # Eq. 5 as in the paper (module docstring).

  def __post_init__(self):
    check_mode(self.mode)
    if self.rejection_floor not in REJECTION_FLOORS:
      raise ValueError(
          f"AdvantageConfig.rejection_floor={self.rejection_floor!r}; expected one of "
          f"{REJECTION_FLOORS}: 'none' keeps the paper's Eq. 5, 'below_executable' puts "
          "every rejected decision below every executable one of its update (ours)")
    if not self.std_floor >= 0 or not self.epsilon >= 0:
      raise ValueError("AdvantageConfig.std_floor and epsilon must be >= 0")
    if self.std_floor + self.epsilon <= 0:
      raise ValueError("AdvantageConfig.std_floor + epsilon must be > 0")
    if not self.advantage_clip > 0:
      raise ValueError(f"advantage_clip must be > 0, got {self.advantage_clip}")
    if self.local_min_count < 1:
      raise ValueError(f"local_min_count must be >= 1, got {self.local_min_count}")
    if not 0.0 <= self.running_stats_decay < 1.0:
      raise ValueError(
          f"running_stats_decay must be in [0, 1), got {self.running_stats_decay}")
    if self.running_stats_init_count < 1:
      raise ValueError("running_stats_init_count must be >= 1")


def normalize_scores(values, mean: float, std: float,
                     config: AdvantageConfig) -> np.ndarray:
  """(x - μ) / (max(σ, std_floor) + ε), clipped to ±advantage_clip (Eq. 9, App. F.4).

  Args:
    values: [n] float scores.
    mean, std: statistics μ, σ to normalize with.
    config: AdvantageConfig.

  Returns:
    [n] float64 advantages.
  """
  x = np.asarray(values, np.float64)
  denom = max(float(std), config.std_floor) + config.epsilon
  return np.clip((x - mean) / denom, -config.advantage_clip, config.advantage_clip)


def _normalize_set(values: np.ndarray, config: AdvantageConfig) -> np.ndarray:
  """Normalizes one set with its own population statistics; identical values -> 0."""
  if values.size == 0 or values.max() == values.min():
    return np.zeros_like(values)
  return normalize_scores(values, values.mean(), values.std(), config)


def group_advantages(rewards, group_ids, config: AdvantageConfig) -> np.ndarray:
  """Within-group normalized advantages, e.g. A^global_k (paper Eq. 9, App. F.4).

  Each rollout's reward is normalized with the mean and population std of the rollouts
  sharing its group (task) id; σ floored at std_floor, ε added, clipped to
  ±advantage_clip; a group whose rewards are all identical (or of size 1) gets 0.

  Args:
    rewards: [M] float rewards (r^global, or r^task for the noVerify control).
    group_ids: [M] hashable task ids (int or str), one per trajectory.
    config: AdvantageConfig.

  Returns:
    [M] float64 advantages.

  Raises:
    ValueError: on shape mismatch or non-finite rewards.
  """
  r = np.asarray(rewards, np.float64)
  g = np.asarray(group_ids)
  if r.ndim != 1 or g.shape != r.shape:
    raise ValueError(f"rewards and group_ids must be [M] arrays of equal length, got "
                     f"{r.shape} and {g.shape}")
  if not np.all(np.isfinite(r)):
    raise ValueError(f"rewards must be finite, got {r}")
  out = np.zeros_like(r)
  for gid in np.unique(g):
    idx = np.flatnonzero(g == gid)
    out[idx] = _normalize_set(r[idx], config)
  return out


@dataclasses.dataclass(frozen=True)
class LocalOpStats:
  """How one op type's A^local was normalized in an update (for metrics)."""
  count: int  # scored executable instances in the batch
  source: str  # 'batch' | 'running' | 'none'
  mean: float  # μ_v used (NaN for 'none')
  std: float  # σ_v used before the floor (NaN for 'none')


def local_advantages(ops: Sequence[str], r_local, scored, config: AdvantageConfig,
                     running_stats: Optional[running_stats_lib.RunningStats]
                     ) -> tuple[np.ndarray, dict[str, LocalOpStats]]:
  """A^local per decision, normalized per operation type (paper Eq. 9, App. F.4).

  Args:
    ops: [N] op names (commands.ALL_OPS).
    r_local: [N] local-verifier scores in [0, 1] (ignored where not scored).
    scored: [N] bool, True for executable decisions with a verifier score.
    config: AdvantageConfig (std floor, ε, clip, local_min_count).
    running_stats: phase running statistics, used for types with fewer than
      local_min_count scored instances; None means none available.

  Returns:
    ([N] float64 A^local, zero where not scored; {op: LocalOpStats} for every op with
    at least one scored instance).
  """
  ops_arr = np.asarray(ops, dtype=object)
  x = np.asarray(r_local, np.float64)
  scored = np.asarray(scored, bool)
  out = np.zeros(x.shape, np.float64)
  info: dict[str, LocalOpStats] = {}
  for op in commands.ALL_OPS:
    idx = np.flatnonzero(scored & (ops_arr == op))
    if idx.size == 0:
      continue
    vals = x[idx]
    if idx.size >= config.local_min_count:
      out[idx] = _normalize_set(vals, config)
      info[op] = LocalOpStats(int(idx.size), 'batch', float(vals.mean()),
                              float(vals.std()))
    elif running_stats is not None and running_stats.is_initialized(op):
      mean, std = running_stats.get(op)
      out[idx] = normalize_scores(vals, mean, std, config)
      info[op] = LocalOpStats(int(idx.size), 'running', mean, std)
    else:
      info[op] = LocalOpStats(int(idx.size), 'none', math.nan, math.nan)
  return out, info


# ----------------------------------------------------------------- A^hier per mode
# Each takes the per-decision [N] arrays A^local, A^global, A^task (clipped and
# broadcast to decisions; a term the mode does not use is zeros) and the costs c, and
# returns [N] float64 A^hier. `MODE_FORMULAS` picks one by AdvantageConfig.mode.


def a_hier_full(a_local, a_global, a_task, costs,
                config: AdvantageConfig) -> np.ndarray:
  """Local+Global (full VerMem, mode 'full'): λ_l A^local + λ_g A^global - λ_c c
  (paper Eq. 5; Table 4 row Local+Global)."""
  del a_task
  return (config.lambda_local * np.asarray(a_local, np.float64)
          + config.lambda_global * np.asarray(a_global, np.float64)
          - config.lambda_constraint * np.asarray(costs, np.float64))


def a_hier_no_verify(a_local, a_global, a_task, costs,
                     config: AdvantageConfig) -> np.ndarray:
  """VerMem-noVerify (mode 'no_verify'): λ_g A^task - λ_c c, the normalized
  task-outcome advantage plus hard constraints (Table 4, Table 16 and App. C captions)."""
  del a_local, a_global
  return (config.lambda_global * np.asarray(a_task, np.float64)
          - config.lambda_constraint * np.asarray(costs, np.float64))


def a_hier_plus_local(a_local, a_global, a_task, costs,
                      config: AdvantageConfig) -> np.ndarray:
  """+Local (mode 'plus_local'): λ_g A^task + λ_l A^local - λ_c c: noVerify plus the
  local operation advantage (Table 4 and Table 18 captions: "+Local adds the local
  operation advantage")."""
  del a_global
  return (config.lambda_global * np.asarray(a_task, np.float64)
          + config.lambda_local * np.asarray(a_local, np.float64)
          - config.lambda_constraint * np.asarray(costs, np.float64))


def a_hier_plus_global(a_local, a_global, a_task, costs,
                       config: AdvantageConfig) -> np.ndarray:
  """+Global (mode 'plus_global'): λ_g A^global - λ_c c: the composite global
  advantage replaces the task-only one (Table 4 and Table 18 captions)."""
  del a_local, a_task
  return (config.lambda_global * np.asarray(a_global, np.float64)
          - config.lambda_constraint * np.asarray(costs, np.float64))


# AdvantageConfig.mode -> its A^hier formula (the paper's Table 4 rows).
MODE_FORMULAS = {'full': a_hier_full, 'no_verify': a_hier_no_verify,
                 'plus_local': a_hier_plus_local, 'plus_global': a_hier_plus_global}


def floor_rejections(a_hier, accepted, costs,
                     config: AdvantageConfig) -> tuple[np.ndarray, int]:
  """Puts every rejected decision below every executable one of the update (ours).

  A^hier_r <- min(A^hier_r, min_{e executable} A^hier_e - λ_c c_r) for each rejected r
  (`rejection_floor='below_executable'`; module docstring). Not the paper's: Eq. 5 is
  the mode's formula alone. With no executable decision the values are returned as
  they are (nothing to rank against).

  Args:
    a_hier: [N] float A^hier of one update by the mode's formula.
    accepted: [N] bool, False for rejected commands.
    costs: [N] constraint costs c in [0, 1].
    config: AdvantageConfig (λ_c = lambda_constraint).

  Returns:
    ([N] float64 A^hier, number of rejected decisions whose value was lowered).
  """
  a = np.array(a_hier, np.float64)
  acc = np.asarray(accepted, bool)
  if acc.all() or not acc.any():
    return a, 0
  floor = a[acc].min() - config.lambda_constraint * np.asarray(costs, np.float64)
  lowered = ~acc & (floor < a)
  a[lowered] = floor[lowered]
  return a, int(lowered.sum())


@dataclasses.dataclass(frozen=True)
class RejectionPreference:
  """Whether an update's A^hier prefers rejected commands (module docstring).

  Attributes:
    share: fraction of executable decisions whose A^hier is below the mean A^hier of
      the rejected ones; NaN when the update has no rejected or no executable decision.
    rejected_mean: mean A^hier of the rejected decisions (NaN when none).
    executable_mean: mean A^hier of the executable decisions (NaN when none).
  """
  share: float
  rejected_mean: float
  executable_mean: float


def rejection_preference(a_hier, accepted) -> RejectionPreference:
  """Rejection-preference diagnostics of one update (SPEC §6 note; ours).

  Args:
    a_hier: [N] float A^hier of the update's decisions (the values the learner gets).
    accepted: [N] bool, False for rejected commands.

  Returns:
    RejectionPreference (NaN for a quantity over an empty set).

  Raises:
    ValueError: if the arrays are not [N] of equal length.
  """
  a = np.asarray(a_hier, np.float64)
  acc = np.asarray(accepted, bool)
  if a.ndim != 1 or acc.shape != a.shape:
    raise ValueError(f"a_hier and accepted must be [N] arrays of equal length, got "
                     f"{a.shape} and {acc.shape}")
  rejected, executable = a[~acc], a[acc]
  rejected_mean = float(rejected.mean()) if rejected.size else math.nan
  executable_mean = float(executable.mean()) if executable.size else math.nan
  share = (float((executable < rejected_mean).mean())
           if rejected.size and executable.size else math.nan)
  return RejectionPreference(share=share, rejected_mean=rejected_mean,
                             executable_mean=executable_mean)


@dataclasses.dataclass(frozen=True)
class Advantages:
  """Output of compute_advantages. Per-decision arrays are [N], per-trajectory [M].

  Attributes:
    a_hier: [N] A^hier_{t,k} by mode (a_hier_* functions), after the rejection floor
      when config.rejection_floor says so: the value every command token of decision
      t gets.
    a_local: [N] clipped A^local (0 for rejected/unscored decisions and in modes that do
      not use the local branch: 'no_verify', 'plus_global').
    a_global: [N] clipped A^global of each decision's trajectory (0 if r_global absent).
    a_task: [N] clipped group-normalized r^task A^task of the trajectory (0 if r_task
      absent).
    costs: [N] constraint costs c_{t,k} as given.
    traj_a_global: [M] A^global_k.
    traj_a_task: [M] A^task_k.
    local_ops: {op: LocalOpStats}: which ops used batch vs running statistics.
    metrics: flat {name: float} summary for logging.
  """
  a_hier: np.ndarray
  a_local: np.ndarray
  a_global: np.ndarray
  a_task: np.ndarray
  costs: np.ndarray
  traj_a_global: np.ndarray
  traj_a_task: np.ndarray
  local_ops: dict
  metrics: dict


def compute_advantages(*, group_ids, trajectory_index, ops: Sequence[str], accepted,
                       costs, r_local, r_global=None, r_task=None,
                       config: AdvantageConfig = AdvantageConfig(),
                       running_stats: Optional[running_stats_lib.RunningStats] = None,
                       update_running_stats: bool = True) -> Advantages:
  """A^hier for every decision of one update batch (paper Eq. 5, 9; App. F.4).

  Args:
    group_ids: [M] task id of each trajectory (its GRPO group G_q, Eq. 8).
    trajectory_index: [N] int, index in [0, M) of each decision's trajectory.
    ops: [N] op name of each decision (commands.ALL_OPS; 'Null' for ∅), or commands.INVALID_OP
      ('Invalid') for text that did not parse into a tool, which must be rejected.
    accepted: [N] bool, False for commands rejected by the executor.
    costs: [N] constraint costs c_{t,k} in [0, 1].
    r_local: [N] r^local in [0, 1], NaN where the local verifier did not score.
    r_global: [M] r^global in [0, 1]; required by 'full' and 'plus_global'.
    r_task: [M] r^task in [0, 1]; required by 'no_verify' and 'plus_local'.
    config: AdvantageConfig.
    running_stats: phase RunningStats; required by modes that use A^local. Mutated in
      place after use when update_running_stats (see module docstring).
    update_running_stats: fold this batch's scored decisions into running_stats.

  Returns:
    Advantages; its metrics include the rejection-preference diagnostics
    'advantage/rejection_preference_share', 'advantage/a_hier_rejected_mean',
    'advantage/a_hier_executable_mean' (each absent when undefined) and
    'advantage/num_rejections_floored' (module docstring).

  Raises:
    ValueError: on shape mismatches, unknown op names, out-of-range indices or values,
      or a missing input the mode needs.
  """
  g = np.asarray(group_ids)
  m = g.shape[0] if g.ndim == 1 else -1
  if g.ndim != 1:
    raise ValueError(f"group_ids must be [M], got shape {g.shape}")
  tidx = np.asarray(trajectory_index)
  n = tidx.shape[0] if tidx.ndim == 1 else -1
  if tidx.ndim != 1 or (tidx.size and not np.issubdtype(tidx.dtype, np.integer)):
    raise ValueError(f"trajectory_index must be an [N] int array, got {tidx!r}")
  tidx = tidx.astype(np.int64)
  if n and (tidx.min() < 0 or tidx.max() >= m):
    raise ValueError(f"trajectory_index values must lie in [0, {m}), got "
                     f"[{tidx.min()}, {tidx.max()}]")
  ops = list(ops)
  acc = np.asarray(accepted, bool)
  for op in set(ops):
    if op != commands.INVALID_OP:
      running_stats_lib.check_op(op)
  c = np.asarray(costs, np.float64)
  rl = np.asarray(r_local, np.float64)
  for name, arr in (('ops', np.asarray(ops, object)), ('accepted', acc), ('costs', c),
                    ('r_local', rl)):
    if arr.shape != (n,):
      raise ValueError(f"{name} must have shape ({n},), got {arr.shape}")
  invalid_accepted = [i for i, op in enumerate(ops) if op == commands.INVALID_OP and acc[i]]
  if invalid_accepted:
    raise ValueError(f"decisions {invalid_accepted[:5]} have op {commands.INVALID_OP!r} but are "
                     "marked accepted")
  if not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(c > 1):
    raise ValueError(f"costs must be finite and in [0, 1], got {c}")
  scored = acc & ~np.isnan(rl)
  if np.any(np.isinf(rl)) or np.any(rl[scored] < 0) or np.any(rl[scored] > 1):
    raise ValueError("r_local scores must lie in [0, 1] (NaN = not scored)")

  mode = config.mode
  check_mode(mode)
  def traj_adv(values, name, required):
    if values is None:
      if required:
        raise ValueError(f"mode {mode!r} requires {name}")
      return np.zeros(m, np.float64)
    v = np.asarray(values, np.float64)
    if v.shape != (m,):
      raise ValueError(f"{name} must have shape ({m},), got {v.shape}")
    if np.any(v < 0) or np.any(v > 1):
      raise ValueError(f"{name} must lie in [0, 1], got {v}")
    return group_advantages(v, g, config)

  traj_a_global = traj_adv(r_global, 'r_global', mode not in TASK_MODES)
  traj_a_task = traj_adv(r_task, 'r_task', mode in TASK_MODES)

  uses_local = mode in LOCAL_MODES
  if uses_local:
    if running_stats is None:
      raise ValueError(f"mode {mode!r} needs running_stats (RunningStats)")
    a_local, local_ops = local_advantages(ops, rl, scored, config, running_stats)
  else:
    a_local, local_ops = np.zeros(n, np.float64), {}

  a_global = traj_a_global[tidx]
  a_task = traj_a_task[tidx]
  a_hier = MODE_FORMULAS[mode](a_local, a_global, a_task, c, config)
  num_floored = 0
  if config.rejection_floor == 'below_executable':
    a_hier, num_floored = floor_rejections(a_hier, acc, c, config)
  preference = rejection_preference(a_hier, acc)

  if uses_local and update_running_stats:
    ops_arr = np.asarray(ops, object)
    for op in commands.ALL_OPS:  # one EMA step per type from this update's moments
      sel = scored & (ops_arr == op)
      if sel.any():
        running_stats.update(op, rl[sel])

  metrics = {
      'advantage/num_decisions': float(n),
      'advantage/num_trajectories': float(m),
      'advantage/num_rejected': float((~acc).sum()),
      'advantage/num_scored': float(scored.sum()),
      'advantage/num_accepted_unscored': float((acc & np.isnan(rl)).sum()),
      'advantage/a_hier_mean': float(a_hier.mean()) if n else 0.0,
      'advantage/a_hier_std': float(a_hier.std()) if n else 0.0,
      'advantage/a_local_mean': float(a_local.mean()) if n else 0.0,
      'advantage/a_global_mean': float(a_global.mean()) if n else 0.0,
      'advantage/a_task_mean': float(a_task.mean()) if n else 0.0,
      'advantage/cost_mean': float(c.mean()) if n else 0.0,
      'advantage/num_rejections_floored': float(num_floored),
  }
  # Absent when undefined (module docstring): no NaN in metrics.jsonl.
  for key, value in (('advantage/rejection_preference_share', preference.share),
                     ('advantage/a_hier_rejected_mean', preference.rejected_mean),
                     ('advantage/a_hier_executable_mean', preference.executable_mean)):
    if not math.isnan(value):
      metrics[key] = value
  for op, s in local_ops.items():
    metrics[f'advantage/local_{op}_count'] = float(s.count)
    metrics[f'advantage/local_{op}_uses_batch'] = float(s.source == 'batch')
    metrics[f'advantage/local_{op}_uses_running'] = float(s.source == 'running')
  return Advantages(a_hier=a_hier, a_local=a_local, a_global=a_global, a_task=a_task,
                    costs=c, traj_a_global=traj_a_global, traj_a_task=traj_a_task,
                    local_ops=local_ops, metrics=metrics)
