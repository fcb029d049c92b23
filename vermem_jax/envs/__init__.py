"""vermem_jax.envs: HotpotQA data, scenarios, task solvers and the episode loop.

Modules:
  hotpotqa       Example / EvidenceUnit, load_examples (json | tfds | hf), 90/10 split.
  tfds_hotpotqa  TFDS builder (array_record, read with tfds.data_source; no TensorFlow).
  task_solvers   TaskSolver, LLMTaskSolver, OracleEvidenceReader.
  environment    run_episodes (App. A.1 loop; schedule or interactive environment),
                 re-exporting the types of episode_types.
  episode_types  EpisodeSpec, Observation, PolicyOutput, DecisionRecord, EpisodeResult.
  episodes       public entry point of the curriculum data: pools, SFT set, phase
                 episodes (over the two packages below).
  sft_data/      the balanced SFT set (templates, seven filters, teacher, builder).
  scenarios/     Phase A/B/C episode generators (s_0, schedules, delayed query).
  interactive    InteractiveEnv / Benchmark: the interface of the interactive benchmarks
                 (adapters in third_party/vermem_benchmarks, loaded by name).
  action_solvers ActionPrompt, GoldPlanSolver: task solvers that act in those envs.

The names below are re-exported for convenience; tfds_hotpotqa is imported only when
the tfds source is used (TFDS import is slow).
"""

from vermem_jax.envs.environment import (DecisionRecord, EnvConfig, EpisodeResult,
                                         EpisodeSpec, Observation, PolicyOutput,
                                         run_episodes)
from vermem_jax.envs.hotpotqa import (DataConfig, EvidenceUnit, Example, Paragraph,
                                      evidence_units, example_from_hf_row,
                                      example_from_json_row, split_train_pools,
                                      supporting_unit_ids)
from vermem_jax.envs.hotpotqa_sources import load_examples
from vermem_jax.envs.task_solvers import (LLMTaskSolver, OracleEvidenceReader,
                                          SolverConfig, SolverInput, SolverOutput,
                                          TaskSolver)

__all__ = [
    'DecisionRecord', 'EnvConfig', 'EpisodeResult', 'EpisodeSpec', 'Observation',
    'PolicyOutput', 'run_episodes', 'DataConfig', 'EvidenceUnit', 'Example',
    'Paragraph', 'evidence_units', 'example_from_hf_row', 'example_from_json_row',
    'load_examples', 'split_train_pools', 'supporting_unit_ids', 'LLMTaskSolver',
    'OracleEvidenceReader', 'SolverConfig', 'SolverInput', 'SolverOutput', 'TaskSolver',
]
