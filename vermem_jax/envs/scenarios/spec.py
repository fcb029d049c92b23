"""What a phase episode is: phases, families, sizes and the ScenarioSpec record.

SPEC §4 and paper Appendix D.4. `ScenarioConfig` is the config section `episodes`
(sizes, budgets, construction knobs); `ScenarioSpec` is an `environment.EpisodeSpec`
plus the construction metadata the generators record (split, delayed query, reference
command, recovery flag, the budget s_0 was built for). The phases' families are
described in the package docstring (`vermem_jax.envs.scenarios`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from vermem_jax import config_util
from vermem_jax.envs import episode_types
from vermem_jax.memory.config import ExecutorConfig

PHASES = ('A', 'B', 'C')

FAMILIES = {
    'A': ('add', 'update', 'delete', 'null'),
    'B': ('retrieve', 'filter', 'select_episode', 'summarize', 'null'),
    'C': ('add_retrieve', 'update_filter', 'delete_select', 'add_summarize'),
}



@dataclasses.dataclass(frozen=True)
class ScenarioConfig:
  """Sizes and construction knobs of the phase episodes (config section `episodes`).

  Attributes:
    seed: episode RNG seed.
    num_train, num_dev: episodes per phase and split. SPEC §4 (paper): A 8,000/800,
      B 8,000/800, C 12,000/1,200 (`paper_counts`); the default is the tiny scale.
    rollout_limit: cap on memory decisions per episode (config `episodes.rollout_limit`,
      decision 16); a spec's max_decisions is min(len(schedule) + 1, rollout_limit).
    token_budget: online-token budget per training rollout (decision; None =
      EnvConfig's).
    context_budget: C_t budget in tokens (SPEC §1 decision 2,048; must equal
      `memory.context_budget` of the run). C_0 is built inside it.
    fill_min, fill_max: Phase B C_0 occupies this fraction of the budget (decision;
      paper D.4 "part of the configured active-context budget").
    max_doc_sentences: sentences kept per document observation (decision): supporting
      sentences always, then the earliest others.
    max_doc_tokens: token cap of one document observation (decision), further bounded
      by context_budget // 4 so several documents fit C.
    phase_a_distractors: distractor sentences interleaved in a Phase A schedule
      (decision).
  """
  seed: int = 0
  num_train: int = 16
  num_dev: int = 4
  rollout_limit: int = 16
  token_budget: Optional[int] = None
  context_budget: int = ExecutorConfig.context_budget  # SPEC §1 (memory config's)
  fill_min: float = 0.5
  fill_max: float = 0.8
  max_doc_sentences: int = 5
  max_doc_tokens: int = 320
  phase_a_distractors: int = 2

  def __post_init__(self):
    for name in ('num_train', 'num_dev', 'phase_a_distractors'):
      if int(getattr(self, name)) < 0:
        raise ValueError(f'ScenarioConfig.{name} must be >= 0, got '
                         f'{getattr(self, name)!r}')
    for name in ('rollout_limit', 'context_budget', 'max_doc_sentences',
                 'max_doc_tokens'):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f'ScenarioConfig.{name} must be positive, got '
                         f'{getattr(self, name)!r}')
    if not 0.0 < self.fill_min <= self.fill_max <= 1.0:
      raise ValueError('ScenarioConfig needs 0 < fill_min <= fill_max <= 1, got '
                       f'{self.fill_min}, {self.fill_max}')

  @classmethod
  def from_config(cls, section, **overrides):
    """Builds from a config section (dict-like), ignoring keys this class lacks."""
    return config_util.dataclass_from_mapping(cls, section, overrides=overrides)


def paper_counts(phase):
  """(num_train, num_dev) of SPEC §4 for `phase`."""
  return {'A': (8000, 800), 'B': (8000, 800), 'C': (12000, 1200)}[phase]


@dataclasses.dataclass(frozen=True)
class DelayedQuery:
  """The query posed once the observation schedule is exhausted (paper D.4).

  Attributes:
    text: the query text (HotpotQA: the question q itself).
    context_source: 'ltm' — the solver should answer from the active LTM entries
      (Phase A: "answered from what LTM holds"); 'context' — from C_t as it stands.
    observation_index: index in `observations` of the observation that poses it
      (always the last one).
  """
  text: str
  context_source: str
  observation_index: int


@dataclasses.dataclass(frozen=True)
class ScenarioSpec(episode_types.EpisodeSpec):
  """An EpisodeSpec plus construction metadata (never shown to the policy).

  Attributes (beyond EpisodeSpec):
    split: 'train' (construction pool) or 'dev' (internal-dev pool).
    delayed_query: the DelayedQuery (its text is also the last observation).
    reference_command: a correct legal first command on s_0 (checked with the
      executor at construction); scripted policies and tests use it.
    is_recovery: the needed evidence is only in H_0, with related distractors more
      recent (Phase B `select_episode`, Phase C `delete_select`).
    context_budget: the C_t budget s_0 was built for (tokens).

  EpisodeSpec fields set here: max_decisions = len(observations) + 1 (the delayed
  query is always reached; schedules are trimmed, distractors first, to fit
  `rollout_limit`); answer_from = len(observations) and answer_context 'ltm' in
  Phase A (the solver is first asked after the query and reads the active LTM);
  answer_from = 0 and answer_context 'context' in Phases B and C; stale_texts = the
  texts of the stale / obsolete entries planted in M_0 (Phase A `update`, `delete`
  with a stale version, Phase C `update_filter`; private label for the oracle reader,
  which refuses to answer while one is among what it reads — a stale entry is not
  fixed by adding the correct fact beside it. Phase C's solver reads C_t, so there
  the stale entry only matters once retrieved into C).
  """
  split: str = ''
  delayed_query: Optional[DelayedQuery] = None
  reference_command: str = ''
  is_recovery: bool = False
  context_budget: int = 0
