"""Config validation: `validate_config` names the first bad field, exit-code-2 style.

The config layer's own checks run one `_check_*` function per section, in the order of
`FIELD_CHECKS` (a new section appends its function there); then every library dataclass
is built (`library.library_configs`), so their own validation runs and a key that is
not one of their fields is reported; with `check_paths`, the files and folders the run
reads must exist. `check_tokenizer_fits_model` is the costlier tokenizer/model check the
CLI runs once before training.
"""

from __future__ import annotations

import math
import os

import ml_collections

from experiments.configs.parts import curriculum
from experiments.configs.parts import library
from experiments.configs.parts import paper
from vermem_jax import paths
from vermem_jax.models import qwen_config

SOLVER_BACKENDS = ('oracle', 'llm', 'openai_compatible')  # = train.task_solver_setup's
ACTION_SOLVER_BACKENDS = ('gold_plan', 'llm', 'openai_compatible')  # its ACTION_BACKENDS
PAPER_BENCHMARKS = ('alfworld', 'scienceworld', 'pddl', 'babyai')  # envs.interactive's
SELECTION_METRICS = ('r_task', 'em', 'f1', 'sf_recall', 'm_ans')  # = train.rl_selection's
SUCCESS_RULES = ('auto', 'em', 'judge')  # = eval.metrics.SUCCESS_RULES
KL_ESTIMATORS = ('exact', 'k3')
GRPO_REDUCTIONS = ('decision', 'sqrt', 'sequence')  # = rl.grpo.GRPO_REDUCTIONS
OLD_LOGPROBS_SOURCES = ('learner', 'sampler')  # = train.rl_learner.OLD_LOGPROBS_SOURCES
TEACHER_BACKENDS = (None, 'openai_compatible')  # = envs.sft_data.config.SFTDataConfig's
LR_SCHEDULES = ('linear', 'cosine', 'constant')  # = train.optim.LR_SCHEDULES
NLL_REDUCTIONS = ('token', 'decision', 'sqrt', 'sequence')  # = rl.grpo.NLL_REDUCTIONS
DTYPES = ('float32', 'bfloat16')


def _require(cond: bool, field: str, message: str) -> None:
  if not cond:
    raise ValueError(f'config.{field}: {message}')


def _positive_finite(value) -> bool:
  """value > 0 and finite (inf passes `> 0` and nan fails it with a misleading reason)."""
  return math.isfinite(value) and value > 0


def _check_run(config: ml_collections.ConfigDict) -> None:
  """The top-level fields: phase, scale, seed."""
  _require(config.phase in curriculum.CONFIG_NAMES, 'phase',
           f'expected one of {curriculum.CONFIG_NAMES}')
  _require(config.scale in curriculum.SCALES, 'scale',
           f'expected one of {curriculum.SCALES}')
  _require(isinstance(config.seed, int), 'seed', 'must be an int')


def _check_model(config: ml_collections.ConfigDict) -> None:
  _require(config.model.dtype in DTYPES, 'model.dtype', f'expected one of {DTYPES}')
  _require(config.model.param_dtype in DTYPES, 'model.param_dtype',
           f'expected one of {DTYPES}, got {config.model.param_dtype!r}')
  impls = qwen_config.ATTN_IMPLEMENTATIONS
  _require(config.model.attn_implementation in impls, 'model.attn_implementation',
           f'expected one of {impls}, got {config.model.attn_implementation!r}')
  for key in ('attn_block_q', 'attn_block_kv'):
    value = config.model[key]
    _require(isinstance(value, int) and value >= 1, f'model.{key}',
             f'must be an int >= 1, got {value!r}')
  if config.scale == 'paper' and config.phase not in curriculum.AGGREGATE_CONFIGS:
    _require(bool(config.model.hf_checkpoint), 'model.hf_checkpoint',
             'paper scale needs a Hugging Face Qwen folder: pass '
             '--config.model.hf_checkpoint=/path/to/Qwen2.5-7B-Instruct')


def _check_memory(config: ml_collections.ConfigDict) -> None:
  m = config.memory
  for key in m.keys():
    if key.startswith('cost_') and key != 'cost_cap':
      _require(0.0 <= m[key] <= m.cost_cap, f'memory.{key}',
               f'cost {m[key]} outside [0, cost_cap={m.cost_cap}] (SPEC §3)')


