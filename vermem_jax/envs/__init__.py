"""vermem_jax.envs: HotpotQA data, scenarios, task solvers and the episode loop.

Modules (import them directly; this package re-exports nothing):
  hotpotqa         Example / EvidenceUnit, the JSON and HF row formats, split files,
                   DataConfig, the 90/10 construction / internal-dev split.
  tfds_hotpotqa    TFDS builder (array_record, read with tfds.data_source; no
                   TensorFlow; tensorflow_datasets is imported on first use).
  hotpotqa_sources load_examples (json | tfds | hf), load_from_config.
  answer_metrics   EM / F1 (official normalization) and supporting-fact recall: the
                   answer metrics rewards, dev selection and evaluation share.
  task_solvers     TaskSolver, LLMTaskSolver, OracleEvidenceReader.
  episode_types    EpisodeSpec, Observation, PolicyOutput, DecisionRecord, EpisodeResult.
  environment      run_episodes (App. A.1 loop; schedule or interactive environment).
  episodes         the curriculum data: pools, phase episodes (over the two packages
                   below).
  sft_data/        the balanced SFT set (templates, seven filters, teacher, builder).
  scenarios/       Phase A/B/C episode generators (s_0, schedules, delayed query).
  interactive      InteractiveEnv / Benchmark: the interface of the interactive
                   benchmarks (adapters in third_party/vermem_benchmarks, loaded by name).
  action_solvers   ActionPrompt, GoldPlanSolver: task solvers that act in those envs.
"""
