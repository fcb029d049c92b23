"""Supervised warm start θ_SFT on the balanced command set (SPEC §4; App. D.3, Eq. 7).

Data. `envs.episodes.build_sft_set` gives train and dev records (x_i, u*_i) from the
construction and internal-dev pools of the HotpotQA train split. Each record becomes
one `batching.DecisionTokens` row:

    prompt  = the policy prompt of x_i (`rl.policy.policy_prompt_ids`: the tokenizer's
              chat template with x_i as the one user message plus the assistant
              generation prompt) — the token ids the RL sampler conditions on;
    command = tokens of u*_i followed by the stop token (`rl.policy.command_target_ids`;
              Qwen: `<|im_end|>`), so the policy learns to stop after one command.

Records whose prompt + command exceed the largest length bucket, or whose command
exceeds `sampling.max_command_tokens` (the policy could never emit it), are dropped and
counted (logged; `num_dropped_*` in the returned metrics).

Loss. Cross-entropy on command tokens only (SPEC §4): each command's token-mean NLL,
averaged over the commands of the optimizer step. Micro-batches of
`batching.micro_batch_size` rows return (Σ_commands token-mean NLL, number of commands)
and their gradient sums; the step divides once (deferred normalization), so any split of
a step into micro-batches gives the same update (gradient accumulation).

Optimizer (SPEC §4; HF Trainer conventions where SPEC is silent): optax AdamW (β 0.9 /
0.999, ε 1e-8; weight decay `sft.weight_decay`, not applied to 1-D parameters — biases
and norm scales — as HF does), global-norm clipping at `sft.max_grad_norm`, learning
rate `sft.learning_rate` with linear warmup over ceil(warmup_ratio · total) steps from 0,
then LINEAR decay to 0 at the last step (HF `get_linear_schedule_with_warmup`; the paper
gives only the warmup ratio). Batch `sft.batch_size` records per step, `sft.num_epochs`
epochs (or `sft.max_steps` steps when set). The last batch of an epoch may be smaller.

Data order. Epoch e visits the train records in `np.random.default_rng([seed, e])`
order (`epoch_permutation`), seed = `config.seed`; optimizer step s (0-based) uses batch
s mod steps_per_epoch of epoch s // steps_per_epoch. The order is a pure function of the
step, so a restored step continues exactly where the killed run stopped.

Evaluation (dev set) after every epoch, every `sft.eval_every` steps and at the last
step: greedy decoding (`sampling.eval_temperature`, SPEC §4) of each dev prompt with the
RL sampler policy (`rl.policy.SamplerPolicy(greedy=True)`), parsed
with `memory.parse_command` and executed with `memory.execute` on the record's own state
s_i under the record's phase subspace (`dev_metrics`): tool accuracy (predicted op ==
target op), invalid-operation rate (unparseable, op outside the phase, or rejected by the
executor), executable rate (1 − invalid), exact command match, and the teacher-forced
dev loss.

Devices (`train/setup.py`). The model config and tokenizer are built once and checked
against each other (`tokenization.check_tokenizer_model_compat`). Parameters and the
AdamW state live on the ('data', 'fsdp', 'tensor') mesh of `config.model.mesh_*`
(FSDP / tensor sharding per models/sharding.py; the optimizer state sharded like the
parameters), micro-batch rows are split over ('data', 'fsdp'), and the jitted steps and dev greedy
decoding run under `sharding.use_sharding` so the model's activation constraints apply.
On one device all of this is the single-device computation.

Checkpoints (`workdir/sft`, one `PhaseCheckpointManager`): after every evaluation, with
selection metrics {tool_accuracy, invalid_rate} (best = higher dev tool accuracy, ties
by lower invalid rate; SPEC §4), and every `checkpoint.save_every` steps. Each holds
params, optimizer state, RNG key and the data position, so a killed run resumes from
its newest restorable checkpoint and ends with params bit-identical to an uninterrupted
run. A run whose newest checkpoint is the completed last step returns its stored final
metrics without work. Metrics go to `workdir/sft/metrics.jsonl` + TensorBoard; the
SFT counts table to the log, stdout and `workdir/sft/sft_data_counts.txt`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vermem_jax import tokenization
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.models import qwen
from vermem_jax.rl import batching
from vermem_jax.rl import grpo
from vermem_jax.rl import policy
from vermem_jax.train import checkpoints
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import setup as setup_lib

PHASE = 'sft'
COUNTS_FILE = 'sft_data_counts.txt'
# AdamW moments/epsilon: the HF Trainer / PyTorch defaults (SPEC §4 names AdamW only).
ADAM_B1 = 0.9
ADAM_B2 = 0.999
ADAM_EPS = 1e-8
# Keys of the micro-batch the jitted SFT step reads (a fixed key set: one trace per shape).
STEP_KEYS = ('input_ids', 'attention_mask', 'positions', 'command_positions',
             'target_ids', 'command_ids')


# ----------------------------------------------------------------------------- records
@dataclasses.dataclass(frozen=True)
class SFTExample:
  """A tokenized SFT record.

  Attributes:
    prompt_tokens: policy prompt ids [T_in] (`rl.policy.policy_prompt_ids(x_i)`).
    command_tokens: ids of u*_i + the stop token [L] (`rl.policy.command_target_ids`;
      the only tokens with loss).
    record: the `episodes.SFTRecord` (op, phase, state s_i, target text).
  """
  prompt_tokens: tuple[int, ...]
  command_tokens: tuple[int, ...]
  record: episodes.SFTRecord

  def decision(self) -> batching.DecisionTokens:
    """The learner row: no old logprobs (unused by the SFT loss), advantage 1."""
    return batching.DecisionTokens(self.prompt_tokens, self.command_tokens,
                                   (0.0,) * len(self.command_tokens), 1.0)


def tokenize_records(records: Sequence[episodes.SFTRecord],
                     tokenizer: tokenization.Tokenizer, *, max_sequence_tokens: int,
                     max_command_tokens: int) -> tuple[list[SFTExample], dict[str, int]]:
  """Tokenizes records; drops (and counts) those that do not fit the learner shapes.

  Args:
    records: SFT records.
    tokenizer: policy tokenizer.
    max_sequence_tokens: largest prompt + command length (the largest length bucket).
    max_command_tokens: largest command length incl. the stop token (min of the
      largest command bucket and `sampling.max_command_tokens`).
  Returns:
    (examples in record order, {'command_too_long': n, 'sequence_too_long': n}).
  """
  dropped = {'command_too_long': 0, 'sequence_too_long': 0}
  out = []
  for rec in records:
    prompt = policy.policy_prompt_ids(tokenizer, rec.policy_input)
    command = tuple(policy.command_target_ids(tokenizer, rec.target))
    if len(command) > max_command_tokens:
      dropped['command_too_long'] += 1
      continue
    if len(prompt) + len(command) > max_sequence_tokens:
      dropped['sequence_too_long'] += 1
      continue
    out.append(SFTExample(tuple(prompt), command, rec))
  return out, dropped


# ----------------------------------------------------------------------------- optimizer
@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """SFT optimizer hyperparameters (config section `sft`; SPEC §4). Hashable: static jit
  argument.

  Attributes:
    learning_rate: peak learning rate (SPEC §4: 2e-5).
    total_steps: optimizer steps of the whole run.
    warmup_ratio: share of total_steps with linear warmup (SPEC §4: 0.03).
    weight_decay: AdamW decoupled weight decay (not on 1-D params).
    max_grad_norm: global-norm clip (SPEC §4: 1.0).
  """
  learning_rate: float
  total_steps: int
  warmup_ratio: float = 0.03
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0

  def __post_init__(self):
    if self.total_steps < 1:
      raise ValueError(f'OptimizerConfig.total_steps must be >= 1, got {self.total_steps}')
    if not 0.0 <= self.warmup_ratio < 1.0:
      raise ValueError(f'OptimizerConfig.warmup_ratio must be in [0, 1), got '
                       f'{self.warmup_ratio}')

  @property
  def warmup_steps(self) -> int:
    """ceil(warmup_ratio · total_steps) (HF `get_warmup_steps`)."""
    return int(math.ceil(self.warmup_ratio * self.total_steps))


def lr_schedule(opt: OptimizerConfig) -> optax.Schedule:
  """Learning rate of the update after `count` completed steps: 0 -> peak over the
  warmup steps, then linearly to 0 at total_steps (HF linear schedule with warmup)."""
  w, total = opt.warmup_steps, opt.total_steps
  decay = optax.linear_schedule(opt.learning_rate, 0.0, max(1, total - w))
  if w == 0:
    return decay
  warm = optax.linear_schedule(0.0, opt.learning_rate, w)
  return optax.join_schedules([warm, decay], [w])


def _decay_mask(params: Any) -> Any:
  return jax.tree.map(lambda p: p.ndim > 1, params)


@functools.partial(jax.jit, static_argnames=('opt',))
def init_optimizer(params: Any, *, opt: OptimizerConfig) -> Any:
  """`make_optimizer(opt).init(params)` as one compiled program (eager init compiles
  every small op separately)."""
  return make_optimizer(opt).init(params)


def make_optimizer(opt: OptimizerConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) -> AdamW with `lr_schedule` (SPEC §4)."""
  return optax.chain(
      optax.clip_by_global_norm(opt.max_grad_norm),
      optax.adamw(lr_schedule(opt), b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS,
                  weight_decay=opt.weight_decay, mask=_decay_mask))