def _check_sampling(config: ml_collections.ConfigDict) -> None:
  s = config.sampling
  _require(s.temperature >= 0.0, 'sampling.temperature', 'must be >= 0')
  _require(s.eval_temperature >= 0.0, 'sampling.eval_temperature', 'must be >= 0')
  _require(0.0 < s.top_p <= 1.0, 'sampling.top_p', 'must be in (0, 1]')
  _require(s.max_command_tokens >= 1, 'sampling.max_command_tokens', 'must be >= 1')
  _require(isinstance(s.share_prefill, bool), 'sampling.share_prefill',
           f'must be a bool, got {s.share_prefill!r}')
  _require(isinstance(s.prompt_overhead_tokens, int) and s.prompt_overhead_tokens >= 0,
           'sampling.prompt_overhead_tokens',
           f'must be an int >= 0, got {s.prompt_overhead_tokens!r}')


def _check_buckets(config: ml_collections.ConfigDict) -> None:
  """The bucket fields (derived or set by hand) cover the longest prompt and row."""
  m, s, b = config.memory, config.sampling, config.batching
  max_prompt = m.policy_input_limit + s.prompt_overhead_tokens
  for field, buckets in (('sampling.prompt_buckets', s.prompt_buckets),
                         ('batching.length_buckets', b.length_buckets),
                         ('batching.command_buckets', b.command_buckets)):
    buckets = list(buckets or ())
    _require(len(buckets) > 0 and all(isinstance(x, int) and x > 0 for x in buckets)
             and buckets == sorted(set(buckets)), field,
             f'must be positive ints, strictly increasing, got {buckets}')
  _require(s.prompt_buckets[-1] >= max_prompt, 'sampling.prompt_buckets',
           f'largest bucket {s.prompt_buckets[-1]} < memory.policy_input_limit + '
           f'sampling.prompt_overhead_tokens = {m.policy_input_limit} + '
           f'{s.prompt_overhead_tokens} = {max_prompt} (the longest policy prompt)')
  _require(b.length_buckets[-1] >= max_prompt + s.max_command_tokens,
           'batching.length_buckets',
           f'largest bucket {b.length_buckets[-1]} < memory.policy_input_limit + '
           f'sampling.prompt_overhead_tokens + sampling.max_command_tokens = '
           f'{m.policy_input_limit} + {s.prompt_overhead_tokens} + '
           f'{s.max_command_tokens} = {max_prompt + s.max_command_tokens}')
  _require(b.command_buckets[-1] >= s.max_command_tokens, 'batching.command_buckets',
           f'largest bucket {b.command_buckets[-1]} < max_command_tokens '
           f'{s.max_command_tokens}')
  _require(b.loss_chunk_size is None or (isinstance(b.loss_chunk_size, int)
                                         and b.loss_chunk_size >= 1),
           'batching.loss_chunk_size', f'must be None or an int >= 1, got '
           f'{b.loss_chunk_size!r}')


def _check_optimizer(section: ml_collections.ConfigDict, name: str) -> None:
  """AdamW moments, schedule and the consecutive non-finite-step limit of sft / rl."""
  for key in ('adam_b1', 'adam_b2'):
    _require(0.0 <= section[key] < 1.0, f'{name}.{key}', 'must be in [0, 1)')
  _require(section.adam_eps > 0, f'{name}.adam_eps', 'must be > 0')
  _require(section.lr_schedule in LR_SCHEDULES, f'{name}.lr_schedule',
           f'{section.lr_schedule!r} not in {LR_SCHEDULES}')
  _require(0.0 <= section.warmup_ratio < 1.0, f'{name}.warmup_ratio', 'must be in [0, 1)')
  _require(section.max_consecutive_skips >= 1, f'{name}.max_consecutive_skips',
           'must be >= 1')


