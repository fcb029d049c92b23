r"""Ahead-of-time memory plan of an RL phase, per device, before renting hardware.

For a backbone (a `models.qwen_config` preset or an HF `config.json`), a device count
and a ('data', 'fsdp', 'tensor') mesh, this compiles -- with `jax.ShapeDtypeStruct`
inputs, so no parameter is ever allocated -- exactly the jitted programs an RL update
runs at the config's shapes (default: `phase_b.py:scale=paper`), and reads each one's
per-device `compiled.memory_analysis()`:

  learner     `train.rl_learner.grpo_step` on one micro-batch (`batching.micro_batch_size`
              rows of the last length bucket, the last command bucket): reference
              forward, policy forward + backward with the config's remat and attention
              kernel, the chunked exact-KL loss (`batching.loss_chunk_size`);
  accumulate  `rl_optimizer.add_grads` (the micro-batch gradient into the update's sum);
  optimizer   `rl_optimizer.apply_update` (global-norm clip + AdamW);
  sampler     `models.sampling` generate program for the rollout batch
              (`rl.tasks_per_update` x `rl.rollouts_per_task` rows, prompts of the last
              `sampling.prompt_buckets` bucket, `sampling.max_command_tokens` new
              tokens; KV cache of P + N slots), once with the shared prefill of the
              first decision (one prefill per task) and once with every row prefilled
              (later decisions);
  decode step `sampling.decode_step` alone (one token for every row with a full cache).

Each stage's peak is the program's arguments + outputs + temporaries - aliased bytes,
plus the training state alive during it that it does not take as an argument (between
programs the state is: θ, π_ref, the AdamW moments, and during the learner the
gradient sum). Persistent sizes come from the abstract arrays' shardings
(`setup.abstract_train_state`, the restore templates the trainer uses).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python \
        experiments/benchmarks/plan_memory.py --model=qwen2.5-7b-instruct --device_gb=80
    ... --model=/ckpt/Qwen3-4B-Instruct-2507/config.json --mesh=1,8,1
    ... --table --models=qwen2.5-7b-instruct,qwen3-4b-instruct-2507 --devices=8 \
        --device_gbs=80,141                     # the README's table

`--devices` must not exceed the devices JAX sees (the XLA flag above makes 8 on a CPU).
`--measure` runs the learner stage on real arrays instead (one device, small shapes)
and prints the measured peak next to the plan (`measured_learner_peak`).

How far the figures can be trusted. The per-device arithmetic of the sharded state
(parameters, moments, gradients, KV cache) is exact: it is the arrays' shapes, dtypes
and shardings, identical on every backend. The temporaries are XLA:CPU's buffer
assignment of the same SPMD-partitioned program; a GPU or TPU compiler fuses more
(usually fewer, smaller temporaries), pads layouts (TPU tiles the two minor dimensions
to (8, 128) and bf16 to (16, 128)), picks another attention kernel under 'auto'
(cuDNN flash on GPU, Pallas on TPU, the blockwise XLA kernel here; all linear in the
input length) and schedules collectives for overlap (the latency-hiding scheduler can
keep the next layer's all-gathered weights alive: + one layer's weights). Read the
temporaries as within ~±25 % on a GPU/TPU, the state as exact, and keep the headroom
`--headroom` (10 %) for the CUDA context, cuBLAS/cuDNN workspaces and fragmentation.
On a GPU, JAX preallocates 75 % of the memory by default: set
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 so the plan's device size is what JAX may use.
`gpu_check.py` prints this plan next to the peak measured on a device.
On CPU the plan is checked against a measured peak (tests/test_plan_memory.py: the
learner stage of a small model, process RSS high-water mark, within 20 %).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import math
import os
import re
import sys
import time
from typing import Any, Sequence

# XLA:CPU's default scheduler orders a program for thread concurrency, not memory: the
# learner step of Qwen2.5-7B's first 4 layers under fsdp=8 needed 17.8 GiB of
# temporaries with it and 6.9 GiB with the memory-minimizing list scheduler. GPU and TPU
# compilers schedule under a memory limit, so the plan's CPU programs use the latter
# (an XLA flag: it must be set before jax is imported; jit's compiler_options do not
# reach it). No effect on other backends.
CPU_SCHEDULER_FLAG = '--xla_cpu_enable_concurrency_optimized_scheduler=false'
if CPU_SCHEDULER_FLAG not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {CPU_SCHEDULER_FLAG}'.strip()

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

import bench_common  # noqa: E402  (this folder is on sys.path)
from experiments.configs import common  # noqa: E402
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.models import sampling  # noqa: E402
from vermem_jax.models import sharding  # noqa: E402
from vermem_jax.train import rl_learner  # noqa: E402
from vermem_jax.train import rl_optimizer  # noqa: E402
from vermem_jax.train import rl_setup  # noqa: E402
from vermem_jax.train import setup as setup_lib  # noqa: E402

GIB = 1024 ** 3
# Share of the device kept free for the runtime (CUDA context, cuBLAS / cuDNN
# workspaces, allocator fragmentation); decision, a common rule of thumb.
DEFAULT_HEADROOM = 0.10
# Learner batch keys and dtypes (batching.to_step_batch): [B, T] model inputs and the
# [B, L] loss layout.
_TOKEN_KEYS = ('input_ids', 'attention_mask', 'positions')
_COMMAND_KEYS = {'command_positions': jnp.int32, 'target_ids': jnp.int32,
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
    loss: rl_learner.LossConfig; opt: rl_optimizer.RLOptimizerConfig.
    rollout_rows: sampler batch B (tasks x rollouts); shared_prefill_rows: prompts
      prefilled at a rollout's first decision (one per task, rounded up to a power of
      two as `generate` does; = rollout_rows without share_prefill).
    prompt_len: the sampler's largest prompt bucket P; max_new_tokens: N.
    do_sample: the sampler draws (temperature > 0).
  """
  model_config: qwen.QwenConfig
  mesh_shape: tuple[int, int, int]
  micro_batch: int
  length: int
  command_tokens: int
  loss_chunk_size: int | None
  loss: rl_learner.LossConfig
  opt: rl_optimizer.RLOptimizerConfig
  rollout_rows: int
  shared_prefill_rows: int
  prompt_len: int
  max_new_tokens: int
  do_sample: bool


