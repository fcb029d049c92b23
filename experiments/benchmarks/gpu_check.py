r"""Paper-scale check on one accelerator: learner step and decode at 8,192-token inputs.

Runs, for a Qwen2.5-0.5B-sized model with random weights (bfloat16 compute, float32
parameters, decoder-layer rematerialization, the layers scanned as the paper config
runs them (`model.scan_layers`), attention `--attn_implementation`, auto =
cuDNN flash attention on GPU), in one process that should finish in well under ten
minutes on one modern GPU:
  learner  `train.loss_step.grpo_loss_and_grads` (reference forward, policy forward + backward,
           exact KL over the vocabulary in chunks of --loss_chunk_size command
           positions) on B = --learner_batch rows of T = --length tokens, the last
           --command_tokens of each row being the command;
  decode   `models.sampling.generate`, greedy, batch --decode_batch, prompts of
           T - --new_tokens tokens (left-padded, varied lengths), --new_tokens new
           tokens, KV cache of T slots (prefill inside the timing).
  rollout  the decoding path of an RL update (issue 38): `sampling.rollout_copy` of θ
           (float32 -> the compute dtype), one greedy dev chunk (--decode_batch rows
           on the copy, prompts of the last bucket, --new_tokens new tokens) and the
           LLM solver's call (--decode_batch rows, prompts of --solver_prompt tokens,
           --solver_new_tokens new tokens), each timed next to `train.time_plan`'s
           planned seconds for this one device (its peak and HBM bandwidth from
           experiments/configs/parts/hardware.py by device kind, the plan's efficiencies)
           and its measured memory next to the memory plan's dev_chunk / solver stage.
For each it prints tokens/s (learner: B·T per step; decode: batch·new tokens per call,
and prefill + decode tokens per second), peak device memory (`memory_stats`; on CPU the
compile-time temp bytes instead) next to the memory plan's prediction for the same
programs and shapes (`train.memory_plan`, compiled ahead of time with abstract inputs
by this device's compiler, as plan_memory.py does for a whole RL update; --skip=plan
leaves it out), and model FLOPs utilization: MFU = model FLOPs per
second / peak FLOPs per second of the device, with model FLOPs counted per token as
2·N (forward) for the non-embedding parameters N, plus 4·n_layers·d_attn·context for
the causal attention scores and values (context = position + 1 averaged over the
sequence), times 3 for forward + backward of the policy (rematerialized forwards not
counted), plus the vocabulary head at the command positions only (what the loss
computes), and for decode the same forward counts of prefill and every step. The peak
comes from --peak_tflops, else a table of known GPUs (bf16 dense), else MFU is omitted.

Planned against measured: the learner's plan is its program's arguments (θ, π_ref, the
micro-batch) + outputs + temporaries; the decode's is the generate program's plus
π_ref, which stays allocated but is not its argument. The device's peak counter
(`peak_bytes_in_use`) cannot be reset, so the decode's measured peak is the process's
peak so far: with the learner first it is the larger of the two; --skip=learner
measures the decode alone.

It has NOT been run on a GPU in this repository's development (no accelerator was
available); its CPU-runnable parts are exercised at tiny sizes:
  .venv/bin/python experiments/benchmarks/gpu_check.py --preset=tiny --hf_checkpoint= \
      --length=256 \
      --command_tokens=32 --learner_batch=2 --decode_batch=4 --new_tokens=8 \
      --vocab_size=4096 --repeats=1
On a GPU (defaults = the paper-scale check):
  python experiments/benchmarks/gpu_check.py --out=gpu_check.json
With SmolLM2 converted (`make install-small`) the default --hf_checkpoint=auto runs
that real model (real weights, its shapes) instead of the random preset; --preset then
names nothing, and --hf_checkpoint= (empty) restores the preset.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bench_common  # noqa: E402  (this folder is on sys.path)
from vermem_jax import paths  # noqa: E402
from vermem_jax.models import gguf_import  # noqa: E402
from vermem_jax.models import hf_io  # noqa: E402
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.models import qwen_config
from vermem_jax.models import sampling  # noqa: E402
from vermem_jax.rl import loss_step  # noqa: E402
from vermem_jax.train import memory_plan  # noqa: E402
from vermem_jax.train import optim  # noqa: E402
from vermem_jax.train import rl_learner  # noqa: E402
from vermem_jax.train import time_plan  # noqa: E402
from experiments.configs.parts import hardware  # noqa: E402

GIB = 1024 ** 3
# Dense bf16 peak TFLOP/s by device kind substring (vendor data sheets, SXM parts).
PEAK_TFLOPS = (('H200', 989.0), ('H100', 989.0), ('A100', 312.0), ('L40S', 362.0),
               ('A10G', 125.0), ('L4', 121.0), ('V100', 125.0))


def _parser():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--preset', default='qwen2.5-0.5b-instruct')
  ap.add_argument('--hf_checkpoint', default='auto',
                  help="a Hugging Face folder whose real weights replace the preset's "
                       "random ones (θ and π_ref both start from it); 'auto' = the "
                       'converted SmolLM2 folder (make install-small) when it is there, '
                       "else the preset; '' = the preset")
  ap.add_argument('--vocab_size', type=int, default=None, help='override the preset')
  ap.add_argument('--attn_implementation', default='auto')
  ap.add_argument('--length', type=int, default=8192, help='T tokens per row')
  ap.add_argument('--command_tokens', type=int, default=256)
  ap.add_argument('--learner_batch', type=int, default=4)
  ap.add_argument('--loss_chunk_size', type=int, default=loss_step.DEFAULT_LOSS_CHUNK_SIZE)
  ap.add_argument('--decode_batch', type=int, default=64)
  ap.add_argument('--new_tokens', type=int, default=256)
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--peak_tflops', type=float, default=None,
                  help='device peak (bf16 dense) for MFU; default from the GPU name')
  ap.add_argument('--solver_prompt', type=int, default=2048,
                  help='solver prompt tokens (rollout part)')
  ap.add_argument('--solver_new_tokens', type=int, default=64)
  ap.add_argument('--skip', default='',
                  help='parts to skip: learner, decode, rollout, plan')
  bench_common.add_out_flag(ap)
  return ap


def non_embedding_params(cfg: qwen_config.QwenConfig) -> int:
  """Parameters of the decoder layers and final norm (what every token multiplies)."""
  d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  n, kv = cfg.num_attention_heads, cfg.num_key_value_heads
  attn = d * n * hd + 2 * d * kv * hd + n * hd * d
  if cfg.attention_bias:
    attn += n * hd + 2 * kv * hd
  if cfg.qk_norm:
    attn += 2 * hd
  per_layer = attn + 3 * d * f + 2 * d
  return cfg.num_hidden_layers * per_layer + d


def forward_flops(cfg: qwen_config.QwenConfig, tokens: int, mean_context: float) -> float:
  """Model FLOPs of a forward over `tokens` tokens (no vocabulary head)."""
  attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
  return tokens * (2 * non_embedding_params(cfg) + attn * mean_context)


def head_flops(cfg: qwen_config.QwenConfig, positions: int) -> float:
  return 2.0 * positions * cfg.hidden_size * cfg.vocab_size


def device_peak(args) -> float | None:
  if args.peak_tflops:
    return args.peak_tflops * 1e12
  kind = jax.devices()[0].device_kind
  for name, tflops in PEAK_TFLOPS:
    if name.lower() in kind.lower():
      return tflops * 1e12
  return None


def peak_memory() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')


def plan_settings(cfg: qwen_config.QwenConfig, args) -> memory_plan.PlanSettings:
  """The shapes this check runs, as `memory_plan.PlanSettings` on one device: the
  learner's micro-batch (--learner_batch x --length, --command_tokens, the default
  GRPO loss with θ_old's log-probs from the learner) and the greedy decode (--decode_batch
  rows, prompts of --length - --new_tokens, every row prefilled)."""
  return memory_plan.PlanSettings(
      model_config=cfg, mesh_shape=(1, 1, 1), micro_batch=args.learner_batch,
      length=args.length, command_tokens=args.command_tokens,
      loss_chunk_size=args.loss_chunk_size,
      loss=rl_learner.LossConfig(old_logprobs='learner'),
      opt=optim.OptimizerConfig(learning_rate=1e-6, total_steps=1, warmup_ratio=0.0,
                                lr_schedule='constant'), rollout_rows=args.decode_batch,
      shared_prefill_rows=args.decode_batch, prompt_len=args.length - args.new_tokens,
      max_new_tokens=args.new_tokens, do_sample=False,
      solver_prompt_len=args.solver_prompt, solver_new_tokens=args.solver_new_tokens,
      llm_solver=True)


def planned_peaks(s: memory_plan.PlanSettings, rollout: bool = True) -> dict:
  """Planned device bytes of this check's two parts (module docstring): {'learner',
  'decode'} in GiB, and the seconds the ahead-of-time compiles took."""
  stages = ('learner', 'sampler') + (('dev_chunk', 'solver') if rollout else ())
  plan = memory_plan.make_plan(s, stages=stages, devices=jax.devices()[:1])
  out = {'learner_gib': plan.stages['learner']['peak'] / GIB,
         'decode_gib': (plan.stages['sampler']['peak'] + plan.state['reference']) / GIB,
         'compile_s': sum(plan.stages[k]['compile_s'] for k in stages)}
  # The rollout part holds θ, π_ref and the copy; the programs take the copy.
  held = plan.state['params'] + plan.state['reference']
  for name in stages[2:]:
    out[f'{name}_gib'] = (plan.stages[name]['peak'] + held) / GIB
  return out


def one_chip(kind: str) -> time_plan.Hardware | None:
  """One chip of the time plan's hardware of this device kind, or None."""
  for hw in hardware.HARDWARE.values():
    if hw.device_kind.lower() in kind.lower():
      return dataclasses.replace(hw, chips=1)
  return None


