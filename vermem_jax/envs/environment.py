"""The episode loop (paper Appendix A.1; SPEC §4), batched over many live episodes.

One memory-decision step t of an episode:
  1. x_t = g(s_t)                                   (memory.render_policy_input)
  2. u_t ~ π_θ(· | x_t)                              (the `policy` callable)
  3. s̃_t = T_m(s_t, u_t)                            (memory.execute; ∅ is the identity)
  4. b_t = π_task(q, C̃_t)                           (the task solver)
  5. s_{t+1} = T_e(s̃_t, b_t, z_{t+1})               (memory.interact; z from the schedule)
until a final answer, the environment's end, the rollout limit or the token budget.

`run_episodes` advances many episodes in lock step: at every step the policy inputs of
all live episodes go to ONE batched policy call and their solver inputs to ONE batched
solver call, so a JAX sampler serves the whole batch at once (the rollout collector
runs K copies of one EpisodeSpec this way; states are immutable, so copies share the
initial state safely).

Termination (checked in this order after step 4 of decision t):
  - 'token_budget': the episode's online tokens exceed `token_budget`. When the policy
    call alone crosses it, the solver is not called; a reply that crosses it does not
    count (final_answer None). The decision gets a 'budget_exceeded' violation (SPEC
    §3: terminal budget violations attach to the last decision before termination).
  - 'answer': the solver gave a final answer.
  - 'env_end': the observation schedule is exhausted (the solver continued but the
    environment has nothing more to reveal).
  - 'rollout_limit': t + 1 == max_decisions; also a 'budget_exceeded' violation on
    the decision (decision: the rollout limit is the interaction budget of SPEC §3).
  A terminated episode still gets s_{t+1} = T_e(s̃_t, b_t, ∅): its task action enters H.
The solver input of a decision after which no observation can come (the schedule is
exhausted or the rollout limit is reached) has `final=True`: the solver must answer
then (paper C.1: when the passages run out the solver answers).
Otherwise z_{t+1} = observations[t] enters through T_e. An observation that does not
fit C's budget stays in H only and its overflow cost is charged to decision t.
A decision's total cost is capped at ExecutorConfig.cost_cap (SPEC §3).

Online tokens (TN, SPEC §7): every policy and solver call's input and output tokens,
the whole prompt counted again at each call. Task steps: solver calls (a decision
before the spec's `answer_from` has none: the query is not posed yet). Tool calls (TC):
decisions whose command named a non-null tool (accepted or rejected; ∅ and unparseable
text are not tool calls).

The policy only ever sees x_t. Labels (answer, supporting facts) live in
`EpisodeSpec.example`, and the stale texts planted in M_0 in `EpisodeSpec.stale_texts`,
for rewards and the oracle reader; they are never rendered.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from vermem_jax import config_util
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import task_solvers
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import interaction
from vermem_jax.memory import serialization
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
  """A task instance ready to run: the initial state and its environment schedule.

  Attributes:
    episode_id: unique id of the episode (records, logs).
    example: the HotpotQA example (labels for rewards / the oracle; never rendered).
    initial_state: s_0 = (q, M_0, C_0, H_0) (memory.MemoryState).
    observations: z_1, z_2, ... revealed after decisions 0, 1, ...
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
      baseline of paper C.4, which has no memory policy. False (every VerMem episode):
      an observation that does not fit stays in H only.
  """
  episode_id: str
  example: hotpotqa.Example
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

  def __post_init__(self):
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

  @property
  def command(self) -> str:
    return self.policy_output.text

  @property
  def solver_called(self) -> bool:
    """Whether the task solver was asked at this decision (not before `answer_from`,
    nor when the policy call alone exhausted the token budget)."""
    return self.solver_output is not _NOT_ASKED


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


def executor_config_for(spec: EpisodeSpec,
                        base: mexec.ExecutorConfig) -> mexec.ExecutorConfig:
  """The ExecutorConfig of one episode: `base` with the spec's phase/op subspace."""
  return dataclasses.replace(base, phase=spec.phase, allowed_ops=spec.allowed_ops)


def render_solver_context(state: mstate.MemoryState,
                          reads: str = SOLVER_READS_CONTEXT) -> str:
  """What the task solver reads, one text block per record: C̃_t's items in context
  order, or (reads='ltm') the current content of the active LTM entries in M order.

  Each record's text passes through `memory.serialization.escape_markup`: trusted
  environment text (observations, HotpotQA sentences) may hold special-token text
  such as "<|im_end|>", which would otherwise end the solver's chat turn. The raw
  texts stay available as `solver_records` (the oracle reader compares those).
  """
  esc = serialization.escape_markup
  if reads == SOLVER_READS_LTM:
    return "\n\n".join(esc(e.content) for e in state.active_entries())
  return "\n\n".join(esc(it.text) for it in state.C)


