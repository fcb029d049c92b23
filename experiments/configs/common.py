"""Shared experiment configuration: every number of SPEC.md as a ConfigDict field.

`get_config(phase, arg)` builds the full `ml_collections.ConfigDict` for one phase of the
curriculum (SPEC §4: sft -> phase_a -> phase_b -> phase_c) at one scale:

- `tiny` (default): a tiny Qwen-architecture model, the Qwen2.5 tokenizer files and the
  HotpotQA samples under the shared data root, the heuristic verifier and the
  oracle-evidence reader, a handful of small updates. A phase runs on a 2-core CPU in
  minutes. Values that differ from SPEC are reduced sizes (counts, lengths), never
  different formulas.
- `paper`: SPEC's values (Qwen2.5-7B-Instruct from an HF folder the user sets in
  `model.hf_checkpoint`, 8 tasks x 8 rollouts, 1,000 / 1,000 / 1,500 updates, ...).

The scale argument comes from the config flag text after ':' (ml_collections
`config_flags`): `--config=phase_b.py:scale=paper`; a bare `paper` / `tiny` works too.

Sections map onto the library's small typed dataclasses with identical key / field
names: `library_configs(config)` builds them all (data -> DataConfig, memory ->
ExecutorConfig, advantage -> AdvantageConfig, reward -> RewardConfig, verifier ->
VerifierConfig, solver -> SolverConfig, episodes -> ScenarioConfig + EnvConfig,
batching -> BatchingConfig) and `model_config(config)` the QwenConfig. The sections
`sampling`, `sft`, `rl`, `eval`, `checkpoint`, `metrics` are read by the trainers.
`validate_config` checks everything and names the bad field. Each field's comment cites
its SPEC section; **decision** marks values SPEC leaves to the configured protocol and
this project fixes.

Derived length buckets. `sampling.prompt_buckets`, `batching.length_buckets` and
`batching.command_buckets` are lazy `ml_collections.FieldReference`s computed from
`memory.policy_input_limit`, `sampling.prompt_overhead_tokens` and
`sampling.max_command_tokens` (`derived_buckets` gives the same values). Reading them
(attribute access, `to_dict()`) yields plain tuples, so overriding one of those three
numbers (`--config.memory.policy_input_limit=4096`) moves every bucket with it, while
overriding a bucket field itself replaces the derivation by the given tuple (checked by
`validate_config`). Copies keep the references (`copy.deepcopy`); a
`FrozenConfigDict` or `copy_and_resolve_references()` freezes the current values.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
from typing import Any, Mapping

import ml_collections

from vermem_jax import paths

# The curriculum (SPEC §4): θ_SFT -> θ_A -> θ_B -> θ_C; each RL phase's reference policy
# and initial parameters are the previous phase's.
PHASE_ORDER = ('sft', 'phase_a', 'phase_b', 'phase_c')
PREVIOUS_PHASE = {'sft': None, 'phase_a': 'sft', 'phase_b': 'phase_a',
                  'phase_c': 'phase_b'}
# Operation subspace name used by vermem_jax.memory.PHASE_OPS (SPEC §4).
PHASE_OP_SPACE = {'sft': 'C', 'phase_a': 'A', 'phase_b': 'B', 'phase_c': 'C'}
SCALES = ('tiny', 'paper')

SOLVER_BACKENDS = ('oracle', 'llm')
KL_ESTIMATORS = ('exact', 'k3')
OLD_LOGPROBS_SOURCES = ('learner', 'sampler')  # = train.rl_phase.OLD_LOGPROBS_SOURCES
TEACHER_BACKENDS = (None, 'openai_compatible')  # = envs.sft_data.config.SFTDataConfig's
DTYPES = ('float32', 'bfloat16')

# The official train file a paper-scale run needs (SPEC §4: the full train split).
PAPER_TRAIN_FILE = 'hotpot_train_v1.1.json'
# SPEC §4: episode counts (train, dev) and number of GRPO updates per RL phase.
PAPER_EPISODES = {'phase_a': (8000, 800), 'phase_b': (8000, 800),
                  'phase_c': (12000, 1200)}
PAPER_UPDATES = {'phase_a': 1000, 'phase_b': 1000, 'phase_c': 1500}

# Config keys that only the config layer reads (not fields of the section's library
# dataclass); `library_configs` drops them.
CONFIG_ONLY_KEYS = {
    'data': ('data_dir',),
    'solver': ('backend', 'hf_checkpoint'),
    'episodes': ('op_space',),
}


def power_of_two_buckets(min_len: int, max_len: int) -> list[int]:
  """Length buckets: powers of two from `min_len` below `max_len`, then `max_len`.

  Ends exactly at `max_len` (not the next power of two) so the longest batch is no
  larger than the longest legal sequence. Both arguments in tokens, min_len a power of 2.
  """
  if min_len <= 0 or max_len <= 0:
    raise ValueError(f'bucket bounds must be positive, got {min_len}, {max_len}')
  buckets = []
  b = min_len
  while b < max_len:
    buckets.append(b)
    b *= 2
  buckets.append(max_len)
  return buckets


# Smallest sampler prompt bucket and learner length bucket (tokens; decision): x_t holds
# the instruction block and the command list, a few hundred tokens at least, so smaller
# buckets would only add compilations.
MIN_PROMPT_BUCKET = 256
MIN_LENGTH_BUCKET = 256
MIN_COMMAND_BUCKET = 16  # decision: short commands (Null, Delete) are ~10-20 tokens

# A lazy FieldReference operation: `fn(value, *args)` with the args dereferenced when the
# field is read. Same fields as ml_collections' (private) op record, which is what
# FieldReference's documented `op` argument expects.
_LazyOp = collections.namedtuple('_LazyOp', ['fn', 'args'])


def _buckets_op(min_len: int, unused_value: Any, max_len: int) -> tuple[int, ...]:
  return tuple(power_of_two_buckets(min_len, int(max_len)))


def _derived_buckets_ref(min_len: int,
                         max_len: ml_collections.FieldReference
                         ) -> ml_collections.FieldReference:
  """A tuple field equal to power_of_two_buckets(min_len, max_len) whenever read.

  Assigning a tuple to the field (command line, code) drops the derivation.
  """
  return ml_collections.FieldReference(
      (), field_type=tuple,
      op=_LazyOp(functools.partial(_buckets_op, min_len), [max_len]))


def derived_buckets(config: ml_collections.ConfigDict) -> dict[str, tuple[int, ...]]:
  """The bucket fields as derived from the config's current limits (tokens).

  Returns:
    {'sampling.prompt_buckets': powers of two from MIN_PROMPT_BUCKET, then
     P_max = memory.policy_input_limit + sampling.prompt_overhead_tokens;
     'batching.length_buckets': powers of two from MIN_LENGTH_BUCKET, then
     P_max + sampling.max_command_tokens;
     'batching.command_buckets': powers of two from MIN_COMMAND_BUCKET, then
     sampling.max_command_tokens}.
    These are the values `get_config` installs (lazily, so they follow overrides of
    the three limits); a config whose bucket fields were set by hand may differ.
  """
  max_prompt = (int(config.memory.policy_input_limit)
                + int(config.sampling.prompt_overhead_tokens))
  max_cmd = int(config.sampling.max_command_tokens)
  return {
      'sampling.prompt_buckets': tuple(power_of_two_buckets(MIN_PROMPT_BUCKET,
                                                            max_prompt)),
      'batching.length_buckets': tuple(power_of_two_buckets(MIN_LENGTH_BUCKET,
                                                            max_prompt + max_cmd)),
      'batching.command_buckets': tuple(power_of_two_buckets(MIN_COMMAND_BUCKET,
                                                             max_cmd)),
  }


def _parse_arg(arg: str | None) -> dict[str, str]:
  """Parses the config-flag argument: '', 'paper', 'scale=paper' (comma separated)."""
  out = {'scale': 'tiny'}
  if arg is None or not str(arg).strip():
    return out
  for part in str(arg).split(','):
    part = part.strip()
    if not part:
      continue
    if '=' in part:
      key, value = (s.strip() for s in part.split('=', 1))
    else:
      key, value = 'scale', part
    if key != 'scale':
      raise ValueError(
          f"unknown config argument {key!r} in {arg!r}; supported: 'scale=tiny' or "
          f"'scale=paper' (override other fields with --config.<section>.<field>=...)")
    if value not in SCALES:
      raise ValueError(f'unknown scale {value!r} in {arg!r}; expected one of {SCALES}')
    out[key] = value
  return out


def get_config(phase: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """Full config for `phase` ('sft', 'phase_a', 'phase_b', 'phase_c') at a scale.

  Args:
    phase: one of PHASE_ORDER.
    arg: the config-flag argument ('scale=tiny' default, 'scale=paper').
  Raises:
    ValueError: unknown phase or argument.
  """
  if phase not in PHASE_ORDER:
    raise ValueError(f'unknown phase {phase!r}; expected one of {PHASE_ORDER}')
  scale = _parse_arg(arg)['scale']
  c = _paper_config(phase)
  if scale == 'tiny':
    _apply_tiny(c, phase)
  c.scale = scale
  return c


def _tokenizer_dir_op(unused_value: Any, data_dir: str, name: str) -> str:
  return paths.tokenizer_dir(name, data_dir)


def _derived_tokenizer_path_ref(c: ml_collections.ConfigDict
                                ) -> ml_collections.FieldReference:
  """A str field equal to `<data.data_dir>/tokenizers/<tokenizer.name>` whenever read,
  so `--config.data.data_dir=/elsewhere` moves the tokenizer with the data.

  Assigning a path to the field (command line, code) drops the derivation. The
  initial value is '' rather than None: FieldReference skips its ops on None.
  """
  return ml_collections.FieldReference(
      '', field_type=str,
      op=_LazyOp(_tokenizer_dir_op,
                 [c.data.get_ref('data_dir'), c.tokenizer.get_ref('name')]))


def _paper_config(phase: str) -> ml_collections.ConfigDict:
  """SPEC's values for `phase`."""
  c = ml_collections.ConfigDict()
  c.phase = phase                      # SPEC §4 curriculum stage
  c.scale = 'paper'
  c.seed = 42                          # SPEC §7: seeds 42, 43, 44 (one per run)
  c.workdir = './workdir'              # the --workdir flag wins when given

  # --- data (SPEC §4) ---
  c.data = ml_collections.ConfigDict()
  c.data.source = 'json'               # 'json' | 'tfds' | 'hf' (envs.hotpotqa.DataConfig)
  c.data.data_dir = paths.default_data_dir()  # user-overridable data root
  # HotpotQA folder; None = <data_dir>/hotpotqa. Official file names are preferred
  # over the *_sample.json files (envs.hotpotqa.SPLIT_FILES).
  c.data.hotpotqa_dir = ml_collections.FieldReference(None, field_type=str)
  c.data.tfds_data_dir = ml_collections.FieldReference(None, field_type=str)
  c.data.dev_fraction = 0.1            # SPEC §4: 90% construction / 10% internal dev
  c.data.split_seed = 0                # salt of the id hash assigning the pools

  # --- tokenizer (SPEC §1: budgets count backbone tokens) ---
  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.name = 'qwen2.5'
  c.tokenizer.path = ml_collections.FieldReference(None, field_type=str)  # None = HF ckpt

  # --- model (paper Table 2 backbone) ---
  c.model = ml_collections.ConfigDict()
  c.model.preset = 'qwen2.5-7b-instruct'
  # HF folder with config.json + safetensors; required at paper scale.
  c.model.hf_checkpoint = ml_collections.FieldReference(None, field_type=str)
  c.model.dtype = 'bfloat16'           # compute dtype on accelerators
  c.model.param_dtype = 'float32'
  c.model.remat = True                 # 8,192-token inputs need rematerialization
  c.model.mesh_data = -1               # mesh axes (models/sharding.py); -1 = the rest
  c.model.mesh_fsdp = 1
  c.model.mesh_tensor = 1

  # --- memory executor + serialization (SPEC §1–3) ---
  # Keys = memory.ExecutorConfig fields (its phase comes from episodes.op_space).
  c.memory = ml_collections.ConfigDict()
  c.memory.context_budget = 2048       # SPEC §1 decision: C_t budget in tokens
  # SPEC §1: g(s) at most 8,192 tokens. A reference: the bucket fields derive from it.
  c.memory.policy_input_limit = ml_collections.FieldReference(8192)
  c.memory.retrieve_top_k = 3          # SPEC §2 decision: BM25 top-k
  c.memory.bm25_k1 = 1.5               # BM25 library defaults (SPEC gives none)
  c.memory.bm25_b = 0.75
  c.memory.max_command_chars = 16384   # decision: longer command text is unparseable
  c.memory.history_command_max_chars = 2000  # decision: rejected command kept in H
  c.memory.max_tool_calls = 0          # SPEC §3 tool budget; 0 = no limit (decision)
  c.memory.check_numbers_on_write = True  # SPEC §2 source support for Add/Update
  # SPEC §3 constraint costs per violation (decision: Table 24 is not in the text).
  c.memory.cost_parse = 1.0            # unparseable command
  c.memory.cost_unknown_tool = 1.0     # unknown tool
  c.memory.cost_bad_argument = 0.5     # missing or ill-typed argument
  c.memory.cost_missing_id = 0.5       # reference to a missing id
  c.memory.cost_foreign_ref = 1.0      # reference outside this task
  c.memory.cost_unsupported_write = 0.5  # unsupported Add/Update
  c.memory.cost_unjustified_delete = 0.5  # Delete without a reason
  c.memory.cost_protected_removal = 1.0  # removal of protected evidence
  c.memory.cost_context_overflow = 0.5  # C over its token budget
  c.memory.cost_budget_exceeded = 0.5  # tool/interaction budget exceeded
  c.memory.cost_leakage = 1.0          # answer / supporting-fact labels leaked
  c.memory.cost_op_not_allowed = 1.0   # decision: like an unknown tool for the phase
  c.memory.cost_cap = 1.0              # SPEC §3: several violations capped at 1.0

  # --- policy sampling (SPEC §4) ---
  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 0.7         # SPEC §4 training rollouts
  c.sampling.top_p = 0.95              # SPEC §4
  c.sampling.eval_temperature = 0.0    # SPEC §4: evaluation is greedy
  # decision: one command per generation (a reference: the buckets derive from it).
  c.sampling.max_command_tokens = ml_collections.FieldReference(256)
  # decision: tokens reserved for the chat template around x_t. An upper bound, not the
  # measured value (Qwen2.5 adds 29, Qwen3 8-12), so one config fits every supported
  # tokenizer; rl.policy.SamplerPolicy refuses a template that needs more.
  c.sampling.prompt_overhead_tokens = ml_collections.FieldReference(64)
  max_prompt = c.memory.get_ref('policy_input_limit') + c.sampling.get_ref(
      'prompt_overhead_tokens')
  # Sampler prompt paddings (models/sampling.py): powers of two, then exactly the
  # longest prompt, so a full 8,192-token x_t pads to 8,256, not to 16,384.
  c.sampling.prompt_buckets = _derived_buckets_ref(MIN_PROMPT_BUCKET, max_prompt)

  # --- learner batches (DESIGN.md: bounded set of jit shapes) ---
  c.batching = ml_collections.ConfigDict()
  c.batching.micro_batch_size = 8      # decision: decisions per learner micro-batch
  # Derived tuples (module docstring); tuples, so config_flags can override them from
  # the command line. The last length bucket holds the longest prompt + command.
  c.batching.length_buckets = _derived_buckets_ref(
      MIN_LENGTH_BUCKET, max_prompt + c.sampling.get_ref('max_command_tokens'))
  c.batching.command_buckets = _derived_buckets_ref(
      MIN_COMMAND_BUCKET, c.sampling.get_ref('max_command_tokens'))
  c.batching.sort_by_length = True     # fewer padded tokens; same update sum

  # --- SFT (SPEC §4) ---
  c.sft = ml_collections.ConfigDict()
  c.sft.num_targets = 8                # 7 tools + ∅, exactly balanced
  c.sft.train_per_target = 4000        # SPEC §4
  c.sft.dev_per_target = 500           # SPEC §4
  c.sft.template_fraction = 0.5        # SPEC §4: half boundary templates, half teacher
  c.sft.min_negative_fraction = 0.25   # SPEC §4: ≥25% boundary/negative per class
  # Optional teacher for the non-template half (paper App. D.2); keys =
  # envs.sft_data.config.SFTDataConfig fields. None = templates fill every class.
  c.sft.teacher_backend = ml_collections.FieldReference(None, field_type=str)  # off
  c.sft.teacher_base_url = ''          # OpenAI-compatible endpoint (…/v1)
  c.sft.teacher_model = ''             # model name served there
  c.sft.teacher_api_key_env = 'VERMEM_TEACHER_API_KEY'  # env var name; never logged
  c.sft.teacher_timeout_s = 30.0       # decision: seconds per request
  c.sft.teacher_max_tokens = 256       # decision: teacher reply length (tokens)
  c.sft.teacher_temperature = 0.7      # decision: diverse teacher commands
  c.sft.learning_rate = 2e-5           # SPEC §4 AdamW
  c.sft.warmup_ratio = 0.03            # SPEC §4
  c.sft.max_grad_norm = 1.0            # SPEC §4
  c.sft.batch_size = 64                # SPEC §4
  c.sft.num_epochs = 3                 # SPEC §4
  c.sft.weight_decay = 0.0             # decision: SPEC gives none (HF Trainer default)
  c.sft.eval_every = 200               # decision: steps between dev evaluations
  c.sft.max_steps = ml_collections.FieldReference(None, field_type=int)  # None = epochs

  # --- RL (SPEC §4, §6) ---
  c.rl = ml_collections.ConfigDict()
  c.rl.num_updates = PAPER_UPDATES.get(phase, 0)  # SPEC §4: A 1000, B 1000, C 1500
  c.rl.tasks_per_update = 8            # SPEC §4
  c.rl.rollouts_per_task = 8           # SPEC §4: K
  c.rl.learning_rate = 1e-6            # SPEC §6
  c.rl.max_grad_norm = 1.0             # SPEC §6
  c.rl.clip_epsilon = 0.2              # SPEC §6 ε_clip
  c.rl.kl_beta = 0.1                   # SPEC §6 β_KL
  c.rl.kl_estimator = 'exact'          # issue 5: exact over the vocabulary; 'k3' optional
  c.rl.entropy_coef = 0.0              # SPEC §6: no entropy bonus
  c.rl.weight_decay = 0.0              # decision: SPEC gives none
  c.rl.monitor_every = 10              # decision: cadence of m^all / m^ans (updates)
  c.rl.reference_phase = PREVIOUS_PHASE[phase] or ''  # SPEC §4 π_ref
  # θ_old log-probs in the ratio ρ (decision; SPEC §6 samples with top-p 0.95):
  #   'learner': recomputed in the learner's forward at the rollout temperature under
  #     stop_gradient. One optimizer step per update makes θ = θ_old there, so ρ = 1
  #     exactly; the sampler's numbers are log-probs under the top-p-renormalized
  #     distribution and would bias ρ by log(nucleus mass).
  #   'sampler': the sampler's recorded log-probs (the bias above included).
  c.rl.old_logprobs = 'learner'

  # --- advantages (SPEC §6, paper Table 23) ---
  # Keys = rl.advantages.AdvantageConfig fields.
  c.advantage = ml_collections.ConfigDict()
  c.advantage.mode = 'full'            # 'full' | 'no_verify' | 'local_only' | 'global_only'
  c.advantage.std_floor = 0.01         # SPEC §6
  c.advantage.epsilon = 1e-6           # SPEC §6
  c.advantage.advantage_clip = 5.0     # SPEC §6: both advantages in [-5, 5]
  c.advantage.local_min_count = 8      # SPEC §6: batch stats need ≥8 of a type
  c.advantage.running_stats_decay = 0.99  # SPEC §6 EMA of the running statistics
  c.advantage.running_stats_init_count = 128  # SPEC §6: dev transitions per type
  c.advantage.lambda_local = 1.0       # SPEC §6 λ_l
  c.advantage.lambda_global = 1.0      # SPEC §6 λ_g
  c.advantage.lambda_constraint = 1.0  # SPEC §6 λ_c

  # --- rewards (SPEC §5) ---
  # Keys = rl.rewards.RewardConfig fields. (Verifier scores 0..4 / 4 live in the
  # verifiers' rubric parsing, SPEC §5.)
  c.reward = ml_collections.ConfigDict()
  c.reward.delta = 0.5                 # SPEC §5: efficiency gate 1[r^task ≥ δ]

  # --- verifiers (SPEC §5; issue 5 backends) ---
  # Keys = verifiers.base.VerifierConfig fields.
  c.verifier = ml_collections.ConfigDict()
  c.verifier.backend = 'openai_compatible'  # the paper uses frozen LLM verifiers
  c.verifier.base_url = 'http://localhost:8000/v1'  # OpenAI-compatible endpoint
  c.verifier.model = 'verifier'        # model name served at base_url
  c.verifier.api_key_env = 'VERMEM_VERIFIER_API_KEY'  # env var name; key never logged
  c.verifier.timeout_s = 60.0          # decision: seconds per request
  c.verifier.max_concurrency = 8       # decision: requests in flight
  c.verifier.max_retries = 2           # decision: retries on malformed output
  c.verifier.backoff_s = 1.0           # decision: HTTP retry backoff base (seconds)
  c.verifier.fallback = 'midpoint'     # 'zero' | 'midpoint' | 'heuristic' | 'skip'
  c.verifier.checkpoint_path = ''      # local_model backend: HF checkpoint folder
  c.verifier.tokenizer_path = ''       # local_model backend: '' = Qwen2.5 tokenizer
  c.verifier.max_new_tokens = 48       # local_model: four short score lines
  c.verifier.batch_size = 16           # local_model: prompts per generate call
  c.verifier.temperature = 0.0         # frozen verifier, greedy (paper App. F.1)
  c.verifier.max_section_chars = 12000  # decision: prompt section truncation
  c.verifier.seed = 0

  # --- task solver π_task (SPEC §4) ---
  # Keys = envs.task_solvers.SolverConfig fields + backend, hf_checkpoint.
  c.solver = ml_collections.ConfigDict()
  c.solver.backend = 'llm'             # 'llm' | 'oracle' (diagnostic stand-in)
  c.solver.hf_checkpoint = ml_collections.FieldReference(None, field_type=str)  # None = backbone
  c.solver.max_new_tokens = 64         # decision: solver answer length (tokens)
  c.solver.temperature = 0.0           # greedy task solver (paper App. C.3)
  c.solver.top_p = 1.0                 # paper App. C.3

  # --- episodes (SPEC §4) ---
  # Keys = envs.scenarios.spec.ScenarioConfig fields + op_space; rollout_limit and
  # token_budget also give envs.environment.EnvConfig.
  c.episodes = ml_collections.ConfigDict()
  train, dev = PAPER_EPISODES.get(phase, (0, 0))
  c.episodes.op_space = PHASE_OP_SPACE[phase]  # SPEC §4 allowed operations
  c.episodes.seed = 0                  # episode RNG seed
  c.episodes.num_train = train         # SPEC §4: A 8000, B 8000, C 12000
  c.episodes.num_dev = dev             # SPEC §4: A 800, B 800, C 1200
  c.episodes.rollout_limit = 16        # decision: max memory decisions per rollout
  # decision: online-token budget per training rollout (None = unlimited).
  c.episodes.token_budget = ml_collections.FieldReference(32768, field_type=int)
  c.episodes.context_budget = c.memory.get_ref('context_budget')  # = memory's (SPEC §1)
  c.episodes.fill_min = 0.5            # decision: Phase B C_0 fills 50–80% of budget
  c.episodes.fill_max = 0.8
  c.episodes.max_doc_sentences = 5     # decision: sentences per document observation
  c.episodes.max_doc_tokens = 320      # decision: tokens per document observation
  c.episodes.phase_a_distractors = 2   # decision: distractors in a Phase A schedule

  # --- evaluation (SPEC §7) ---
  c.eval = ml_collections.ConfigDict()
  c.eval.budgets = tuple(range(1000, 5001, 500))  # SPEC §7 hard episode budgets (tokens)
  c.eval.target_success = 40.0         # SPEC §7: S* for TN@S*
  c.eval.target_budget = 2500          # SPEC §7: B* for SR@B*
  c.eval.seeds = (42, 43, 44)          # SPEC §7
  c.eval.temperature = 0.0             # SPEC §4

  # --- checkpoints (DESIGN.md) ---
  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.max_to_keep = 3         # decision: newest N kept (+ SFT's best)
  c.checkpoint.save_every = 10         # decision: updates (RL) / steps (SFT) per save

  # --- metrics (issue 6) ---
  c.metrics = ml_collections.ConfigDict()
  c.metrics.log_every = 1              # updates (RL) / steps (SFT) per log row
  c.metrics.tensorboard = True
  c.metrics.advantage_table = True     # one row per decision, workdir/<phase>/advantages.jsonl
  c.metrics.progress_bar = True
  return c


