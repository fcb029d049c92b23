"""What one RL phase needs before its first update, built once from the config
(SPEC §4-6; paper App. B, D.5, F.4).

`build_setup(config)` returns a `PhaseSetup`: the policy's tokenizer and model config,
the phase's train / internal-dev episodes (SPEC §4: built from the HotpotQA train
split's 90% construction / 10% internal-dev pools), the task solver π_task, the local +
global verifier, and the library settings (executor, environment, advantages, rewards,
learner batching, sampling, rollout groups, loss, optimizer). Checks before the first
rollout: the tokenizer fits the policy's and an 'llm' solver checkpoint's vocabularies
(that checkpoint is loaded onto the training mesh, `train/setup.py`, and read without
activation constraints), and a verifier with `preflight()` (OpenAI-compatible HTTP) must
answer one request.

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
import ml_collections

from vermem_jax.envs import episode_types
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax.envs.scenarios import spec as scenario_spec
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.models import qwen_config
from vermem_jax.rl import advantages as adv
from vermem_jax.rl import batching
from vermem_jax.rl import policy as policy_lib
from vermem_jax.rl import rewards as rw
from vermem_jax.rl import rollout
from vermem_jax.rl import running_stats
from vermem_jax.rl import running_stats_init
from vermem_jax import config_util
from vermem_jax.verifiers import backends
from vermem_jax.verifiers import base as vbase
from vermem_jax.train import optim
from vermem_jax.train import rl_learner
from vermem_jax.train import rl_optimizer
from vermem_jax.train import setup as setup_lib
from vermem_jax.train import task_solver_setup

# SPEC §4: the curriculum θ_SFT -> θ_A -> θ_B -> θ_C; each RL phase starts from, and
# regularizes towards, the previous phase's parameters.
PREVIOUS_PHASE = {'phase_a': 'sft', 'phase_b': 'phase_a', 'phase_c': 'phase_b'}
RL_PHASES = tuple(PREVIOUS_PHASE)


def _section(config: ml_collections.ConfigDict, name: str) -> dict[str, Any]:
  return config[name].to_dict()



@dataclasses.dataclass
class PhaseSetup:
  """Everything a phase's updates need, built once from the config.

  Attributes:
    phase, op_space: 'phase_b', 'B' (memory.commands.PHASE_OP_SPACE).
    tokenizer, model_config: the policy's.
    train_specs, dev_specs: the phase's train / internal-dev episodes (SPEC §4).
    solver: π_task; verifier: local + global verifier.
    executor_config, env_config, advantage_config, reward_config, batching_config,
    sampling_config, rollout_config: library settings.
    loss, opt, ppo: learner settings.
    construction, dev_pool: the HotpotQA pools (SPEC §4 90/10 split).
  """
  phase: str
  op_space: str
  tokenizer: Any
  model_config: qwen_config.QwenConfig
  train_specs: list
  dev_specs: list
  solver: Any
  verifier: Any
  executor_config: ExecutorConfig
  env_config: episode_types.EnvConfig
  advantage_config: adv.AdvantageConfig
  reward_config: rw.RewardConfig
  batching_config: batching.BatchingConfig
  sampling_config: policy_lib.PolicySamplingConfig
  rollout_config: rollout.RolloutConfig
  loss: rl_learner.LossConfig
  opt: optim.OptimizerConfig
  ppo: rl_optimizer.PPOConfig
  construction: list
  dev_pool: list

  @property
  def collect(self) -> rollout.CollectConfig:
    """How an update's rollouts are run and scored."""
    return rollout.CollectConfig(
        rollouts_per_task=self.rollout_config.rollouts_per_task,
        executor_config=self.executor_config, env_config=self.env_config,
        advantage_config=self.advantage_config, reward_config=self.reward_config)

  @property
  def learner(self) -> rl_learner.LearnerConfig:
    """The learner update's settings."""
    return rl_learner.LearnerConfig(
        model_config=self.model_config, batching_config=self.batching_config,
        opt=self.opt, loss=self.loss, ppo=self.ppo,
        pad_id=int(self.tokenizer.pad_token_id))


