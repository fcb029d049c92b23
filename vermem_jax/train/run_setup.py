"""The typed setup of one phase, built once from the experiment ConfigDict.

`RunSetup.from_config(config)` reads every section a training phase needs
(experiments/configs/parts/paper.py) into the library's frozen dataclasses, each of
which checks its own values, and makes the checks that span sections here, once. The
trainers (`train/sft.py:run_sft`, `train/rl_phase.py:run_rl_phase`,
`train/pretrain.py:run_pretrain`) build it first and
hand each function the typed part it reads; no code below them reads the ConfigDict.

  model      ModelSetup: QwenConfig, its name in the fingerprint, checkpoint folder,
             tokenizer folder, mesh sizes (sections `model`, `tokenizer`)
  executor   memory.ExecutorConfig in the phase's op space (section `memory`;
             memory.commands.PHASE_OP_SPACE)
  env, scenario, data   episodes and HotpotQA pools (sections `episodes`, `data`)
  sampling, batching    the sampler and the learner's shapes
  advantage, reward, verifier, solver   scoring of an RL update
  loop       phase_runner.LoopSettings (sections `checkpoint`, `metrics`)
  rl         RLSettings of an RL phase (section `rl`), else None
  sft        SFTSettings of the SFT phase (section `sft`), else None
  pretrain   pretrain_data.PretrainConfig of the tiny base's pretraining (section
             `pretrain`), else None

Cross-section checks (ValueError naming the field): an RL phase has no entropy bonus
(SPEC §6), at least one update and a sampling temperature > 0 (SPEC §4: 0.7);
pretraining starts from random weights (no `model.hf_checkpoint`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from vermem_jax import config_util
from vermem_jax.envs import episode_types
from vermem_jax.envs import hotpotqa
from vermem_jax.envs.scenarios import spec as scenario_spec
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax.memory import commands
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.models import qwen_config
from vermem_jax.rl import advantages
from vermem_jax.rl import batching
from vermem_jax.rl import policy
from vermem_jax.rl import rewards
from vermem_jax.rl import rollout
from vermem_jax.train import optim
from vermem_jax.train import phase_runner
from vermem_jax.train import pretrain_data
from vermem_jax.train import rl_learner
from vermem_jax.train import rl_optimizer
from vermem_jax.train import rl_selection
from vermem_jax.train import setup as setup_lib
from vermem_jax.train import task_solver_setup
from vermem_jax.verifiers import base as verifier_base

# SPEC §4: the curriculum θ_SFT -> θ_A -> θ_B -> θ_C; each RL phase starts from, and
# regularizes towards, the previous phase's parameters.
PREVIOUS_PHASE = {'phase_a': 'sft', 'phase_b': 'phase_a', 'phase_c': 'phase_b'}
RL_PHASES = tuple(PREVIOUS_PHASE)


@dataclasses.dataclass(frozen=True)
class ModelSetup:
  """The policy model (sections `model`, `tokenizer`).

  Attributes:
    config: its QwenConfig (`setup.model_config_from`).
    identity: its name in a resume fingerprint (`setup.model_identity`).
    hf_checkpoint: the HF folder its weights come from ('' = random init).
    param_dtype: the dtype parameters are stored in.
    tokenizer_path: the tokenizer folder (`setup.tokenizer_path`; '' = none set,
      which `setup.load_tokenizer` refuses).
    mesh: the device mesh's sizes.
  """
  config: qwen_config.QwenConfig
  identity: str
  hf_checkpoint: str
  param_dtype: str
  tokenizer_path: str
  mesh: setup_lib.MeshConfig


@dataclasses.dataclass(frozen=True)
class RLSettings:
  """An RL phase's own settings (section `rl`; SPEC §4-6, paper C.8, F.4, F.7).

  Attributes:
    rollout: T tasks per update, K rollouts per task.
    loss, opt, ppo: the learner's loss, optimizer (schedule over every step of the
      phase) and PPO passes.
    loss_temperature: `rl.loss_temperature` as set (None: the sampling temperature,
      which `loss.temperature` holds); part of the fingerprint.
    num_updates: updates of the phase (>= 1).
    eval_every, eval_episodes, selection_metric: checkpoint selection on internal dev
      (every `eval_every` updates, on the first `eval_episodes` dev episodes, 0 = all).
    internal_dev_episodes: greedy dev episodes of the phase summary (0 = off).
    monitor_every: cadence of m^all / m^ans (updates).
    max_consecutive_skips: non-finite steps in a row that stop the run.
    running_stats_init_count: dev transitions per op type that initialize the
      running local statistics (`advantage.running_stats_init_count`).
    running_stats_sft_data: the SFT set builder's settings for those transitions.
    advantage_table: write `advantages.jsonl` (`metrics.advantage_table`).
  """
  rollout: rollout.RolloutConfig
  loss: rl_learner.LossConfig
  loss_temperature: float | None
  opt: optim.OptimizerConfig
  ppo: rl_optimizer.PPOConfig
  num_updates: int
  eval_every: int
  eval_episodes: int
  selection_metric: str
  internal_dev_episodes: int
  monitor_every: int
  max_consecutive_skips: int
  running_stats_init_count: int
  running_stats_sft_data: sft_config.SFTDataConfig
  advantage_table: bool


@dataclasses.dataclass(frozen=True)
class SFTSettings:
  """The SFT phase's own settings (section `sft`; SPEC §4, App. D.3).

  Attributes:
    data: the SFT set builder's settings (its seed is `episodes.seed`: the set does
      not change with the run seed).
    opt: the optimizer; its `total_steps` is a placeholder until the set's size is
      known (`optimizer`).
    batch_size, num_epochs, max_steps: the schedule (max_steps set: it wins).
    eval_every, eval_each_epoch: dev evaluation cadence.
    max_consecutive_skips: non-finite steps in a row that stop the run.
    length_group_batches: batches grouped by length (0 = off).
    loss_reduction: Eq. 7's NLL reduction.
  """
  data: sft_config.SFTDataConfig
  opt: optim.OptimizerConfig
  batch_size: int
  num_epochs: int
  max_steps: int | None
  eval_every: int
  eval_each_epoch: bool
  max_consecutive_skips: int
  length_group_batches: int
  loss_reduction: str

  def optimizer(self, total_steps: int) -> optim.OptimizerConfig:
    """The optimizer over `total_steps` optimizer steps."""
    return dataclasses.replace(self.opt, total_steps=int(total_steps))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSetup:
  """Everything a phase reads of its config, typed (module docstring)."""
  phase: str
  seed: int
  model: ModelSetup
  executor: ExecutorConfig
  env: episode_types.EnvConfig
  scenario: scenario_spec.ScenarioConfig
  data: hotpotqa.DataConfig
  sampling: policy.PolicySamplingConfig
  batching: batching.BatchingConfig
  advantage: advantages.AdvantageConfig
  reward: rewards.RewardConfig
  verifier: verifier_base.VerifierConfig
  solver: task_solver_setup.SolverSetup
  loop: phase_runner.LoopSettings
  rl: RLSettings | None = None
  sft: SFTSettings | None = None
  pretrain: pretrain_data.PretrainConfig | None = None

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'RunSetup':
    """The typed setup of `config` (experiments/configs/<phase>.py).

    Raises:
      ValueError: a bad field, named (`config.<section>.<field>: ...`).
    """
    phase, m = str(config.phase), config.model
    if phase == 'pretrain' and m.hf_checkpoint:
      raise ValueError('config.model.hf_checkpoint: pretraining starts from random '
                       'weights; leave it unset')
    mc = setup_lib.model_config_from(config)
    model = ModelSetup(config=mc, identity=setup_lib.model_identity(config),
                       hf_checkpoint=str(m.hf_checkpoint or ''),
                       param_dtype=str(m.param_dtype),
                       tokenizer_path=setup_lib.tokenizer_path(config, required=False),
                       mesh=setup_lib.MeshConfig.from_section(m))
    sampling = config_util.dataclass_from_mapping(policy.PolicySamplingConfig,
                                                  config.sampling.to_dict())
    return cls(
        phase=phase, seed=int(config.seed), model=model,
        executor=config_util.dataclass_from_mapping(
            ExecutorConfig, config.memory.to_dict(),
            overrides={'phase': commands.PHASE_OP_SPACE.get(phase, 'C')}),
        env=episode_types.EnvConfig.from_config(config.episodes.to_dict()),
        scenario=scenario_spec.ScenarioConfig.from_config(config.episodes.to_dict()),
        data=hotpotqa.DataConfig.from_config(config.data.to_dict()),
        sampling=sampling,
        batching=config_util.dataclass_from_mapping(batching.BatchingConfig,
                                                    config.batching.to_dict()),
        advantage=config_util.dataclass_from_mapping(advantages.AdvantageConfig,
                                                     config.advantage.to_dict()),
        reward=config_util.dataclass_from_mapping(rewards.RewardConfig,
                                                  config.reward.to_dict()),
        verifier=verifier_base.VerifierConfig.from_config(config.verifier.to_dict()),
        solver=task_solver_setup.SolverSetup.from_config(config),
        loop=phase_runner.LoopSettings.from_config(config),
        rl=_rl_settings(config, sampling) if phase in RL_PHASES else None,
        sft=_sft_settings(config) if phase == 'sft' else None,
        pretrain=(pretrain_data.PretrainConfig.from_section(
            config.pretrain.to_dict()) if phase == 'pretrain' else None))


def _sft_data(config: ml_collections.ConfigDict, **overrides: Any) -> sft_config.SFTDataConfig:
  """The SFT set builder's settings: section `sft` plus the memory and episode fields
  it shares; the construction seed is the episode seed."""
  return sft_config.SFTDataConfig.from_config(
      config.sft.to_dict(), seed=config.episodes.seed,
      context_budget=config.memory.context_budget,
      policy_input_limit=config.memory.policy_input_limit,
      local_ids=bool(config.memory.get('local_ids', False)),
      max_doc_sentences=config.episodes.max_doc_sentences,
      max_doc_tokens=config.episodes.max_doc_tokens, **overrides)


def _rl_settings(config: ml_collections.ConfigDict,
                 sampling: policy.PolicySamplingConfig) -> RLSettings:
  r = config.rl
  if r.entropy_coef != 0:
    raise ValueError('config.rl.entropy_coef: SPEC §6 uses no entropy bonus and this '
                     f'trainer implements none; got {r.entropy_coef}')
  if int(r.num_updates) < 1:
    raise ValueError(f'config.rl.num_updates: must be >= 1, got {r.num_updates}')
  if not sampling.temperature > 0:
    raise ValueError('config.sampling.temperature: RL rollouts sample (SPEC §4: 0.7); '
                     f'got {sampling.temperature}')
  ppo = rl_optimizer.PPOConfig(int(r.num_iterations), int(r.mini_batches_per_iteration))
  temperature = r.loss_temperature
  count = int(config.advantage.running_stats_init_count)
  return RLSettings(
      rollout=rollout.RolloutConfig.from_config(r.to_dict()),
      loss=rl_learner.LossConfig(
          clip_epsilon=float(r.clip_epsilon), kl_beta=float(r.kl_beta),
          kl_estimator=str(r.kl_estimator),
          temperature=float(sampling.temperature if temperature is None else temperature),
          old_logprobs=str(r.old_logprobs), max_log_ratio=float(r.max_log_ratio),
          reduction=str(r.loss_reduction)),
      loss_temperature=None if temperature is None else float(temperature),
      opt=optim.OptimizerConfig.from_section(
          r, name='rl', total_steps=max(1, int(r.num_updates) * ppo.steps_per_update)),
      ppo=ppo, num_updates=int(r.num_updates), eval_every=int(r.get('eval_every', 0)),
      eval_episodes=int(r.get('eval_episodes', 0)),
      selection_metric=rl_selection.check_metric(
          str(r.get('selection_metric', rl_selection.DEFAULT_METRIC))),
      internal_dev_episodes=int(r.get('internal_dev_episodes', 0)),
      monitor_every=int(r.monitor_every),
      max_consecutive_skips=int(r.max_consecutive_skips),
      running_stats_init_count=count,
      running_stats_sft_data=_sft_data(config, train_per_target=1, dev_per_target=count,
                                       teacher_backend=None),
      advantage_table=bool(config.metrics.advantage_table))


def _sft_settings(config: ml_collections.ConfigDict) -> SFTSettings:
  s = config.sft
  return SFTSettings(
      data=_sft_data(config),
      # total_steps = 1 stands in until the SFT set's size gives the real count.
      opt=optim.OptimizerConfig.from_section(s, name='sft', total_steps=1),
      batch_size=int(s.batch_size), num_epochs=int(s.num_epochs),
      max_steps=s.max_steps, eval_every=int(s.eval_every),
      eval_each_epoch=bool(s.eval_each_epoch),
      max_consecutive_skips=int(s.max_consecutive_skips),
      length_group_batches=int(s.get('length_group_batches', 0)),
      loss_reduction=str(s.loss_reduction))