def phase_config(phase: str = 'phase_b', scale: str = 'paper',
                 model: str | None = None,
                 overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The experiment config the plan reads: `common.get_config(phase, scale)` with
  `model` (a preset name, or a path to an HF config.json / its folder) and
  {'section.field': value} overrides applied.

  Raises:
    ValueError: an unknown phase, scale, preset or field.
  """
  config = common.get_config(phase, f'scale={scale}')
  if model:
    if os.path.exists(model):
      config.model.hf_checkpoint = model
    else:
      config.model.preset = model
      config.model.hf_checkpoint = None
  for key, value in (overrides or {}).items():
    section, _, name = key.partition('.')
    if section not in config or name not in config[section]:
      raise ValueError(f'unknown config field {key!r}')
    config[section][name] = value
  return config


def plan_settings(config: ml_collections.ConfigDict, num_devices: int) -> PlanSettings:
  """`PlanSettings` of an RL phase config on `num_devices` devices.

  Raises:
    ValueError: a bad config field (named), e.g. a mesh that does not cover the
      devices.
  """
  mc = setup_lib.model_config_from(config)
  tasks, rollouts = int(config.rl.tasks_per_update), int(config.rl.rollouts_per_task)
  rows = tasks * rollouts
  shared = (min(rows, 1 << max(0, tasks - 1).bit_length())
            if config.sampling.share_prefill else rows)
  return PlanSettings(
      model_config=mc, mesh_shape=setup_lib.mesh_shape_from(config, num_devices),
      micro_batch=int(config.batching.micro_batch_size),
      length=int(config.batching.length_buckets[-1]),
      command_tokens=int(config.batching.command_buckets[-1]),
      loss_chunk_size=config.batching.loss_chunk_size,
      loss=rl_setup.loss_config_from(config), opt=rl_learner.optimizer_config_from(config),
      rollout_rows=rows, shared_prefill_rows=shared,
      prompt_len=int(config.sampling.prompt_buckets[-1]),
      max_new_tokens=int(config.sampling.max_command_tokens),
      do_sample=float(config.sampling.temperature) > 0)


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


def learner_batch(s: PlanSettings, mesh: Any = None) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract `batching.to_step_batch` arrays of one micro-batch, rows placed as
  `setup.place_batch` places them (split over ('data', 'fsdp') where they divide)."""
  def one(shape, dtype):
    sh = None if mesh is None else setup_lib.batch_sharding(mesh, shape)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)
  bt, bl = (s.micro_batch, s.length), (s.micro_batch, s.command_tokens)
  out = {k: one(bt, jnp.int32) for k in _TOKEN_KEYS}
  out.update({k: one(bl, dtype) for k, dtype in _COMMAND_KEYS.items()})
  return out