def planned_generate_s(cfg, hw: time_plan.Hardware, rows: int, prompt: int,
                       new_tokens: int) -> float:
  """`time_plan`'s seconds of one greedy generate call on one chip: the prefill at
  the prefill efficiency, `new_tokens` steps streaming the copy and the KV cache."""
  work = time_plan.Work()
  work.add('flops', 'rollout_prefill',
           time_plan.generate_flops(cfg, rows, rows, prompt, new_tokens, 0))
  work.add('flops', 'rollout_decode', new_tokens * time_plan.forward_flops(
      cfg, rows, 1, prompt + new_tokens, rows))
  copy = time_plan.matrix_params(cfg) * np.dtype(cfg.compute_dtype).itemsize
  work.add('hbm_bytes', 'rollout_decode_per_chip', new_tokens * copy)
  work.add('hbm_bytes', 'rollout_decode', new_tokens * rows * (prompt + new_tokens)
           * time_plan.kv_bytes_per_token(cfg))
  sec = time_plan.stage_seconds(work, hw, hardware.EFFICIENCY, 0.0, 1)
  return sec['rollout_prefill'] + sec['rollout_decode']


def rollout_check(cfg, params, args, planned) -> dict:
  """The rollout copy, a dev chunk and the solver call, measured and planned."""
  hw = one_chip(jax.devices()[0].device_kind)
  b, n, p = args.decode_batch, args.new_tokens, args.length - args.new_tokens
  first, copy_s = bench_common.time_median(
      lambda: jax.block_until_ready(sampling.rollout_copy(cfg, params)), args.repeats)
  copy = sampling.rollout_copy(cfg, params)
  rs = np.random.RandomState(2)
  out = {'copy_s': copy_s, 'copy_first_call_s': first}
  if hw is not None:
    # Read float32 θ, write the copy.
    moved = (time_plan.matrix_params(cfg) * (4 + np.dtype(cfg.compute_dtype).itemsize))
    out['copy_planned_s'] = moved / (hw.hbm_bytes_per_s * hardware.EFFICIENCY.decode_hbm)
  for name, prompt, new in (('dev_chunk', p, n),
                            ('solver', args.solver_prompt, args.solver_new_tokens)):
    prompts = [rs.randint(1, cfg.vocab_size, prompt).tolist() for _ in range(b)]
    kw = dict(rng=0, max_new_tokens=new, temperature=0.0, stop_token_ids=(),
              pad_token_id=0, prompt_buckets=(prompt,))
    first, sec = bench_common.time_median(lambda: jax.block_until_ready(
        sampling.generate(cfg, copy, prompts, **kw).tokens), args.repeats)
    out[f'{name}_s'] = sec
    out[f'{name}_first_call_s'] = first
    out[f'{name}_planned_s'] = (None if hw is None
                                else planned_generate_s(cfg, hw, b, prompt, new))
    mem = peak_memory()
    out[f'{name}_peak_memory_gib'] = None if mem is None else mem / GIB
    out[f'{name}_planned_gib'] = planned.get(f'{name}_gib')
  return out


