"""Ahead-of-time per-device memory plan of an RL update (nothing is allocated).

For an RL phase's shapes (`PlanSettings`, from a config by `plan_settings`) and a
('data', 'fsdp', 'tensor') mesh, `make_plan` compiles -- with `jax.ShapeDtypeStruct`
inputs carrying the trainer's shardings -- exactly the jitted programs an update runs
and reads each one's per-device `compiled.memory_analysis()`:

  learner     `loss_step.grpo_loss_and_grads` on one micro-batch (`batching.micro_batch_size`
              rows of the last length bucket, the last command bucket): reference
              forward, policy forward + backward with the config's remat and attention
              kernel, the chunked exact-KL loss (`batching.loss_chunk_size`);
  accumulate  `rl_optimizer.add_grads` (the micro-batch gradient into the update's sum);
  optimizer   `rl_optimizer.apply_update` (global-norm clip + AdamW);
  rollout_copy `sampling.rollout_copy`: θ cast to the compute dtype and laid out for
              decoding, once per update and per dev evaluation;
  sampler     `sampling` generate program on the rollout copy for the rollout batch
              (`rl.tasks_per_update` x `rl.rollouts_per_task` rows, prompts of the
              last `sampling.prompt_buckets` bucket, `sampling.max_command_tokens` new
              tokens; KV cache of P + N slots), once with the shared prefill of the
              first decision (`sampler_shared`: one prefill per task) and once with
              every row prefilled (later decisions);
  decode_step `sampling.decode_step` alone (one token for every row, full cache);
  dev_chunk   the greedy program of one internal-dev chunk (selection and summary):
              rollout-batch rows, every row prefilled, the last prompt bucket;
  solver      the LLM task solver's greedy program on its frozen copy of the starting
              checkpoint (matrices in the compute dtype, `rollout_copy`'s layout):
              rollout-batch rows, prompts of `solver_prompt_len`,
              `solver.max_new_tokens` new tokens, while the policy's copy is alive.

A stage's peak is the program's arguments + outputs + temporaries - aliased bytes,
plus the training state alive during it that it does not take as an argument (between
programs: θ, π_ref, the AdamW moments, during the learner the gradient sum, during
rollouts the rollout copy and the solver's copy).
Persistent sizes come from the abstract arrays' shardings
(`setup.abstract_train_state`, the restore templates the trainer uses), which are exact
on every backend; the temporaries are the compiling backend's buffer assignment
(experiments/benchmarks/plan_memory.py says how far CPU figures carry to a GPU/TPU).
Used by experiments/benchmarks/plan_memory.py (the CLI) and gpu_check.py (the plan
next to a measured peak).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from vermem_jax.models import kv_cache
from vermem_jax.models import qwen_config
from vermem_jax.models import sampling
from vermem_jax.models import sharding
from vermem_jax.rl import loss_step
from vermem_jax.train import optim
from vermem_jax.train import rl_learner
from vermem_jax.train import rl_optimizer
from vermem_jax.train import run_setup
from vermem_jax.train import setup as setup_lib

GIB = 1024 ** 3
# Share of the device kept free for the runtime (CUDA context, cuBLAS / cuDNN
# workspaces, allocator fragmentation); decision, a common rule of thumb.
DEFAULT_HEADROOM = 0.10
# Learner batch keys and dtypes (batching.to_step_batch): [B, T] model inputs and the
# [B, L] loss layout.
TOKEN_KEYS = ('input_ids', 'attention_mask', 'positions')
COMMAND_KEYS = {'command_positions': jnp.int32, 'target_ids': jnp.int32,
                'command_ids': jnp.int32, 'advantages': jnp.float32,
                'old_logprobs': jnp.float32}


@dataclasses.dataclass(frozen=True)
class PlanSettings:
  """The shapes and settings one RL update compiles with (from a phase config).

  Attributes:
    model_config: the policy's QwenConfig (numerics, remat, attention kernel applied).
    mesh_shape: (data, fsdp, tensor).
    micro_batch: learner rows per micro-batch; length: T tokens per row (the last
      length bucket); command_tokens: L (the last command bucket).
    loss_chunk_size: command positions per vocabulary chunk (None: unchunked).
    loss: rl_learner.LossConfig; opt: optim.OptimizerConfig.
    rollout_rows: sampler batch B (tasks x rollouts); shared_prefill_rows: prompts
      prefilled at a rollout's first decision (one per task, rounded up to a power of
      two as `generate` does; = rollout_rows without share_prefill).
    prompt_len: the sampler's largest prompt bucket P; max_new_tokens: N.
    do_sample: the sampler draws (temperature > 0).
    solver_prompt_len: the LLM solver's prompt bucket (tokens): the smallest prompt
      bucket that holds the active context C (`memory.context_budget`) and the chat
      reserve (`sampling.prompt_overhead_tokens`); solver_new_tokens: its reply cap.
    llm_solver: the task solver is the 'llm' backend (its copy is planned).
  """
  model_config: qwen_config.QwenConfig
  mesh_shape: tuple[int, int, int]
  micro_batch: int
  length: int
  command_tokens: int
  loss_chunk_size: int | None
  loss: rl_learner.LossConfig
  opt: optim.OptimizerConfig
  rollout_rows: int
  shared_prefill_rows: int
  prompt_len: int
  max_new_tokens: int
  do_sample: bool
  solver_prompt_len: int = 0
  solver_new_tokens: int = 0
  llm_solver: bool = False


def plan_settings(config: ml_collections.ConfigDict, num_devices: int) -> PlanSettings:
  """`PlanSettings` of an RL phase config on `num_devices` devices.

  Raises:
    ValueError: a bad config field (named), e.g. a mesh that does not cover the
      devices.
  """
  run = run_setup.RunSetup.from_config(config)
  tasks, rows = run.rl.rollout.tasks_per_update, run.rl.rollout.num_rollouts
  shared = (min(rows, 1 << max(0, tasks - 1).bit_length())
            if run.sampling.share_prefill else rows)
  buckets = tuple(int(b) for b in run.sampling.prompt_buckets)
  solver_need = int(config.memory.context_budget) + int(
      config.sampling.prompt_overhead_tokens)
  return PlanSettings(
      model_config=run.model.config, mesh_shape=run.model.mesh.shape(num_devices),
      micro_batch=int(run.batching.micro_batch_size),
      length=int(run.batching.length_buckets[-1]),
      command_tokens=int(run.batching.command_buckets[-1]),
      loss_chunk_size=run.batching.loss_chunk_size, loss=run.rl.loss, opt=run.rl.opt,
      rollout_rows=rows, shared_prefill_rows=shared,
      prompt_len=int(run.sampling.prompt_buckets[-1]),
      max_new_tokens=int(run.sampling.max_command_tokens),
      do_sample=float(run.sampling.temperature) > 0,
      solver_prompt_len=min([b for b in buckets if b >= solver_need] or buckets[-1:]),
      solver_new_tokens=int(run.solver.config.max_new_tokens),
      llm_solver=run.solver.backend == 'llm')


def tree_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of arrays / ShapeDtypeStructs (its shard of
  each leaf; an unsharded leaf counts whole)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = tuple(leaf.shape)
    sh = getattr(leaf, 'sharding', None)
    if sh is not None:
      shape = sh.shard_shape(shape)
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def program_bytes(compiled: Any) -> dict[str, int]:
  """Per-device bytes of a compiled program (`memory_analysis()`): argument, output,
  temp, alias, and peak = argument + output + temp - alias."""
  ma = compiled.memory_analysis()
  out = {'argument': int(ma.argument_size_in_bytes),
         'output': int(ma.output_size_in_bytes),
         'temp': int(ma.temp_size_in_bytes), 'alias': int(ma.alias_size_in_bytes)}
  out['peak'] = out['argument'] + out['output'] + out['temp'] - out['alias']
  return out


def program_costs(compiled: Any) -> dict[str, float]:
  """Per-device {'flops', 'bytes_accessed'} of a compiled program (XLA
  `cost_analysis()`). XLA counts a while loop's body once, whatever its trip count
  (the token loop, a scan over layers): experiments/benchmarks/plan_time.py scales
  them."""
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return {'flops': float(ca.get('flops', 0.0)),
          'bytes_accessed': float(ca.get('bytes accessed', 0.0))}


def learner_batch(s: PlanSettings, mesh: Any = None) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract `batching.to_step_batch` arrays of one micro-batch, rows placed as
  `setup.place_batch` places them (split over ('data', 'fsdp') where they divide)."""
  def one(shape, dtype):
    sh = None if mesh is None else setup_lib.batch_sharding(mesh, shape)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)
  bt, bl = (s.micro_batch, s.length), (s.micro_batch, s.command_tokens)
  out = {k: one(bt, jnp.int32) for k in TOKEN_KEYS}
  out.update({k: one(bl, dtype) for k, dtype in COMMAND_KEYS.items()})
  return out