def grpo_step_kwargs(s: PlanSettings) -> dict[str, Any]:
  """The static arguments `rl_learner.learner_update` passes `grpo_step` (first step
  of an update: θ_old's log-probs from the learner, as the default config does)."""
  return dict(model_config=s.model_config, clip_epsilon=s.loss.clip_epsilon,
              kl_beta=s.loss.kl_beta, kl_estimator=s.loss.kl_estimator,
              temperature=s.loss.temperature, max_log_ratio=s.loss.max_log_ratio,
              loss_chunk_size=s.loss_chunk_size,
              old_from_learner=s.loss.old_logprobs == 'learner')


def abstract_state(s: PlanSettings, mesh: Any) -> tuple[Any, Any]:
  """(params, AdamW state) as ShapeDtypeStructs with the trainer's shardings."""
  return setup_lib.abstract_train_state(
      s.model_config, rl_learner.make_optimizer(s.opt).init, mesh)


def kv_cache_bytes(s: PlanSettings, mesh: Any) -> int:
  """Per-device bytes of the sampler's KV cache (rollout_rows x (P + N) slots), rows
  split over ('data', 'fsdp') where they divide."""
  shapes = jax.eval_shape(functools.partial(
      qwen.init_cache, s.model_config, s.rollout_rows, s.prompt_len + s.max_new_tokens))
  return tree_bytes(jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                     sharding=setup_lib.batch_sharding(mesh, x.shape)),
      shapes))