def learner_check(cfg, params, ref_params, args, peak) -> dict:
  b, t, l = args.learner_batch, args.length, args.command_tokens
  rs = np.random.RandomState(0)
  lengths = np.full(b, t)
  lengths[1:] = rs.randint(t // 2, t + 1, b - 1)  # one full row, others shorter
  ids = rs.randint(0, cfg.vocab_size, (b, t)).astype(np.int32)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  pos = np.stack([np.arange(n - l - 1, n - 1) for n in lengths]).astype(np.int32)
  # batching.to_step_batch's positions: cumsum(mask) - 1, clipped at 0.
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  batch = {'input_ids': ids, 'attention_mask': mask, 'positions': positions,
           'command_positions': pos,
           'target_ids': rs.randint(0, cfg.vocab_size, (b, l)).astype(np.int32),
           'command_ids': np.repeat(np.arange(1, b + 1, dtype=np.int32)[:, None], l, 1),
           'advantages': rs.randn(b, l).astype(np.float32),
           'old_logprobs': np.zeros((b, l), np.float32)}
  batch = {k: jnp.asarray(x) for k, x in batch.items()}
  t0 = time.perf_counter()
  # The planner's program: the same jitted function and static arguments.
  compiled = loss_step.grpo_loss_and_grads.lower(
      params, ref_params, batch,
      **memory_plan.learner_step_kwargs(plan_settings(cfg, args))).compile()
  compile_s = time.perf_counter() - t0
  program = memory_plan.program_bytes(compiled)
  temp = program['temp']
  first, sec = bench_common.time_median(lambda: jax.block_until_ready(compiled(params, ref_params, batch)),
                      args.repeats)
  real = int(mask.sum())
  # Every position of a row attends its prefix: mean context (T_row + 1) / 2.
  ctx = float(np.sum(lengths * (lengths + 1) / 2) / real)
  flops = (3 * forward_flops(cfg, real, ctx) + forward_flops(cfg, real, ctx)
           + 4 * head_flops(cfg, b * l))
  out = {'rows': b, 'length': t, 'command_tokens': l, 'real_tokens': real,
         'seconds': sec, 'tokens_per_s': b * t / sec, 'real_tokens_per_s': real / sec,
         'compile_s': compile_s, 'first_call_s': first, 'temp_gib': temp / GIB,
         'program_gib': program['peak'] / GIB,
         'model_tflops_per_step': flops / 1e12}
  mem = peak_memory()
  out['peak_memory_gib'] = None if mem is None else mem / GIB
  out['mfu'] = None if peak is None else flops / sec / peak
  return out


def decode_check(cfg, params, args, peak) -> dict:
  b, n = args.decode_batch, args.new_tokens
  p = args.length - n
  rs = np.random.RandomState(1)
  lens = rs.randint(p // 2, p + 1, b)
  lens[0] = p
  prompts = [rs.randint(0, cfg.vocab_size, k).tolist() for k in lens]
  kw = dict(rng=0, max_new_tokens=n, temperature=0.0, stop_token_ids=(), pad_token_id=0,
            prompt_buckets=(p,))
  first, sec = bench_common.time_median(lambda: jax.block_until_ready(
      sampling.generate(cfg, params, prompts, **kw).tokens), args.repeats)
  real = int(lens.sum())
  prefill = forward_flops(cfg, real, float(np.sum(lens * (lens + 1) / 2) / real))
  steps = forward_flops(cfg, b * n, float(np.mean(lens)) + n / 2)
  flops = prefill + steps + head_flops(cfg, b * (n + 1))
  out = {'batch': b, 'prompt_bucket': p, 'new_tokens': n, 'seconds': sec,
         'tokens_per_s': b * n / sec, 'prefill_and_new_tokens_per_s': (real + b * n) / sec,
         'first_call_s': first, 'model_tflops_per_call': flops / 1e12}
  mem = peak_memory()
  out['peak_memory_gib'] = None if mem is None else mem / GIB
  out['mfu'] = None if peak is None else flops / sec / peak
  return out


def main(argv=None):
  args = _parser().parse_args(argv)
  overrides = dict(dtype='bfloat16', param_dtype='float32', remat=True, scan_layers=True,
                   attn_implementation=args.attn_implementation)
  folder = args.hf_checkpoint
  if folder == 'auto':
    folder = paths.small_model_dir() if gguf_import.is_converted(
        paths.small_model_dir()) else ''
  if args.vocab_size:
    if folder:
      raise SystemExit(f'--vocab_size applies to a preset, not to {folder}')
    overrides['vocab_size'] = args.vocab_size
  if folder:
    cfg = qwen_config.QwenConfig.from_hf(folder, **overrides)
  else:
    cfg = qwen_config.QwenConfig.preset(args.preset, **overrides)
  model_name = folder or args.preset
  if args.length > cfg.max_position_embeddings:
    raise SystemExit(f'--length {args.length} > max_position_embeddings')
  peak = device_peak(args)
  dev = jax.devices()[0]
  print(f'device: {dev.device_kind} ({jax.default_backend()}), {len(jax.devices())} '
        f'device(s); peak {"unknown (no MFU)" if peak is None else f"{peak / 1e12:.0f} TFLOP/s"}; '
        f'model {model_name} ({non_embedding_params(cfg) / 1e6:.0f}M non-embedding '
        f'parameters, V={cfg.vocab_size}), bf16 compute, remat, scanned layers, attention '
        f'{args.attn_implementation}; load average {os.getloadavg()[0]:.1f}', flush=True)
  t0 = time.perf_counter()
  if folder:
    _, params = hf_io.load_hf_checkpoint(folder, dtype=cfg.param_dtype)
    ref_params = jax.tree.map(jnp.copy, params)
  else:
    params = qwen.init_params(cfg, jax.random.PRNGKey(0))
    ref_params = qwen.init_params(cfg, jax.random.PRNGKey(1))
  jax.block_until_ready((params, ref_params))
  figures = {'device': dev.device_kind, 'backend': jax.default_backend(),
             'preset': args.preset, 'hf_checkpoint': folder, 'vocab_size': cfg.vocab_size,
             'attn_implementation': args.attn_implementation,
             'init_s': time.perf_counter() - t0}
  planned = {}
  if 'plan' not in args.skip:
    planned = planned_peaks(plan_settings(cfg, args), rollout='rollout' not in args.skip)
    figures['plan'] = planned
    print(f'memory plan (this device\'s compiler, abstract inputs, '
          f'{planned["compile_s"]:.0f} s): learner {planned["learner_gib"]:.2f} GiB, '
          f'decode {planned["decode_gib"]:.2f} GiB', flush=True)
  if 'learner' not in args.skip:
    r = learner_check(cfg, params, ref_params, args, peak)
    figures['learner'] = r
    print(f'learner step: B={r["rows"]} x T={r["length"]} ({r["command_tokens"]} command '
          f'tokens/row, exact KL): {r["seconds"]:.3f} s/step, {r["tokens_per_s"]:.0f} '
          f'tokens/s, compile {r["compile_s"]:.1f} s, temp {r["temp_gib"]:.2f} GiB, peak '
          f'memory {_gib(r["peak_memory_gib"])} (planned '
          f'{_gib(planned.get("learner_gib"))}), MFU {_pct(r["mfu"])}', flush=True)
  if 'decode' not in args.skip:
    r = decode_check(cfg, params, args, peak)
    figures['decode'] = r
    print(f'decode: batch {r["batch"]}, prompts <= {r["prompt_bucket"]}, '
          f'{r["new_tokens"]} new tokens: {r["seconds"]:.2f} s/call, '
          f'{r["tokens_per_s"]:.0f} new tokens/s ({r["prefill_and_new_tokens_per_s"]:.0f} '
          f'prefill + new tokens/s), first call {r["first_call_s"]:.1f} s, peak memory '
          f'so far {_gib(r["peak_memory_gib"])} (planned '
          f'{_gib(planned.get("decode_gib"))}), MFU {_pct(r["mfu"])}', flush=True)
  if 'rollout' not in args.skip:
    r = rollout_check(cfg, params, args, planned)
    figures['rollout'] = r
    print(f'rollout copy: {r["copy_s"]:.3f} s (planned {_sec(r.get("copy_planned_s"))})')
    for name in ('dev_chunk', 'solver'):
      print(f'{name}: {r[name + "_s"]:.2f} s/call (planned '
            f'{_sec(r[name + "_planned_s"])}), first call {r[name + "_first_call_s"]:.1f} '
            f's, peak memory so far {_gib(r[name + "_peak_memory_gib"])} (planned '
            f'{_gib(r[name + "_planned_gib"])})', flush=True)
  figures['total_s'] = time.perf_counter() - t0
  print(f'total {figures["total_s"]:.0f} s')
  bench_common.write_figures(args.out, figures)
  return 0


def _gib(x):
  return 'n/a' if x is None else f'{x:.2f} GiB'


def _sec(x):
  return 'n/a (unknown device)' if x is None else f'{x:.2f} s'


def _pct(x):
  return 'n/a' if x is None else f'{100 * x:.1f}%'


if __name__ == '__main__':
  sys.exit(main())