def learner_step_kwargs(s: PlanSettings) -> dict[str, Any]:
  """The static arguments `rl_learner.learner_update` passes the learner step
  `loss_step.grpo_loss_and_grads` (first step
  of an update: θ_old's log-probs from the learner, as the default config does)."""
  return dict(model_config=s.model_config, clip_epsilon=s.loss.clip_epsilon,
              kl_beta=s.loss.kl_beta, kl_estimator=s.loss.kl_estimator,
              temperature=s.loss.temperature, max_log_ratio=s.loss.max_log_ratio,
              loss_chunk_size=s.loss_chunk_size,
              old_from_learner=s.loss.old_logprobs == 'learner')


def abstract_state(s: PlanSettings, mesh: Any) -> tuple[Any, Any]:
  """(params, AdamW state) as ShapeDtypeStructs with the trainer's shardings."""
  return setup_lib.abstract_train_state(
      s.model_config, optim.make_optimizer(s.opt).init, mesh)


def kv_cache_bytes(s: PlanSettings, mesh: Any) -> int:
  """Per-device bytes of the sampler's KV cache (rollout_rows x (P + N) slots), rows
  split over ('data', 'fsdp') where they divide."""
  shapes = jax.eval_shape(functools.partial(
      kv_cache.init_cache, s.model_config, s.rollout_rows, s.prompt_len + s.max_new_tokens))
  return tree_bytes(jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                     sharding=setup_lib.batch_sharding(mesh, x.shape)),
      shapes))