@dataclasses.dataclass
class Plan:
  """Per-device bytes of the training state and of every stage (module docstring).

  state: {'params', 'optimizer', 'reference', 'grads', 'kv_cache'} bytes.
  stages: {name: {'argument', 'output', 'temp', 'alias', 'peak' (program),
    'resident' (state alive but not an argument), 'stage_peak', 'compile_s'}}.
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


STAGES = ('learner', 'accumulate', 'optimizer', 'sampler_shared', 'sampler',
          'decode_step')


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
  state = {'params': tree_bytes(params), 'optimizer': tree_bytes(opt_state),
           'reference': tree_bytes(params), 'grads': tree_bytes(grads),
           'kv_cache': kv_cache_bytes(s, mesh)}
  replicated = setup_lib.replicated(mesh)
  programs = {
      'learner': (lambda: rl_learner.grpo_step.lower(
          params, params, learner_batch(s, mesh), **grpo_step_kwargs(s)),
                  ('optimizer', 'grads')),
      'accumulate': (lambda: rl_optimizer.add_grads.lower(grads, grads),
                     ('params', 'reference', 'optimizer')),
      'optimizer': (lambda: rl_optimizer.apply_update.lower(
          params, opt_state, grads,
          jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated), opt=s.opt),
                    ('reference',)),
      'sampler_shared': (lambda: sampling.lower_generate(
          s.model_config, params, batch=s.rollout_rows,
          prefill_rows=s.shared_prefill_rows, prompt_len=s.prompt_len,
          max_new_tokens=s.max_new_tokens, do_sample=s.do_sample,
          input_sharding=replicated), ('reference', 'optimizer')),
      'sampler': (lambda: sampling.lower_generate(
          s.model_config, params, batch=s.rollout_rows, prefill_rows=s.rollout_rows,
          prompt_len=s.prompt_len, max_new_tokens=s.max_new_tokens,
          do_sample=s.do_sample, input_sharding=replicated), ('reference', 'optimizer')),
      'decode_step': (lambda: sampling.lower_decode_step(
          s.model_config, params, batch=s.rollout_rows,
          num_slots=s.prompt_len + s.max_new_tokens, do_sample=s.do_sample,
          sharding_for=lambda shape: setup_lib.batch_sharding(mesh, shape)),
                      ('reference', 'optimizer')),
  }
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
    out[name] = row
  return Plan(s, state, out)


def verdict(peak: int, device_gib: float, headroom: float = DEFAULT_HEADROOM) -> str:
  """'fits' when peak <= (1 - headroom) x device, 'tight' when it fits only the whole
  device, else 'does not fit'."""
  if peak <= (1 - headroom) * device_gib * GIB:
    return 'fits'
  return 'tight' if peak <= device_gib * GIB else 'does not fit'


def gib(x: float) -> str:
  return f'{x / GIB:7.2f}'


def format_plan(plan: Plan, device_gib: float, headroom: float = DEFAULT_HEADROOM) -> str:
  """The per-device table of `plan` and its verdict against `device_gib` GiB."""
  s = plan.settings
  mc = s.model_config
  lines = [
      f'mesh (data, fsdp, tensor) = {s.mesh_shape}; {mc.num_hidden_layers} layers, '
      f'hidden {mc.hidden_size}, V {mc.vocab_size}; params {mc.param_dtype}, compute '
      f'{mc.dtype}, remat {mc.remat}, attention {mc.attn_implementation}',
      f'learner micro-batch {s.micro_batch} x {s.length} tokens ({s.command_tokens} '
      f'command, loss chunk {s.loss_chunk_size}, KL {s.loss.kl_estimator}); sampler '
      f'{s.rollout_rows} rows x ({s.prompt_len} + {s.max_new_tokens}) slots',
      'per device (GiB):',
      f'  parameters {gib(plan.state["params"])}   optimizer state '
      f'{gib(plan.state["optimizer"])}   reference {gib(plan.state["reference"])}',
      f'  gradients  {gib(plan.state["grads"])}   KV cache '
      f'{gib(plan.state["kv_cache"])} (inside the sampler temporaries)',
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


# ----------------------------------------------------------------------- measuring
def _proc_status_kib(field: str) -> int:
  with open('/proc/self/status', encoding='ascii') as f:
    return int(re.search(rf'^{field}:\s+(\d+) kB', f.read(), re.M).group(1))


def rss_bytes() -> int:
  """This process's resident set size (Linux /proc)."""
  return _proc_status_kib('VmRSS') * 1024


def reset_peak_rss() -> None:
  """Resets the RSS high-water mark to the current RSS (Linux: clear_refs 5)."""
  with open('/proc/self/clear_refs', 'w', encoding='ascii') as f:
    f.write('5')


def peak_rss_bytes() -> int:
  return _proc_status_kib('VmHWM') * 1024


# glibc serves allocations above this size with mmap and returns them on free, so the
# RSS follows XLA's buffers; without it the threshold grows up to 32 MiB and freed
# compiler memory is reused without showing in the RSS.
MALLOC_ENV = {'MALLOC_MMAP_THRESHOLD_': '65536'}


