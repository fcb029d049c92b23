"""The GRPO learner of an RL phase: optimizer and the jitted update over one update's
decisions (SPEC §6, Eq. 10-11; paper App. F.6).

Optimizer (SPEC §6; `train/rl_optimizer.py`, `train/optim.py`). clip_by_global_norm(rl.max_grad_norm = 1.0) ->
AdamW(rl.adam_b1, rl.adam_b2, rl.adam_eps) at rl.learning_rate (1e-6) under
rl.lr_schedule (default constant: the paper names no schedule), weight decay
rl.weight_decay (not on 1-D parameters), no entropy bonus (rl.entropy_coef must be 0).

PPO passes (`learner_update`; SPEC §6 GRPO passes, a decision: the paper gives no
value). θ_old and the advantages are fixed by the rollout pass; then
rl.num_iterations = μ passes over the update's N decisions, each pass split into
rl.mini_batches_per_iteration = M shuffled mini-batches (a fresh permutation per pass,
seeded by (seed, update, pass); M = 1 keeps the decisions in order) and ONE optimizer
step per mini-batch: μ·M steps per update. A mini-batch's decisions become padded
micro-batches (`batching.micro_batches`, command-token weights divided by that
mini-batch's N_b decisions); `loss_step.grpo_loss_and_grads` (command_token_stats +
grpo.grpo_loss_from_token_stats, jitted: the head and loss run in chunks of
`batching.loss_chunk_size` command positions, no [B, L, V] array) returns loss and
gradient SUMS per micro-batch, which are accumulated and divided once by N_b
(`rl_optimizer.apply_update`), so the deferred normalization holds per mini-batch
(SPEC §6: per-command token mean, then mean over the mini-batch's decisions; M = 1:
over all decisions of the update). With μ = M = 1
this is the single step per update of one-iteration GRPO; with μ > 1 or M > 1 the ratio
ρ = π_θ / π_θold moves away from 1 after the first step and the ε-clip acts.

θ_old's log-probabilities (`rl.old_logprobs`). The sampler records each command token's
log-probability under the distribution it was DRAWN from: logits / T restricted to the
top-p nucleus and renormalized (models/sampling.py), which exceeds log π_θold(y | h) at
temperature T by the log of the nucleus mass (≈ log 0.95 for a flat tiny model).
'learner' (default) therefore takes log π_θold at the loss temperature from the
learner: the first optimizer step of an update runs at θ = θ_old, so its own forward
gives them under stop_gradient (ρ = 1, ∇ρ = ∇ log π_θ, no extra pass), and the
decisions outside that first mini-batch (M > 1) get theirs from one forward-only pass
at θ_old before the first step; all later steps reuse these fixed values. The
sampler's values are kept as a diagnostic (`train/sampler_logprob_gap`, learner θ_old
minus sampler per command token). 'sampler' uses the sampler's numbers in the ratio.

Loss temperature and top-p (decision). The ratio, π_ref and the KL are evaluated on
softmax(logits / rl.loss_temperature) over the whole vocabulary; loss_temperature
defaults to the sampling temperature (0.7), as TRL and Tunix evaluate the policy at
the temperature they sample with. Top-p (0.95) stays a sampling device and is not
applied in the loss: π_θ in Eq. 10 is the policy itself, and a nucleus-truncated π_θ
would give tokens outside the nucleus log-probability -∞ (an undefined ratio and KL
once θ moves) and a loss that is not differentiable at the nucleus boundary. The cost is
the per-token offset log(nucleus mass) between sampler and learner, reported above.

Non-finite steps (SPEC §6; `train/nonfinite.py`). A mini-batch whose loss or gradient
holds NaN/Inf is not applied (parameters and optimizer state stay unchanged); it
counts in `train/skipped_steps` and is booked on the caller's `SkipCounter`, which
stops the run after rl.max_consecutive_skips skips in a row, naming the update.

Metrics: 'train/*' combine every optimizer step of the update; 'train/pass{p}/*'
(p = 1..μ) give clip_fraction, clip_active_fraction, ratio_min, ratio_max, kl,
approx_kl, loss and grad_norm of pass p alone.

Devices (`train/setup.py`). θ, π_ref and the AdamW state are placed on the
('data', 'fsdp', 'tensor') mesh by the caller; learner micro-batch rows are split over
('data', 'fsdp') and the jitted learner runs under `sharding.use_sharding`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from vermem_jax.models import qwen_config
from vermem_jax.rl import batching
from vermem_jax.rl import grpo
from vermem_jax.rl import loss_step
from vermem_jax.train import distributed
from vermem_jax.train import nonfinite
from vermem_jax.train import optim
from vermem_jax.train import rl_optimizer
from vermem_jax.train import setup as setup_lib

# Sources of θ_old's log-probabilities (module docstring).
OLD_LOGPROBS_SOURCES = ('learner', 'sampler')
DEFAULT_OLD_LOGPROBS = 'learner'
# Metrics reported per PPO pass as 'train/pass{p}/<name>'.
PASS_METRICS = ('clip_fraction', 'clip_active_fraction', 'ratio_min', 'ratio_max', 'kl',
                'approx_kl')


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
  """Static loss settings (config section `rl`; SPEC §6)."""
  clip_epsilon: float = 0.2  # SPEC §6 ε_clip
  kl_beta: float = 0.1  # SPEC §6 β_KL
  kl_estimator: str = 'exact'
  # rl.loss_temperature: ratios, π_ref and KL at this T (default: the sampling
  # temperature, SPEC §4 0.7; module docstring).
  temperature: float = 0.7
  old_logprobs: str = DEFAULT_OLD_LOGPROBS
  # rl.max_log_ratio: clamp of log ρ before exp (decision: only guards overflow).
  max_log_ratio: float = grpo.DEFAULT_MAX_LOG_RATIO
  # rl.loss_reduction: a command's 1/L in Eq. 11 ('decision'; rl/grpo.py docstring).
  reduction: str = 'decision'

  def __post_init__(self):
    if self.old_logprobs not in OLD_LOGPROBS_SOURCES:
      raise ValueError(f'rl.old_logprobs must be one of {OLD_LOGPROBS_SOURCES}, got '
                       f'{self.old_logprobs!r}')
    if not self.temperature > 0:
      raise ValueError(f'rl.loss_temperature must be > 0, got {self.temperature}')
    if not self.max_log_ratio > 0:
      raise ValueError(f'rl.max_log_ratio must be > 0, got {self.max_log_ratio}')
    if self.reduction not in grpo.GRPO_REDUCTIONS:
      raise ValueError(f'rl.loss_reduction must be one of {grpo.GRPO_REDUCTIONS}, got '
                       f'{self.reduction!r}')


@dataclasses.dataclass
class _Step:
  """One optimizer step of learner_update (host-side record)."""
  loss: float
  grad_norm: float
  finite: bool
  parts: list
  logprobs: list  # learner log π_θ per decision of the mini-batch ([L_d] arrays)
  num_micro_batches: int
  shapes: set
  seconds: tuple  # (batching, loss + gradient, optimizer)


def _mini_batch_step(params, ref_params, opt_state, subset, *, old_from_learner, kw,
                     batching_config, opt, pad_id, mesh):
  """Loss and gradient sums over `subset`'s micro-batches, then one guarded step."""
  t0 = time.perf_counter()
  mbs = batching.micro_batches(subset, batching_config, pad_id=pad_id)
  t_batch = time.perf_counter() - t0
  t0 = time.perf_counter()
  grad_sum = setup_lib.zeros_like_params(params)
  loss_sum, parts, lps = 0.0, [], [None] * len(subset)
  for mb in mbs:
    step_batch = batching.to_step_batch(mb)
    with setup_lib.mesh_context(mesh):
      (l, _, m, learner_lp), grads = loss_step.grpo_loss_and_grads(
          params, ref_params, setup_lib.place_batch(step_batch, mesh),
          old_from_learner=old_from_learner, **kw)
      grad_sum = rl_optimizer.add_grads(grad_sum, grads)
    loss_sum += float(l)
    parts.append(m)
    # Rows may sit on other processes' devices: gather them (a collective).
    learner_lp = distributed.to_host(learner_lp)
    for cid, v in batching.values_by_decision(mb, learner_lp).items():
      lps[cid - 1] = v
  t_grad = time.perf_counter() - t0
  t0 = time.perf_counter()
  n = len(subset)
  grad_norm = float('nan')
  with setup_lib.mesh_context(mesh):
    finite = nonfinite.is_finite(loss_sum, grad_sum)
    if finite:  # else: skipped, θ and the optimizer state stay as they are
      params, opt_state, grad_norm = rl_optimizer.apply_update(
          params, opt_state, grad_sum, jnp.asarray(float(n), jnp.float32), opt=opt)
      grad_norm = float(grad_norm)  # waits for the step
  step = _Step(loss_sum / n, grad_norm, finite, parts, lps, len(mbs),
               batching.batch_shapes(mbs), (t_batch, t_grad, time.perf_counter() - t0))
  return params, opt_state, step


