"""What one RL phase needs before its first update, built once from its typed setup
(SPEC §4-6; paper App. B, D.5, F.4).

`build_setup(run)` turns the phase's typed setup (`train/run_setup.py`) into a
`PhaseSetup`: the policy's tokenizer, the phase's train / internal-dev episodes (SPEC
§4: built from the HotpotQA train split's 90% construction / 10% internal-dev pools),
the task solver π_task, the local + global verifier and the learner's batching. Checks
before the first rollout: the tokenizer fits the policy's and an 'llm' solver
checkpoint's vocabularies (that checkpoint is loaded onto the training mesh,
`train/setup.py`, and read without activation constraints), and a verifier with
`preflight()` (OpenAI-compatible HTTP) must answer one request.

Running local statistics (SPEC §6, App. F.4). At phase start a fresh `RunningStats` is
initialized from `advantage.running_stats_init_count` executable internal-dev
transitions per op type enabled in the phase (`init_running_stats`, through
`rl.running_stats_init.init_running_stats_from_dev`; candidates (`dev_transitions`):
the target commands of SFT dev records built from the internal-dev pool, then the
reference commands of the phase's dev episodes). They are updated after every update
batch by the rollout collector and saved in every checkpoint (`to_dict`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging
import jax

from vermem_jax.envs import episodes
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.memory import commands as mcommands
from vermem_jax.rl import batching
from vermem_jax.rl import policy as policy_lib
from vermem_jax.rl import rollout
from vermem_jax.rl import running_stats
from vermem_jax.rl import running_stats_init
from vermem_jax.verifiers import backends
from vermem_jax.verifiers import base as vbase
from vermem_jax.train import rl_learner
from vermem_jax.train import run_setup
from vermem_jax.train import setup as setup_lib
from vermem_jax.train import task_solver_setup


@dataclasses.dataclass
class PhaseSetup:
  """What a phase's updates need beyond its typed settings, built once.

  Attributes:
    run: the typed settings (`run_setup.RunSetup`; `run.rl` is set).
    tokenizer: the policy's.
    train_specs, dev_specs: the phase's train / internal-dev episodes (SPEC §4).
    solver: π_task; verifier: local + global verifier.
    batching_config: the learner's shapes (`rl_learner.learner_batching_config`).
    construction, dev_pool: the HotpotQA pools (SPEC §4 90/10 split).
  """
  run: run_setup.RunSetup
  tokenizer: Any
  train_specs: list
  dev_specs: list
  solver: Any
  verifier: Any
  batching_config: batching.BatchingConfig
  construction: list
  dev_pool: list

  @property
  def collect(self) -> rollout.CollectConfig:
    """How an update's rollouts are run and scored."""
    run = self.run
    return rollout.CollectConfig(
        rollouts_per_task=run.rl.rollout.rollouts_per_task,
        executor_config=run.executor, env_config=run.env,
        advantage_config=run.advantage, reward_config=run.reward)

  @property
  def learner(self) -> rl_learner.LearnerConfig:
    """The learner update's settings."""
    run = self.run
    return rl_learner.LearnerConfig(
        model_config=run.model.config, batching_config=self.batching_config,
        opt=run.rl.opt, loss=run.rl.loss, ppo=run.rl.ppo,
        pad_id=int(self.tokenizer.pad_token_id))


def check_tasks_split(tasks_per_update: int, num_processes: int) -> None:
  """Each process of a multi-host run collects whole task groups of every update.

  Raises:
    ValueError: `rl.tasks_per_update` below the number of processes (names the field).
  """
  if int(tasks_per_update) < int(num_processes):
    raise ValueError(f'config.rl.tasks_per_update: {tasks_per_update} tasks per '
                     f'update cannot be split over {num_processes} processes (each '
                     'process collects whole task groups); use at least one task per '
                     'process')