def measured_learner_peak(s: PlanSettings, seed: int = 0) -> dict[str, int]:
  """Runs the learner stage on one CPU device with real arrays and measures its peak.

  The CPU backend has no `memory_stats()`, so the peak is the process's RSS
  high-water mark: the program is compiled first, the RSS noted, the training state
  (θ, π_ref, AdamW moments, gradient sum) and one micro-batch allocated, the mark
  reset (`reset_peak_rss`), `grpo_step` run once; measured = high-water mark - the RSS
  noted before the state. Start the process with `MALLOC_ENV` so freed memory is
  returned to the system. Single device only (`s.mesh_shape` must be (1, 1, 1)).

  Returns:
    {'measured': bytes, 'planned': the plan's learner stage_peak, 'state': bytes
    allocated before the step (RSS growth)}.
  Raises:
    ValueError: a mesh with more than one device.
  """
  if math.prod(s.mesh_shape) != 1:
    raise ValueError(f'measured_learner_peak runs on one device, got mesh {s.mesh_shape}')
  plan = make_plan(s, stages=('learner',), devices=jax.devices()[:1])
  kw = grpo_step_kwargs(s)
  shapes = jax.eval_shape(functools.partial(qwen.init_params, s.model_config),
                          jax.random.PRNGKey(0))
  compiled = rl_learner.grpo_step.lower(shapes, shapes, learner_batch(s), **kw).compile()
  before = rss_bytes()
  key = jax.random.PRNGKey(seed)
  params = qwen.init_params(s.model_config, key)
  ref = jax.tree.map(lambda x: x * 1.01, params)
  opt_state = rl_learner.make_optimizer(s.opt).init(params)
  grad_sum = setup_lib.zeros_like_params(params)
  rs = np.random.RandomState(seed)
  b, t, l = s.micro_batch, s.length, s.command_tokens
  batch = {'input_ids': rs.randint(0, s.model_config.vocab_size, (b, t)),
           'attention_mask': np.ones((b, t)), 'positions': np.tile(np.arange(t), (b, 1)),
           'command_positions': np.tile(np.arange(t - l - 1, t - 1), (b, 1)),
           'target_ids': rs.randint(0, s.model_config.vocab_size, (b, l)),
           'command_ids': np.repeat(np.arange(1, b + 1)[:, None], l, 1),
           'advantages': rs.randn(b, l), 'old_logprobs': np.zeros((b, l))}
  batch = {k: jnp.asarray(v, _COMMAND_KEYS.get(k, jnp.int32)) for k, v in batch.items()}
  # Pages of the state are written (init, AdamW zeros, gradient zeros): all resident.
  jax.block_until_ready((params, ref, opt_state, grad_sum, batch))
  state = rss_bytes() - before
  reset_peak_rss()
  out = compiled(params, ref, batch)
  jax.block_until_ready(out)
  measured = peak_rss_bytes() - before
  del out
  return {'measured': measured, 'planned': int(plan.stages['learner']['stage_peak']),
          'state': state}


# ----------------------------------------------------------------------------- CLI
def _parser():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--config', default='phase_b', help='RL phase config (phase_a/b/c)')
  ap.add_argument('--scale', default='paper')
  ap.add_argument('--model', default=None,
                  help='preset name or HF config.json (default: the config\'s)')
  ap.add_argument('--models', default=None, help='comma-separated, with --table')
  ap.add_argument('--devices', type=int, default=None,
                  help='device count (default: all JAX devices)')
  ap.add_argument('--mesh', default=None,
                  help='data,fsdp,tensor (-1 = the rest; default: the config\'s)')
  ap.add_argument('--micro_batch', type=int, default=None)
  ap.add_argument('--remat', choices=('true', 'false'), default=None)
  ap.add_argument('--attn_implementation', default=None)
  ap.add_argument('--loss_chunk_size', type=int, default=None)
  ap.add_argument('--device_gb', type=float, default=80.0,
                  help='device memory in GiB for the verdict')
  ap.add_argument('--device_gbs', default=None, help='comma-separated, with --table')
  ap.add_argument('--headroom', type=float, default=DEFAULT_HEADROOM)
  ap.add_argument('--stages', default=','.join(STAGES))
  ap.add_argument('--table', action='store_true',
                  help='one row per model x device size (fits / peak GiB)')
  ap.add_argument('--measure', action='store_true',
                  help='measure the learner stage on one CPU device (small shapes)')
  ap.add_argument('--set', action='append', default=[], metavar='SECTION.FIELD=VALUE',
                  help='any other config field, e.g. --set=batching.length_buckets=(1024,)')
  bench_common.add_out_flag(ap)
  return ap


