"""The library's typed configs built from the ConfigDict sections.

Sections map onto the library's small typed dataclasses with identical key / field
names: `library_configs(config)` builds them all (data -> DataConfig, memory ->
ExecutorConfig, advantage -> AdvantageConfig, reward -> RewardConfig, verifier ->
VerifierConfig, solver -> SolverConfig, episodes -> ScenarioConfig + EnvConfig,
batching -> BatchingConfig, eval.judge -> JudgeConfig) and `model_config(config)` the
QwenConfig. The sections
`sampling`, `sft`, `rl`, `eval`, `checkpoint`, `metrics` are read by the trainers.
The libraries are imported inside the functions: they are heavier than the config layer.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from experiments.configs.parts import curriculum
from vermem_jax import config_util
from vermem_jax import http_chat
from vermem_jax import paths

# Config keys that only the config layer or the trainers read (not fields of the
# section's library dataclass); `library_configs` drops them. The solver's endpoint keys
# go to its own http_chat.ChatBackendConfig ('solver_chat').
CONFIG_ONLY_KEYS = {
    'data': ('data_dir',),
    'solver': ('backend', 'hf_checkpoint'),
}


def model_config(config: ml_collections.ConfigDict) -> Any:
  """The policy's `models.QwenConfig`: from `model.hf_checkpoint`'s config.json when
  set, else the `model.preset`; `model.dtype`, `param_dtype`, `remat`, `scan_layers` applied.

  Raises:
    ValueError: an unknown preset or an unreadable checkpoint config (names the field).
  """
  # The trainers' own builder (one definition); imported here because the library is
  # heavier than the config layer.
  from vermem_jax.train import setup  # pylint: disable=g-import-not-at-top
  return setup.model_config_from(config)


def library_configs(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Builds the library dataclasses from their config sections.

  Returns:
    {'data': envs.hotpotqa.DataConfig, 'memory': memory.ExecutorConfig (phase = the
    phase's op space, curriculum.PHASE_OP_SPACE), 'advantage':
    rl.advantages.AdvantageConfig, 'reward': rl.rewards.RewardConfig, 'verifier': verifiers.base.VerifierConfig, 'solver':
    envs.task_solvers.SolverConfig, 'episodes': envs.scenarios.spec.ScenarioConfig,
    'env': envs.environment.EnvConfig, 'batching': rl.batching.BatchingConfig, 'judge':
    eval.judges.JudgeConfig (section eval.judge), 'solver_chat': the solver's
    http_chat.ChatBackendConfig, 'sft_data': envs.sft_data.config.SFTDataConfig (with
    the teacher's endpoint)}.
  Raises:
    ValueError: `config.<section>: <problem>` for an unknown key or a value the
      dataclass rejects.
  """
  # Imported here: the libraries are heavier than the config layer.
  from vermem_jax.envs import environment  # pylint: disable=g-import-not-at-top
  from vermem_jax.envs import hotpotqa  # pylint: disable=g-import-not-at-top
  from vermem_jax.envs.scenarios import spec as scenario_spec  # pylint: disable=g-import-not-at-top
  from vermem_jax.envs import task_solvers  # pylint: disable=g-import-not-at-top
  from vermem_jax.memory import config as memory_config  # pylint: disable=g-import-not-at-top
  from vermem_jax.rl import advantages  # pylint: disable=g-import-not-at-top
  from vermem_jax.rl import batching  # pylint: disable=g-import-not-at-top
  from vermem_jax.rl import rewards  # pylint: disable=g-import-not-at-top
  from vermem_jax.verifiers import base as verifier_base  # pylint: disable=g-import-not-at-top
  from vermem_jax.envs.sft_data import config as sft_data_config  # pylint: disable=g-import-not-at-top

  def build(section: str, cls: type, values: dict | None = None, **extra: Any) -> Any:
    values = config[section].to_dict() if values is None else values
    for key in CONFIG_ONLY_KEYS.get(section, ()):
      values.pop(key, None)
    try:
      if section == 'verifier':
        return verifier_base.VerifierConfig.from_config(values, strict=True)
      return config_util.dataclass_from_mapping(cls, values, strict=True,
                                                what=cls.__name__, overrides=extra)
    except (ValueError, TypeError) as e:
      raise ValueError(f'config.{section}: {e}') from e

  # The endpoint's messages start with the field (`solver.timeout_s must be ...`).
  try:
    solver_chat, solver_values = http_chat.ChatBackendConfig.split(
        config.solver, defaults=task_solvers.DEFAULT_CHAT)
    if config.solver.backend == 'openai_compatible':
      solver_chat.check_endpoint()
  except ValueError as e:
    raise ValueError(f'config.{e}') from e
  out = {
      'data': build('data', hotpotqa.DataConfig, hotpotqa_dir=hotpotqa_dir(config)),
      'memory': build('memory', memory_config.ExecutorConfig,
                      phase=curriculum.PHASE_OP_SPACE[config.phase]),
      'advantage': build('advantage', advantages.AdvantageConfig),
      'reward': build('reward', rewards.RewardConfig),
      'verifier': build('verifier', verifier_base.VerifierConfig),
      'solver': build('solver', task_solvers.SolverConfig, solver_values),
      'solver_chat': solver_chat,
      'episodes': build('episodes', scenario_spec.ScenarioConfig),
      'batching': build('batching', batching.BatchingConfig),
  }
  try:
    out['env'] = environment.EnvConfig.from_config(config.episodes.to_dict())
  except (ValueError, TypeError) as e:
    raise ValueError(f'config.episodes: {e}') from e
  from vermem_jax.eval import judges  # pylint: disable=g-import-not-at-top
  try:
    out['judge'] = judges.JudgeConfig.from_config(config.eval.judge.to_dict(), strict=True)
  except (ValueError, TypeError) as e:
    raise ValueError(f'config.eval.judge: {e}') from e
  try:
    out['sft_data'] = sft_data_config.SFTDataConfig.from_config(config.sft.to_dict())
  except (ValueError, TypeError) as e:
    # The teacher endpoint's messages start with the field (`sft.teacher_timeout_s ...`).
    text = str(e)
    raise ValueError(f'config.{text}' if text.startswith('sft.')
                     else f'config.sft: {text}') from e
  return out


def hotpotqa_dir(config: ml_collections.ConfigDict) -> str:
  """The HotpotQA folder: `data.hotpotqa_dir`, else `<data.data_dir>/hotpotqa`."""
  return config.data.hotpotqa_dir or paths.hotpotqa_dir(config.data.data_dir)
