"""One GRPO phase of the curriculum: Phase A, B or C (SPEC §4-6; paper App. B, D.5, F.4,
F.6, F.7).

`run_rl_phase(config, workdir)` trains θ_p for p = config.phase ('phase_a' | 'phase_b' |
'phase_c') into `workdir/<phase>/`.

Initialization (SPEC §4, App. B/F.6). π_θ starts from the previous phase's parameters and
the reference policy π_ref IS those parameters, frozen for the whole phase: θ_SFT (the
best SFT checkpoint by dev tool accuracy) for A, θ_A for B, θ_B for C. Both are read with
`checkpoints.restore_params_only` from `workdir/<previous phase>/`; only policy
parameters pass between phases (a fresh optimizer state, fresh running statistics).
`<phase dir>/reference.json` records which checkpoint step was loaded and a SHA-256 of
the reference parameters (`params_fingerprint`), so anyone can check that π_ref is
exactly the previous phase's parameters.

Optimizer (SPEC §6). clip_by_global_norm(rl.max_grad_norm = 1.0) -> optax AdamW at the
constant rate rl.learning_rate (1e-6; the paper names no schedule), weight decay
rl.weight_decay (not applied to 1-D parameters, as in SFT), no entropy bonus
(rl.entropy_coef must be 0; the loss has no entropy term).

Running local statistics (SPEC §6, App. F.4). At phase start a fresh `RunningStats` is
initialized from `advantage.running_stats_init_count` executable internal-dev
transitions per op type enabled in the phase (`rollout.init_running_stats_from_dev`;
candidates: the target commands of SFT dev records built from the internal-dev pool,
then the reference commands of the phase's dev episodes). They are updated after every
update batch by the rollout collector and saved in every checkpoint (`to_dict`).

One update n (1-based; a checkpoint's step = completed updates):
  1. θ_old := the current parameters, frozen for the update. Tasks: `tasks_per_update`
     train episodes chosen by `rollout.select_tasks(pool, n, ...)` (a pure function of
     (seed, n): the data position is the update index). Key: `rollout.update_rng(seed,
     n)`. `rollout.collect_update` runs the T x K rollouts with the sampler at
     temperature 0.7 / top-p 0.95, scores them and returns A^hier per decision.
  2. Learner: every decision (∅ and rejected commands included) becomes one row of the
     padded micro-batches (`batching.micro_batches`; command-token weights already
     divided by the update's N decisions). `grpo_step` (grpo.command_logits +
     grpo.grpo_loss_from_logits, jitted; the computation of grpo.grpo_loss_and_grads)
     returns loss and gradient SUMS per micro-batch; they are accumulated and divided
     once by N, then one
     optimizer step is applied (SPEC §6: per-command token mean, then mean over all
     decisions of the update).
  3. Logging, then a checkpoint every `checkpoint.save_every` updates and at the end.

θ_old's log-probabilities. With exactly one optimizer step per update, the parameters
that sampled the update are θ_old exactly. The sampler records each command token's
log-probability under the distribution it was DRAWN from: logits / T restricted to the
top-p nucleus and renormalized (models/sampling.py), which exceeds log π_θold(y | h) at
temperature T (the policy the loss evaluates) by the log of the nucleus mass (≈ log
0.95 for a flat tiny model). The default (`rl.old_logprobs = 'learner'`, read with a
default since the config field is optional) therefore takes log π_θold at temperature T
from the learner's own forward pass under stop_gradient (`grpo_step`): θ = θ_old at the
single step, so ρ = 1 exactly and ∇ρ = ∇ log π_θ, as in GRPO with one policy iteration,
at no extra forward pass. The sampler's values are kept as a diagnostic
(`train/sampler_logprob_gap`, learner minus sampler per command token: ≈ 0 up to the
nucleus renormalization and KV-cache vs full-sequence rounding). `rl.old_logprobs =
'sampler'` uses the sampler's numbers in the ratio instead.

Monitors (paper App. F.7): m^all and m^ans are averaged over the update's T x K
trajectories of the rollout batch collected BEFORE update n's optimizer step; they are
logged as `monitor/m_all`, `monitor/m_ans` at `monitor/point` = n - 1 (completed updates;
point 0 is the batch collected before the first update) whenever (n - 1) is a multiple
of `rl.monitor_every`, and for the last update. (The per-update reward means, including
`reward/m_all` / `reward/m_ans`, are logged with every row.)

Files in `workdir/<phase>/`: Orbax steps (params, optimizer state, next update's key,
running statistics, data position), `metrics.jsonl` + TensorBoard events (one row per
logged update: `train/*` learner, `reward/*`, `rollout/*`, `advantage/*`, `tokens/*`,
`time/*` stage seconds, `monitor/*`), `advantages.jsonl` (one row per decision,
`metrics.ADVANTAGE_COLUMNS`), `reference.json`.

Resume. On start the newest restorable checkpoint is restored (a corrupt newest step is
skipped with a logged warning naming it, and moved aside — never deleted — when that
step is saved again); the JSONL logs are cut back to the restored step, so they match an
uninterrupted run row for row (except wall-clock fields). Because tasks, keys and the
running statistics are functions of (seed, update, checkpoint), a run killed at any
moment and resumed ends with parameters bit-identical to an uninterrupted run with the
same seed. A run whose newest restorable checkpoint is the last update returns its
stored final metrics without work. A workdir holding a run with other settings, or whose
previous phase changed since this phase started, is refused (ValueError).

Devices (`train/setup.py`). θ, π_ref and the AdamW state are placed on the
('data', 'fsdp', 'tensor') mesh of `config.model.mesh_*` (restore templates carry the
shardings, so checkpoints load directly into that layout); learner micro-batch rows are
split over ('data', 'fsdp') and the jitted learner runs under `sharding.use_sharding`.
The rollout sampler runs under the same rules (`setup.generate_fn_for`); an 'llm'
solver checkpoint is loaded onto the same mesh and read without activation constraints. Before the first rollout the
tokenizer is checked against the policy's and the solver checkpoint's vocabularies, and
a verifier with `preflight()` (OpenAI-compatible HTTP) must answer one request.

Single-host: the reference fingerprint reads every parameter to host memory once per
phase start.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import time
from typing import Any, Mapping, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vermem_jax.envs import environment
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import task_solvers
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.models import hf_io
from vermem_jax.models import qwen
from vermem_jax.rl import advantages as adv
from vermem_jax.rl import batching
from vermem_jax.rl import grpo
from vermem_jax.rl import policy as policy_lib
from vermem_jax.rl import rewards as rw
from vermem_jax.rl import rollout
from vermem_jax import verifiers
from vermem_jax.verifiers import base as vbase
from vermem_jax.train import checkpoints
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import setup as setup_lib

# SPEC §4: the curriculum θ_SFT -> θ_A -> θ_B -> θ_C; each RL phase starts from, and
# regularizes towards, the previous phase's parameters.
PREVIOUS_PHASE = {'phase_a': 'sft', 'phase_b': 'phase_a', 'phase_c': 'phase_b'}
RL_PHASES = tuple(PREVIOUS_PHASE)
REFERENCE_FILE = 'reference.json'
# Sources of θ_old's log-probabilities (module docstring).
OLD_LOGPROBS_SOURCES = ('learner', 'sampler')
DEFAULT_OLD_LOGPROBS = 'learner'
# AdamW moments/epsilon: the PyTorch / HF defaults, as in SFT (SPEC §6 names AdamW only
# through the SFT recipe; the paper gives no RL optimizer details beyond lr and clip).
ADAM_B1 = 0.9
ADAM_B2 = 0.999
ADAM_EPS = 1e-8


# ----------------------------------------------------------------------------- helpers
def params_fingerprint(params: Any) -> str:
  """SHA-256 hex digest of a parameter tree: every leaf's path, dtype, shape and bytes.

  Leaves are visited in `jax.tree_util.tree_flatten_with_path` order (sorted dict keys),
  each contributing `keystr(path)`, `dtype.str`, `shape` and its C-order bytes. Equal
  digests mean bit-identical trees (up to SHA-256 collisions).
  """
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    arr = np.ascontiguousarray(np.asarray(leaf))
    h.update(jax.tree_util.keystr(path).encode())
    h.update(arr.dtype.str.encode())
    h.update(repr(tuple(arr.shape)).encode())
    h.update(arr.tobytes())
  return h.hexdigest()


def _fields_from(cls: type, section: Mapping[str, Any], **extra: Any) -> Any:
  """`cls(**section)` keeping only `cls`'s fields (the config layer checks the rest)."""
  names = {f.name for f in dataclasses.fields(cls) if f.init}
  values = {k: v for k, v in dict(section).items() if k in names}
  values.update(extra)
  return cls(**values)