def _apply_tiny(c: ml_collections.ConfigDict, phase: str) -> None:
  """Shrinks sizes so a phase runs on a 2-core CPU in minutes (same formulas)."""
  c.data.data_dir = paths.default_data_dir()  # HotpotQA samples + tokenizers
  # <data_dir>/tokenizers/<name>, following later data_dir / name overrides.
  c.tokenizer.path = _derived_tokenizer_path_ref(c)
  c.model.preset = 'tiny'
  c.model.hf_checkpoint = None         # randomly initialised tiny Qwen
  c.model.dtype = 'float32'            # CPU
  c.model.remat = False
  # Shorter inputs for CPU speed; the SFT builder needs >= ~512 tokens of g(s) to fit
  # the instruction block and a Summarize state. The bucket fields follow (derived).
  c.memory.context_budget = 384
  c.memory.policy_input_limit = 768
  # Every SFT target fits (longest template command measured at 149 Qwen tokens), so no
  # class is dropped from the balanced set.
  c.sampling.max_command_tokens = 160
  c.batching.micro_batch_size = 8
  c.sft.train_per_target = 8
  c.sft.dev_per_target = 4
  c.sft.batch_size = 8
  c.sft.num_epochs = 3                 # 64 examples / 8 = 8 steps x 3 epochs
  c.sft.learning_rate = 1e-3           # a random tiny model needs a larger step
  c.sft.eval_every = 8
  c.rl.num_updates = 2 if phase != 'sft' else 0
  c.rl.tasks_per_update = 2
  c.rl.rollouts_per_task = 4
  c.rl.monitor_every = 1
  c.advantage.running_stats_init_count = 4
  c.verifier.backend = 'heuristic'     # CPU stand-in for the LLM verifiers
  c.solver.backend = 'oracle'          # oracle-evidence reader
  if phase in PAPER_EPISODES:
    c.episodes.num_train = 16
    c.episodes.num_dev = 4
  c.episodes.rollout_limit = 3
  c.episodes.token_budget = 16384
  c.checkpoint.save_every = 1