def context_evidence(state: mstate.MemoryState,
                     reads: str = SOLVER_READS_CONTEXT) -> frozenset[str]:
  """Evidence-unit ids behind what the solver reads (transitive provenance computed by
  the executor: C items' `evidence`, or the active LTM entries' current versions')."""
  refs = set()
  if reads == SOLVER_READS_LTM:
    for e in state.active_entries():
      refs.update(e.current.evidence)
  else:
    for it in state.C:
      refs.update(it.evidence)
  return frozenset(refs)


def solver_records(state: mstate.MemoryState, reads: str = SOLVER_READS_CONTEXT,
                   ) -> tuple[task_solvers.SolverRecord, ...]:
  """The records the task solver reads, each with its evidence: C̃_t's items in context
  order, or (reads='ltm') the active LTM entries' current versions in M order (the
  blocks of `render_solver_context`, same order, as raw unescaped texts)."""
  if reads == SOLVER_READS_LTM:
    return tuple(task_solvers.SolverRecord(e.content, frozenset(e.current.evidence))
                 for e in state.active_entries())
  return tuple(task_solvers.SolverRecord(it.text, frozenset(it.evidence))
               for it in state.C)


def solver_input(spec: EpisodeSpec, state: mstate.MemoryState, *,
                 final: bool = False) -> task_solvers.SolverInput:
  """The task solver's view of s̃_t: q and C̃_t (or M's active entries, per spec), with
  the records' provenance and the spec's private stale texts (oracle only). `final`:
  no observation follows this call (the solver must answer now)."""
  reads = spec.answer_context
  return task_solvers.SolverInput(task_id=spec.example.id, question=state.q,
                                  context=render_solver_context(state, reads),
                                  source_refs=context_evidence(state, reads),
                                  records=solver_records(state, reads),
                                  stale_texts=frozenset(spec.stale_texts),
                                  final=final)


# b_t of a decision before the query is posed: no solver call, nothing recorded in H.
_NOT_ASKED = task_solvers.SolverOutput(kind=task_solvers.CONTINUE, answer=None, text="")


@dataclasses.dataclass
class _Live:
  """Mutable progress of one episode inside run_episodes."""
  spec: EpisodeSpec
  config: mexec.ExecutorConfig
  max_decisions: int
  token_budget: Optional[int]
  state: mstate.MemoryState
  decisions: list = dataclasses.field(default_factory=list)
  tokens: list = dataclasses.field(default_factory=lambda: [0, 0, 0, 0])
  tool_calls: int = 0
  rejected_tool_calls: int = 0
  task_steps: int = 0
  final_answer: Optional[str] = None
  terminated_by: Optional[str] = None

  @property
  def online_tokens(self) -> int:
    return sum(self.tokens)

  @property
  def last_decision(self) -> bool:
    """No observation can follow the current decision (schedule or rollout limit)."""
    t = len(self.decisions)
    return t >= len(self.spec.observations) or t + 1 >= self.max_decisions

  def over_budget(self, extra: int = 0) -> bool:
    return (self.token_budget is not None
            and self.online_tokens + int(extra) > self.token_budget)


def _violation(kind: str, config: mexec.ExecutorConfig, message: str) -> mexec.Violation:
  return mexec.Violation(kind=kind, cost=config.cost(kind), message=message)