def _section(config: ml_collections.ConfigDict, name: str) -> dict[str, Any]:
  return config[name].to_dict()


def learner_batching_config(bcfg: batching.BatchingConfig, *, policy_input_limit: int,
                            prompt_overhead: int,
                            max_command_tokens: int) -> batching.BatchingConfig:
  """`bcfg` with a last length bucket covering the longest possible learner row.

  A row is the chat-templated x_t (at most policy_input_limit + prompt_overhead tokens)
  plus at most max_command_tokens command tokens. When config.batching.length_buckets
  ends below that, one bucket of exactly that length is appended (one more jit shape)
  and a warning names the config field, instead of failing mid-run.
  """
  need = int(policy_input_limit) + int(prompt_overhead) + int(max_command_tokens)
  if bcfg.length_buckets[-1] >= need:
    return bcfg
  logging.warning(
      'config.batching.length_buckets ends at %d tokens, below policy_input_limit (%d) '
      '+ chat-template overhead (%d) + max_command_tokens (%d) = %d; adding a %d-token '
      'bucket', bcfg.length_buckets[-1], policy_input_limit, prompt_overhead,
      max_command_tokens, need, need)
  return dataclasses.replace(bcfg, length_buckets=tuple(bcfg.length_buckets) + (need,))


# ----------------------------------------------------------------------------- optimizer
@dataclasses.dataclass(frozen=True)
class RLOptimizerConfig:
  """RL optimizer (config section `rl`; SPEC §6). Hashable: a static jit argument.

  Attributes:
    learning_rate: constant AdamW rate (SPEC §6: 1e-6).
    max_grad_norm: global-norm clip (SPEC §6: 1.0).
    weight_decay: AdamW decoupled weight decay, not on 1-D params (SPEC gives none: 0).
  """
  learning_rate: float = 1e-6
  max_grad_norm: float = 1.0
  weight_decay: float = 0.0

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f'rl.learning_rate must be > 0, got {self.learning_rate}')
    if not self.max_grad_norm > 0:
      raise ValueError(f'rl.max_grad_norm must be > 0, got {self.max_grad_norm}')
    if self.weight_decay < 0:
      raise ValueError(f'rl.weight_decay must be >= 0, got {self.weight_decay}')