def _require(cond: bool, field: str, message: str) -> None:
  if not cond:
    raise ValueError(f'config.{field}: {message}')


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
  _require(config.phase in PHASE_ORDER, 'phase', f'expected one of {PHASE_ORDER}')
  _require(config.scale in SCALES, 'scale', f'expected one of {SCALES}')
  _require(isinstance(config.seed, int), 'seed', 'must be an int')
  _require(config.model.dtype in DTYPES, 'model.dtype', f'expected one of {DTYPES}')
  _require(config.model.param_dtype in DTYPES, 'model.param_dtype',
           f'expected one of {DTYPES}')
  if config.scale == 'paper':
    _require(bool(config.model.hf_checkpoint), 'model.hf_checkpoint',
             'paper scale needs a Hugging Face Qwen folder: pass '
             '--config.model.hf_checkpoint=/path/to/Qwen2.5-7B-Instruct')
  m = config.memory
  for key in m.keys():
    if key.startswith('cost_') and key != 'cost_cap':
      _require(0.0 <= m[key] <= m.cost_cap, f'memory.{key}',
               f'cost {m[key]} outside [0, cost_cap={m.cost_cap}] (SPEC §3)')
  s = config.sampling
  _require(s.temperature >= 0.0, 'sampling.temperature', 'must be >= 0')
  _require(s.eval_temperature >= 0.0, 'sampling.eval_temperature', 'must be >= 0')
  _require(0.0 < s.top_p <= 1.0, 'sampling.top_p', 'must be in (0, 1]')
  _require(s.max_command_tokens >= 1, 'sampling.max_command_tokens', 'must be >= 1')
  _require(isinstance(s.prompt_overhead_tokens, int) and s.prompt_overhead_tokens >= 0,
           'sampling.prompt_overhead_tokens',
           f'must be an int >= 0, got {s.prompt_overhead_tokens!r}')
  b = config.batching
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
  t = config.sft
  _require(t.num_targets == 8, 'sft.num_targets', 'SPEC §4 has 8 targets (7 tools + ∅)')
  _require(t.train_per_target >= 1, 'sft.train_per_target', 'must be >= 1')
  _require(t.dev_per_target >= 1, 'sft.dev_per_target', 'must be >= 1')
  _require(0.0 <= t.template_fraction <= 1.0, 'sft.template_fraction', 'must be in [0, 1]')
  _require(0.0 <= t.min_negative_fraction <= 1.0, 'sft.min_negative_fraction',
           'must be in [0, 1]')
  _require(t.learning_rate > 0, 'sft.learning_rate', 'must be > 0')
  _require(0.0 <= t.warmup_ratio < 1.0, 'sft.warmup_ratio', 'must be in [0, 1)')
  _require(t.max_grad_norm > 0, 'sft.max_grad_norm', 'must be > 0')
  _require(t.batch_size >= 1, 'sft.batch_size', 'must be >= 1')
  _require(t.num_epochs >= 1, 'sft.num_epochs', 'must be >= 1')
  _require(t.weight_decay >= 0, 'sft.weight_decay', 'must be >= 0')
  _require(t.eval_every >= 1, 'sft.eval_every', 'must be >= 1')
  _require(t.max_steps is None or t.max_steps >= 1, 'sft.max_steps', 'must be >= 1 or None')
  _require(t.teacher_backend in TEACHER_BACKENDS, 'sft.teacher_backend',
           f'{t.teacher_backend!r} not in {TEACHER_BACKENDS}')
  if t.teacher_backend:
    _require(bool(t.teacher_base_url) and bool(t.teacher_model), 'sft.teacher_base_url',
             'the teacher needs sft.teacher_base_url and sft.teacher_model')
  _require(t.teacher_timeout_s > 0, 'sft.teacher_timeout_s', 'must be > 0 seconds')
  _require(t.teacher_max_tokens >= 1, 'sft.teacher_max_tokens', 'must be >= 1')
  _require(t.teacher_temperature >= 0, 'sft.teacher_temperature', 'must be >= 0')
  for key in ('model.mesh_data', 'model.mesh_fsdp', 'model.mesh_tensor'):
    section, name = key.split('.')
    value = config[section][name]
    _require(isinstance(value, int) and (value >= 1 or (name == 'mesh_data'
                                                        and value == -1)),
             key, f'must be an int >= 1 (mesh_data may be -1 = the rest), got {value!r}')
  r = config.rl
  _require(r.num_updates >= 0, 'rl.num_updates', 'must be >= 0')
  _require(r.tasks_per_update >= 1, 'rl.tasks_per_update', 'must be >= 1')
  _require(r.rollouts_per_task >= 2, 'rl.rollouts_per_task',
           f'K={r.rollouts_per_task}: group normalization needs K >= 2')
  _require(r.learning_rate > 0, 'rl.learning_rate', 'must be > 0')
  _require(r.max_grad_norm > 0, 'rl.max_grad_norm', 'must be > 0')
  _require(r.clip_epsilon > 0, 'rl.clip_epsilon', 'must be > 0')
  _require(r.kl_beta >= 0, 'rl.kl_beta', 'must be >= 0')
  _require(r.kl_estimator in KL_ESTIMATORS, 'rl.kl_estimator',
           f'{r.kl_estimator!r} not in {KL_ESTIMATORS}')
  _require(r.entropy_coef >= 0, 'rl.entropy_coef', 'must be >= 0')
  _require(r.weight_decay >= 0, 'rl.weight_decay', 'must be >= 0')
  _require(r.monitor_every >= 1, 'rl.monitor_every', 'must be >= 1')
  _require(r.old_logprobs in OLD_LOGPROBS_SOURCES, 'rl.old_logprobs',
           f'{r.old_logprobs!r} not in {OLD_LOGPROBS_SOURCES}')
  _require(r.reference_phase == (PREVIOUS_PHASE[config.phase] or ''),
           'rl.reference_phase',
           f'{config.phase} uses {PREVIOUS_PHASE[config.phase]!r} as π_ref (SPEC §4)')
  a = config.advantage
  _require(0.0 < a.running_stats_decay < 1.0, 'advantage.running_stats_decay',
           'must be in (0, 1)')
  for lam in ('lambda_local', 'lambda_global', 'lambda_constraint'):
    _require(a[lam] >= 0, f'advantage.{lam}', 'must be >= 0')
  _require(config.solver.backend in SOLVER_BACKENDS, 'solver.backend',
           f'{config.solver.backend!r} not in {SOLVER_BACKENDS}')
  e = config.episodes
  _require(e.op_space in ('A', 'B', 'C'), 'episodes.op_space', "expected 'A', 'B' or 'C'")
  _require(e.op_space == PHASE_OP_SPACE[config.phase], 'episodes.op_space',
           f'{config.phase} trains op space {PHASE_OP_SPACE[config.phase]!r} (SPEC §4)')
  _require(e.context_budget == m.context_budget, 'episodes.context_budget',
           f'{e.context_budget} != memory.context_budget {m.context_budget}')
  _require(e.token_budget is None or e.token_budget >= 1, 'episodes.token_budget',
           'must be >= 1 token or None')
  if config.phase != 'sft':
    _require(e.num_train >= r.tasks_per_update, 'episodes.num_train',
             f'{e.num_train} episodes < rl.tasks_per_update={r.tasks_per_update}')
  ev = config.eval
  _require(len(ev.budgets) > 0 and list(ev.budgets) == sorted(set(ev.budgets)),
           'eval.budgets', 'must be a non-empty increasing list of token budgets')
  _require(ev.budgets[0] <= ev.target_budget <= ev.budgets[-1], 'eval.target_budget',
           f'B*={ev.target_budget} outside the budget range')
  _require(0.0 <= ev.target_success <= 100.0, 'eval.target_success', 'must be in [0, 100]')
  _require(config.checkpoint.max_to_keep >= 1, 'checkpoint.max_to_keep', 'must be >= 1')
  _require(config.checkpoint.save_every >= 1, 'checkpoint.save_every', 'must be >= 1')
  _require(config.metrics.log_every >= 1, 'metrics.log_every', 'must be >= 1')
  library_configs(config)  # the libraries' own checks, errors prefixed by section
  if check_paths:
    _require(os.path.isdir(config.data.data_dir), 'data.data_dir',
             f'{config.data.data_dir!r} is not a directory '
             f'(set --config.data.data_dir or ${paths.DATA_DIR_ENV})')
    _require(os.path.isdir(hotpotqa_dir(config)), 'data.hotpotqa_dir',
             f'{hotpotqa_dir(config)!r} is not a directory')
    if config.data.source == 'json':
      # Found now, not when the trainer builds its pools after model setup.
      from vermem_jax.envs import hotpotqa  # pylint: disable=g-import-not-at-top
      try:
        hotpotqa.find_split_file(hotpotqa.TRAIN, hotpotqa_dir(config))
      except FileNotFoundError as e:
        raise ValueError(f'config.data.hotpotqa_dir: {e}') from e
    if config.scale == 'paper' and config.data.source == 'json':
      official = os.path.join(hotpotqa_dir(config), PAPER_TRAIN_FILE)
      _require(os.path.isfile(official), 'data.hotpotqa_dir',
               f'paper scale trains on the full HotpotQA train split; {official} is '
               'missing (point --config.data.hotpotqa_dir at the official files)')
    for field, folder in (('model.hf_checkpoint', config.model.hf_checkpoint),
                          ('solver.hf_checkpoint', config.solver.hf_checkpoint),
                          ('verifier.checkpoint_path', config.verifier.checkpoint_path
                           if config.verifier.backend == 'local_model' else None)):
      if folder:
        _require(os.path.isdir(folder), field, f'{folder!r} is not a directory')
  if check_paths or not config.model.hf_checkpoint:
    model_config(config)  # unknown preset / unreadable checkpoint config.json
  if check_paths:
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
  setup.load_tokenizer_for(config, model_config(config))