# ----------------------------------------------------------------------------- step
def _step_batch(mb: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  step = batching.to_step_batch(mb)
  return {k: step[k] for k in STEP_KEYS}


def zero_accumulator(params: Any) -> dict[str, Any]:
  """Empty gradient/loss accumulator for one optimizer step (float32; gradient sums
  sharded like `params`, so FSDP keeps them split)."""
  zero = jnp.zeros((), jnp.float32)
  return {'grads': setup_lib.zeros_like_params(params),
          'loss_sum': zero, 'count': zero, 'token_nll': zero, 'token_correct': zero,
          'tokens': zero}


def _accumulate(params, acc, batch, model_config):
  (total, count, m), grads = grpo.sft_loss_and_grads(
      params, batch, model_config=model_config, reduction='decision')
  return {
      'grads': jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc['grads'], grads),
      'loss_sum': acc['loss_sum'] + total,
      'count': acc['count'] + count,
      'token_nll': acc['token_nll'] + m['token_nll'][0],
      'token_correct': acc['token_correct'] + m['token_accuracy'][0],
      'tokens': acc['tokens'] + m['token_nll'][1],
  }


@functools.lru_cache(maxsize=None)
def _accumulate_fn(donate: bool) -> Callable:
  # Donating the accumulator halves peak gradient memory on accelerators; the CPU
  # backend cannot donate and would warn on every call.
  return jax.jit(_accumulate, static_argnames=('model_config',),
                 donate_argnums=(1,) if donate else ())


