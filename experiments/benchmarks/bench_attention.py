r"""Memory (and speed) of the model per attention kernel vs input length.

For a 1-layer Qwen with 16 heads at batch 1 (the issue-12 measurement; flags change
it), compiles the forward (final hidden states, no vocabulary head) and the forward +
backward of a scalar of them at each of `--lengths`, for each kernel of
`--implementations` (models/attention.py), and prints the compile-time temp memory
(`memory_analysis().temp_size_in_bytes`; nothing runs) and its growth from one length
to the next: ~2x per doubling is linear in T, ~4x is quadratic. With --time the
forward + backward also runs at each length, the kernels interleaved `--repeats`
times (median tokens/s, with the load average).

Usage:
  .venv/bin/python experiments/benchmarks/bench_attention.py --out=attention.json
  (the issue's check: the blockwise forward at 8,192 tokens <= ~2.6x its 4,096 temps)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bench_common  # noqa: E402  (this folder is on sys.path)
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.models import qwen_config

GIB = 1024 ** 3


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--lengths', default='4096,8192')
  ap.add_argument('--implementations', default='eager,sdpa,blockwise')
  ap.add_argument('--batch', type=int, default=1)
  ap.add_argument('--layers', type=int, default=1)
  ap.add_argument('--heads', type=int, default=16)
  ap.add_argument('--kv_heads', type=int, default=16)
  ap.add_argument('--head_dim', type=int, default=64)
  ap.add_argument('--hidden', type=int, default=1024)
  ap.add_argument('--dtype', default='float32')
  ap.add_argument('--time', action='store_true', help='also run forward + backward')
  ap.add_argument('--repeats', type=int, default=2)
  bench_common.add_out_flag(ap)
  args = ap.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(',')]
  base = qwen_config.QwenConfig(vocab_size=1024, hidden_size=args.hidden,
                         intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                         dtype=args.dtype, max_position_embeddings=max(lengths))
  params = jax.eval_shape(lambda: qwen.init_params(base, jax.random.PRNGKey(0)))
  print(f'{args.layers}-layer Qwen, {args.heads}/{args.kv_heads} heads x {args.head_dim}, '
        f'D={args.hidden}, batch {args.batch}, {args.dtype}; blocks '
        f'{base.attn_block_q}x{base.attn_block_kv}; backend {jax.default_backend()}; '
        f'load average {os.getloadavg()[0]:.1f}')
  print(f'{"kernel":>10} {"T":>6} {"fwd temp GiB":>13} {"x prev":>7} '
        f'{"fwd+bwd GiB":>12} {"x prev":>7}')
  figures = {'lengths': lengths, 'kernels': {}}
  compiled = {}
  for impl in args.implementations.split(','):
    cfg = base.replace(attn_implementation=impl)
    model = qwen.Qwen(cfg)
    rows, prev = [], None

    def fwd(p, ids, model=model):
      return model.apply({'params': p}, ids, return_hidden=True)

    def grad(p, ids, fwd=fwd):
      return jax.grad(lambda p: jnp.sum(fwd(p, ids).astype(jnp.float32)))(p)

    for t in lengths:
      ids = jax.ShapeDtypeStruct((args.batch, t), jnp.int32)
      temps = []
      for fn in (fwd, grad):
        c = jax.jit(fn).lower(params, ids).compile()
        temps.append(int(c.memory_analysis().temp_size_in_bytes))
      compiled[(impl, t)] = c
      growth = [None, None] if prev is None else [a / b for a, b in zip(temps, prev)]
      rows.append({'length': t, 'forward_temp_bytes': temps[0],
                   'forward_backward_temp_bytes': temps[1],
                   'forward_growth': growth[0], 'forward_backward_growth': growth[1]})
      show = lambda g: '' if g is None else f'{g:.2f}x'
      print(f'{impl:>10} {t:>6} {temps[0] / GIB:>13.3f} {show(growth[0]):>7} '
            f'{temps[1] / GIB:>12.3f} {show(growth[1]):>7}', flush=True)
      prev = temps
    figures['kernels'][impl] = rows
  if args.time:
    real = qwen.init_params(base, jax.random.PRNGKey(0))
    times = {k: [] for k in compiled}
    for (_, t), c in compiled.items():  # warm-up
      jax.block_until_ready(c(real, jnp.zeros((args.batch, t), jnp.int32)))
    for _ in range(args.repeats):
      for (impl, t), c in compiled.items():
        ids = jnp.zeros((args.batch, t), jnp.int32)
        t0 = time.perf_counter()
        jax.block_until_ready(c(real, ids))
        times[(impl, t)].append(time.perf_counter() - t0)
    print(f'forward + backward, median of {args.repeats} (load average '
          f'{os.getloadavg()[0]:.1f}):')
    figures['forward_backward_tokens_per_s'] = {}
    for (impl, t), ts in times.items():
      tps = args.batch * t / statistics.median(ts)
      figures['forward_backward_tokens_per_s'][f'{impl}@{t}'] = tps
      print(f'  {impl:>10} T={t}: {tps:9.1f} tokens/s')
  bench_common.write_figures(args.out, figures)
  return 0


if __name__ == '__main__':
  sys.exit(main())