def model_config(config: ml_collections.ConfigDict) -> Any:
  """The policy's `models.QwenConfig`: from `model.hf_checkpoint`'s config.json when
  set, else the `model.preset`; `model.dtype`, `param_dtype`, `remat` applied.

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
    {'data': envs.hotpotqa.DataConfig, 'memory': memory.ExecutorConfig (phase =
    episodes.op_space), 'advantage': rl.advantages.AdvantageConfig, 'reward':
    rl.rewards.RewardConfig, 'verifier': verifiers.base.VerifierConfig, 'solver':
    envs.task_solvers.SolverConfig, 'episodes': envs.scenarios.spec.ScenarioConfig,
    'env': envs.environment.EnvConfig, 'batching': rl.batching.BatchingConfig}.
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

  def build(section: str, cls: type, **extra: Any) -> Any:
    values = config[section].to_dict()
    for key in CONFIG_ONLY_KEYS.get(section, ()):
      values.pop(key, None)
    try:
      return to_dataclass(cls, values, **extra)
    except (ValueError, TypeError) as e:
      raise ValueError(f'config.{section}: {e}') from e

  out = {
      'data': build('data', hotpotqa.DataConfig, hotpotqa_dir=hotpotqa_dir(config)),
      'memory': build('memory', memory_config.ExecutorConfig,
                      phase=config.episodes.op_space),
      'advantage': build('advantage', advantages.AdvantageConfig),
      'reward': build('reward', rewards.RewardConfig),
      'verifier': build('verifier', verifier_base.VerifierConfig),
      'solver': build('solver', task_solvers.SolverConfig),
      'episodes': build('episodes', scenario_spec.ScenarioConfig),
      'batching': build('batching', batching.BatchingConfig),
  }
  try:
    out['env'] = environment.EnvConfig.from_config(config.episodes.to_dict())
  except (ValueError, TypeError) as e:
    raise ValueError(f'config.episodes: {e}') from e
  return out


def hotpotqa_dir(config: ml_collections.ConfigDict) -> str:
  """The HotpotQA folder: `data.hotpotqa_dir`, else `<data.data_dir>/hotpotqa`."""
  return config.data.hotpotqa_dir or paths.hotpotqa_dir(config.data.data_dir)


def to_dataclass(cls: type, section: Mapping[str, Any] | ml_collections.ConfigDict,
                 *, strict: bool = True, **extra: Any) -> Any:
  """Builds library dataclass `cls` from a config section (keys = field names).

  Args:
    cls: a dataclass type (e.g. memory.ExecutorConfig, rl.advantages.AdvantageConfig).
    section: the ConfigDict section (or mapping).
    strict: raise if the section holds keys `cls` does not have.
    **extra: values for fields not in the section (they win over the section).
  Raises:
    ValueError: naming unknown keys (strict) or the dataclass's unknown fields.
  """
  if not dataclasses.is_dataclass(cls):
    raise ValueError(f'{cls!r} is not a dataclass')
  values = dict(section.to_dict() if isinstance(section, ml_collections.ConfigDict)
                else section)
  values.update(extra)
  names = {f.name for f in dataclasses.fields(cls) if f.init}
  unknown = sorted(set(values) - names)
  if unknown and strict:
    raise ValueError(f'{cls.__name__} has no field(s) {unknown}; config keys must match '
                     f'its fields {sorted(names)}')
  return cls(**{k: v for k, v in values.items() if k in names})