def _overrides(args) -> dict[str, Any]:
  out = {}
  if args.mesh:
    try:
      data, fsdp, tensor = (int(x) for x in args.mesh.split(','))
    except ValueError as e:
      raise ValueError(f'--mesh must be data,fsdp,tensor ints, got {args.mesh!r}') from e
    out.update({'model.mesh_data': data, 'model.mesh_fsdp': fsdp,
                'model.mesh_tensor': tensor})
  if args.micro_batch:
    out['batching.micro_batch_size'] = args.micro_batch
  if args.remat:
    out['model.remat'] = args.remat == 'true'
  if args.attn_implementation:
    out['model.attn_implementation'] = args.attn_implementation
  if args.loss_chunk_size:
    out['batching.loss_chunk_size'] = args.loss_chunk_size
  for item in args.set:
    key, sep, value = item.partition('=')
    if not sep:
      raise ValueError(f'--set needs SECTION.FIELD=VALUE, got {item!r}')
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  if args.measure and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
    os.execve(sys.executable, [sys.executable] + sys.argv,  # RSS must follow XLA
              dict(os.environ, **MALLOC_ENV))
  try:
    overrides = _overrides(args)
    models = (args.models.split(',') if args.table and args.models else [args.model])
    sizes = ([float(x) for x in args.device_gbs.split(',')]
             if args.table and args.device_gbs else [args.device_gb])
    n = args.devices or jax.device_count()
    stages = tuple(x for x in args.stages.split(',') if x)
    settings = [plan_settings(phase_config(args.config, args.scale, m, overrides), n)
                for m in models]
  except (ValueError, KeyError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'plan_memory: {args.config}:scale={args.scale}, {n} device(s) '
        f'({jax.default_backend()} compiler), stages {",".join(stages)}', flush=True)
  figures = {}
  if args.measure:
    r = measured_learner_peak(settings[0])
    print(f'learner stage on one device: planned {r["planned"] / GIB:.3f} GiB, '
          f'measured {r["measured"] / GIB:.3f} GiB (RSS high-water mark; state '
          f'{r["state"] / GIB:.3f} GiB), planned/measured '
          f'{r["planned"] / max(r["measured"], 1):.3f}')
    bench_common.write_figures(args.out, r)
    return 0
  rows = []
  for model, s in zip(models, settings):
    try:
      plan = make_plan(s, stages=stages)
    except ValueError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    name = model or s.model_config.vocab_size
    print(f'\n== {name}', flush=True)
    if not args.table:
      print(format_plan(plan, sizes[0], args.headroom), flush=True)
    figures[str(name)] = {'state': plan.state, 'stages': plan.stages,
                          'peak': plan.peak, 'mesh': s.mesh_shape}
    for size in sizes:
      rows.append((str(name), n, size, verdict(plan.peak, size, args.headroom),
                   plan.peak / GIB, plan.peak_stage))
  if args.table:
    print(f'\n| backbone | devices | mesh (data, fsdp, tensor) | device GiB | verdict '
          f'| peak GiB / device | peak stage |')
    print('| --- | --- | --- | --- | --- | --- | --- |')
    for (name, dev, size, v, peak, stage), s in zip(
        rows, [s for s in settings for _ in sizes]):
      print(f'| {name} | {dev} | {s.mesh_shape} | {size:g} | {v} | {peak:.1f} | {stage} |')
  bench_common.write_figures(args.out, figures)
  return 0


if __name__ == '__main__':
  sys.exit(main())