def check_phase(config: ml_collections.ConfigDict) -> str:
  """config.phase ('phase_a' | 'phase_b' | 'phase_c') after the RL-only field checks.

  Raises:
    ValueError: config.phase not an RL phase, rl.entropy_coef != 0 (SPEC §6: no
      entropy bonus), or rl.num_updates < 1.
  """
  phase = config.phase
  if phase not in RL_PHASES:
    raise ValueError(f'config.phase: run_rl_phase trains {RL_PHASES}, got {phase!r}')
  if config.rl.entropy_coef != 0:
    raise ValueError('config.rl.entropy_coef: SPEC §6 uses no entropy bonus and this '
                     f'trainer implements none; got {config.rl.entropy_coef}')
  if int(config.rl.num_updates) < 1:
    raise ValueError(f'config.rl.num_updates: must be >= 1, got {config.rl.num_updates}')
  return phase


def check_tasks_split(config: ml_collections.ConfigDict, num_processes: int) -> None:
  """Each process of a multi-host run collects whole task groups of every update.

  Raises:
    ValueError: `rl.tasks_per_update` below the number of processes (names the field).
  """
  if int(config.rl.tasks_per_update) < int(num_processes):
    raise ValueError(f'config.rl.tasks_per_update: {config.rl.tasks_per_update} tasks per '
                     f'update cannot be split over {num_processes} processes (each '
                     'process collects whole task groups); use at least one task per '
                     'process')


def build_setup(config: ml_collections.ConfigDict, *, solver_params: Any = None,
                mesh: jax.sharding.Mesh | None = None,
                num_processes: int = 1) -> PhaseSetup:
  """Tokenizer, episodes, solver, verifier and library configs of one phase.

  Checks before any rollout: the tokenizer fits the policy's (and an 'llm' solver
  checkpoint's) vocabulary (`tokenization.check_tokenizer_model_compat`), and a
  verifier with a `preflight()` (the OpenAI-compatible backend) answers one request.

  Args:
    config: the phase config (experiments/configs/phase_*.py).
    solver_params: parameters for an 'llm' task solver without its own checkpoint.
    mesh: where an 'llm' solver checkpoint's parameters are placed (sharded like the
      policy's); None = the default device.
    num_processes: processes of a multi-host run; each collects a block of every
      update's tasks, so `rl.tasks_per_update` must be at least this.
  Raises:
    ValueError: a bad config field (named), e.g. an 'llm' solver without weights, a
      tokenizer whose ids exceed a model's vocab_size, or an unreachable verifier.
  """
  phase = check_phase(config)
  check_tasks_split(config, num_processes)
  op_space = mcommands.PHASE_OP_SPACE[phase]
  mc = setup_lib.model_config_from(config)
  tok = setup_lib.load_tokenizer_for(config, mc)
  exec_cfg = config_util.dataclass_from_mapping(
      ExecutorConfig, _section(config, 'memory'), overrides={'phase': op_space})
  env_cfg = episode_types.EnvConfig.from_config(_section(config, 'episodes'))
  scen_cfg = scenario_spec.ScenarioConfig.from_config(_section(config, 'episodes'))
  construction, dev_pool = episodes.load_pools(
      hotpotqa.DataConfig.from_config(_section(config, 'data')))
  train_specs, dev_specs = episodes.build_phase_episodes(
      op_space, construction, dev_pool, count_tokens=tok.count_tokens, config=scen_cfg)
  if len(train_specs) < int(config.rl.tasks_per_update):
    raise ValueError(f'config.episodes.num_train: {len(train_specs)} train episodes < '
                     f'rl.tasks_per_update={config.rl.tasks_per_update}')
  # The oracle may hold the labels of both pools (train rollouts and dev scoring).
  solver = task_solver_setup.make_task_solver(
      config, tok, list(construction) + list(dev_pool), solver_params=solver_params,
      mesh=mesh)
  verifier = backends.make_verifier(
      config_util.dataclass_from_mapping(vbase.VerifierConfig, _section(config, 'verifier')))
  if hasattr(verifier, 'preflight'):
    # Transport failures become fallback scores during scoring; fail now instead.
    verifier.preflight()
  sampling_cfg = config_util.dataclass_from_mapping(policy_lib.PolicySamplingConfig, _section(config, 'sampling'))
  bcfg = rl_learner.learner_batching_config(
      config_util.dataclass_from_mapping(batching.BatchingConfig, _section(config, 'batching')),
      policy_input_limit=exec_cfg.policy_input_limit,
      prompt_overhead=policy_lib.prompt_overhead_tokens(tok),
      max_command_tokens=sampling_cfg.max_command_tokens)
  if not sampling_cfg.temperature > 0:
    raise ValueError('config.sampling.temperature: RL rollouts sample (SPEC §4: 0.7); '
                     f'got {sampling_cfg.temperature}')
  loss = loss_config_from(config)
  return PhaseSetup(
      phase=phase, op_space=op_space, tokenizer=tok, model_config=mc,
      train_specs=list(train_specs), dev_specs=list(dev_specs), solver=solver,
      verifier=verifier, executor_config=exec_cfg, env_config=env_cfg,
      advantage_config=config_util.dataclass_from_mapping(adv.AdvantageConfig, _section(config, 'advantage')),
      reward_config=config_util.dataclass_from_mapping(rw.RewardConfig, _section(config, 'reward')),
      batching_config=bcfg, sampling_config=sampling_cfg,
      rollout_config=rollout.RolloutConfig.from_config(_section(config, 'rl')),
      loss=loss, opt=rl_optimizer.optimizer_config_from(config),
      ppo=rl_optimizer.PPOConfig(int(config.rl.num_iterations),
                               int(config.rl.mini_batches_per_iteration)),
      construction=list(construction), dev_pool=list(dev_pool))