def _check_sft(config: ml_collections.ConfigDict) -> None:
  t = config.sft
  _check_optimizer(t, 'sft')
  _require(t.loss_reduction in NLL_REDUCTIONS, 'sft.loss_reduction',
           f'{t.loss_reduction!r} not in {NLL_REDUCTIONS}')
  _require(isinstance(t.length_group_batches, int) and t.length_group_batches >= 0,
           'sft.length_group_batches', f'must be an int >= 0 (0: no length grouping), '
           f'got {t.length_group_batches!r}')
  _require(t.train_per_target >= 1, 'sft.train_per_target', 'must be >= 1')
  _require(t.dev_per_target >= 1, 'sft.dev_per_target', 'must be >= 1')
  _require(0.0 <= t.template_fraction <= 1.0, 'sft.template_fraction', 'must be in [0, 1]')
  _require(0.0 <= t.min_negative_fraction <= 1.0, 'sft.min_negative_fraction',
           'must be in [0, 1]')
  _require(_positive_finite(t.learning_rate), 'sft.learning_rate',
           f'must be a finite number > 0, got {t.learning_rate}')
  _require(t.max_grad_norm > 0, 'sft.max_grad_norm', 'must be > 0')
  _require(t.batch_size >= 1, 'sft.batch_size', 'must be >= 1')
  _require(t.num_epochs >= 1, 'sft.num_epochs', 'must be >= 1')
  _require(t.weight_decay >= 0, 'sft.weight_decay', 'must be >= 0')
  _require(t.eval_every >= 1, 'sft.eval_every', 'must be >= 1')
  _require(isinstance(t.eval_each_epoch, bool), 'sft.eval_each_epoch',
           f'must be True or False, got {t.eval_each_epoch!r}')
  _require(t.max_steps is None or t.max_steps >= 1, 'sft.max_steps', 'must be >= 1 or None')
  _require(t.teacher_backend in TEACHER_BACKENDS, 'sft.teacher_backend',
           f'{t.teacher_backend!r} not in {TEACHER_BACKENDS}')
  # The teacher's endpoint (sft.teacher_base_url, ...) is checked by its
  # http_chat.ChatBackendConfig when library_configs builds SFTDataConfig.
  _require(t.teacher_max_tokens >= 1, 'sft.teacher_max_tokens', 'must be >= 1')
  _require(t.teacher_temperature >= 0, 'sft.teacher_temperature', 'must be >= 0')


def _check_model_mesh(config: ml_collections.ConfigDict) -> None:
  for key in ('model.mesh_data', 'model.mesh_fsdp', 'model.mesh_tensor'):
    section, name = key.split('.')
    value = config[section][name]
    _require(isinstance(value, int) and (value >= 1 or (name == 'mesh_data'
                                                        and value == -1)),
             key, f'must be an int >= 1 (mesh_data may be -1 = the rest), got {value!r}')


def _check_rl(config: ml_collections.ConfigDict) -> None:
  r = config.rl
  _check_optimizer(r, 'rl')
  for key in ('num_iterations', 'mini_batches_per_iteration'):
    _require(isinstance(r[key], int) and r[key] >= 1, f'rl.{key}', 'must be an int >= 1')
  _require(r.loss_temperature is None or r.loss_temperature > 0, 'rl.loss_temperature',
           'must be > 0 (None = sampling.temperature)')
  _require(r.max_log_ratio > 0, 'rl.max_log_ratio', 'must be > 0')
  _require(r.loss_reduction in GRPO_REDUCTIONS, 'rl.loss_reduction',
           f'{r.loss_reduction!r} not in {GRPO_REDUCTIONS}')
  if config.phase in curriculum.PHASE_ORDER[1:]:
    # Checked here, not only when the phase starts, so that --dry_run refuses it too.
    _require(r.num_updates >= 1, 'rl.num_updates',
             f'must be >= 1 in an RL phase ({config.phase}), got {r.num_updates}')
  else:
    _require(r.num_updates >= 0, 'rl.num_updates', 'must be >= 0')
  _require(r.tasks_per_update >= 1, 'rl.tasks_per_update', 'must be >= 1')
  _require(r.rollouts_per_task >= 2, 'rl.rollouts_per_task',
           f'K={r.rollouts_per_task}: group normalization needs K >= 2')
  _require(_positive_finite(r.learning_rate), 'rl.learning_rate',
           f'must be a finite number > 0, got {r.learning_rate}')
  _require(r.max_grad_norm > 0, 'rl.max_grad_norm', 'must be > 0')
  _require(r.clip_epsilon > 0, 'rl.clip_epsilon', 'must be > 0')
  _require(r.kl_beta >= 0, 'rl.kl_beta', 'must be >= 0')
  _require(r.kl_estimator in KL_ESTIMATORS, 'rl.kl_estimator',
           f'{r.kl_estimator!r} not in {KL_ESTIMATORS}')
  _require(r.entropy_coef >= 0, 'rl.entropy_coef', 'must be >= 0')
  _require(r.weight_decay >= 0, 'rl.weight_decay', 'must be >= 0')
  _require(r.monitor_every >= 1, 'rl.monitor_every', 'must be >= 1')
  _require(isinstance(r.internal_dev_episodes, int) and r.internal_dev_episodes >= 0,
           'rl.internal_dev_episodes',
           f'must be an int >= 0 (0 = off), got {r.internal_dev_episodes!r}')
  _require(r.old_logprobs in OLD_LOGPROBS_SOURCES, 'rl.old_logprobs',
           f'{r.old_logprobs!r} not in {OLD_LOGPROBS_SOURCES}')
  _require(isinstance(r.eval_every, int) and r.eval_every >= 1, 'rl.eval_every',
           f'must be an int >= 1 (updates between internal-dev scores), got '
           f'{r.eval_every!r}')
  _require(r.selection_metric in SELECTION_METRICS, 'rl.selection_metric',
           f'{r.selection_metric!r} not in {SELECTION_METRICS}')
  _require(isinstance(r.eval_episodes, int) and r.eval_episodes >= 0,
           'rl.eval_episodes', f'must be an int >= 0 (0 = all), got {r.eval_episodes!r}')