def theta_old_logprobs(params, decisions, *, model_config, batching_config,
                       temperature, pad_id, mesh=None) -> list[np.ndarray]:
  """log π_θ(y_j | h_j) at `temperature` of every command token of `decisions` (one
  forward pass, no gradient): [L_d] float32 per decision, in order."""
  out = [None] * len(decisions)
  for mb in batching.micro_batches(decisions, batching_config, pad_id=pad_id):
    step_batch = batching.to_step_batch(mb)
    with setup_lib.mesh_context(mesh):
      lp = loss_step.policy_logprobs(params, setup_lib.place_batch(step_batch, mesh),
                                model_config=model_config, temperature=temperature,
                                loss_chunk_size=batching_config.loss_chunk_size)
    for cid, v in batching.values_by_decision(mb, distributed.to_host(lp)).items():
      out[cid - 1] = v
  return out


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """What the learner update reads (config sections `model`, `batching`, `rl`).

  Attributes:
    model_config: the policy's QwenConfig.
    batching_config: learner shapes (`learner_batching_config`).
    opt: the optimizer (optim.OptimizerConfig, section `rl`).
    loss: ε, β, KL estimator, loss temperature, θ_old log-prob source, log-ratio clamp.
    ppo: μ passes and M mini-batches per pass.
    pad_id: the tokenizer's padding id.
  """
  model_config: qwen_config.QwenConfig
  batching_config: batching.BatchingConfig
  opt: optim.OptimizerConfig
  loss: LossConfig = LossConfig()
  ppo: rl_optimizer.PPOConfig = rl_optimizer.PPOConfig()
  pad_id: int = 0