def loss_config_from(config: ml_collections.ConfigDict) -> rl_learner.LossConfig:
  """The learner's LossConfig from `rl` (loss temperature: rl.loss_temperature, or
  sampling.temperature when None)."""
  r = config.rl
  temperature = r.loss_temperature
  if temperature is None:
    temperature = config.sampling.temperature
  return rl_learner.LossConfig(
      clip_epsilon=float(r.clip_epsilon), kl_beta=float(r.kl_beta),
      kl_estimator=str(r.kl_estimator), temperature=float(temperature),
      old_logprobs=str(r.old_logprobs), max_log_ratio=float(r.max_log_ratio))


def dev_transitions(config: ml_collections.ConfigDict,
                    setup: PhaseSetup) -> list[vbase.LocalVerifierInput]:
  """Executable internal-dev transitions for the running-statistics init (SPEC §6).

  SFT dev records (balanced over the 8 decision types, `advantage.
  running_stats_init_count` per type, built from the internal-dev pool with the SFT
  templates) first, then the reference commands of the phase's dev episodes. When the
  dev pool cannot fill that many SFT records per type, the SFT part is skipped with a
  warning (the episodes' transitions remain).
  """
  count = int(config.advantage.running_stats_init_count)
  tok = setup.tokenizer
  out: list[vbase.LocalVerifierInput] = []
  sft_cfg = sft_config.SFTDataConfig.from_config(
      _section(config, 'sft'), seed=config.episodes.seed, train_per_target=1,
      dev_per_target=count, teacher_backend=None,
      context_budget=config.memory.context_budget,
      policy_input_limit=config.memory.policy_input_limit,
      local_ids=bool(config.memory.get('local_ids', False)),
      max_doc_sentences=config.episodes.max_doc_sentences,
      max_doc_tokens=config.episodes.max_doc_tokens)
  try:
    _, dev_records, _ = sft_build.build_sft_set(
        setup.construction, setup.dev_pool, count_tokens=tok.count_tokens,
        config=sft_cfg, verbose=False)
    out += running_stats_init.dev_inputs_from_sft_records(
        dev_records, count_tokens=tok.count_tokens,
        executor_config=setup.executor_config)
  except ValueError as e:
    logging.warning('running statistics: no SFT dev records (%s); using the dev '
                    'episodes only', e)
  out += running_stats_init.dev_inputs_from_episodes(
      setup.dev_specs, count_tokens=tok.count_tokens,
      executor_config=setup.executor_config)
  return out


def init_running_stats(config: ml_collections.ConfigDict,
                       setup: PhaseSetup) -> tuple[running_stats.RunningStats, dict[str, int]]:
  """Fresh phase RunningStats from scored dev transitions (SPEC §6, App. F.4)."""
  ops = mcommands.PHASE_OPS[setup.op_space]
  return running_stats_init.init_running_stats_from_dev(
      setup.verifier, dev_transitions(config, setup), ops=ops,
      count=int(config.advantage.running_stats_init_count),
      decay=setup.advantage_config.running_stats_decay)