def run_episodes(episodes: Sequence[EpisodeSpec], policy: Policy,
                 solver: task_solvers.TaskSolver, *,
                 count_tokens: Callable[[str], int],
                 executor_config: mexec.ExecutorConfig = mexec.ExecutorConfig(),
                 env_config: EnvConfig = EnvConfig()) -> list[EpisodeResult]:
  """Runs all episodes to termination, batching policy and solver calls across them.

  Args:
    episodes: EpisodeSpecs (the same spec may appear K times for a GRPO group).
    policy: batched callable, list of x_t strings -> list of PolicyOutput (same length).
    solver: a TaskSolver; called once per step on all live episodes.
    count_tokens: `str -> int` of the backbone tokenizer (C budget, g(s) limit).
    executor_config: base ExecutorConfig (budgets, costs); phase/allowed ops come from
      each spec.
    env_config: default rollout limit and token budget.

  Returns:
    One EpisodeResult per spec, in input order.

  Raises:
    ValueError: the policy or solver returned a different number of outputs than
      inputs, or a spec has max_decisions < 1.
  """
  live = []
  for spec in episodes:
    max_dec = spec.max_decisions if spec.max_decisions is not None else (
        env_config.rollout_limit)
    if max_dec < 1:
      raise ValueError(f"episode {spec.episode_id}: max_decisions must be >= 1, "
                       f"got {max_dec}")
    budget = spec.token_budget if spec.token_budget is not None else (
        env_config.token_budget)
    live.append(_Live(spec, executor_config_for(spec, executor_config), max_dec,
                      budget, spec.initial_state))

  active = list(live)
  while active:
    inputs = [serialization.render_policy_input(
        ep.state, count_tokens, allowed_ops=ep.config.ops,
        limit=ep.config.policy_input_limit, context_budget=ep.config.context_budget)
              for ep in active]
    outputs = list(policy(inputs))
    if len(outputs) != len(active):
      raise ValueError(f"policy returned {len(outputs)} outputs for {len(active)} inputs")
    transitions = []
    for ep, out in zip(active, outputs):
      if isinstance(out, str):
        out = PolicyOutput(out)
      transitions.append((out, mexec.execute(ep.state, out.text, ep.config, count_tokens)))
    # The solver is asked once the query is posed, and only while the episode is still
    # within its token budget after this policy call (a hard budget stops the episode).
    asked = [i for i, ep in enumerate(active)
             if len(ep.decisions) >= ep.spec.answer_from
             and not ep.over_budget(transitions[i][0].input_tokens
                                    + transitions[i][0].output_tokens)]
    answers = list(solver.solve([solver_input(active[i].spec,
                                              transitions[i][1].state_after,
                                              final=active[i].last_decision)
                                 for i in asked])) if asked else []
    if len(answers) != len(asked):
      raise ValueError(f"solver returned {len(answers)} outputs for {len(asked)} inputs")
    solver_outs = [_NOT_ASKED] * len(active)
    for i, b in zip(asked, answers):
      solver_outs[i] = b
      active[i].task_steps += 1
    still = []
    for ep, x, (out, tr), b in zip(active, inputs, transitions, solver_outs):
      if _advance(ep, x, out, tr, b, count_tokens):
        still.append(ep)
    active = still

  return [EpisodeResult(
      spec=ep.spec, decisions=tuple(ep.decisions), final_state=ep.state,
      final_answer=ep.final_answer, terminated_by=ep.terminated_by,
      policy_input_tokens=ep.tokens[0], policy_output_tokens=ep.tokens[1],
      solver_input_tokens=ep.tokens[2], solver_output_tokens=ep.tokens[3],
      task_steps=ep.task_steps, tool_calls=ep.tool_calls,
      rejected_tool_calls=ep.rejected_tool_calls) for ep in live]


def _advance(ep: _Live, x: str, out: PolicyOutput, tr: mexec.Transition,
             b: task_solvers.SolverOutput, count_tokens: Callable[[str], int]) -> bool:
  """Books decision t of `ep` and applies T_e; returns whether the episode goes on."""
  t = len(ep.decisions)
  ep.tokens[0] += int(out.input_tokens)
  ep.tokens[1] += int(out.output_tokens)
  ep.tokens[2] += int(b.input_tokens)
  ep.tokens[3] += int(b.output_tokens)
  ep.tool_calls += int(tr.is_tool_call and tr.accepted)
  ep.rejected_tool_calls += int(tr.is_tool_call and not tr.accepted)
  violations = list(tr.violations)

  observation = None
  if ep.over_budget():
    ep.terminated_by = "token_budget"
    violations.append(_violation(
        "budget_exceeded", ep.config,
        f"online tokens {ep.online_tokens} exceed the episode budget {ep.token_budget}"))
  elif b.kind == task_solvers.ANSWER:
    ep.terminated_by = "answer"
    ep.final_answer = b.answer
  elif t >= len(ep.spec.observations):
    ep.terminated_by = "env_end"
  elif t + 1 >= ep.max_decisions:
    ep.terminated_by = "rollout_limit"
    violations.append(_violation(
        "budget_exceeded", ep.config,
        f"rollout limit of {ep.max_decisions} decisions reached without an answer"))
  else:
    observation = ep.spec.observations[t]

  if observation is None:
    next_state, overflow = interaction.interact(
        tr.state_after, b.text, None, count_tokens, ep.config)
  else:
    next_state, overflow = interaction.interact(
        tr.state_after, b.text, observation.text, count_tokens, ep.config,
        observation_refs=observation.source_refs, task_state=observation.task_state,
        protected=observation.protected,
        evict_oldest=ep.spec.evict_oldest_observations)
  if overflow:
    violations.append(mexec.Violation(
        kind="context_overflow", cost=float(overflow),
        message="the observation did not fit the active-context budget; kept in H only"))
  per_kind = {}
  for v in violations:  # SPEC §3: summed over distinct kinds, then capped.
    per_kind[v.kind] = max(per_kind.get(v.kind, 0.0), v.cost)
  cost = min(ep.config.cost_cap, sum(per_kind.values()))

  ep.decisions.append(DecisionRecord(
      step=t, policy_input=x, policy_output=out, op=tr.op, accepted=tr.accepted,
      violations=tuple(violations), cost=cost, is_tool_call=tr.is_tool_call,
      transition_message=tr.message, state=ep.state, state_after_memory=tr.state_after,
      next_state=next_state, solver_output=b, observation=observation, transition=tr))
  ep.state = next_state
  return ep.terminated_by is None