def learner_update(params: Any, ref_params: Any, opt_state: Any,
                   decisions: Sequence[batching.DecisionTokens], learner: LearnerConfig,
                   *, mesh: jax.sharding.Mesh | None = None,
                   shuffle_seed: Sequence[int] = (0,),
                   skip_counter: nonfinite.SkipCounter | None = None,
                   label: str = 'update') -> tuple[Any, Any, dict[str, float]]:
  """The optimizer steps of one update: μ passes x M mini-batches (module docstring).

  Args:
    params: θ = θ_old (frozen copy not needed: arrays are immutable).
    ref_params: θ_ref (the previous phase's parameters).
    opt_state: optimizer state.
    decisions: the update's N decisions (prompt ids [T_in], command ids [L], sampler
      logprobs [L], A^hier fixed by the rollout pass), ∅ and rejected commands included.
    learner: model, learner shapes, optimizer, loss, PPO passes, padding id.
    mesh: the training mesh (`setup.make_mesh`; params, ref_params and opt_state
      already placed on it): micro-batch rows are split over ('data', 'fsdp'), the
      model's activation constraints apply, gradient sums are sharded like the params.
      None = single-device behaviour (arrays as placed).
    shuffle_seed: ints seeding the mini-batch permutations (e.g. (seed, update)); pass
      p uses NumPy's default_rng([*shuffle_seed, p]).
    skip_counter: books every step's finiteness and raises NonFiniteError after too
      many skips in a row; None = skip and count only.
    label: names the update in that error (e.g. 'phase_b update 12').
  Returns:
    (new params, new opt_state, metrics): 'train/loss' (mean over the steps of Σ/N_b
    of each command's token-mean −ℓ), 'train/policy_loss', 'train/kl_loss',
    'train/kl', 'train/clip_fraction', 'train/clip_active_fraction',
    'train/approx_kl', 'train/ratio', 'train/ratio_min', 'train/ratio_max',
    'train/entropy', 'train/logprob_gap', 'train/logprob_abs_gap', 'train/advantage'
    (token-level, over every step), 'train/grad_norm' (pre-clip, mean over steps),
    'train/pass{p}/{PASS_METRICS, loss, grad_norm}', 'train/optimizer_steps',
    'train/skipped_steps' (non-finite, not applied), 'train/num_mini_batches' (per
    pass), 'train/sampler_logprob_gap' and '_abs_gap' (learner θ_old minus sampler, per
    command token), 'train/num_decisions', 'train/num_micro_batches', 'train/num_shapes',
    'train/learning_rate' (peak), and seconds 'time/learner_batching_s',
    'time/learner_grads_s' (loss + gradient), 'time/learner_optimizer_s',
    'time/learner_old_logprobs_s'.
  Raises:
    ValueError: no decisions, or a decision longer than the learner shapes.
    nonfinite.NonFiniteError: from `skip_counter`.
  """
  model_config, batching_config = learner.model_config, learner.batching_config
  loss, opt, ppo, pad_id = learner.loss, learner.opt, learner.ppo, learner.pad_id
  n = len(decisions)
  if n == 0:
    raise ValueError('an update needs at least one decision')
  m_req = int(ppo.mini_batches_per_iteration)
  plans = [batching.mini_batch_partition(
      n, m_req, np.random.default_rng([*map(int, shuffle_seed), p]) if m_req > 1
      else None) for p in range(int(ppo.num_iterations))]
  single = ppo.steps_per_update == 1
  from_learner = loss.old_logprobs == 'learner'
  kw = dict(model_config=model_config, clip_epsilon=loss.clip_epsilon,
            kl_beta=loss.kl_beta, kl_estimator=loss.kl_estimator,
            temperature=loss.temperature, max_log_ratio=loss.max_log_ratio,
            loss_chunk_size=batching_config.loss_chunk_size, reduction=loss.reduction)
  # Learner log π_θold per decision, once known (θ_old fixed for the whole update).
  at_old: list = [None] * n
  t0 = time.perf_counter()
  first = set(plans[0][0].tolist())
  rest = [i for i in range(n) if i not in first]
  if from_learner and rest:  # M > 1: decisions the first step does not see at θ_old
    for i, lp in zip(rest, theta_old_logprobs(
        params, [decisions[i] for i in rest], model_config=model_config,
        batching_config=batching_config, temperature=loss.temperature, pad_id=pad_id,
        mesh=mesh)):
      at_old[i] = lp
  t_old = time.perf_counter() - t0
  steps: list[list[_Step]] = []
  for p, plan in enumerate(plans):
    steps.append([])
    for k, idx in enumerate(plan):
      first_step = p == 0 and k == 0
      subset = [decisions[i] if (first_step or not from_learner) else
                dataclasses.replace(decisions[i], old_logprobs=at_old[i]) for i in idx]
      params, opt_state, st = _mini_batch_step(
          params, ref_params, opt_state, subset,
          old_from_learner=from_learner and first_step, kw=kw,
          batching_config=batching_config, opt=opt, pad_id=pad_id, mesh=mesh)
      if first_step:  # θ = θ_old here: these are θ_old's log-probs
        for i, lp in zip(idx, st.logprobs):
          at_old[i] = lp
      steps[-1].append(st)
      if skip_counter is not None:
        where = label if single else (f'{label}, pass {p + 1}/{len(plans)}, '
                                      f'mini-batch {k + 1}/{len(plan)}')
        skip_counter.record(st.finite, where)
  return params, opt_state, _update_metrics(steps, decisions, at_old, opt, t_old)