def build_setup(run: run_setup.RunSetup, *, solver_params: Any = None,
                mesh: jax.sharding.Mesh | None = None,
                num_processes: int = 1) -> PhaseSetup:
  """Tokenizer, episodes, solver, verifier and learner batching of one RL phase.

  Checks before any rollout: the tokenizer fits the policy's (and an 'llm' solver
  checkpoint's) vocabulary (`tokenization.check_tokenizer_model_compat`), and a
  verifier with a `preflight()` (the OpenAI-compatible backend) answers one request.

  Args:
    run: the phase's typed setup (`run.rl` set).
    solver_params: parameters for an 'llm' task solver without its own checkpoint.
    mesh: where an 'llm' solver checkpoint's parameters are placed (sharded like the
      policy's); None = the default device.
    num_processes: processes of a multi-host run; each collects a block of every
      update's tasks, so `rl.tasks_per_update` must be at least this.
  Raises:
    ValueError: a bad config field (named), e.g. an 'llm' solver without weights, a
      tokenizer whose ids exceed a model's vocab_size, or an unreachable verifier.
  """
  tasks = run.rl.rollout.tasks_per_update
  check_tasks_split(tasks, num_processes)
  mc = run.model.config
  tok = setup_lib.load_tokenizer(run.model.tokenizer_path, mc)
  construction, dev_pool = episodes.load_pools(run.data)
  train_specs, dev_specs = episodes.build_phase_episodes(
      run.executor.phase, construction, dev_pool, count_tokens=tok.count_tokens,
      config=run.scenario)
  if len(train_specs) < tasks:
    raise ValueError(f'config.episodes.num_train: {len(train_specs)} train episodes < '
                     f'rl.tasks_per_update={tasks}')
  # The oracle may hold the labels of both pools (train rollouts and dev scoring).
  solver = task_solver_setup.make_task_solver(
      run.solver, tok, list(construction) + list(dev_pool), solver_params=solver_params,
      model_config=mc, mesh=mesh)
  verifier = backends.make_verifier(run.verifier)
  if hasattr(verifier, 'preflight'):
    # Transport failures become fallback scores during scoring; fail now instead.
    verifier.preflight()
  bcfg = rl_learner.learner_batching_config(
      run.batching, policy_input_limit=run.executor.policy_input_limit,
      prompt_overhead=policy_lib.prompt_overhead_tokens(tok),
      max_command_tokens=run.sampling.max_command_tokens)
  return PhaseSetup(
      run=run, tokenizer=tok, train_specs=list(train_specs), dev_specs=list(dev_specs),
      solver=solver, verifier=verifier, batching_config=bcfg,
      construction=list(construction), dev_pool=list(dev_pool))


def dev_transitions(setup: PhaseSetup) -> list[vbase.LocalVerifierInput]:
  """Executable internal-dev transitions for the running-statistics init (SPEC §6).

  SFT dev records (balanced over the 8 decision types, `advantage.
  running_stats_init_count` per type, built from the internal-dev pool with the SFT
  templates) first, then the reference commands of the phase's dev episodes. When the
  dev pool cannot fill that many SFT records per type, the SFT part is skipped with a
  warning (the episodes' transitions remain).
  """
  tok, executor = setup.tokenizer, setup.run.executor
  out: list[vbase.LocalVerifierInput] = []
  try:
    _, dev_records, _ = sft_build.build_sft_set(
        setup.construction, setup.dev_pool, count_tokens=tok.count_tokens,
        config=setup.run.rl.running_stats_sft_data, verbose=False)
    out += running_stats_init.dev_inputs_from_sft_records(
        dev_records, count_tokens=tok.count_tokens, executor_config=executor)
  except ValueError as e:
    logging.warning('running statistics: no SFT dev records (%s); using the dev '
                    'episodes only', e)
  out += running_stats_init.dev_inputs_from_episodes(
      setup.dev_specs, count_tokens=tok.count_tokens, executor_config=executor)
  return out


def init_running_stats(setup: PhaseSetup) -> tuple[running_stats.RunningStats, dict[str, int]]:
  """Fresh phase RunningStats from scored dev transitions (SPEC §6, App. F.4)."""
  run = setup.run
  return running_stats_init.init_running_stats_from_dev(
      setup.verifier, dev_transitions(setup), ops=mcommands.PHASE_OPS[run.executor.phase],
      count=run.rl.running_stats_init_count,
      decay=run.advantage.running_stats_decay)