def make_optimizer(opt: RLOptimizerConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) -> AdamW(learning_rate) (SPEC §6)."""
  return optax.chain(
      optax.clip_by_global_norm(opt.max_grad_norm),
      optax.adamw(opt.learning_rate, b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS,
                  weight_decay=opt.weight_decay,
                  mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)))


# Shared with the SFT trainer (train/setup.py).
model_config_from = setup_lib.model_config_from


@jax.jit
def _add_grads(acc: Any, grads: Any) -> Any:
  return jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)


@functools.partial(jax.jit, static_argnames=('opt',))
def apply_update(params: Any, opt_state: Any, grad_sum: Any, num_decisions: jax.Array,
                 *, opt: RLOptimizerConfig) -> tuple[Any, Any, jax.Array]:
  """One optimizer step from the update's summed gradient (jitted; divides once).

  Args:
    params, opt_state: θ and the `make_optimizer(opt)` state.
    grad_sum: Σ over micro-batches of ∂(Σ_decisions per-command token-mean loss)/∂θ
      (float32 tree shaped like params).
    num_decisions: N, decisions in the update (float32 scalar, >= 1).
  Returns:
    (new params, new opt_state, global norm of the mean gradient before clipping).
  """
  grads = jax.tree.map(lambda g, p: (g / num_decisions).astype(p.dtype), grad_sum,
                       params)
  updates, new_opt_state = make_optimizer(opt).update(grads, opt_state, params)
  return optax.apply_updates(params, updates), new_opt_state, optax.global_norm(grads)


def _combine_metrics(parts: Sequence[Mapping[str, tuple]]) -> dict[str, float]:
  """Merges per-micro-batch (value, count) metrics: sums, or min/max for *_min/*_max."""
  merged: dict[str, list] = {}
  for m in parts:
    for k, (v, n) in m.items():
      v, n = float(v), float(n)
      if k not in merged:
        merged[k] = [v, n]
      elif n > 0:
        if merged[k][1] == 0:
          merged[k] = [v, n]
        elif k.endswith('_min'):
          merged[k] = [min(merged[k][0], v), merged[k][1] + n]
        elif k.endswith('_max'):
          merged[k] = [max(merged[k][0], v), merged[k][1] + n]
        else:
          merged[k] = [merged[k][0] + v, merged[k][1] + n]
  return grpo.finalize_metrics({k: tuple(v) for k, v in merged.items()})


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Static loss settings (config section `rl` + sampling temperature; SPEC §6)."""
  clip_epsilon: float = 0.2  # SPEC §6 ε_clip
  kl_beta: float = 0.1  # SPEC §6 β_KL
  kl_estimator: str = 'exact'
  temperature: float = 0.7  # SPEC §4 rollout temperature (ratios at the same T)
  old_logprobs: str = DEFAULT_OLD_LOGPROBS

  def __post_init__(self):
    if self.old_logprobs not in OLD_LOGPROBS_SOURCES:
      raise ValueError(f'rl.old_logprobs must be one of {OLD_LOGPROBS_SOURCES}, got '
                       f'{self.old_logprobs!r}')


@functools.partial(jax.jit, static_argnames=(
    'model_config', 'clip_epsilon', 'kl_beta', 'kl_estimator', 'temperature',
    'old_from_learner'))
def grpo_step(params: Any, ref_params: Any, batch: Mapping[str, jax.Array], *,
              model_config: qwen.QwenConfig, clip_epsilon: float, kl_beta: float,
              kl_estimator: str, temperature: float, old_from_learner: bool):
  """Summed GRPO loss and gradient of one micro-batch (Eq. 11), jitted.

  Same computation as `grpo.grpo_loss_and_grads` (policy and reference logits at the
  command positions only, `grpo.grpo_loss_from_logits`), plus the learner's own
  log π_θ(y_j | h_j) at `temperature`. With `old_from_learner`, θ_old's log-probs are
  those values under stop_gradient: θ = θ_old at the update's single optimizer step, so
  ρ = exp(log π_θ − sg(log π_θ)) = 1 and ∇ρ = ∇ log π_θ, without a second forward pass
  (module docstring). Otherwise batch['old_logprobs'] (the sampler's) is used.

  Args:
    params, ref_params: θ and θ_ref parameter trees.
    batch: `batching.to_step_batch` arrays ([B, T] model inputs, [B, L] loss layout).
    model_config, clip_epsilon, kl_beta, kl_estimator, temperature: static settings.
    old_from_learner: see above.
  Returns:
    ((loss_sum, num_decisions, metrics, learner_logprobs [B, L] float32 (0 on
    padding)), grads of loss_sum) — sums, not yet divided by the update's N.
  """
  ref_logits = None
  if kl_beta != 0:
    ref_logits = jax.lax.stop_gradient(grpo.command_logits(model_config, ref_params,
                                                           batch))
  mask = batch['command_ids'] > 0

  def loss_fn(p):
    logits = grpo.command_logits(model_config, p, batch)
    logp = jax.lax.stop_gradient(grpo.token_logprobs_from_logits(
        logits, batch['target_ids'], temperature=temperature))
    logp = jnp.where(mask, logp, 0.0)
    loss_batch = dict(batch, old_logprobs=logp) if old_from_learner else batch
    loss_sum, num, metrics = grpo.grpo_loss_from_logits(
        logits, ref_logits, loss_batch, clip_epsilon=clip_epsilon, kl_beta=kl_beta,
        kl_estimator=kl_estimator, temperature=temperature)
    return loss_sum, (num, metrics, logp)

  (loss_sum, (num, metrics, logp)), grads = jax.value_and_grad(
      loss_fn, has_aux=True)(params)
  return (loss_sum, num, metrics, logp), grads


def learner_update(params: Any, ref_params: Any, opt_state: Any,
                   decisions: Sequence[batching.DecisionTokens], *,
                   model_config: qwen.QwenConfig, batching_config: batching.BatchingConfig,
                   loss: LossConfig, opt: RLOptimizerConfig, pad_id: int,
                   mesh: jax.sharding.Mesh | None = None
                   ) -> tuple[Any, Any, dict[str, float]]:
  """One GRPO optimizer step over all decisions of an update (SPEC §6, Eq. 11).

  Args:
    params: θ = θ_old (frozen copy not needed: arrays are immutable).
    ref_params: θ_ref (the previous phase's parameters).
    opt_state: optimizer state.
    decisions: the update's N decisions (prompt ids [T_in], command ids [L], sampler
      logprobs [L], A^hier), ∅ and rejected commands included.
    model_config: policy QwenConfig.
    batching_config: learner shapes.
    loss: ε, β, KL estimator, temperature, θ_old log-prob source.
    opt: optimizer settings.
    pad_id: padding token id.
    mesh: the training mesh (`setup.make_mesh_from`; params, ref_params and opt_state
      already placed on it): micro-batch rows are split over ('data', 'fsdp'), the
      model's activation constraints apply, gradient sums are sharded like the params.
      None = single-device behaviour (arrays as placed).
  Returns:
    (new params, new opt_state, metrics): 'train/loss' (= Σ/N of each command's
    token-mean −ℓ), 'train/policy_loss', 'train/kl_loss', 'train/kl', 'train/
    clip_fraction', 'train/ratio', 'train/ratio_min', 'train/ratio_max',
    'train/entropy', 'train/logprob_gap', 'train/logprob_abs_gap', 'train/advantage'
    (token-level), 'train/grad_norm' (pre-clip), 'train/sampler_logprob_gap' and
    '_abs_gap' (learner θ_old minus sampler, per command token), 'train/num_decisions',
    'train/num_micro_batches', 'train/num_shapes', 'train/learning_rate', and seconds
    'time/learner_batching_s', 'time/learner_grads_s' (loss + gradient),
    'time/learner_optimizer_s'.
  Raises:
    ValueError: no decisions, or a decision longer than the learner shapes.
  """
  n = len(decisions)
  if n == 0:
    raise ValueError('an update needs at least one decision')
  t0 = time.perf_counter()
  mbs = batching.micro_batches(decisions, batching_config, pad_id=pad_id)
  t_batch = time.perf_counter() - t0
  t_grad = 0.0
  grad_sum = setup_lib.zeros_like_params(params)
  loss_sum, parts = 0.0, []
  gap_sum = gap_abs_sum = gap_count = 0.0
  kwargs = dict(model_config=model_config, clip_epsilon=loss.clip_epsilon,
                kl_beta=loss.kl_beta, kl_estimator=loss.kl_estimator,
                temperature=loss.temperature,
                old_from_learner=loss.old_logprobs == 'learner')
  for mb in mbs:
    t0 = time.perf_counter()
    step_batch = batching.to_step_batch(mb)
    with setup_lib.mesh_context(mesh):
      (l, _, m, learner_lp), grads = grpo_step(
          params, ref_params, setup_lib.place_batch(step_batch, mesh), **kwargs)
      grad_sum = _add_grads(grad_sum, grads)
    loss_sum += float(l)
    parts.append(m)
    mask = step_batch['command_ids'] > 0
    gap = (np.asarray(learner_lp) - step_batch['old_logprobs'])[mask]
    gap_sum += float(gap.sum())
    gap_abs_sum += float(np.abs(gap).sum())
    gap_count += float(mask.sum())
    t_grad += time.perf_counter() - t0
  t0 = time.perf_counter()
  with setup_lib.mesh_context(mesh):
    new_params, new_opt_state, grad_norm = apply_update(
        params, opt_state, grad_sum, jnp.asarray(float(n), jnp.float32), opt=opt)
  grad_norm = float(grad_norm)  # waits for the step
  t_opt = time.perf_counter() - t0
  out = {f'train/{k}': v for k, v in _combine_metrics(parts).items()}
  out['train/loss'] = loss_sum / n
  out['train/grad_norm'] = grad_norm
  out['train/sampler_logprob_gap'] = gap_sum / max(gap_count, 1.0)
  out['train/sampler_logprob_abs_gap'] = gap_abs_sum / max(gap_count, 1.0)
  out['train/num_decisions'] = float(n)
  out['train/num_micro_batches'] = float(len(mbs))
  out['train/num_shapes'] = float(len(batching.batch_shapes(mbs)))
  out['train/learning_rate'] = float(opt.learning_rate)
  out['time/learner_batching_s'] = t_batch
  out['time/learner_grads_s'] = t_grad
  out['time/learner_optimizer_s'] = t_opt
  return new_params, new_opt_state, out


# ----------------------------------------------------------------------------- setup
@dataclasses.dataclass
class PhaseSetup:
  """Everything a phase's updates need, built once from the config.

  Attributes:
    phase, op_space: 'phase_b', 'B'.
    tokenizer, model_config: the policy's.
    train_specs, dev_specs: the phase's train / internal-dev episodes (SPEC §4).
    solver: π_task; verifier: local + global verifier.
    executor_config, env_config, advantage_config, reward_config, batching_config,
    sampling_config, rollout_config: library settings.
    loss, opt: learner settings.
    construction, dev_pool: the HotpotQA pools (SPEC §4 90/10 split).
  """
  phase: str
  op_space: str
  tokenizer: Any
  model_config: qwen.QwenConfig
  train_specs: list
  dev_specs: list
  solver: Any
  verifier: Any
  executor_config: ExecutorConfig
  env_config: environment.EnvConfig
  advantage_config: adv.AdvantageConfig
  reward_config: rw.RewardConfig
  batching_config: batching.BatchingConfig
  sampling_config: policy_lib.PolicySamplingConfig
  rollout_config: rollout.RolloutConfig
  loss: LossConfig
  opt: RLOptimizerConfig
  construction: list
  dev_pool: list


def _check_phase(config: ml_collections.ConfigDict) -> str:
  phase = config.phase
  if phase not in RL_PHASES:
    raise ValueError(f'config.phase: run_rl_phase trains {RL_PHASES}, got {phase!r}')
  if config.rl.entropy_coef != 0:
    raise ValueError('config.rl.entropy_coef: SPEC §6 uses no entropy bonus and this '
                     f'trainer implements none; got {config.rl.entropy_coef}')
  if int(config.rl.num_updates) < 1:
    raise ValueError(f'config.rl.num_updates: must be >= 1, got {config.rl.num_updates}')
  return phase


def build_setup(config: ml_collections.ConfigDict, *, solver_params: Any = None,
                mesh: jax.sharding.Mesh | None = None) -> PhaseSetup:
  """Tokenizer, episodes, solver, verifier and library configs of one phase.

  Checks before any rollout: the tokenizer fits the policy's (and an 'llm' solver
  checkpoint's) vocabulary (`tokenization.check_tokenizer_model_compat`), and a
  verifier with a `preflight()` (the OpenAI-compatible backend) answers one request.

  Args:
    config: the phase config (experiments/configs/phase_*.py).
    solver_params: parameters for an 'llm' task solver without its own checkpoint.
    mesh: where an 'llm' solver checkpoint's parameters are placed (sharded like the
      policy's); None = the default device.
  Raises:
    ValueError: a bad config field (named), e.g. an 'llm' solver without weights, a
      tokenizer whose ids exceed a model's vocab_size, or an unreachable verifier.
  """
  phase = _check_phase(config)
  op_space = config.episodes.op_space
  mc = setup_lib.model_config_from(config)
  tok = setup_lib.load_tokenizer_for(config, mc)
  exec_cfg = _fields_from(ExecutorConfig, _section(config, 'memory'), phase=op_space)
  env_cfg = environment.EnvConfig.from_config(_section(config, 'episodes'))
  scen_cfg = episodes.ScenarioConfig.from_config(_section(config, 'episodes'))
  construction, dev_pool = episodes.load_pools(
      hotpotqa.DataConfig.from_config(_section(config, 'data')))
  train_specs, dev_specs = episodes.build_phase_episodes(
      op_space, construction, dev_pool, count_tokens=tok.count_tokens, config=scen_cfg)
  if len(train_specs) < int(config.rl.tasks_per_update):
    raise ValueError(f'config.episodes.num_train: {len(train_specs)} train episodes < '
                     f'rl.tasks_per_update={config.rl.tasks_per_update}')
  if config.solver.backend == 'oracle':
    solver = task_solvers.OracleEvidenceReader.from_examples(
        list(construction) + list(dev_pool), tokenizer=tok)
  elif config.solver.backend == 'llm':
    path = config.solver.hf_checkpoint or config.model.hf_checkpoint
    if path:
      s_cfg, s_params = hf_io.load_hf_checkpoint(path, dtype=config.model.param_dtype,
                                                 mesh=mesh)
      s_cfg = s_cfg.replace(dtype=config.model.dtype)
      field = ('config.solver.hf_checkpoint' if config.solver.hf_checkpoint
               else 'config.model.hf_checkpoint')
      setup_lib.check_tokenizer_fits(tok, s_cfg, field=field)
    elif solver_params is not None:
      s_cfg, s_params = mc, solver_params
    else:
      raise ValueError('config.solver.hf_checkpoint: the llm task solver needs weights '
                       '(set solver.hf_checkpoint or model.hf_checkpoint), or use '
                       "solver.backend='oracle'")
    solver = task_solvers.LLMTaskSolver(
        tok, s_cfg, s_params,
        config=task_solvers.SolverConfig.from_config(_section(config, 'solver')))
  else:
    raise ValueError(f'config.solver.backend: unknown {config.solver.backend!r}')
  verifier = verifiers.make_verifier(
      _fields_from(vbase.VerifierConfig, _section(config, 'verifier')))
  if hasattr(verifier, 'preflight'):
    # Transport failures become fallback scores during scoring; fail now instead.
    verifier.preflight()
  sampling_cfg = _fields_from(policy_lib.PolicySamplingConfig, _section(config, 'sampling'))
  bcfg = learner_batching_config(
      _fields_from(batching.BatchingConfig, _section(config, 'batching')),
      policy_input_limit=exec_cfg.policy_input_limit,
      prompt_overhead=policy_lib.prompt_overhead_tokens(tok),
      max_command_tokens=sampling_cfg.max_command_tokens)
  loss = LossConfig(clip_epsilon=float(config.rl.clip_epsilon),
                    kl_beta=float(config.rl.kl_beta),
                    kl_estimator=str(config.rl.kl_estimator),
                    temperature=float(sampling_cfg.temperature),
                    old_logprobs=str(config.rl.get('old_logprobs', DEFAULT_OLD_LOGPROBS)))
  if not loss.temperature > 0:
    raise ValueError('config.sampling.temperature: RL rollouts sample (SPEC §4: 0.7); '
                     f'got {loss.temperature}')
  return PhaseSetup(
      phase=phase, op_space=op_space, tokenizer=tok, model_config=mc,
      train_specs=list(train_specs), dev_specs=list(dev_specs), solver=solver,
      verifier=verifier, executor_config=exec_cfg, env_config=env_cfg,
      advantage_config=_fields_from(adv.AdvantageConfig, _section(config, 'advantage')),
      reward_config=_fields_from(rw.RewardConfig, _section(config, 'reward')),
      batching_config=bcfg, sampling_config=sampling_cfg,
      rollout_config=rollout.RolloutConfig.from_config(_section(config, 'rl')),
      loss=loss,
      opt=RLOptimizerConfig(learning_rate=float(config.rl.learning_rate),
                            max_grad_norm=float(config.rl.max_grad_norm),
                            weight_decay=float(config.rl.weight_decay)),
      construction=list(construction), dev_pool=list(dev_pool))


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
  sft_cfg = episodes.SFTDataConfig.from_config(
      _section(config, 'sft'), seed=config.episodes.seed, train_per_target=1,
      dev_per_target=count, teacher_backend=None,
      context_budget=config.memory.context_budget,
      policy_input_limit=config.memory.policy_input_limit,
      max_doc_sentences=config.episodes.max_doc_sentences,
      max_doc_tokens=config.episodes.max_doc_tokens)
  try:
    _, dev_records, _ = episodes.build_sft_set(
        setup.construction, setup.dev_pool, count_tokens=tok.count_tokens,
        config=sft_cfg, verbose=False)
    out += rollout.dev_inputs_from_sft_records(
        dev_records, count_tokens=tok.count_tokens,
        executor_config=setup.executor_config)
  except ValueError as e:
    logging.warning('running statistics: no SFT dev records (%s); using the dev '
                    'episodes only', e)
  out += rollout.dev_inputs_from_episodes(
      setup.dev_specs, count_tokens=tok.count_tokens,
      executor_config=setup.executor_config)
  return out


def init_running_stats(config: ml_collections.ConfigDict,
                       setup: PhaseSetup) -> tuple[adv.RunningStats, dict[str, int]]:
  """Fresh phase RunningStats from scored dev transitions (SPEC §6, App. F.4)."""
  ops = mcommands.PHASE_OPS[setup.op_space]
  return rollout.init_running_stats_from_dev(
      setup.verifier, dev_transitions(config, setup), ops=ops,
      count=int(config.advantage.running_stats_init_count),
      decay=setup.advantage_config.running_stats_decay)


def trajectory_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Config fields that determine the phase's trajectory (checked on resume).

  `rl.num_updates` is not part of it: a finished run may be extended.
  """
  r = config.rl
  return {
      'phase': config.phase, 'seed': int(config.seed),
      'model': config.model.hf_checkpoint or config.model.preset,
      'tasks_per_update': int(r.tasks_per_update),
      'rollouts_per_task': int(r.rollouts_per_task),
      'learning_rate': float(r.learning_rate), 'max_grad_norm': float(r.max_grad_norm),
      'clip_epsilon': float(r.clip_epsilon), 'kl_beta': float(r.kl_beta),
      'kl_estimator': str(r.kl_estimator), 'weight_decay': float(r.weight_decay),
      'old_logprobs': str(r.get('old_logprobs', DEFAULT_OLD_LOGPROBS)),
      'advantage_mode': str(config.advantage.mode),
      'episodes_seed': int(config.episodes.seed),
      'num_train_episodes': int(config.episodes.num_train),
      'temperature': float(config.sampling.temperature),
      'top_p': float(config.sampling.top_p),
      'max_command_tokens': int(config.sampling.max_command_tokens),
      'policy_input_limit': int(config.memory.policy_input_limit),
      'context_budget': int(config.memory.context_budget),
      'rollout_limit': int(config.episodes.rollout_limit),
      'verifier': str(config.verifier.backend), 'solver': str(config.solver.backend),
  }


def _check_resume(metadata: Mapping[str, Any], fingerprint: Mapping[str, Any],
                  directory: str) -> None:
  setup_lib.check_resume(metadata, fingerprint, directory, what='a run')


def data_position(update: int, setup: PhaseSetup, seed: int) -> dict[str, int]:
  """The task sampler's position after `update` completed updates (JSON)."""
  t = setup.rollout_config.tasks_per_update
  return {'update': int(update), 'tasks_consumed': int(update) * int(t),
          'num_train_episodes': len(setup.train_specs), 'seed': int(seed)}


def read_reference(phase_directory: str) -> dict[str, Any] | None:
  """`reference.json` of a phase directory (None when missing)."""
  path = os.path.join(phase_directory, REFERENCE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, value: Mapping[str, Any]) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _numeric(values: Mapping[str, Any]) -> dict[str, float]:
  out = {}
  for k, v in values.items():
    if isinstance(v, (bool, np.bool_)):
      out[k] = float(v)
    elif isinstance(v, (int, float, np.integer, np.floating)):
      out[k] = float(v)
  return out


def rollout_summary(result: rollout.RolloutResult) -> dict[str, float]:
  """Token, tool-call and monitor means of an update's trajectories (SPEC §5, §7)."""
  trajs = result.trajectories
  n = max(len(trajs), 1)
  return {
      'tokens/online_mean': sum(t.result.online_tokens for t in trajs) / n,
      'tokens/policy_input_mean': sum(t.result.policy_input_tokens for t in trajs) / n,
      'tokens/command_total': float(sum(d.command_tokens for d in result.decisions)),
      'rollout/tool_calls_mean': sum(t.result.tool_calls for t in trajs) / n,
      'rollout/task_steps_mean': sum(t.result.task_steps for t in trajs) / n,
      'rollout/decisions_per_trajectory': result.num_decisions / n,
      'rollout/rejected_share': (sum(not d.accepted for d in result.decisions)
                                 / max(result.num_decisions, 1)),
  }


# ----------------------------------------------------------------------------- driver
def run_rl_phase(config: ml_collections.ConfigDict, workdir: str, *,
                 stop_after_update: int | None = None) -> dict[str, Any]:
  """Trains one RL phase into `workdir/<config.phase>` (module docstring).

  Args:
    config: a phase config (experiments/configs/phase_{a,b,c}.py).
    workdir: run directory; reads `workdir/<previous phase>/`, writes
      `workdir/<phase>/`.
    stop_after_update: stop once this many updates are complete (as if killed right
      after that update's checkpoint, if one was due; drills and tests).
  Returns:
    Final metrics (JSON values): 'phase', 'step' (completed updates), 'num_updates',
    'complete', 'wall_time_s' (this call, seconds), 'cumulative_wall_time_s',
    'reference_phase', 'reference_step', 'reference_params_sha256',
    'params_sha256' (final θ), 'resumed_from' (restored step or 0) and the last logged
    update's metrics (`train/*`, `reward/*`, `rollout/*`, `time/*`, ...).
  Raises:
    ValueError: a bad config field; a workdir holding this phase with other settings or
      a different reference policy.
    checkpoints.CheckpointError: the previous phase has no restorable checkpoint, or
      this phase's checkpoints are all unrestorable.
  """
  t_start = time.time()
  phase = _check_phase(config)
  prev = PREVIOUS_PHASE[phase]
  if config.rl.get('reference_phase', prev) not in ('', prev):
    raise ValueError(f'config.rl.reference_phase: {phase} uses {prev!r} as π_ref '
                     f'(SPEC §4), got {config.rl.reference_phase!r}')
  directory = checkpoints.phase_dir(workdir, phase)
  prev_dir = checkpoints.phase_dir(workdir, prev)
  total = int(config.rl.num_updates)
  seed = int(config.seed)
  fingerprint = trajectory_fingerprint(config)
  mc = setup_lib.model_config_from(config)
  mesh = setup_lib.make_mesh_from(config)
  opt = RLOptimizerConfig(learning_rate=float(config.rl.learning_rate),
                          max_grad_norm=float(config.rl.max_grad_norm),
                          weight_decay=float(config.rl.weight_decay))
  # Abstract arrays with the mesh shardings: restores land directly on the layout.
  param_shapes, opt_shapes = setup_lib.abstract_train_state(
      mc, make_optimizer(opt).init, mesh)
  template = checkpoints.TrainState(
      step=0, params=param_shapes, opt_state=opt_shapes, rng=rollout.update_rng(seed, 1),
      running_stats={}, data_position={}, metadata={})

  # ---- resume (newest restorable checkpoint, with fallback past corrupt ones)
  mgr = checkpoints.PhaseCheckpointManager(
      directory, max_to_keep=int(config.checkpoint.max_to_keep))
  latest = mgr.latest_step()
  restored = mgr.restore(template)
  if restored is not None:
    _check_resume(restored.metadata, fingerprint, directory)
    if latest is not None and restored.step != latest:
      logging.warning(
          '%s: the newest checkpoint (step %d) cannot be restored; resuming from step '
          '%d instead and redoing updates %d..%d. The unrestorable step stays on disk '
          '(moved to %s/ when step %d is saved again).', phase, latest, restored.step,
          restored.step + 1, latest, os.path.join(directory,
                                                  checkpoints.UNRESTORABLE_DIR), latest)
    md = restored.metadata or {}
    if restored.step >= total and md.get('final_metrics'):
      mgr.close()
      logging.info('%s in %s is complete at update %d; nothing to do', phase, directory,
                   restored.step)
      done = dict(md['final_metrics'])
      done['wall_time_s'] = time.time() - t_start
      return done

  # ---- reference policy π_ref = θ_prev, and θ's initialization
  ref_params, ref_step = checkpoints.restore_params_only(prev_dir, param_shapes,
                                                         prefer_best=True)
  ref_sha = params_fingerprint(ref_params)
  reference = {'phase': phase, 'reference_phase': prev, 'reference_dir': prev_dir,
               'reference_step': int(ref_step), 'params_sha256': ref_sha}
  if restored is not None:
    old_ref = (restored.metadata or {}).get('reference') or {}
    if old_ref and (old_ref.get('params_sha256') != ref_sha
                    or old_ref.get('reference_step') != ref_step):
      raise ValueError(
          f'{directory} was trained against {prev} step {old_ref.get("reference_step")} '
          f'(sha256 {str(old_ref.get("params_sha256"))[:12]}…), but {prev_dir} now '
          f'gives step {ref_step} (sha256 {ref_sha[:12]}…); π_ref changed, so the run '
          'cannot be resumed exactly. Use a fresh --workdir.')
  logging.info('%s: π_ref = %s step %d (params sha256 %s)', phase, prev, ref_step,
               ref_sha[:16])

  setup = build_setup(config, mesh=mesh)
  tok = setup.tokenizer
  if restored is None:
    step = 0
    params = ref_params  # θ_0 = θ_prev (SPEC §4); arrays are immutable, so sharing is safe
    opt_state = setup_lib.init_opt_state(make_optimizer(setup.opt).init, params, mesh)
    running, used = init_running_stats(config, setup)
    logging.info('%s: running statistics initialized from dev transitions %s', phase,
                 used)
    prior_wall = 0.0
    reference['initial_params_sha256'] = params_fingerprint(params)
    reference['running_stats_init_counts'] = used
    _write_json(os.path.join(directory, REFERENCE_FILE), reference)
  else:
    step, params, opt_state = restored.step, restored.params, restored.opt_state
    expected = data_position(step, setup, seed)
    if restored.data_position != expected:
      raise ValueError(f'{directory}: checkpoint step {step} has data position '
                       f'{restored.data_position}, expected {expected} (different '
                       'episodes); use a fresh --workdir')
    running = adv.RunningStats.from_dict(restored.running_stats)
    prior_wall = float((restored.metadata or {}).get('cumulative_wall_time_s', 0.0))
    if read_reference(directory) is None:
      _write_json(os.path.join(directory, REFERENCE_FILE), reference)
    logging.info('%s resumes from update %d of %d in %s', phase, step, total, directory)
  resumed_from = step

  policy = policy_lib.SamplerPolicy(
      setup.model_config, params, tok, sampling_config=setup.sampling_config,
      batch_buckets=(setup.rollout_config.num_rollouts,),
      generate_fn=setup_lib.generate_fn_for(mesh))
  stop = total if stop_after_update is None else min(total, int(stop_after_update))
  save_every = int(config.checkpoint.save_every)
  log_every = int(config.metrics.log_every)
  monitor_every = int(config.rl.monitor_every)
  writer = metrics_lib.MetricsWriter(directory, resume_step=step,
                                     tensorboard=bool(config.metrics.tensorboard))
  table = (metrics_lib.AdvantageTable(directory, phase, resume_update=step)
           if config.metrics.advantage_table else None)
  bar = metrics_lib.progress_bar(total, initial=step, desc=phase,
                                 disable=not config.metrics.progress_bar)
  last: dict[str, float] = {}
  last_logged: dict[str, float] = {}
  try:
    while step < stop:
      n = step + 1
      t0 = time.perf_counter()
      # θ_old := θ. The sampler reads these (immutable) arrays for the whole update.
      policy.params = params
      task_ids = rollout.select_tasks(len(setup.train_specs), n,
                                      setup.rollout_config.tasks_per_update, seed=seed)
      result = rollout.collect_update(
          [setup.train_specs[i] for i in task_ids], policy, setup.solver,
          setup.verifier, rng=rollout.update_rng(seed, n),
          count_tokens=tok.count_tokens,
          rollouts_per_task=setup.rollout_config.rollouts_per_task,
          running_stats=running, executor_config=setup.executor_config,
          env_config=setup.env_config, advantage_config=setup.advantage_config,
          reward_config=setup.reward_config, phase=phase, update=n)
      t1 = time.perf_counter()
      params, opt_state, learn = learner_update(
          params, ref_params, opt_state, result.decision_tokens(),
          model_config=setup.model_config, batching_config=setup.batching_config,
          loss=setup.loss, opt=setup.opt, pad_id=int(tok.pad_token_id), mesh=mesh)
      jax.block_until_ready(params)
      t2 = time.perf_counter()
      step = n
      row = dict(_numeric(result.metrics))
      row.update(rollout_summary(result))
      row.update(learn)
      row['time/learner_s'] = t2 - t1
      row['time/update_s'] = t2 - t0
      row['rollout/task_ids_first'] = float(task_ids[0])
      is_monitor = (n - 1) % monitor_every == 0 or n == total
      if is_monitor:
        row['monitor/point'] = float(n - 1)
        row['monitor/m_all'] = row.get('reward/m_all', math.nan)
        row['monitor/m_ans'] = row.get('reward/m_ans', math.nan)
      last = row
      if n % log_every == 0 or n == total or is_monitor:
        writer.write(n, row)
        last_logged = row
      if table is not None:
        table.add_rows(result.advantage_rows())
      bar.update(1)
      bar.set_postfix(loss=f'{learn["train/loss"]:.3f}', kl=f'{learn["train/kl"]:.2e}',
                      r=f'{row.get("reward/r_global", math.nan):.3f}')
      if n % save_every == 0 or n == total:
        wall = prior_wall + time.time() - t_start
        metadata = {'fingerprint': fingerprint, 'reference': reference,
                    'cumulative_wall_time_s': wall, 'complete': n >= total,
                    'num_updates': total}
        if n >= total:
          metadata['final_metrics'] = _final_metrics(
              phase, n, total, wall, reference, params, resumed_from, row)
        mgr.save(checkpoints.TrainState(
            step=n, params=params, opt_state=opt_state, rng=rollout.update_rng(seed, n + 1),
            running_stats=running.to_dict(), data_position=data_position(n, setup, seed),
            metadata=metadata))
  finally:
    bar.close()
    writer.close()
    if table is not None:
      table.close()
  mgr.close()
  wall = prior_wall + time.time() - t_start
  out = _final_metrics(phase, step, total, wall, reference, params, resumed_from,
                       last or last_logged)
  out['wall_time_s'] = time.time() - t_start
  return out


def _final_metrics(phase: str, step: int, total: int, wall: float,
                   reference: Mapping[str, Any], params: Any, resumed_from: int,
                   row: Mapping[str, float]) -> dict[str, Any]:
  """The returned / stored summary (JSON values only)."""
  out = {'phase': phase, 'step': int(step), 'num_updates': int(total),
         'complete': step >= total, 'cumulative_wall_time_s': float(wall),
         'reference_phase': reference['reference_phase'],
         'reference_step': int(reference['reference_step']),
         'reference_params_sha256': reference['params_sha256'],
         'params_sha256': params_fingerprint(params),
         'resumed_from': int(resumed_from)}
  for k, v in row.items():
    out[k] = float(v) if math.isfinite(float(v)) else None
  return json.loads(json.dumps(out))