def _update_metrics(steps, decisions, at_old, opt, t_old) -> dict[str, float]:
  flat = [st for pass_steps in steps for st in pass_steps]
  out = {f'train/{k}': v for k, v in
         _combine_metrics([m for st in flat for m in st.parts]).items()}
  out['train/loss'] = float(np.mean([st.loss for st in flat]))
  out['train/grad_norm'] = float(np.mean([st.grad_norm for st in flat]))
  for p, pass_steps in enumerate(steps):
    pm = _combine_metrics([m for st in pass_steps for m in st.parts])
    for key in PASS_METRICS:
      out[f'train/pass{p + 1}/{key}'] = pm[key]
    out[f'train/pass{p + 1}/loss'] = float(np.mean([st.loss for st in pass_steps]))
    out[f'train/pass{p + 1}/grad_norm'] = float(
        np.mean([st.grad_norm for st in pass_steps]))
  gap = np.concatenate([np.asarray(lp, np.float64) - np.asarray(d.old_logprobs)
                        for lp, d in zip(at_old, decisions) if lp is not None] or [[]])
  out['train/sampler_logprob_gap'] = float(gap.sum()) / max(gap.size, 1)
  out['train/sampler_logprob_abs_gap'] = float(np.abs(gap).sum()) / max(gap.size, 1)
  out['train/optimizer_steps'] = float(len(flat))
  out['train/skipped_steps'] = float(sum(not st.finite for st in flat))
  out['train/num_mini_batches'] = float(len(steps[0]))
  out['train/num_decisions'] = float(len(decisions))
  out['train/num_micro_batches'] = float(sum(st.num_micro_batches for st in flat))
  out['train/num_shapes'] = float(len(set().union(*(st.shapes for st in flat))))
  out['train/learning_rate'] = float(opt.learning_rate)
  for i, key in enumerate(('batching', 'grads', 'optimizer')):
    out[f'time/learner_{key}_s'] = float(sum(st.seconds[i] for st in flat))
  out['time/learner_old_logprobs_s'] = t_old
  return out
