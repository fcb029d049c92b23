"""The jitted SFT step: command-token negative log-likelihood with
gradient accumulation (SPEC §4; App. D.3, Eq. 7).

Loss (`sft.loss_reduction`). Negative log-likelihood of the command tokens only
(SPEC §4). 'sequence' is Eq. 7 literally: each command's NLL -log π(u* | x) summed over
its tokens, averaged over the commands of the optimizer step (the paper-scale default).
'decision': each command's token-mean NLL averaged over the commands (every command
weighs the same whatever its length). 'sqrt': each command's summed NLL divided by the
square root of its token count, averaged over the commands (between the two; the
tiny-scale default). 'token': the mean over all command tokens of the step.
Micro-batches of `batching.micro_batch_size` rows return the reduction's sum and count
and their gradient sums (`accumulate_micro_batch`); the step divides once (deferred
normalization, `apply_accumulated`), so any split of a step into micro-batches gives
the same update (gradient accumulation, `train_step`).
`command_loss` is the same loss without a gradient (the dev loss).

Optimizer (SPEC §4; `optim.make_optimizer`, shared with the RL phases): optax AdamW (`sft.adam_b1` / `adam_b2` /
`adam_eps`, decision: 0.9 / 0.999 / 1e-8 as PyTorch and HF; weight decay
`sft.weight_decay`, not applied to 1-D parameters — biases and norm scales — as HF
does), global-norm clipping at `sft.max_grad_norm`, learning rate `sft.learning_rate`
with linear warmup over ceil(warmup_ratio · total) steps from lr/w (never 0), then
`sft.lr_schedule` (decision: 'linear' decay to 0 at the last step, HF `get_linear_schedule_with_warmup`;
the paper gives only the warmup ratio). Batch `sft.batch_size` records per step,
`sft.num_epochs` epochs (or `sft.max_steps` steps when set).

Non-finite steps (SPEC §6; `train/nonfinite.py`): a step whose loss or gradient holds
NaN/Inf is not applied (parameters and optimizer state unchanged) and is reported as
'skipped' by `train_step`; the trainer counts them and stops after
`sft.max_consecutive_skips` in a row.

Devices (`train/setup.py`). Parameters and the AdamW state live on the
('data', 'fsdp', 'tensor') mesh of `config.model.mesh_*` (the optimizer state sharded
like the parameters); micro-batch rows are split over ('data', 'fsdp') and the jitted
steps run under `sharding.use_sharding`, so the model's activation constraints apply.
On one device all of this is the single-device computation.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vermem_jax.models import qwen_config
from vermem_jax.rl import batching
from vermem_jax.rl import grpo
from vermem_jax.rl import loss_step
from vermem_jax.train import nonfinite
from vermem_jax.train import optim
from vermem_jax.train import setup as setup_lib

# Keys of the micro-batch the jitted SFT step reads (a fixed key set: one trace per shape).
STEP_KEYS = ('input_ids', 'attention_mask', 'positions', 'command_positions',
             'target_ids', 'command_ids')


# ----------------------------------------------------------------------------- step
def _step_batch(mb: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  step = batching.to_step_batch(mb)
  return {k: step[k] for k in STEP_KEYS}


def zero_accumulator(params: Any) -> dict[str, Any]:
  """Empty gradient/loss accumulator for one optimizer step (float32; gradient sums
  sharded like `params`, so FSDP keeps them split)."""
  zero = jnp.zeros((), jnp.float32)
  return {'grads': setup_lib.zeros_like_params(params),
          'loss_sum': zero, 'count': zero, 'commands': zero, 'token_nll': zero,
          'token_correct': zero, 'tokens': zero}


def _accumulate(params, acc, batch, model_config, reduction, loss_chunk_size):
  (total, count, m), grads = loss_step.sft_loss_and_grads(
      params, batch, model_config=model_config, reduction=reduction,
      loss_chunk_size=loss_chunk_size)
  commands = jnp.sum(jnp.any(batch['command_ids'] > 0, axis=1).astype(jnp.float32))
  return {
      'grads': jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc['grads'], grads),
      'loss_sum': acc['loss_sum'] + total,
      'count': acc['count'] + count,
      'commands': acc['commands'] + commands,
      'token_nll': acc['token_nll'] + m['token_nll'][0],
      'token_correct': acc['token_correct'] + m['token_accuracy'][0],
      'tokens': acc['tokens'] + m['token_nll'][1],
  }


@functools.lru_cache(maxsize=None)
def _accumulate_fn(donate: bool) -> Callable:
  # Donating the accumulator halves peak gradient memory on accelerators; the CPU
  # backend cannot donate and would warn on every call.
  return jax.jit(_accumulate,
                 static_argnames=('model_config', 'reduction', 'loss_chunk_size'),
                 donate_argnums=(1,) if donate else ())


def accumulate_micro_batch(params: Any, acc: Mapping[str, Any],
                           micro_batch: Mapping[str, np.ndarray], *,
                           model_config: qwen_config.QwenConfig,
                           mesh: jax.sharding.Mesh | None = None,
                           reduction: str = 'decision',
                           loss_chunk_size: int | None = loss_step.DEFAULT_LOSS_CHUNK_SIZE
                           ) -> dict[str, Any]:
  """Adds one micro-batch's command NLL sums and gradient sums to `acc` (jitted).

  Args:
    params: policy parameters.
    acc: from `zero_accumulator` or a previous call (consumed on accelerators).
    micro_batch: a `batching.build_batch` / `micro_batches` batch ([B, T] and [B, L]
      arrays; only the STEP_KEYS are read).
    model_config: QwenConfig (static).
    mesh: the training mesh (`setup.make_mesh`): rows are split over
      ('data', 'fsdp') and the model's activation constraints apply; None = as placed.
    reduction: `sft.loss_reduction` (module docstring; grpo.NLL_REDUCTIONS).
    loss_chunk_size: command positions per vocabulary chunk of the head and NLL
      (`batching.loss_chunk_size`; rl/token_stats.py); None = unchunked.
  Returns:
    acc + {grads: ∂(loss sum)/∂params, loss_sum: the reduction's sum, count: its
    divisor (commands, or command tokens for 'token'), commands, token_nll /
    token_correct / tokens: token-level sums}.
  """
  donate = jax.default_backend() != 'cpu'
  batch = setup_lib.place_batch(_step_batch(micro_batch), mesh)
  with setup_lib.mesh_context(mesh):
    return _accumulate_fn(donate)(params, acc, batch, model_config=model_config,
                                  reduction=reduction, loss_chunk_size=loss_chunk_size)


def _summary(acc: Mapping[str, Any], grads: Any) -> dict[str, jax.Array]:
  count = jnp.maximum(acc['count'], 1.0)
  tokens = jnp.maximum(acc['tokens'], 1.0)
  return {'loss': acc['loss_sum'] / count, 'grad_norm': optax.global_norm(grads),
          'token_nll': acc['token_nll'] / tokens,
          'token_accuracy': acc['token_correct'] / tokens,
          'num_commands': acc['commands'], 'num_command_tokens': acc['tokens']}


def _mean_grads(acc: Mapping[str, Any], params: Any) -> Any:
  count = jnp.maximum(acc['count'], 1.0)
  grads = jax.tree.map(lambda g: g / count, acc['grads'])
  return jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)


@functools.partial(jax.jit, static_argnames=('opt',))
def apply_accumulated(params: Any, opt_state: Any, acc: Mapping[str, Any], *,
                      opt: optim.OptimizerConfig) -> tuple[Any, Any, dict[str, jax.Array]]:
  """One optimizer update from an accumulated step (jitted; divides once).

  Args:
    params, opt_state: current parameters and `optim.make_optimizer(opt)` state.
    acc: the step's accumulator (all its micro-batches).
    opt: optim.OptimizerConfig (static).
  Returns:
    (params, opt_state, {'loss': the step's loss (sum / count of the reduction),
    'grad_norm': global norm of that loss's gradient before clipping, 'token_nll',
    'token_accuracy', 'num_commands', 'num_command_tokens'}). The update's learning
    rate is `optim.learning_rate_fn(opt)(k)` for the k-th applied update (0-based).
  """
  grads = _mean_grads(acc, params)
  tx = optim.make_optimizer(opt)
  updates, new_opt_state = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  return new_params, new_opt_state, _summary(acc, grads)


@jax.jit
def _skipped_summary(acc: Mapping[str, Any], params: Any) -> dict[str, jax.Array]:
  return _summary(acc, _mean_grads(acc, params))


def train_step(params: Any, opt_state: Any,
               micro_batches: Sequence[Mapping[str, np.ndarray]], *,
               model_config: qwen_config.QwenConfig, opt: optim.OptimizerConfig,
               mesh: jax.sharding.Mesh | None = None, reduction: str = 'decision',
               loss_chunk_size: int | None = loss_step.DEFAULT_LOSS_CHUNK_SIZE
               ) -> tuple[Any, Any, dict[str, float]]:
  """One SFT optimizer step over all micro-batches of a batch (gradient accumulation).

  With `mesh`, params / opt_state should already be placed on it (`setup.
  init_or_load_params`, `setup.init_opt_state`); the result keeps their shardings. A
  non-finite loss or gradient skips the update: params and opt_state come back
  unchanged and metrics['skipped'] is 1.

  Returns:
    (params, opt_state, metrics as Python floats: see `apply_accumulated`, plus
    'skipped' (0 or 1)).
  """
  if not micro_batches:
    raise ValueError('an SFT step needs at least one micro-batch')
  acc = zero_accumulator(params)
  for mb in micro_batches:
    acc = accumulate_micro_batch(params, acc, mb, model_config=model_config, mesh=mesh,
                                 reduction=reduction, loss_chunk_size=loss_chunk_size)
  with setup_lib.mesh_context(mesh):
    finite = nonfinite.is_finite(acc['loss_sum'], acc['grads'])
    if finite:
      params, opt_state, out = apply_accumulated(params, opt_state, acc, opt=opt)
    else:  # not applied: θ and the optimizer state stay as they are
      out = _skipped_summary(acc, params)
  metrics = {k: float(v) for k, v in jax.device_get(out).items()}
  metrics['skipped'] = float(not finite)
  return params, opt_state, metrics


@functools.partial(jax.jit, static_argnames=('model_config', 'reduction',
                                             'loss_chunk_size'))
def _nll_sums(params, batch, model_config, reduction, loss_chunk_size):
  stats = loss_step.command_token_stats(model_config, params, batch, entropy=False,
                                   correct=True, chunk_size=loss_chunk_size)
  total, count, _ = grpo.command_nll_from_token_stats(stats, batch, reduction=reduction)
  return total, count


def command_loss(params: Any, micro_batches: Sequence[Mapping[str, np.ndarray]], *,
                 model_config: qwen_config.QwenConfig,
                 mesh: jax.sharding.Mesh | None = None,
                 reduction: str = 'decision',
                 loss_chunk_size: int | None = loss_step.DEFAULT_LOSS_CHUNK_SIZE) -> float:
  """The SFT loss of `reduction` over the micro-batches, no gradient (the dev loss);
  vocabulary chunks of `loss_chunk_size` command positions."""
  total, count = 0.0, 0.0
  for mb in micro_batches:
    with setup_lib.mesh_context(mesh):
      t, c = _nll_sums(params, setup_lib.place_batch(_step_batch(mb), mesh), model_config,
                       reduction, loss_chunk_size)
    total += float(t)
    count += float(c)
  return total / max(count, 1.0)
