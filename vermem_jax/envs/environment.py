"""The episode loop (paper Appendix A.1; SPEC §4), batched over many live episodes.

One memory-decision step t of an episode:
  1. x_t = g(s_t)                                   (memory.render_policy_input)
  2. u_t ~ π_θ(· | x_t)                              (the `policy` callable)
  3. s̃_t = T_m(s_t, u_t)                            (memory.execute; ∅ is the identity)
  4. b_t = π_task(q, C̃_t)                           (the task solver)
  5. s_{t+1} = T_e(s̃_t, b_t, z_{t+1})               (memory.interact; z from the
                                                       schedule or from env.step(b_t))
until a final answer, the environment's end, the rollout limit or the token budget.

Two kinds of environment share the loop. A schedule episode (HotpotQA, the training
scenarios) reveals `spec.observations[t]` after decision t, whatever the solver did.
An interactive episode (`spec.env`, an `envs.interactive.InteractiveEnv`: ALFWorld,
ScienceWorld, PDDL, BabyAI; paper C.2) plays the solver's action b_t with
`env.step` and z_{t+1} is the environment's reply; the environment's `done` ends the
episode with its own success and progress (EpisodeResult.success / .progress).

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
  - interactive episodes: the action is played (a reply that crossed the budget
    above is never played, so an exhausted budget is unsuccessful) and its reply is
    z_{t+1}; 'env_end' when the environment is done (success, failure or its own
    step limit), else 'rollout_limit' as below (the decision limit is separate from
    the environment's step limit: a help command costs a decision, not a step).
    Their solver never ends an episode by answering.
  - 'answer': the solver gave a final answer.
  - 'env_end': the observation schedule is exhausted (the solver continued but the
    environment has nothing more to reveal).
  - 'rollout_limit': t + 1 == max_decisions; also a 'budget_exceeded' violation on
    the decision (decision: the rollout limit is the interaction budget of SPEC §3).
  A terminated schedule episode still gets s_{t+1} = T_e(s̃_t, b_t, ∅): its task action
  enters H; a terminated interactive episode gets the last reply as z_{t+1} too.
The solver input of a decision after which no observation can come (the schedule is
exhausted or the rollout limit is reached) has `final=True`: the solver must answer
then (paper C.1: when the passages run out the solver answers).
Otherwise z_{t+1} = observations[t] enters through T_e. An observation that T_e does
not admit into C (it would leave less than `ExecutorConfig.chunk_tokens` of the budget
free; memory.interaction) stays in H only and its overflow cost is charged to
decision t.
A decision's total cost is capped at ExecutorConfig.cost_cap (SPEC §3).

Online tokens (TN, SPEC §7): every policy and solver call's input and output tokens,
the whole prompt counted again at each call. Task steps: solver calls (a decision
before the spec's `answer_from` has none: the query is not posed yet). Tool calls (TC):
executed (accepted) non-null memory-tool calls; commands naming a tool that the executor
rejected are counted apart (`rejected_tool_calls`); ∅ and unparseable text are neither.

The policy only ever sees x_t. Labels (answer, supporting facts) live in
`EpisodeSpec.example`, and the stale texts planted in M_0 in `EpisodeSpec.stale_texts`,
for rewards and the oracle reader; they are never rendered.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from vermem_jax.envs import episode_types
from vermem_jax.envs import interactive
from vermem_jax.envs import task_solvers
from vermem_jax.envs.episode_types import (SOLVER_READS_CONTEXT, SOLVER_READS_LTM,
                                           DecisionRecord, EnvConfig, EpisodeResult,
                                           EpisodeSpec, Observation, Policy,
                                           PolicyOutput)
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import interaction
from vermem_jax.memory import serialization
from vermem_jax.memory import state as mstate


def executor_config_for(spec: EpisodeSpec,
                        base: mconfig.ExecutorConfig) -> mconfig.ExecutorConfig:
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
  return task_solvers.SolverInput(task_id=spec.task_id, question=state.q,
                                  context=render_solver_context(state, reads),
                                  source_refs=context_evidence(state, reads),
                                  records=solver_records(state, reads),
                                  stale_texts=frozenset(spec.stale_texts),
                                  final=final)


# The task state x_t shows during an interactive episode (our wording).
ENV_TASK_STATE_START = "acting in the environment; no action played yet"
ENV_TASK_STATE = "acting in the environment; {steps} actions played, the latest: {action}"


@dataclasses.dataclass
class _Live:
  """Mutable progress of one episode inside run_episodes."""
  spec: EpisodeSpec
  config: mconfig.ExecutorConfig
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
  success: bool = False
  progress: float = 0.0
  env_steps: int = 0

  @property
  def online_tokens(self) -> int:
    return sum(self.tokens)

  @property
  def last_decision(self) -> bool:
    """No observation can follow the current decision (schedule or rollout limit;
    an interactive environment always replies)."""
    t = len(self.decisions)
    if t + 1 >= self.max_decisions:
      return True
    return self.spec.env is None and t >= len(self.spec.observations)

  def over_budget(self, extra: int = 0) -> bool:
    return (self.token_budget is not None
            and self.online_tokens + int(extra) > self.token_budget)


def _violation(kind: str, config: mconfig.ExecutorConfig, message: str) -> mexec.Violation:
  return mexec.Violation(kind=kind, cost=config.cost(kind), message=message)


def run_episodes(episodes: Sequence[EpisodeSpec], policy: Policy,
                 solver: task_solvers.TaskSolver, *,
                 count_tokens: Callable[[str], int],
                 executor_config: mconfig.ExecutorConfig = mconfig.ExecutorConfig(),
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
      inputs, a spec has max_decisions < 1, or two specs share one interactive env.
    envs.interactive.EnvStateError: an interactive spec's env is not reset or is
      already done.
  """
  envs = [id(s.env) for s in episodes if s.env is not None]
  if len(set(envs)) != len(envs):
    raise ValueError("two episodes share one interactive environment; build one spec "
                     "(and env) per episode")
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
        limit=ep.config.policy_input_limit, context_budget=ep.config.context_budget,
        local_ids=ep.config.local_ids)
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
    solver_outs = [episode_types.NOT_ASKED] * len(active)
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
      rejected_tool_calls=ep.rejected_tool_calls, success=ep.success,
      progress=ep.progress, env_steps=ep.env_steps) for ep in live]


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
  action = env_step = None
  if ep.over_budget():
    ep.terminated_by = "token_budget"
    violations.append(_violation(
        "budget_exceeded", ep.config,
        f"online tokens {ep.online_tokens} exceed the episode budget {ep.token_budget}"))
  elif ep.spec.env is not None:
    if b is not episode_types.NOT_ASKED:
      action, env_step, observation = _play(ep, b)
    if env_step is not None and env_step.done:
      ep.terminated_by = "env_end"
  elif b.kind == task_solvers.ANSWER:
    ep.terminated_by = "answer"
    ep.final_answer = b.answer
  elif t >= len(ep.spec.observations):
    ep.terminated_by = "env_end"
  elif t + 1 < ep.max_decisions:
    observation = ep.spec.observations[t]
  if ep.terminated_by is None and t + 1 >= ep.max_decisions:
    ep.terminated_by = "rollout_limit"
    violations.append(_violation(
        "budget_exceeded", ep.config,
        f"rollout limit of {ep.max_decisions} decisions reached before the task ended"))

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
      next_state=next_state, solver_output=b, observation=observation, transition=tr,
      action=action, env_step=env_step))
  ep.state = next_state
  return ep.terminated_by is None


def _play(ep: _Live, b: task_solvers.SolverOutput):
  """Plays b_t in the episode's interactive env: (action, Step, Observation z_{t+1}).

  The action is b_t's parsed action, else its raw text (the environment then says it
  did not understand, and the step counts)."""
  action = interactive.normalize_action(b.action if b.action is not None else b.text)
  step = ep.spec.env.step(action)
  ep.success = bool(step.success)
  ep.progress = float(step.progress)
  ep.env_steps = int(step.info.get("steps", ep.env_steps))
  obs = Observation(text=step.observation, task_state=ENV_TASK_STATE.format(
      steps=ep.env_steps, action=action or "(none)"))
  return action, step, obs