def _check_advantage(config: ml_collections.ConfigDict) -> None:
  a = config.advantage
  _require(0.0 < a.running_stats_decay < 1.0, 'advantage.running_stats_decay',
           'must be in (0, 1)')
  for lam in ('lambda_local', 'lambda_global', 'lambda_constraint'):
    _require(a[lam] >= 0, f'advantage.{lam}', 'must be >= 0')


def _check_solver(config: ml_collections.ConfigDict) -> None:
  s = config.solver
  if config.phase in curriculum.BENCHMARK_CONFIGS:
    _require(s.backend in ACTION_SOLVER_BACKENDS, 'solver.backend',
             f'{s.backend!r} cannot act in an interactive benchmark; expected one of '
             f'{ACTION_SOLVER_BACKENDS} (the oracle reader answers HotpotQA only)')
  else:
    _require(s.backend in SOLVER_BACKENDS, 'solver.backend',
             f'{s.backend!r} not in {SOLVER_BACKENDS}'
             + (' (gold_plan acts in the interactive benchmarks only)'
                if s.backend == 'gold_plan' else ''))
  # The endpoint (solver.base_url, timeout_s, ...) is checked by its
  # http_chat.ChatBackendConfig when library_configs builds it.


def _check_episodes(config: ml_collections.ConfigDict) -> None:
  e, m, r = config.episodes, config.memory, config.rl
  _require(e.context_budget == m.context_budget, 'episodes.context_budget',
           f'{e.context_budget} != memory.context_budget {m.context_budget}')
  _require(e.max_doc_tokens == m.max_doc_tokens, 'episodes.max_doc_tokens',
           f'{e.max_doc_tokens} != memory.max_doc_tokens {m.max_doc_tokens} (one '
           'document rule for the generators and the environment, SPEC §7)')
  _require(e.token_budget is None or e.token_budget >= 1, 'episodes.token_budget',
           'must be >= 1 token or None')
  if config.phase in curriculum.PHASE_ORDER[1:]:  # the RL phases
    _require(e.num_train >= r.tasks_per_update, 'episodes.num_train',
             f'{e.num_train} episodes < rl.tasks_per_update={r.tasks_per_update}')


