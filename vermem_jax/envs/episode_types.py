"""The episode loop's data types (paper Appendix A.1; SPEC §4): what an episode is
(`EpisodeSpec`, its scheduled `Observation`s), what a policy returns (`PolicyOutput`),
and what a finished episode holds (`DecisionRecord`, `EpisodeResult`).

`vermem_jax.envs.environment` runs episodes over these types.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from vermem_jax import config_util
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import task_solvers
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import state as mstate

TERMINATION_REASONS = ("answer", "env_end", "rollout_limit", "token_budget")
# What the task solver reads: the active context C̃_t, or the active LTM entries of M_t
# (Phase A's delayed query is "answered from what LTM holds", SPEC §4).
SOLVER_READS_CONTEXT = "context"
SOLVER_READS_LTM = "ltm"
SOLVER_READS = (SOLVER_READS_CONTEXT, SOLVER_READS_LTM)


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """Episode-loop defaults (keys of config section `episodes`), used where a spec
  gives none.

  Attributes:
    rollout_limit: max memory decisions per episode. The paper leaves it to the
      configured protocol; decision: 16 (`config.episodes.rollout_limit`).
    token_budget: hard online-token budget per episode; None = unlimited. The
      budget-controlled frontier sets 1,000..5,000 (SPEC §7).
  """
  rollout_limit: int = 16
  token_budget: Optional[int] = None

  @classmethod
  def from_config(cls, section) -> "EnvConfig":
    """From a config section (dict-like), ignoring keys this class lacks."""
    return config_util.dataclass_from_mapping(cls, section)


@dataclasses.dataclass(frozen=True)
class Observation:
  """One environment observation z_{t+1} of the schedule.

  Attributes:
    text: what the environment reveals (e.g. a HotpotQA passage).
    source_refs: its evidence-unit ids ("{title}#{sent_id}"), environment provenance.
    task_state: new current environment state text (None keeps the old one).
    protected: the observation's C item is protected evidence (trusted).
  """
  text: str
  source_refs: tuple[str, ...] = ()
  task_state: Optional[str] = None
  protected: bool = False


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
  """A task instance ready to run: the initial state and its environment, either a
  fixed schedule of observations (HotpotQA, the training scenarios) or an interactive
  environment that answers the solver's actions (the agent benchmarks).

  Attributes:
    episode_id: unique id of the episode (records, logs).
    example: the HotpotQA example (labels for rewards / the oracle; never rendered);
      None for an interactive-benchmark episode.
    initial_state: s_0 = (q, M_0, C_0, H_0) (memory.MemoryState).
    observations: z_1, z_2, ... revealed after decisions 0, 1, ... (schedule episodes;
      must be empty when `env` is set).
    env: an `envs.interactive.InteractiveEnv` already reset (its task and first
      observation are in `initial_state`), or None. The loop plays each solver
      action with `env.step` and z_{t+1} is the reply; the environment's `done` ends
      the episode ('env_end') with its success and progress. One spec per env: the
      loop refuses two live episodes sharing one. The caller closes it.
    phase: 'A' | 'B' | 'C'; selects the allowed operation subspace.
    allowed_ops: explicit op names overriding the phase subspace (None: PHASE_OPS).
    max_decisions: rollout limit (None: EnvConfig.rollout_limit).
    token_budget: online-token budget (None: EnvConfig.token_budget).
    family: scenario family name (metrics only).
    answer_from: first decision index t at which the task solver is asked. Earlier
      decisions get no solver call (b_t is empty, no tokens, no task step): the query
      has not been posed yet (a delayed query posed by observation k means
      answer_from = k + 1). 0 = from the first decision (evaluation, SPEC §7).
    answer_context: what the solver reads, 'context' (C̃_t) or 'ltm' (the active LTM
      entries; Phase A's delayed query).
    stale_texts: private label (never rendered): texts of the stale / obsolete
      versions planted in M_0 (an outdated number, an incomplete version). They reach
      the task solver as `SolverInput.stale_texts`; the oracle reader refuses to
      answer while one of them is still what it reads (a stale entry left in place,
      or a conflict beside the corrected one). () when nothing stale was planted.
    evict_oldest_observations: T_e makes room for a new observation by dropping the
      oldest unprotected C items (`memory.interact(evict_oldest=True)`): the Base
      baseline of paper C.4, which has no memory policy, filling C's whole budget.
      False (every VerMem episode): an observation T_e does not admit (it would leave
      less than `ExecutorConfig.chunk_tokens` free) stays in H only.
  """
  episode_id: str
  example: Optional[hotpotqa.Example]
  initial_state: mstate.MemoryState
  observations: tuple[Observation, ...] = ()
  phase: str = "C"
  allowed_ops: Optional[tuple[str, ...]] = None
  max_decisions: Optional[int] = None
  token_budget: Optional[int] = None
  family: str = ""
  answer_from: int = 0
  answer_context: str = SOLVER_READS_CONTEXT
  stale_texts: tuple[str, ...] = ()
  evict_oldest_observations: bool = False
  # Last and defaulted, so positional construction with the fields above still works.
  env: Optional[Any] = None

  def __post_init__(self):
    if self.example is None and self.env is None:
      raise ValueError(f"episode {self.episode_id}: needs a HotpotQA example or an "
                       "interactive environment (env)")
    if self.env is not None and self.observations:
      raise ValueError(f"episode {self.episode_id}: an interactive episode gets its "
                       "observations from env.step; observations must be empty")
    if isinstance(self.stale_texts, str) or not all(
        isinstance(t, str) for t in self.stale_texts):
      raise ValueError(f"episode {self.episode_id}: stale_texts must be a tuple of "
                       f"strings, got {self.stale_texts!r}")
    object.__setattr__(self, "stale_texts", tuple(self.stale_texts))
    if self.answer_context not in SOLVER_READS:
      raise ValueError(f"episode {self.episode_id}: answer_context must be one of "
                       f"{SOLVER_READS}, got {self.answer_context!r}")
    if self.answer_from < 0:
      raise ValueError(f"episode {self.episode_id}: answer_from must be >= 0")

  @property
  def task_id(self) -> str:
    """The task instance id the solver is told: the HotpotQA question id, else the
    state's task id (a benchmark instance id)."""
    return self.example.id if self.example is not None else self.initial_state.task_id


@dataclasses.dataclass(frozen=True)
class PolicyOutput:
  """One generated command u_t and its token accounting.

  Attributes:
    text: the command text.
    input_tokens: tokens of the policy prompt (x_t in its chat template).
    output_tokens: generated tokens (stop token included).
    prompt_ids: optional prompt token ids [T_in] (rollout records).
    token_ids: optional command token ids [L] (rollout records; the trained tokens).
    logprobs: optional sampler logprobs of token_ids [L] (float).
  """
  text: str
  input_tokens: int = 0
  output_tokens: int = 0
  prompt_ids: Optional[tuple[int, ...]] = None
  token_ids: Optional[tuple[int, ...]] = None
  logprobs: Optional[tuple[float, ...]] = None


# A batched policy: policy inputs x_t (one per live episode) -> one PolicyOutput each.
# A plain command string is accepted in place of a PolicyOutput (zero token counts; for
# scripted policies whose cost is not measured).
Policy = Callable[[Sequence[str]], Sequence[PolicyOutput]]


@dataclasses.dataclass(frozen=True)
class DecisionRecord:
  """One memory decision of an episode.

  Attributes:
    step: decision index t.
    policy_input: x_t.
    policy_output: u_t with its token ids / logprobs when the policy provides them.
    op: op name ('Invalid' for text naming no tool).
    accepted: T_m committed the command (∅ included).
    violations: memory.Violation tuple: T_m's, then interaction overflow and the
      terminal budget violation when they apply.
    cost: c_{t,k} = min(cost_cap, sum of violation costs).
    is_tool_call: the command named a non-null tool (accepted or not; an executed
      call, counted in TC, when also `accepted`).
    transition_message: executor outcome or rejection reasons.
    state: s_t.
    state_after_memory: s̃_t.
    next_state: s_{t+1}.
    solver_output: the task action b_t.
    observation: z_{t+1} delivered after this decision, or None.
    transition: the executor's memory.Transition of u_t on s_t (its parsed `command`,
      None for unparseable text; its `state_after` is s̃_t and its `violations` are
      T_m's only). None only for a record built by hand.
    action: the action played in the interactive environment after this decision
      (b_t's action, normalised by the env), or None (no env, or no solver call).
    env_step: what `env.step(action)` returned (`envs.interactive.Step`:
      observation, done, success, progress, info), or None.
  """
  step: int
  policy_input: str
  policy_output: PolicyOutput
  op: str
  accepted: bool
  violations: tuple
  cost: float
  is_tool_call: bool
  transition_message: str
  state: mstate.MemoryState
  state_after_memory: mstate.MemoryState
  next_state: mstate.MemoryState
  solver_output: task_solvers.SolverOutput
  observation: Optional[Observation]
  # Last and defaulted, so positional construction with the fields above still works.
  transition: Optional[mexec.Transition] = None
  action: Optional[str] = None
  env_step: Optional[Any] = None

  @property
  def command(self) -> str:
    return self.policy_output.text

  @property
  def solver_called(self) -> bool:
    """Whether the task solver was asked at this decision (not before `answer_from`,
    nor when the policy call alone exhausted the token budget)."""
    return self.solver_output is not NOT_ASKED


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
  """A finished episode.

  Attributes:
    spec: the EpisodeSpec it ran.
    decisions: DecisionRecords in order (T_k = len(decisions)).
    final_state: s_{T_k}.
    final_answer: the solver's answer, or None.
    terminated_by: one of TERMINATION_REASONS.
    policy_input_tokens, policy_output_tokens, solver_input_tokens,
    solver_output_tokens: token sums over the episode's calls.
    task_steps: solver calls.
    tool_calls: executed (accepted) non-null memory-tool calls: TC and the online
      cost's call count (paper Eq. 15 / App. F.3 count executed calls; ∅ is a decision,
      not a call).
    rejected_tool_calls: commands naming a non-null tool that the executor rejected;
      not calls of the online cost (their cost c_{t,k} reaches P_aux), reported apart.
    success: interactive episodes: the benchmark's own success signal at the end
      (False when the token budget or the decision limit stopped it first); False
      for schedule episodes (HotpotQA success is scored from the answer).
    progress: interactive episodes: the running-best progress in [0, 1] (PDDL's
      progress rate; 1.0 on success); 0.0 for schedule episodes.
    env_steps: actions the environment counted (help commands excluded).
  """
  spec: EpisodeSpec
  decisions: tuple[DecisionRecord, ...]
  final_state: mstate.MemoryState
  final_answer: Optional[str]
  terminated_by: str
  policy_input_tokens: int
  policy_output_tokens: int
  solver_input_tokens: int
  solver_output_tokens: int
  task_steps: int
  tool_calls: int
  rejected_tool_calls: int = 0
  success: bool = False
  progress: float = 0.0
  env_steps: int = 0

  @property
  def online_tokens(self) -> int:
    """TN: all input and output tokens of the policy and solver calls (SPEC §7)."""
    return (self.policy_input_tokens + self.policy_output_tokens
            + self.solver_input_tokens + self.solver_output_tokens)

  @property
  def num_decisions(self) -> int:
    return len(self.decisions)

  @property
  def constraint_costs(self) -> tuple[float, ...]:
    return tuple(d.cost for d in self.decisions)


# The operation-mix name of a decision whose text is not a command. 'Invalid' (the op
# the executor records for it) is not used: on the interactive benchmarks an invalid
# action is one the environment refused.
UNPARSEABLE = 'Unparseable'


def decision_kind(d) -> str:
  """The operation-mix name of one decision (every op mix: RL rollouts, internal dev,
  evaluation): its tool when it is a tool call (executed or rejected, a tool outside
  the phase's set included), 'Null' for an accepted ∅, `UNPARSEABLE` for text that is
  not a command, whatever tool name it starts with.

  Args:
    d: a decision with `op`, `accepted` and `is_tool_call` (DecisionRecord,
      rl.rollout_records.RolloutDecision).
  """
  if d.is_tool_call or (d.op == mcommands.NULL and d.accepted):
    return d.op
  return UNPARSEABLE


# b_t of a decision before the query is posed: no solver call, nothing recorded in H.
NOT_ASKED = task_solvers.SolverOutput(kind=task_solvers.CONTINUE, answer=None, text="")
