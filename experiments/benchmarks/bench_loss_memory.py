"""Peak temporary memory of the GRPO loss step (compile-time figures), and its speed.

Claim checked (issue 5): with a 151,936-token vocabulary and prompts up to 8,192 tokens,
the loss step's memory does not grow with prompt length × vocabulary, because only the
L command positions are projected to the vocabulary (`vermem_jax.rl.grpo`).

Method: each function is lowered and compiled with abstract inputs
(`jax.jit(f).lower(ShapeDtypeStruct...).compile()`, JAX's AOT API) and
`compiled.memory_analysis().temp_size_in_bytes` is read; nothing is executed, so the
naive variants that would need many GiB are only compiled. Two comparisons:

  head   hidden states [B, T, D] -> loss and its gradient w.r.t. the hidden states and
         the lm_head weight. `gathered` = ours (gather L positions, lm_head there);
         `naive` = lm_head over all T positions, then gather the logits.
  model  the full jitted step `loss_step.grpo_loss_and_grads` on a Qwen-architecture model
         (tiny trunk, Qwen vocabulary, policy + reference forward, exact KL) vs the
         same step computing full [B, T, V] logits with `Qwen.apply`. The trunk's
         attention grows with T² regardless of V, so the vocabulary's share,
         temp(V=151936) - temp(V=small), is reported per prompt length.

  step   (issue 12) the learner's jitted step as trained (`loss_step.grpo_loss_and_grads`:
         policy + reference forward, θ_old log-probs, loss, gradients) on the tiny
         trunk with the Qwen vocabulary at --step_batch rows x --step_length tokens x
         --command_tokens command tokens, exact KL and k3, with the head and loss
         unchunked (loss_chunk_size None) and in chunks of --chunk_sizes command
         positions (rl/token_stats.py), attention 'auto'; --before adds the code
         before issue 12 (eager attention, unchunked loss) as the baseline. With
         --time, the variants also run, interleaved --repeats times, and learner
         tokens/s (B·T / step seconds, median) are printed with the load average.

Rows print temp bytes and growth over the shortest prompt divided by ΔT·V·4 bytes
(one float32 [ΔT, V] array): ~0 means no prompt × vocabulary term, >= 1 means at
least one full-vocabulary array per prompt token.

Usage:
  .venv/bin/python experiments/benchmarks/bench_loss_memory.py [--model] \\
      [--lengths 1024,2048,4096,8192] [--command_tokens 256] [--batch 1] \\
      [--step] [--time] [--out=FILE.json]
The issue-12 figure (8 rows, 1,024 tokens, 256 command tokens, exact KL):
  .venv/bin/python experiments/benchmarks/bench_loss_memory.py --step --time \\
      --before --skip_head --lengths=1024 --out=loss_memory.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bench_common  # noqa: E402  (this folder is on sys.path)
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.models import qwen_config
from vermem_jax.rl import grpo  # noqa: E402
from vermem_jax.rl import loss_step  # noqa: E402
from vermem_jax.rl import token_stats  # noqa: E402


GIB = 1024 ** 3


def _loss_batch_specs(b, l):
  i32, f32 = jnp.int32, jnp.float32
  return {'target_ids': jax.ShapeDtypeStruct((b, l), i32),
          'command_ids': jax.ShapeDtypeStruct((b, l), i32),
          'advantages': jax.ShapeDtypeStruct((b, l), f32),
          'old_logprobs': jax.ShapeDtypeStruct((b, l), f32),
          'command_positions': jax.ShapeDtypeStruct((b, l), i32)}


def _full_logits_loss(logits, ref_logits, batch, *, temperature):
  """The GRPO loss on whole [B, L, V] logits (the un-chunked baseline): (loss_sum, ...)."""
  stats = token_stats.stats_from_logits(logits, ref_logits, batch['target_ids'],
                                        temperature=temperature, kl_estimator='exact')
  return grpo.grpo_loss_from_token_stats(stats, batch)


def _temp_bytes(fn, *specs) -> int:
  compiled = jax.jit(fn).lower(*specs).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def head_variants(v, d):
  """(gathered, naive) head+loss gradient functions of (hidden, ref_hidden, w, batch)."""
  def gathered(hidden, ref_hidden, w, batch):
    def f(hidden, w):
      h = grpo.gather_positions(hidden, batch['command_positions'])
      rh = grpo.gather_positions(ref_hidden, batch['command_positions'])
      return _full_logits_loss(h @ w, rh @ w, batch, temperature=0.7)[0]
    return jax.grad(f, argnums=(0, 1))(hidden, w)

  def naive(hidden, ref_hidden, w, batch):
    def f(hidden, w):
      logits = grpo.gather_positions(hidden @ w, batch['command_positions'])
      ref = grpo.gather_positions(ref_hidden @ w, batch['command_positions'])
      return _full_logits_loss(logits, ref, batch, temperature=0.7)[0]
    return jax.grad(f, argnums=(0, 1))(hidden, w)
  del v, d
  return gathered, naive


def model_variants(cfg):
  def gathered(params, ref_params, batch):
    return loss_step.grpo_loss_and_grads(params, ref_params, batch, model_config=cfg,
                                    temperature=0.7)

  def naive(params, ref_params, batch):
    model = qwen.Qwen(cfg)
    ref_full = model.apply({'params': ref_params}, batch['input_ids'],
                           attention_mask=batch['attention_mask'])
    def f(p):
      full = model.apply({'params': p}, batch['input_ids'],
                         attention_mask=batch['attention_mask'])
      lg = grpo.gather_positions(full, batch['command_positions'])
      rf = grpo.gather_positions(ref_full, batch['command_positions'])
      return _full_logits_loss(lg, rf, batch, temperature=0.7)[0]
    return jax.value_and_grad(f)(params)
  return gathered, naive


def _step_batch(b, t, l, v, seed=0):
  """A random learner step batch: right-padded rows, commands at the end of each."""
  rs = np.random.RandomState(seed)
  lengths = rs.randint(t // 2, t + 1, b)
  ids = rs.randint(0, v, (b, t)).astype(np.int32)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  cmd = np.minimum(l, lengths - 1)
  pos = np.zeros((b, l), np.int32)
  cid = np.zeros((b, l), np.int32)
  for r in range(b):
    pos[r, :cmd[r]] = np.arange(lengths[r] - cmd[r] - 1, lengths[r] - 1)
    cid[r, :cmd[r]] = 1 + r
  return {'input_ids': ids, 'attention_mask': mask, 'command_positions': pos,
          'target_ids': rs.randint(0, v, (b, l)).astype(np.int32), 'command_ids': cid,
          'advantages': rs.randn(b, l).astype(np.float32),
          'old_logprobs': (rs.randn(b, l) - 11.0).astype(np.float32)}


def step_figures(cfg, args, chunks):
  """Compile-time temp (and, with --time, tokens/s) of loss_step.grpo_loss_and_grads."""
  b, t, l = args.step_batch, args.step_length, args.command_tokens
  batch = _step_batch(b, t, l, cfg.vocab_size)
  specs = {k: jax.ShapeDtypeStruct(x.shape, x.dtype) for k, x in batch.items()}
  params = jax.eval_shape(lambda: qwen.init_params(cfg, jax.random.PRNGKey(0)))
  out = {'batch': b, 'length': t, 'command_tokens': l, 'rows': {}}
  print(f'\n== learner step loss_step.grpo_loss_and_grads: tiny trunk, V={cfg.vocab_size}, '
        f'B={b}, T={t}, L={l} ==')
  print(f'{"estimator":>9} {"chunk":>6} {"attention":>10} {"temp GiB":>9}')
  steps = {}
  variants = [(chunk, 'auto') for chunk in chunks]
  if args.before:  # the code before issue 12: eager attention, unchunked loss
    variants.insert(0, (None, 'eager'))
  for est in args.estimators.split(','):
    for chunk, attn in variants:
      c = cfg.replace(attn_implementation=attn)
      fn = jax.jit(lambda p, r, x, est=est, chunk=chunk, c=c: loss_step.grpo_loss_and_grads(
          p, r, x, model_config=c, clip_epsilon=0.2, kl_beta=0.1, kl_estimator=est,
          temperature=0.7, old_from_learner=True, loss_chunk_size=chunk))
      compiled = fn.lower(params, params, specs).compile()
      temp = int(compiled.memory_analysis().temp_size_in_bytes)
      name = f'{est}/{chunk if chunk else "unchunked"}' + ('/eager' if attn == 'eager'
                                                          else '')
      out['rows'][name] = {'estimator': est, 'chunk': chunk, 'attention': attn,
                           'temp_bytes': temp, 'temp_gib': temp / GIB}
      print(f'{est:>9} {str(chunk):>6} {attn:>10} {temp / GIB:>9.3f}')
      steps[name] = compiled
  if args.time:
    real = qwen.init_params(cfg, jax.random.PRNGKey(0))
    ref = qwen.init_params(cfg, jax.random.PRNGKey(1))
    xs = {k: jnp.asarray(x) for k, x in batch.items()}
    for compiled in steps.values():  # warm-up
      jax.block_until_ready(compiled(real, ref, xs))
    times = {name: [] for name in steps}
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeats):
      for name, compiled in steps.items():
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(real, ref, xs))
        times[name].append(time.perf_counter() - t0)
      loads.append(os.getloadavg()[0])
    print(f'timed round-robin x{args.repeats} (median); load average '
          f'{min(loads):.1f}-{max(loads):.1f}')
    for name, ts in times.items():
      sec = statistics.median(ts)
      out['rows'][name].update(seconds=sec, tokens_per_s=b * t / sec)
      print(f'  {name:>16}: {sec:7.3f} s/step  {b * t / sec:9.1f} tokens/s')
    for est in args.estimators.split(','):
      base_name = f'{est}/unchunked/eager' if args.before else f'{est}/unchunked'
      base = out['rows'].get(base_name)
      for name, row in out['rows'].items():
        if base and row['estimator'] == est and name != base_name:
          row['speed_vs_baseline'] = row['tokens_per_s'] / base['tokens_per_s']
          print(f'  ratio {name} / {base_name}: {row["speed_vs_baseline"]:.2f}x')
    out['load_average'] = [min(loads), max(loads)]
  return out


def _report(title, rows, lengths, v):
  print(f'\n== {title} ==')
  print(f'{"variant":>9} {"T":>6} {"temp GiB":>9} {"Δ vs T0 GiB":>12} '
        f'{"Δ/(ΔT·V·4B)":>12}')
  for name, temps in rows.items():
    for t, tb in zip(lengths, temps):
      growth = tb - temps[0]
      denom = (t - lengths[0]) * v * 4
      ratio = growth / denom if denom else float('nan')
      print(f'{name:>9} {t:>6} {tb / GIB:>9.3f} {growth / GIB:>12.3f} {ratio:>12.3f}')


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--lengths', default='1024,2048,4096,8192')
  ap.add_argument('--command_tokens', type=int, default=256)
  ap.add_argument('--batch', type=int, default=1)
  ap.add_argument('--hidden', type=int, default=64)
  ap.add_argument('--small_vocab', type=int, default=1024,
                  help='vocabulary of the comparison model in --model')
  ap.add_argument('--model', action='store_true',
                  help='also compile the full model step (slower)')
  ap.add_argument('--step', action='store_true',
                  help='the learner step, chunked vs unchunked (issue 12)')
  ap.add_argument('--step_batch', type=int, default=8)
  ap.add_argument('--step_length', type=int, default=1024)
  ap.add_argument('--chunk_sizes', default=str(loss_step.DEFAULT_LOSS_CHUNK_SIZE),
                  help='comma-separated loss_chunk_size values compared to None')
  ap.add_argument('--estimators', default='exact,k3')
  ap.add_argument('--time', action='store_true', help='with --step: run and time it')
  ap.add_argument('--before', action='store_true',
                  help='with --step: add the pre-issue-12 step (eager attention, '
                       'unchunked loss) as the baseline of the ratios')
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--skip_head', action='store_true', help='skip the head comparison')
  bench_common.add_out_flag(ap)
  args = ap.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(',')]
  b, l = args.batch, args.command_tokens
  cfg = qwen_config.QwenConfig.preset('tiny', hidden_size=args.hidden)
  v, d = cfg.vocab_size, cfg.hidden_size
  print(f'backend={jax.default_backend()} vocab={v} hidden={d} batch={b} '
        f'command_tokens(L)={l} prompt lengths={lengths}')

  results = {'vocab': v, 'hidden': d, 'batch': b, 'command_tokens': l,
             'lengths': lengths, 'load_average': os.getloadavg()[0]}
  if not args.skip_head:
    gathered, naive = head_variants(v, d)
    rows = {'gathered': [], 'naive': []}
    for t in lengths:
      specs = (jax.ShapeDtypeStruct((b, t, d), jnp.float32),
               jax.ShapeDtypeStruct((b, t, d), jnp.float32),
               jax.ShapeDtypeStruct((d, v), jnp.float32), _loss_batch_specs(b, l))
      rows['gathered'].append(_temp_bytes(gathered, *specs))
      rows['naive'].append(_temp_bytes(naive, *specs))
    _report('head + loss + grads from hidden states', rows, lengths, v)
    one = b * l * v * 4
    print(f'(one float32 [B, L, V] array = {one / GIB:.3f} GiB; gathered temp at the '
          f'longest prompt = {rows["gathered"][-1] / one:.1f} such arrays)')
    results['head'] = {k: [int(x) for x in r] for k, r in rows.items()}

  if args.model:
    # The trunk's own memory grows with T (attention scores [B, N, T, T], activations
    # [B, T, D]) whatever the vocabulary, so the vocabulary's share is isolated as
    # temp(V) - temp(V_small) at each T: constant in T means no T x V term.
    small = cfg.replace(vocab_size=args.small_vocab)
    print(f'\n== full step: Qwen trunk ({cfg.num_hidden_layers} layers) + lm_head + '
          f'loss + grads; vocabulary share = temp(V={v}) - temp(V={small.vocab_size}) ==')
    print(f'{"variant":>9} {"T":>6} {"temp GiB":>9} {"V share GiB":>12} '
          f'{"Δshare/(ΔT·ΔV·4B)":>18}')
    results['model'] = {}
    for name in ('gathered', 'naive'):
      shares = []
      results['model'][name] = []
      for t in lengths:
        batch = dict(_loss_batch_specs(b, l),
                     input_ids=jax.ShapeDtypeStruct((b, t), jnp.int32),
                     attention_mask=jax.ShapeDtypeStruct((b, t), jnp.int32))
        temps = []
        for c in (cfg, small):
          params = jax.eval_shape(
              lambda c=c: qwen.init_params(c, jax.random.PRNGKey(0)))
          fn = dict(zip(('gathered', 'naive'), model_variants(c)))[name]
          temps.append(_temp_bytes(fn, params, params, batch))
        shares.append(temps[0] - temps[1])
        results['model'][name].append({'length': t, 'temp_bytes': int(temps[0]),
                                       'vocab_share_bytes': int(shares[-1])})
        denom = (t - lengths[0]) * (v - small.vocab_size) * 4
        ratio = (shares[-1] - shares[0]) / denom if denom else float('nan')
        print(f'{name:>9} {t:>6} {temps[0] / GIB:>9.3f} {shares[-1] / GIB:>12.3f} '
              f'{ratio:>18.3f}')
  if args.step:
    chunks = [None] + [int(c) for c in args.chunk_sizes.split(',') if c]
    results['step'] = step_figures(cfg, args, chunks)
  bench_common.write_figures(args.out, results)
  return 0


if __name__ == '__main__':
  sys.exit(main())
