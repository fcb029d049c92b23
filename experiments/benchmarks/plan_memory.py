r"""Ahead-of-time memory plan of an RL phase, per device, before renting hardware.

For a backbone (a `models.qwen_config` preset or an HF `config.json`), a device count
and a ('data', 'fsdp', 'tensor') mesh, this prints `train.memory_plan`'s per-device
plan of an RL update at the config's shapes (default: `phase_b.py:scale=paper`):
the stages learner, accumulate, optimizer, rollout_copy, sampler_shared, sampler,
decode_step, dev_chunk and solver, each compiled ahead of time with abstract inputs
(nothing is allocated; the stages and the peak arithmetic are described in
vermem_jax/train/memory_plan.py; docs/time-plan.md has the table).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python \
        experiments/benchmarks/plan_memory.py --model=qwen2.5-7b-instruct --device_gb=74.5
    ... --model=/ckpt/Qwen3-4B-Instruct-2507/config.json --mesh=1,8,1
    ... --table --models=qwen2.5-7b-instruct,qwen3-4b-instruct-2507 --devices=8 \
        --device_gb=74.5                        # every stage, both backbones, 80 GB
    ... --table --models=qwen2.5-7b-instruct,qwen3-4b-instruct-2507 --devices=8 \
        --device_gbs=74.5,87.5,131.3 --stages=learner,sampler,decode_step
                                                # docs/hardware.md's table (GiB: 80/94/141 GB)

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
import functools
import math
import os
import re
import sys
from typing import Any

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
from vermem_jax.rl import loss_step  # noqa: E402
from vermem_jax.train import memory_plan  # noqa: E402
from vermem_jax.train import optim  # noqa: E402
from vermem_jax.train import setup as setup_lib  # noqa: E402

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


def measured_learner_peak(s: memory_plan.PlanSettings, seed: int = 0) -> dict[str, int]:
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
  plan = memory_plan.make_plan(s, stages=('learner',), devices=jax.devices()[:1])
  kw = memory_plan.learner_step_kwargs(s)
  shapes = jax.eval_shape(functools.partial(qwen.init_params, s.model_config),
                          jax.random.PRNGKey(0))
  compiled = loss_step.grpo_loss_and_grads.lower(shapes, shapes, memory_plan.learner_batch(s),
                                        **kw).compile()
  before = rss_bytes()
  key = jax.random.PRNGKey(seed)
  params = qwen.init_params(s.model_config, key)
  ref = jax.tree.map(lambda x: x * 1.01, params)
  opt_state = optim.make_optimizer(s.opt).init(params)
  grad_sum = setup_lib.zeros_like_params(params)
  rs = np.random.RandomState(seed)
  b, t, l = s.micro_batch, s.length, s.command_tokens
  batch = {'input_ids': rs.randint(0, s.model_config.vocab_size, (b, t)),
           'attention_mask': np.ones((b, t)), 'positions': np.tile(np.arange(t), (b, 1)),
           'command_positions': np.tile(np.arange(t - l - 1, t - 1), (b, 1)),
           'target_ids': rs.randint(0, s.model_config.vocab_size, (b, l)),
           'command_ids': np.repeat(np.arange(1, b + 1)[:, None], l, 1),
           'advantages': rs.randn(b, l), 'old_logprobs': np.zeros((b, l))}
  batch = {k: jnp.asarray(v, memory_plan.COMMAND_KEYS.get(k, jnp.int32))
           for k, v in batch.items()}
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
  ap.add_argument('--device_gb', type=float, default=74.5,
                  help='device memory in GiB for the verdict (74.5 GiB: an 80 GB '
                       'A100 / H100; data sheets count decimal GB)')
  ap.add_argument('--device_gbs', default=None, help='comma-separated, with --table')
  ap.add_argument('--headroom', type=float, default=memory_plan.DEFAULT_HEADROOM)
  ap.add_argument('--stages', default=','.join(memory_plan.STAGES))
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
  out.update(overrides_from(args.set))
  return out


def overrides_from(items) -> dict[str, Any]:
  """{'section.field': value} of `--set=SECTION.FIELD=VALUE` items (values parsed as
  Python literals, else kept as text).

  Raises:
    ValueError: an item without '='.
  """
  out = {}
  for item in items:
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
    settings = [memory_plan.plan_settings(
        phase_config(args.config, args.scale, m, overrides), n) for m in models]
  except (ValueError, KeyError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'plan_memory: {args.config}:scale={args.scale}, {n} device(s) '
        f'({jax.default_backend()} compiler), stages {",".join(stages)}', flush=True)
  figures = {}
  if args.measure:
    r = measured_learner_peak(settings[0])
    gib = {k: r[k] / memory_plan.GIB for k in ('planned', 'measured', 'state')}
    print(f'learner stage on one device: planned {gib["planned"]:.3f} GiB, measured '
          f'{gib["measured"]:.3f} GiB (RSS high-water mark; state {gib["state"]:.3f} '
          f'GiB), planned/measured '
          f'{r["planned"] / max(r["measured"], 1):.3f}')
    bench_common.write_figures(args.out, r)
    return 0
  rows = []
  for model, s in zip(models, settings):
    try:
      plan = memory_plan.make_plan(s, stages=stages)
    except ValueError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    name = model or s.model_config.vocab_size
    print(f'\n== {name}', flush=True)
    if not args.table:
      print(memory_plan.format_plan(plan, sizes[0], args.headroom), flush=True)
    figures[str(name)] = {'state': plan.state, 'stages': plan.stages,
                          'peak': plan.peak, 'mesh': s.mesh_shape}
    for size in sizes:
      rows.append((str(name), n, size, memory_plan.verdict(plan.peak, size, args.headroom),
                   plan.peak / memory_plan.GIB, plan.peak_stage))
  if args.table:
    print(f'\n| backbone | devices | mesh (data, fsdp, tensor) | device GiB | verdict '
          f'| peak GiB / device | peak stage |')
    print('| --- | --- | --- | --- | --- | --- | --- |')
    for (name, dev, size, v, peak, stage), s in zip(
        rows, [s for s in settings for _ in sizes]):
      print(f'| {name} | {dev} | {s.mesh_shape} | {size:g} | {v} | {peak:.1f} | {stage} |')
    print(memory_plan.stage_table(figures))
  bench_common.write_figures(args.out, figures)
  return 0


if __name__ == '__main__':
  sys.exit(main())
