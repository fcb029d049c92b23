"""Sizes and options of the SFT set (config section `sft`; SPEC §4, paper D.1–D.3)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from vermem_jax import config_util
from vermem_jax import http_chat
from vermem_jax.envs.scenarios.spec import ScenarioConfig
from vermem_jax.memory.config import ExecutorConfig

# The teacher endpoint's defaults (keys `sft.teacher_base_url`, ... of the config). The
# teacher asks once per state, sequentially, and falls back to a template on failure:
# no retries.
DEFAULT_TEACHER = http_chat.ChatBackendConfig(
    api_key_env='VERMEM_TEACHER_API_KEY', timeout_s=30.0, max_concurrency=1,
    max_retries=0, backoff_s=1.0, section='sft', key_prefix='teacher_')


@dataclasses.dataclass(frozen=True)
class SFTDataConfig:
  """Sizes and options of the SFT set (config section `sft`; SPEC §4).

  Attributes:
    train_per_target, dev_per_target: records per target and split (paper 4,000 /
      500; tiny default 32 / 8).
    template_fraction: share of each class from templates when a teacher is set
      (SPEC §4: half); without a teacher templates fill every class.
    min_negative_fraction: SPEC §4 floor on boundary/negative states per class (25%).
    boundary_fraction: share of each class built on boundary/negative states
      (decision 0.5, at least min_negative_fraction).
    teacher_backend: None (off) or 'openai_compatible'.
    teacher: the endpoint, keys `sft.teacher_base_url` (…/v1), `teacher_model`,
      `teacher_api_key_env` (the variable holding the API key), `teacher_timeout_s`
      (HTTP timeout, seconds) (http_chat.ChatBackendConfig; `from_config`).
    teacher_max_tokens, teacher_temperature: decoding of the teacher reply.
    seed: RNG seed.
    context_budget: C_t budget (SPEC §1: 2,048 tokens; = memory.context_budget).
    policy_input_limit: limit of x_i (SPEC §1: 8,192 tokens).
    max_doc_sentences, max_doc_tokens: document caps (scenarios.spec.ScenarioConfig).
    max_attempts_per_record: give up after this many candidate states per record.
    local_ids: x_i and the target u*_i cite this task's ids without their namespace
      (= memory.local_ids; `ExecutorConfig.local_ids`).
  """
  train_per_target: int = 32
  dev_per_target: int = 8
  template_fraction: float = 0.5
  min_negative_fraction: float = 0.25
  boundary_fraction: float = 0.5
  teacher_backend: Optional[str] = None
  teacher: http_chat.ChatBackendConfig = DEFAULT_TEACHER
  teacher_max_tokens: int = 256
  teacher_temperature: float = 0.7
  seed: int = 0
  # One source for the shared numbers: the memory and episode configs' defaults.
  context_budget: int = ExecutorConfig.context_budget
  policy_input_limit: int = ExecutorConfig.policy_input_limit
  max_doc_sentences: int = ScenarioConfig.max_doc_sentences
  max_doc_tokens: int = ScenarioConfig.max_doc_tokens
  max_attempts_per_record: int = 40
  local_ids: bool = ExecutorConfig.local_ids

  def __post_init__(self):
    if self.train_per_target < 0 or self.dev_per_target < 0:
      raise ValueError('SFTDataConfig: per-target sizes must be >= 0')
    if not 0.0 <= self.min_negative_fraction <= 1.0:
      raise ValueError('SFTDataConfig.min_negative_fraction must be in [0, 1]')
    if not self.min_negative_fraction <= self.boundary_fraction <= 1.0:
      raise ValueError(f'SFTDataConfig.boundary_fraction ({self.boundary_fraction}) '
                       f'must be in [min_negative_fraction '
                       f'({self.min_negative_fraction}), 1]')
    if not 0.0 <= self.template_fraction <= 1.0:
      raise ValueError('SFTDataConfig.template_fraction must be in [0, 1]')
    if self.teacher_backend not in (None, 'openai_compatible'):
      raise ValueError(f'SFTDataConfig.teacher_backend must be None or '
                       f"'openai_compatible', got {self.teacher_backend!r}")
    if self.teacher_backend:
      self.teacher.check_endpoint()
    if self.max_attempts_per_record <= 0:
      raise ValueError('SFTDataConfig.max_attempts_per_record must be positive')

  @classmethod
  def from_config(cls, section, **overrides):
    """Builds from config section `sft` (dict-like; the teacher's flat `teacher_*`
    keys become `teacher`), ignoring keys this class lacks.

    Raises:
      ValueError: a bad value, named.
    """
    teacher, rest = http_chat.ChatBackendConfig.split(section, defaults=DEFAULT_TEACHER)
    return config_util.dataclass_from_mapping(cls, rest,
                                              overrides={'teacher': teacher, **overrides})

  @property
  def teacher_fraction(self):
    """Share of each class the teacher may fill (when a teacher is in use)."""
    return 1.0 - self.template_fraction