def _check_eval(config: ml_collections.ConfigDict) -> None:
  ev = config.eval
  budgets = ev.budgets
  _require(isinstance(budgets, (tuple, list)) and len(budgets) > 0
           and all(isinstance(b, int) and b > 0 for b in budgets)
           and list(budgets) == sorted(set(budgets)), 'eval.budgets',
           "must be a non-empty increasing tuple of token budgets (ints > 0), e.g. "
           f"--config.eval.budgets='(1000,4000)'; got {budgets!r}")
  _require(ev.budgets[0] <= ev.target_budget <= ev.budgets[-1], 'eval.target_budget',
           f'B*={ev.target_budget} outside the budget range')
  _require(0.0 <= ev.target_success <= 100.0, 'eval.target_success', 'must be in [0, 100]')
  seeds = list(ev.seeds) if isinstance(ev.seeds, (tuple, list)) else [ev.seeds]
  _require(len(seeds) > 0 and all(isinstance(s, int) for s in seeds), 'eval.seeds',
           f"must be a non-empty tuple of ints, e.g. --config.eval.seeds='(42,43,44)'; "
           f'got {ev.seeds!r}')
  _require(len(set(seeds)) == len(seeds), 'eval.seeds', f'repeats a seed: {ev.seeds!r}')
  _require(ev.temperature == 0.0, 'eval.temperature',
           'evaluation decodes greedily (paper C.3: temperature 0, top-p 1)')
  _require(isinstance(ev.num_questions, int) and ev.num_questions >= 0,
           'eval.num_questions', f'must be an int >= 0 (0 = all), got {ev.num_questions!r}')
  _require(isinstance(ev.policies, str), 'eval.policies', 'must be a comma-separated str')
  _require(isinstance(ev.batch_size, int) and ev.batch_size >= 0, 'eval.batch_size',
           f'must be an int >= 0 (0 = all at once), got {ev.batch_size!r}')
  _require(ev.success_rule in SUCCESS_RULES, 'eval.success_rule',
           f'{ev.success_rule!r} not in {SUCCESS_RULES}')
  if ev.success_rule == 'judge':
    _require(bool(ev.judge.backend), 'eval.success_rule',
             "'judge' needs eval.judge.backend")
  _require(0.0 <= ev.judge_success_threshold <= 1.0, 'eval.judge_success_threshold',
           'must be in [0, 1]')
  if config.phase in curriculum.EVAL_CONFIGS:
    _require(config.solver.temperature == 0.0 and config.solver.top_p == 1.0,
             'solver.temperature', 'evaluation decodes greedily (temperature 0, top-p 1)')
  _require(isinstance(ev.max_decisions, int) and ev.max_decisions >= 0,
           'eval.max_decisions', f'must be an int >= 0 (0 = benchmark.max_steps), got '
           f'{ev.max_decisions!r}')
  fb = tuple(ev.frontier_benchmarks)
  _require(len(fb) > 0 and set(fb) <= set(PAPER_BENCHMARKS), 'eval.frontier_benchmarks',
           f'must name some of {PAPER_BENCHMARKS}, got {ev.frontier_benchmarks!r}')
  if config.phase in curriculum.BENCHMARK_CONFIGS:
    steps = config.benchmark.get('max_steps')
    _require(isinstance(steps, int) and steps >= 1, 'benchmark.max_steps',
             f'must be an int >= 1, got {steps!r}')


def _check_checkpoint(config: ml_collections.ConfigDict) -> None:
  _require(config.checkpoint.max_to_keep >= 1, 'checkpoint.max_to_keep', 'must be >= 1')
  _require(config.checkpoint.save_every >= 1, 'checkpoint.save_every', 'must be >= 1')
  _require(isinstance(config.checkpoint.get('async_save', True), bool),
           'checkpoint.async_save', 'must be a bool')


def _check_metrics(config: ml_collections.ConfigDict) -> None:
  _require(config.metrics.log_every >= 1, 'metrics.log_every', 'must be >= 1')


def _check_runtime(config: ml_collections.ConfigDict) -> None:
  r = config.runtime
  _require(isinstance(r.compilation_cache_dir, str), 'runtime.compilation_cache_dir',
           f"must be a path string ('' = off), got {r.compilation_cache_dir!r}")
  _require(isinstance(r.cache_min_compile_time_secs, (int, float))
           and r.cache_min_compile_time_secs >= 0, 'runtime.cache_min_compile_time_secs',
           f'must be a number >= 0, got {r.cache_min_compile_time_secs!r}')
  _require(isinstance(r.cache_min_entry_size_bytes, int)
           and not isinstance(r.cache_min_entry_size_bytes, bool)
           and r.cache_min_entry_size_bytes >= -1, 'runtime.cache_min_entry_size_bytes',
           f'must be an int >= -1, got {r.cache_min_entry_size_bytes!r}')


# Run in this order; the first failing field is the one reported.
FIELD_CHECKS = (_check_run, _check_model, _check_memory, _check_sampling, _check_buckets,
                _check_sft, _check_model_mesh, _check_rl, _check_advantage,
                _check_solver, _check_episodes, _check_eval, _check_checkpoint,
                _check_metrics, _check_runtime)


