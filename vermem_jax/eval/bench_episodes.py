"""Memory episodes on the interactive benchmarks (paper Appendix C.1-C.2; SPEC §7).

ALFWorld, ScienceWorld, PDDL and BabyAI instances run through the same memory
environment and batched episode loop as HotpotQA evaluation and training
(`envs.environment.run_episodes`, one batched policy call per step across the live
episodes):

  s_0: M_0 and H_0 empty; C_0 = the (protected) instruction and the benchmark's first
       observation (`InteractiveEnv.reset`); q, the benchmark's task text, is part of
       the state and shown to policy and solver at every step.
  Each step: one memory decision on x_t = g(s_t), then the task solver proposes the
       next action from (q, C̃_t) (`envs.action_solvers`), the environment plays it and
       its reply z_{t+1} enters H and C through T_e.
  End: the environment is done (success, failure or its own step limit: 'env_end'),
       the decision limit is reached ('rollout_limit'), or the hard online-token
       budget is exhausted ('token_budget'; unsuccessful).

The outcome is the benchmark's own: `EpisodeResult.success` (ALFWorld `won`,
ScienceWorld score 100, PDDL goal reached, BabyAI mission verified) and `.progress`
(PDDL's progress rate; 1.0 on success). Base (paper C.4) is `episodes.base_policy`
with `base=True`: no memory decision, C keeps the newest observations that fit.
Environments are built, reset and closed here, one per episode (a ScienceWorld env
holds one JVM while it lives).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from vermem_jax.envs import environment
from vermem_jax.envs import episode_types
from vermem_jax.envs import interactive
from vermem_jax.envs import task_solvers
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import state as mstate

# The memory policy's instruction on the benchmarks (our wording; the same framing as
# the HotpotQA instruction, for a task that is acted out instead of answered).
INSTRUCTION_TEXT = (
    'Task: complete the task below by acting in a text environment. Observations '
    'arrive after each action; long-term memory and the episode history can bring '
    'earlier material back.')


def build_env_episode(env: interactive.InteractiveEnv, *,
                      count_tokens: Callable[[str], int], context_budget: int,
                      max_decisions: int, base: bool = False,
                      token_budget: Optional[int] = None, phase: str = 'C',
                      episode_id: Optional[str] = None) -> episode_types.EpisodeSpec:
  """Resets `env` and returns the evaluation episode of its instance (module
  docstring).

  Args:
    env: a fresh or finished InteractiveEnv; it is reset here and played by the loop.
    count_tokens: backbone `str -> int` token counter.
    context_budget: C_t budget in tokens; the first observation enters C_0 only if it
      fits beside the instruction (otherwise it is in H only, as later ones).
    max_decisions: the decision limit of the episode (separate from the env's step
      limit: a help command costs a decision, not a step).
    base: the Base baseline's context rule (newest observations that fit).
    token_budget: hard online-token budget (None: unlimited).
    phase: the policy's op space ('C': all tools; 'A'/'B' for an earlier phase's
      policy, as `eval.episodes.build_episode`).
    episode_id: defaults to the instance id.

  Returns:
    An EpisodeSpec over `phase`'s command space with `env` set, no HotpotQA
    example, answer_from = 0.

  Raises:
    ValueError: max_decisions < 1.
  """
  if max_decisions < 1:
    raise ValueError(f'max_decisions must be >= 1, got {max_decisions}')
  first = env.reset()
  state = mstate.new_state(env.instance_id, first.task, count_tokens,
                           instruction=INSTRUCTION_TEXT,
                           task_state=environment.ENV_TASK_STATE_START)
  # H_0 stays empty (paper C.2): the first observation is the initial input in C_0.
  if first.observation and (state.context_tokens() + count_tokens(first.observation)
                            <= context_budget):
    state, item_id = mstate.add_context(state, mstate.OBSERVATION, first.observation,
                                        count_tokens)
    state = state.evolve(env_item_id=item_id)
  return episode_types.EpisodeSpec(
      episode_id=episode_id or env.instance_id, example=None, initial_state=state,
      phase=phase, max_decisions=int(max_decisions), token_budget=token_budget,
      family=f'{env.benchmark}_test', answer_from=0,
      answer_context=episode_types.SOLVER_READS_CONTEXT,
      evict_oldest_observations=bool(base), env=env)


def run_instances(bench: interactive.Benchmark, bench_config: Any,
                  instances: Sequence[Any], policy: episode_types.Policy,
                  solver: task_solvers.TaskSolver, *, count_tokens: Callable[[str], int],
                  executor_config: mconfig.ExecutorConfig, max_decisions: int,
                  base: bool = False, token_budget: Optional[int] = None,
                  phase: str = 'C') -> list[episode_types.EpisodeResult]:
  """Runs one episode per instance, all advancing together, and closes their envs.

  Args:
    bench, bench_config: the Benchmark and its config (`bench.config_class`).
    instances: from `bench.instances(bench_config)` (a subsample of them).
    policy: batched `x_t list -> PolicyOutput list` (greedy sampler or base_policy).
    solver: an action solver (`envs.action_solvers`).
    count_tokens, executor_config: as `environment.run_episodes`.
    max_decisions, base, token_budget, phase: as `build_env_episode`.

  Returns:
    One EpisodeResult per instance, in order.
  """
  envs = []
  try:
    specs = []
    for inst in instances:
      envs.append(bench.make_env(inst, bench_config))
      specs.append(build_env_episode(
          envs[-1], count_tokens=count_tokens,
          context_budget=executor_config.context_budget, max_decisions=max_decisions,
          base=base, token_budget=token_budget, phase=phase))
    return environment.run_episodes(
        specs, policy, solver, count_tokens=count_tokens,
        executor_config=executor_config,
        env_config=episode_types.EnvConfig(rollout_limit=max_decisions))
  finally:
    for env in envs:
      env.close()
