"""Training data of the curriculum: the SFT set and the Phase A/B/C episodes (SPEC §4).

The curriculum's data over two packages (import their names from the modules that
define them):
  - `sft_data`: the balanced SFT set (8 targets, boundary templates, seven filters,
    dedupe, optional teacher) — paper Appendix D.1–D.3.
  - `scenarios`: the phase scenario generators (initial M_0, C_0, H_0, observation
    schedule, operation subspace, termination, delayed query) — paper Appendix D.4.

Both draw from HotpotQA *train* examples only: the construction pool gives train
records/episodes, the internal-dev pool gives dev ones (`load_pools`, 90/10 by
question id, SPEC §4). The reference answer and supporting facts shape construction
but never appear in a policy input (see the two packages for the precise guarantees).

Typical use:

    construction, dev = episodes.load_pools()
    tok = tokenization.load_tokenizer(paths.tokenizer_dir('qwen2.5'))
    train_sft, dev_sft, report = sft_build.build_sft_set(
        construction, dev, count_tokens=tok.count_tokens)
    train_a, dev_a = episodes.build_phase_episodes(
        'A', construction, dev, count_tokens=tok.count_tokens)
"""

from __future__ import annotations

from typing import Callable, Sequence

from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.envs.scenarios.build import build_episodes
from vermem_jax.envs.scenarios.spec import ScenarioConfig, ScenarioSpec


def load_pools(data_config: hotpotqa.DataConfig = hotpotqa.DataConfig(),
               ) -> tuple[list[hotpotqa.Example], list[hotpotqa.Example]]:
  """(construction pool, internal-dev pool) of the HotpotQA train split (SPEC §4).

  Raises whatever `hotpotqa.load_from_config` raises (missing file, malformed row).
  """
  examples = hotpotqa_sources.load_from_config(data_config, hotpotqa.TRAIN)
  return hotpotqa.split_train_pools(examples, dev_fraction=data_config.dev_fraction,
                                    seed=data_config.split_seed)


def build_phase_episodes(phase: str, construction: Sequence[hotpotqa.Example],
                         dev: Sequence[hotpotqa.Example], *,
                         count_tokens: Callable[[str], int],
                         config: ScenarioConfig = ScenarioConfig(),
                         ) -> tuple[list[ScenarioSpec], list[ScenarioSpec]]:
  """Train episodes from the construction pool and dev episodes from the dev pool.

  Args:
    phase: 'A' | 'B' | 'C'.
    construction, dev: the two pools (`load_pools`).
    count_tokens: `str -> int` backbone token counter (tokens).
    config: ScenarioConfig (num_train / num_dev, seed, budgets).

  Returns:
    (train specs [config.num_train], dev specs [config.num_dev]).
  """
  train = build_episodes(construction, phase, count_tokens=count_tokens,
                         config=config, split='train')
  dev_specs = build_episodes(dev, phase, count_tokens=count_tokens, config=config,
                             split='dev')
  return train, dev_specs