def _check_paths(config: ml_collections.ConfigDict) -> None:
  """The data folders and split file (configs that read HotpotQA: not the benchmark
  evaluations nor table2), and the checkpoint folders the config names."""
  if config.phase not in (tuple(curriculum.BENCHMARK_CONFIGS)
                          + curriculum.AGGREGATE_CONFIGS):
    _check_hotpotqa_paths(config)
  for field, folder in (('model.hf_checkpoint', config.model.hf_checkpoint),
                        ('solver.hf_checkpoint', config.solver.hf_checkpoint),
                        ('verifier.checkpoint_path', config.verifier.checkpoint_path
                         if config.verifier.backend == 'local_model' else None)):
    if folder:
      _require(os.path.isdir(folder), field, f'{folder!r} is not a directory')


def _check_hotpotqa_paths(config: ml_collections.ConfigDict) -> None:
  _require(os.path.isdir(config.data.data_dir), 'data.data_dir',
           f'{config.data.data_dir!r} is not a directory '
           f'(set --config.data.data_dir or ${paths.DATA_DIR_ENV})')
  hotpotqa_dir = library.hotpotqa_dir(config)
  _require(os.path.isdir(hotpotqa_dir), 'data.hotpotqa_dir',
           f'{hotpotqa_dir!r} is not a directory')
  if config.data.source == 'json':
    # Found now, not when the trainer builds its pools after model setup.
    from vermem_jax.envs import hotpotqa  # pylint: disable=g-import-not-at-top
    try:
      hotpotqa.find_split_file(hotpotqa.TRAIN, hotpotqa_dir)
    except FileNotFoundError as e:
      raise ValueError(f'config.data.hotpotqa_dir: {e}') from e
  if config.scale == 'paper' and config.data.source == 'json':
    official = os.path.join(hotpotqa_dir, paper.PAPER_TRAIN_FILE)
    _require(os.path.isfile(official), 'data.hotpotqa_dir',
             f'paper scale trains on the full HotpotQA train split; {official} is '
             'missing (point --config.data.hotpotqa_dir at the official files)')


def _check_tokenizer_path(config: ml_collections.ConfigDict) -> None:
  # The trainers load config.tokenizer.path, else the checkpoint folder's tokenizer.
  from vermem_jax import tokenization  # pylint: disable=g-import-not-at-top
  tok_path = config.tokenizer.path or config.model.hf_checkpoint
  _require(bool(tok_path), 'tokenizer.path',
           'no tokenizer: set it, or model.hf_checkpoint whose folder holds one')
  try:
    tokenization.check_tokenizer_path(tok_path)
  except (OSError, ValueError) as e:
    hint = ('' if config.tokenizer.path else
            ' (tokenizer.path is unset, so the tokenizer is read from '
            'model.hf_checkpoint; set --config.tokenizer.path)')
    raise ValueError(f'config.tokenizer.path: {e}{hint}') from e


def validate_config(config: ml_collections.ConfigDict, *,
                    check_paths: bool = False) -> None:
  """Raises ValueError naming the first bad field (`config.<section>.<field>: why`).

  Checks the config layer's own fields, then builds every library dataclass
  (`library_configs`), so their own validation runs and a key that is not one of their
  fields is reported.

  Args:
    config: a config from `get_config` (possibly overridden on the command line).
    check_paths: also require that files and folders the run reads exist.
  """
  for check in FIELD_CHECKS:
    check(config)
  library.library_configs(config)  # the libraries' own checks, errors prefixed by section
  if check_paths:
    _check_paths(config)
  if check_paths or not config.model.hf_checkpoint:
    library.model_config(config)  # unknown preset / unreadable checkpoint config.json
  if check_paths:
    _check_tokenizer_path(config)


def check_tokenizer_fits_model(config: ml_collections.ConfigDict) -> None:
  """Loads the run's tokenizer and raises if it can emit ids the model lacks.

  Costs one tokenizer load (seconds), so `run.py` calls it once before training rather
  than `validate_config` on every call. See `tokenization.check_tokenizer_model_compat`.

  Raises:
    ValueError: `config.tokenizer.path: ...` naming both vocabulary sizes, or the
      tokenizer / model config problems `validate_config(check_paths=True)` reports.
  """
  # The trainers' loader: cached per folder, so the trainer reuses this load.
  from vermem_jax.train import setup  # pylint: disable=g-import-not-at-top
  setup.load_tokenizer_for(config, library.model_config(config))