@dataclasses.dataclass
class Plan:
  """Per-device bytes of the training state and of every stage (module docstring).

  state: {'params', 'optimizer', 'reference', 'grads', 'kv_cache', 'rollout_copy',
    'solver_copy' (0 without an 'llm' solver)} bytes.
  stages: {name: {'argument', 'output', 'temp', 'alias', 'peak' (program),
    'resident' (state alive but not an argument), 'stage_peak', 'compile_s',
    'flops', 'bytes_accessed' (`program_costs`)}}.
  """
  settings: PlanSettings
  state: dict[str, int]
  stages: dict[str, dict[str, float]]

  @property
  def peak(self) -> int:
    return int(max(st['stage_peak'] for st in self.stages.values()))

  @property
  def peak_stage(self) -> str:
    return max(self.stages, key=lambda k: self.stages[k]['stage_peak'])


STAGES = ('learner', 'accumulate', 'optimizer', 'rollout_copy', 'sampler_shared',
          'sampler', 'decode_step', 'dev_chunk', 'solver')
# State alive while the decoding programs run (θ is no longer their argument: the
# rollout copy is).
DECODING_RESIDENT = ('params', 'reference', 'optimizer', 'solver_copy')


def make_plan(s: PlanSettings, *, stages: Sequence[str] = STAGES,
              devices: Sequence[Any] | None = None) -> Plan:
  """Compiles the stages with abstract inputs on a mesh of `s.mesh_shape` over
  `devices` (default: the first data*fsdp*tensor of jax.devices()).

  Raises:
    ValueError: more mesh devices than JAX has (names the XLA flag), unknown stages.
  """
  unknown = sorted(set(stages) - set(STAGES))
  if unknown:
    raise ValueError(f'unknown stages {unknown}; known: {STAGES}')
  n = math.prod(s.mesh_shape)
  if devices is None:
    if n > jax.device_count():
      raise ValueError(f'the mesh {s.mesh_shape} needs {n} devices, JAX sees '
                       f'{jax.device_count()}; on CPU set XLA_FLAGS='
                       f'--xla_force_host_platform_device_count={n}')
    devices = jax.devices()[:n]
  mesh = sharding.make_mesh(*s.mesh_shape, devices=devices)
  params, opt_state = abstract_state(s, mesh)
  # The gradient sum: float32 like each parameter, with its sharding.
  grads = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32,
                                                      sharding=p.sharding), params)
  copy = sampling.abstract_rollout_copy(s.model_config, params, mesh)
  state = {'params': tree_bytes(params), 'optimizer': tree_bytes(opt_state),
           'reference': tree_bytes(params), 'grads': tree_bytes(grads),
           'kv_cache': kv_cache_bytes(s, mesh), 'rollout_copy': tree_bytes(copy),
           'solver_copy': tree_bytes(copy) if s.llm_solver else 0}
  replicated = setup_lib.replicated(mesh)
  greedy = functools.partial(sampling.lower_generate, s.model_config, copy,
                             batch=s.rollout_rows, prefill_rows=s.rollout_rows,
                             do_sample=False, input_sharding=replicated)
  programs = {
      'learner': (lambda: loss_step.grpo_loss_and_grads.lower(
          params, params, learner_batch(s, mesh), **learner_step_kwargs(s)),
                  ('optimizer', 'grads')),
      'accumulate': (lambda: rl_optimizer.add_grads.lower(grads, grads),
                     ('params', 'reference', 'optimizer')),
      'optimizer': (lambda: rl_optimizer.apply_update.lower(
          params, opt_state, grads,
          jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated), opt=s.opt),
                    ('reference',)),
      'rollout_copy': (lambda: sampling.lower_rollout_copy(s.model_config, params,
                                                           mesh),
                       ('reference', 'optimizer', 'solver_copy')),
      'sampler_shared': (lambda: sampling.lower_generate(
          s.model_config, copy, batch=s.rollout_rows,
          prefill_rows=s.shared_prefill_rows, prompt_len=s.prompt_len,
          max_new_tokens=s.max_new_tokens, do_sample=s.do_sample,
          input_sharding=replicated), DECODING_RESIDENT),
      'sampler': (lambda: sampling.lower_generate(
          s.model_config, copy, batch=s.rollout_rows, prefill_rows=s.rollout_rows,
          prompt_len=s.prompt_len, max_new_tokens=s.max_new_tokens,
          do_sample=s.do_sample, input_sharding=replicated), DECODING_RESIDENT),
      'decode_step': (lambda: sampling.lower_decode_step(
          s.model_config, copy, batch=s.rollout_rows,
          num_slots=s.prompt_len + s.max_new_tokens, do_sample=s.do_sample,
          sharding_for=lambda shape: setup_lib.batch_sharding(mesh, shape)),
                      DECODING_RESIDENT),
      'dev_chunk': (lambda: greedy(prompt_len=s.prompt_len,
                                   max_new_tokens=s.max_new_tokens), DECODING_RESIDENT),
      'solver': (lambda: greedy(prompt_len=s.solver_prompt_len,
                                max_new_tokens=s.solver_new_tokens),
                 ('params', 'reference', 'optimizer', 'rollout_copy')),
  }
  if not s.llm_solver:  # no model behind the solver: nothing to plan
    stages = [st for st in stages if st != 'solver']
  out = {}
  for name in stages:
    lower, resident = programs[name]
    t0 = time.perf_counter()
    with setup_lib.mesh_context(mesh):
      compiled = lower().compile()
    row = dict(program_bytes(compiled))
    row['resident'] = sum(state[k] for k in resident)
    row['stage_peak'] = row['peak'] + row['resident']
    row['compile_s'] = time.perf_counter() - t0
    row.update(program_costs(compiled))
    out[name] = row
  return Plan(s, state, out)