def accumulate_micro_batch(params: Any, acc: Mapping[str, Any],
                           micro_batch: Mapping[str, np.ndarray], *,
                           model_config: qwen.QwenConfig,
                           mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Adds one micro-batch's command NLL sums and gradient sums to `acc` (jitted).

  Args:
    params: policy parameters.
    acc: from `zero_accumulator` or a previous call (consumed on accelerators).
    micro_batch: a `batching.build_batch` / `micro_batches` batch ([B, T] and [B, L]
      arrays; only the STEP_KEYS are read).
    model_config: QwenConfig (static).
    mesh: the training mesh (`setup.make_mesh_from`): rows are split over
      ('data', 'fsdp') and the model's activation constraints apply; None = as placed.
  Returns:
    acc + {grads: ∂(Σ_commands token-mean NLL)/∂params, loss_sum: that sum, count:
    number of commands, token_nll / token_correct / tokens: token-level sums}.
  """
  donate = jax.default_backend() != 'cpu'
  batch = setup_lib.place_batch(_step_batch(micro_batch), mesh)
  with setup_lib.mesh_context(mesh):
    return _accumulate_fn(donate)(params, acc, batch, model_config=model_config)


@functools.partial(jax.jit, static_argnames=('opt',))
def apply_accumulated(params: Any, opt_state: Any, acc: Mapping[str, Any], *,
                      opt: OptimizerConfig) -> tuple[Any, Any, dict[str, jax.Array]]:
  """One optimizer update from an accumulated step (jitted; divides once).

  Args:
    params, opt_state: current parameters and `make_optimizer(opt)` state.
    acc: the step's accumulator (all its micro-batches).
    opt: OptimizerConfig (static).
  Returns:
    (params, opt_state, {'loss': mean over commands of each command's token-mean NLL,
    'grad_norm': global norm of that loss's gradient before clipping, 'token_nll',
    'token_accuracy', 'num_commands', 'num_command_tokens'}). The update's learning
    rate is `lr_schedule(opt)(k)` for the k-th update (0-based).
  """
  count = jnp.maximum(acc['count'], 1.0)
  grads = jax.tree.map(lambda g: g / count, acc['grads'])
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
  tx = make_optimizer(opt)
  updates, new_opt_state = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  tokens = jnp.maximum(acc['tokens'], 1.0)
  out = {'loss': acc['loss_sum'] / count, 'grad_norm': optax.global_norm(grads),
         'token_nll': acc['token_nll'] / tokens,
         'token_accuracy': acc['token_correct'] / tokens,
         'num_commands': acc['count'], 'num_command_tokens': acc['tokens']}
  return new_params, new_opt_state, out


def train_step(params: Any, opt_state: Any,
               micro_batches: Sequence[Mapping[str, np.ndarray]], *,
               model_config: qwen.QwenConfig, opt: OptimizerConfig,
               mesh: jax.sharding.Mesh | None = None
               ) -> tuple[Any, Any, dict[str, float]]:
  """One SFT optimizer step over all micro-batches of a batch (gradient accumulation).

  With `mesh`, params / opt_state should already be placed on it (`setup.
  init_or_load_params`, `setup.init_opt_state`); the result keeps their shardings.

  Returns:
    (params, opt_state, metrics as Python floats; see `apply_accumulated`).
  """
  if not micro_batches:
    raise ValueError('an SFT step needs at least one micro-batch')
  acc = zero_accumulator(params)
  for mb in micro_batches:
    acc = accumulate_micro_batch(params, acc, mb, model_config=model_config, mesh=mesh)
  with setup_lib.mesh_context(mesh):
    params, opt_state, out = apply_accumulated(params, opt_state, acc, opt=opt)
  return params, opt_state, {k: float(v) for k, v in jax.device_get(out).items()}


@functools.partial(jax.jit, static_argnames=('model_config',))
def _nll_sums(params, batch, model_config):
  logits = grpo.command_logits(model_config, params, batch)
  total, count, _ = grpo.command_nll_from_logits(logits, batch, reduction='decision')
  return total, count


def command_loss(params: Any, micro_batches: Sequence[Mapping[str, np.ndarray]], *,
                 model_config: qwen.QwenConfig,
                 mesh: jax.sharding.Mesh | None = None) -> float:
  """Mean over commands of each command's token-mean NLL (no gradient; dev loss)."""
  total, count = 0.0, 0.0
  for mb in micro_batches:
    with setup_lib.mesh_context(mesh):
      t, c = _nll_sums(params, setup_lib.place_batch(_step_batch(mb), mesh), model_config)
    total += float(t)
    count += float(c)
  return total / max(count, 1.0)


# ----------------------------------------------------------------------------- data order
def steps_per_epoch(num_examples: int, batch_size: int) -> int:
  """ceil(num_examples / batch_size) optimizer steps per epoch."""
  if num_examples < 1 or batch_size < 1:
    raise ValueError(f'need >= 1 example and batch size, got {num_examples}, {batch_size}')
  return -(-num_examples // batch_size)


def epoch_permutation(num_examples: int, epoch: int, seed: int) -> np.ndarray:
  """Order in which epoch `epoch` visits the examples: [num_examples] int64."""
  return np.random.default_rng([int(seed), int(epoch)]).permutation(num_examples)


def batch_indices(step: int, num_examples: int, batch_size: int,
                  seed: int) -> tuple[np.ndarray, int, int]:
  """Example indices of 0-based optimizer step `step`, with its (epoch, batch index)."""
  spe = steps_per_epoch(num_examples, batch_size)
  epoch, b = divmod(int(step), spe)
  order = epoch_permutation(num_examples, epoch, seed)
  return order[b * batch_size:(b + 1) * batch_size], epoch, b


# ----------------------------------------------------------------------------- dev metrics
def dev_metrics(records: Sequence[episodes.SFTRecord], predictions: Sequence[str], *,
                executor_config: ExecutorConfig,
                count_tokens: Callable[[str], int]) -> dict[str, float]:
  """Dev metrics of predicted command texts (SPEC §4 checkpoint selection).

  Each prediction is parsed (`parse_command`) and executed (`memory.execute`) on its
  record's state s_i with the record's phase subspace (the record's phase replaces
  `executor_config.phase`).

  Args:
    records: dev records (op, target, phase, state).
    predictions: generated command text per record (end-of-turn token removed).
    executor_config: budgets/costs of the executor.
    count_tokens: backbone token counter (tokens).
  Returns:
    {'tool_accuracy': share with predicted op == target op (unparseable text has op
     'Invalid'), 'invalid_rate': share unparseable, outside the phase subspace, or
     rejected by the executor, 'executable_rate': 1 - invalid_rate, 'exact_match':
     share whose parsed command equals the parsed target (canonical arguments),
     'unparseable_rate', 'num_dev', and 'tool_accuracy/<op>' per target op}.
  Raises:
    ValueError: different numbers of records and predictions, or no records.
  """
  if len(records) != len(predictions):
    raise ValueError(f'{len(records)} dev records but {len(predictions)} predictions')
  if not records:
    raise ValueError('dev metrics need at least one record')
  tool, invalid, exact, unparseable = [], [], [], []
  per_op: dict[str, list[bool]] = {}
  for rec, text in zip(records, predictions):
    parsed = cmds.parse_command(text, executor_config.max_command_chars)
    ok_parse = isinstance(parsed, cmds.Command)
    pred_op = parsed.op if ok_parse else cmds.INVALID_OP
    cfg = dataclasses.replace(executor_config, phase=rec.phase, allowed_ops=None)
    accepted = mexec.execute(rec.state, text, cfg, count_tokens).accepted
    target = cmds.parse_command(rec.target, executor_config.max_command_chars)
    tool.append(pred_op == rec.op)
    per_op.setdefault(rec.op, []).append(pred_op == rec.op)
    invalid.append(not accepted)
    unparseable.append(not ok_parse)
    exact.append(ok_parse and isinstance(target, cmds.Command) and parsed == target)
  out = {'tool_accuracy': float(np.mean(tool)), 'invalid_rate': float(np.mean(invalid)),
         'executable_rate': 1.0 - float(np.mean(invalid)),
         'exact_match': float(np.mean(exact)),
         'unparseable_rate': float(np.mean(unparseable)), 'num_dev': float(len(records))}
  for op in sorted(per_op):
    out[f'tool_accuracy/{op}'] = float(np.mean(per_op[op]))
  return out


def predict_commands(params: Any, model_config: qwen.QwenConfig,
                     records: Sequence[episodes.SFTRecord],
                     tokenizer: tokenization.Tokenizer, *, batch_size: int,
                     sampling_config: policy.PolicySamplingConfig,
                     rng: Any = 0, mesh: jax.sharding.Mesh | None = None) -> list[str]:
  """Greedy command text for each record's x_i through the RL sampler policy.

  Uses `rl.policy.SamplerPolicy(greedy=True)` (eval_temperature, SPEC §4: 0), i.e. the
  same prompt, stop tokens and decoding as rollout evaluation. Inputs are sorted by
  length and sent in batches of exactly `batch_size` rows, so generation compiles once
  per prompt bucket. With `mesh` (params placed on it) the sampler runs under its
  sharding rules (`setup.generate_fn_for`).

  Returns:
    list[str] in record order (stop token removed, whitespace stripped).
  """
  if not records:
    return []
  sampler = policy.SamplerPolicy(model_config, params, tokenizer,
                                 sampling_config=sampling_config, greedy=True,
                                 batch_buckets=(batch_size,),
                                 generate_fn=setup_lib.generate_fn_for(mesh))
  order = sorted(range(len(records)), key=lambda i: len(records[i].policy_input))
  texts = [''] * len(records)
  key = jax.random.PRNGKey(rng) if isinstance(rng, (int, np.integer)) else rng
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    key, sub = jax.random.split(key)
    outs = sampler([records[i].policy_input for i in idx], sub)
    for i, out in zip(idx, outs):
      texts[i] = out.text
  return texts


# ----------------------------------------------------------------------------- config glue
# Shared with the RL trainer (train/setup.py); kept under the old name for callers.
_tokenizer = setup_lib.load_tokenizer_cached


def _executor_config(config: ml_collections.ConfigDict) -> ExecutorConfig:
  names = {f.name for f in dataclasses.fields(ExecutorConfig)}
  values = {k: v for k, v in config.memory.to_dict().items() if k in names}
  return ExecutorConfig(**values, phase=config.episodes.op_space)


def _sft_data_config(config: ml_collections.ConfigDict) -> episodes.SFTDataConfig:
  # The construction seed is the episode seed: the data set does not change with the
  # run seed (config.seed drives init and shuffling).
  return episodes.SFTDataConfig.from_config(
      config.sft.to_dict(), seed=config.episodes.seed,
      context_budget=config.memory.context_budget,
      policy_input_limit=config.memory.policy_input_limit,
      max_doc_sentences=config.episodes.max_doc_sentences,
      max_doc_tokens=config.episodes.max_doc_tokens)


def trajectory_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Config fields that determine the training trajectory (checked on resume)."""
  s = config.sft
  return {'seed': config.seed, 'model': config.model.hf_checkpoint or config.model.preset,
          'train_per_target': s.train_per_target, 'dev_per_target': s.dev_per_target,
          'learning_rate': s.learning_rate, 'warmup_ratio': s.warmup_ratio,
          'weight_decay': s.weight_decay, 'max_grad_norm': s.max_grad_norm,
          'batch_size': s.batch_size, 'num_epochs': s.num_epochs,
          'max_steps': s.max_steps, 'episodes_seed': config.episodes.seed,
          'template_fraction': s.template_fraction,
          'teacher_backend': s.teacher_backend,
          'policy_input_limit': config.memory.policy_input_limit,
          'context_budget': config.memory.context_budget,
          # Records longer than the learner shapes are dropped (see tokenize_records).
          'max_command_tokens': config.sampling.max_command_tokens,
          'max_sequence_tokens': config.batching.length_buckets[-1],
          'max_command_bucket': config.batching.command_buckets[-1]}


def _check_resume(meta: Mapping[str, Any], fingerprint: Mapping[str, Any],
                  directory: str) -> None:
  setup_lib.check_resume(meta.get('metadata'), fingerprint, directory, what='an SFT run')


def _completed_metrics(directory: str, fingerprint: Mapping[str, Any]) -> dict | None:
  """Stored final metrics when the newest checkpoint is the completed last step."""
  if not checkpoints.has_checkpoint(directory):
    return None
  with checkpoints.PhaseCheckpointManager(directory) as mgr:
    latest = mgr.latest_step()
    try:
      meta = mgr.read_meta(latest)
    except Exception:  # pylint: disable=broad-except
      return None  # the normal path restores with fallback and reports it
  _check_resume(meta, fingerprint, directory)
  md = meta.get('metadata') or {}
  if md.get('complete') and md.get('final_metrics'):
    return dict(md['final_metrics'])
  return None


# ----------------------------------------------------------------------------- driver
def _prefixed(prefix: str, values: Mapping[str, float]) -> dict[str, float]:
  return {f'{prefix}/{k}': v for k, v in values.items()}


def run_sft(config: ml_collections.ConfigDict, workdir: str, *,
            stop_after_step: int | None = None) -> dict[str, Any]:
  """Trains θ_SFT into `workdir/sft` (SPEC §4); resumes from its newest checkpoint.

  Args:
    config: the `sft` experiment config (experiments/configs/sft.py).
    workdir: run directory; the phase writes `workdir/sft/`.
    stop_after_step: stop once this many optimizer steps are complete (as if killed
      after that step; preemption drills and tests). None trains to the end.
  Returns:
    Final metrics: 'step', 'total_steps', 'wall_time_s' (this call, seconds),
    'cumulative_wall_time_s' (all calls of this run), 'train_loss' (last step),
    the last dev metrics (`dev_metrics` keys + 'dev_loss'), 'best_step' and its
    'best_tool_accuracy' / 'best_invalid_rate', 'num_train', 'num_dev', dropped-record
    counts, and 'complete' (bool).
  Raises:
    ValueError: a bad config field, a workdir holding a run with other settings, or no
      trainable record left after the length limits.
  """
  t_start = time.time()
  directory = checkpoints.phase_dir(workdir, PHASE)
  fingerprint = trajectory_fingerprint(config)
  done = _completed_metrics(directory, fingerprint)
  if done is not None:
    logging.info('SFT in %s is complete at step %s; nothing to do', directory,
                 done.get('step'))
    done['wall_time_s'] = time.time() - t_start
    return done

  # --- model config, tokenizer (checked against each other), mesh
  model_cfg = setup_lib.model_config_from(config)
  tok = setup_lib.load_tokenizer_for(config, model_cfg)
  mesh = setup_lib.make_mesh_from(config)

  # --- data
  exec_cfg = _executor_config(config)
  bcfg = batching.BatchingConfig(**config.batching.to_dict())
  sampling_cfg = policy.PolicySamplingConfig(**config.sampling.to_dict())
  construction, dev_pool = episodes.load_pools(hotpotqa.DataConfig.from_config(
      config.data.to_dict()))
  train_records, dev_records, report = episodes.build_sft_set(
      construction, dev_pool, count_tokens=tok.count_tokens,
      config=_sft_data_config(config), verbose=False)
  table = report.format_table()
  print(table, flush=True)
  logging.info('SFT set:\n%s', table)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, COUNTS_FILE), 'w') as f:
    f.write(table + '\n')
  max_cmd = min(bcfg.command_buckets[-1], int(config.sampling.max_command_tokens))
  limits = dict(max_sequence_tokens=bcfg.length_buckets[-1], max_command_tokens=max_cmd)
  train, drop_train = tokenize_records(train_records, tok, **limits)
  dev, drop_dev = tokenize_records(dev_records, tok, **limits)
  if any(drop_train.values()) or any(drop_dev.values()):
    logging.warning('SFT records dropped (longer than the learner shapes: command <= %d '
                    'tokens incl. end of turn, sequence <= %d tokens): train %s, dev %s',
                    max_cmd, limits['max_sequence_tokens'], drop_train, drop_dev)
  if not train:
    raise ValueError('no SFT train record fits config.sampling.max_command_tokens / '
                     'config.batching.length_buckets')
  train_decisions = [e.decision() for e in train]
  dev_batches = (batching.micro_batches([e.decision() for e in dev], bcfg,
                                        pad_id=tok.pad_token_id) if dev else [])

  # --- schedule
  seed = int(config.seed)
  batch_size = int(config.sft.batch_size)
  spe = steps_per_epoch(len(train), batch_size)
  total = (int(config.sft.max_steps) if config.sft.max_steps
           else spe * int(config.sft.num_epochs))
  opt = OptimizerConfig(learning_rate=float(config.sft.learning_rate), total_steps=total,
                        warmup_ratio=float(config.sft.warmup_ratio),
                        weight_decay=float(config.sft.weight_decay),
                        max_grad_norm=float(config.sft.max_grad_norm))
  schedule = lr_schedule(opt)
  eval_every = int(config.sft.eval_every)
  save_every = int(config.checkpoint.save_every)

  def position(step: int) -> dict[str, int]:
    epoch, b = divmod(step, spe)
    return {'epoch': epoch, 'batch': b, 'shuffle_seed': seed, 'steps_per_epoch': spe,
            'num_train': len(train)}

  # --- state
  init_key, rng = jax.random.split(jax.random.PRNGKey(seed))
  model_cfg, params = setup_lib.init_or_load_params(config, model_cfg, init_key, mesh)
  # Sharded like the params (AdamW moments mirror them); the template below carries
  # these shardings, so a restore lands on the same layout.
  opt_state = setup_lib.init_opt_state(make_optimizer(opt).init, params, mesh)
  template = checkpoints.TrainState(step=0, params=params, opt_state=opt_state, rng=rng,
                                    data_position=position(0), metadata={})
  with checkpoints.PhaseCheckpointManager(
      directory, max_to_keep=int(config.checkpoint.max_to_keep)) as mgr:
    step, prior_wall, last_dev, train_loss = 0, 0.0, {}, float('nan')
    restored = mgr.restore(template)
    if restored is not None:
      _check_resume({'metadata': restored.metadata}, fingerprint, directory)
      if restored.data_position != position(restored.step):
        raise ValueError(f'{directory}: checkpoint step {restored.step} has data position '
                         f'{restored.data_position}, expected {position(restored.step)} '
                         '(different SFT data); use a fresh --workdir')
      step, params, opt_state, rng = (restored.step, restored.params, restored.opt_state,
                                      restored.rng)
      prior_wall = float(restored.metadata.get('cumulative_wall_time_s', 0.0))
      last_dev = dict(restored.metadata.get('dev_metrics') or {})
      train_loss = float(restored.metadata.get('train_loss', train_loss))
      logging.info('SFT resumes from step %d of %d in %s (epoch %d, batch %d)', step,
                   total, directory, *divmod(step, spe))
    stop = total if stop_after_step is None else min(total, int(stop_after_step))

    def evaluate(p) -> dict[str, float]:
      preds = predict_commands(p, model_cfg, [e.record for e in dev], tok,
                               batch_size=bcfg.micro_batch_size,
                               sampling_config=sampling_cfg,
                               rng=jax.random.fold_in(rng, 1), mesh=mesh)
      out = dev_metrics([e.record for e in dev], preds, executor_config=exec_cfg,
                        count_tokens=tok.count_tokens)
      out['dev_loss'] = command_loss(p, dev_batches, model_config=model_cfg, mesh=mesh)
      for e, text in list(zip(dev, preds))[:2]:
        logging.info('SFT dev example: target %r -> predicted %r', e.record.target[:120],
                     text[:120])
      return out

    writer = metrics_lib.MetricsWriter(directory, resume_step=step,
                                       tensorboard=bool(config.metrics.tensorboard))
    bar = metrics_lib.progress_bar(total, initial=step, desc=PHASE, unit='step',
                                   disable=not config.metrics.progress_bar)
    try:
      while step < stop:
        t0 = time.time()
        idx, _, _ = batch_indices(step, len(train), batch_size, seed)
        decisions = [train_decisions[i] for i in idx]
        mbs = batching.micro_batches(decisions, bcfg, pad_id=tok.pad_token_id)
        params, opt_state, m = train_step(params, opt_state, mbs, model_config=model_cfg,
                                          opt=opt, mesh=mesh)
        m['lr'] = float(schedule(step))
        step += 1
        dt = time.time() - t0
        train_loss = m['loss']
        tokens = sum(len(d.prompt_tokens) + len(d.command_tokens) for d in decisions)
        if step % int(config.metrics.log_every) == 0 or step == total:
          writer.write(step, _prefixed('train', {
              'loss': m['loss'], 'lr': m['lr'], 'grad_norm': m['grad_norm'],
              'token_accuracy': m['token_accuracy'], 'token_nll': m['token_nll'],
              'tokens_per_s': tokens / max(dt, 1e-9), 'step_time_s': dt,
              'epoch': step / spe}))
        bar.update(1)
        bar.set_postfix(loss=f'{m["loss"]:.3f}', lr=f'{m["lr"]:.2e}')
        is_eval = step % eval_every == 0 or step % spe == 0 or step == total
        selection = None
        if is_eval and dev:
          last_dev = evaluate(params)
          writer.write(step, _prefixed('dev', last_dev))
          selection = {'tool_accuracy': last_dev['tool_accuracy'],
                       'invalid_rate': last_dev['invalid_rate']}
          logging.info('SFT step %d: dev tool accuracy %.3f, invalid rate %.3f, exact '
                       '%.3f, dev loss %.4f', step, last_dev['tool_accuracy'],
                       last_dev['invalid_rate'], last_dev['exact_match'],
                       last_dev['dev_loss'])
        # A stop_after_step stop saves nothing extra: it behaves like a kill.
        if is_eval or step % save_every == 0:
          wall = prior_wall + time.time() - t_start
          final = None
          if step == total:
            final = _final_metrics(step, total, wall, train_loss, last_dev, mgr, selection,
                                   len(train), len(dev), drop_train, drop_dev)
          metadata = {'fingerprint': fingerprint, 'total_steps': total,
                      'cumulative_wall_time_s': wall, 'dev_metrics': last_dev,
                      'train_loss': train_loss, 'complete': step == total}
          if final is not None:
            metadata['final_metrics'] = final
          mgr.save(checkpoints.TrainState(step=step, params=params, opt_state=opt_state,
                                          rng=rng, data_position=position(step),
                                          metadata=metadata),
                   selection_metrics=selection)
    finally:
      bar.close()
      writer.close()
    wall = prior_wall + time.time() - t_start
    result = _final_metrics(step, total, wall, train_loss, last_dev, mgr, None, len(train),
                            len(dev), drop_train, drop_dev)
  result['wall_time_s'] = time.time() - t_start
  return result


def _final_metrics(step, total, wall, train_loss, last_dev, mgr, selection, num_train,
                   num_dev, drop_train, drop_dev) -> dict[str, Any]:
  """The returned / stored summary (JSON values only)."""
  best = mgr.best_step()
  best_metrics = None
  if selection is not None:
    # The step being saved is not yet known to the manager.
    key = checkpoints.sft_selection_key(selection)
    if best is None or key > checkpoints.sft_selection_key(_best_selection(mgr, best)):
      best, best_metrics = step, selection
  if best is not None and best_metrics is None:
    best_metrics = _best_selection(mgr, best)
  out = {'step': int(step), 'total_steps': int(total), 'complete': step >= total,
         'cumulative_wall_time_s': float(wall), 'train_loss': float(train_loss),
         'num_train': int(num_train), 'num_dev': int(num_dev),
         'num_dropped_train': int(sum(drop_train.values())),
         'num_dropped_dev': int(sum(drop_dev.values())),
         'best_step': None if best is None else int(best)}
  out.update({k: float(v) for k, v in last_dev.items() if k != 'num_dev'})
  if best_metrics:
    out['best_tool_accuracy'] = float(best_metrics['tool_accuracy'])
    out['best_invalid_rate'] = float(best_metrics['invalid_rate'])
  return json.loads(json.dumps(out))


def _best_selection(mgr: checkpoints.PhaseCheckpointManager, step: int) -> dict:
  return dict(mgr.read_meta(step).get('selection_metrics') or {})