def verdict(peak: int, device_gib: float, headroom: float = DEFAULT_HEADROOM) -> str:
  """'fits' when peak <= (1 - headroom) x device, 'tight' when it fits only the whole
  device, else 'does not fit'."""
  if peak <= (1 - headroom) * device_gib * GIB:
    return 'fits'
  return 'tight' if peak <= device_gib * GIB else 'does not fit'


def gib(x: float) -> str:
  """Bytes as GiB, 7 wide with 2 decimals (the plan's table cells)."""
  return f'{x / GIB:7.2f}'


def stage_table(plans: dict[str, dict[str, Any]]) -> str:
  """A Markdown table of every stage's per-device peak (GiB, resident state included)
  for each backbone of `plans` ({name: {'stages': Plan.stages}})."""
  names = list(plans)
  stages = [st for st in STAGES if any(st in plans[n]['stages'] for n in names)]
  lines = ['\n| stage (peak GiB / device) | ' + ' | '.join(names) + ' |',
           '| --- |' + ' --- |' * len(names)]
  for st in stages:
    cells = [f'{plans[n]["stages"][st]["stage_peak"] / GIB:.1f}'
             if st in plans[n]['stages'] else '-' for n in names]
    lines.append(f'| {st} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def format_plan(plan: Plan, device_gib: float, headroom: float = DEFAULT_HEADROOM) -> str:
  """The per-device table of `plan` and its verdict against `device_gib` GiB."""
  s = plan.settings
  mc = s.model_config
  lines = [
      f'mesh (data, fsdp, tensor) = {s.mesh_shape}; {mc.num_hidden_layers} layers, '
      f'hidden {mc.hidden_size}, V {mc.vocab_size}; params {mc.param_dtype}, compute '
      f'{mc.dtype}, remat {mc.remat}, scan_layers {mc.scan_layers}, attention '
      f'{mc.attn_implementation}',
      f'learner micro-batch {s.micro_batch} x {s.length} tokens ({s.command_tokens} '
      f'command, loss chunk {s.loss_chunk_size}, KL {s.loss.kl_estimator}); sampler '
      f'{s.rollout_rows} rows x ({s.prompt_len} + {s.max_new_tokens}) slots',
      'per device (GiB):',
      f'  parameters {gib(plan.state["params"])}   optimizer state '
      f'{gib(plan.state["optimizer"])}   reference {gib(plan.state["reference"])}',
      f'  gradients  {gib(plan.state["grads"])}   KV cache '
      f'{gib(plan.state["kv_cache"])} (inside the sampler temporaries)',
      f'  rollout copy {gib(plan.state["rollout_copy"])}   solver copy '
      f'{gib(plan.state["solver_copy"])} (compute dtype, laid out for decoding)',
      f'  {"stage":<15}{"arguments":>10}{"outputs":>9}{"temps":>9}{"resident":>10}'
      f'{"peak":>9}  compile',
  ]
  for name, st in plan.stages.items():
    lines.append(f'  {name:<15}{gib(st["argument"]):>10}{gib(st["output"]):>9}'
                 f'{gib(st["temp"]):>9}{gib(st["resident"]):>10}'
                 f'{gib(st["stage_peak"]):>9}  {st["compile_s"]:.0f} s')
  v = verdict(plan.peak, device_gib, headroom)
  lines.append(f'peak {plan.peak / GIB:.2f} GiB ({plan.peak_stage}) on a '
               f'{device_gib:g} GiB device: {v} (headroom {headroom:.0%})')
  return '\n'.join(lines)


