"""Peak temporary memory of the GRPO loss step vs prompt length (compile-time figures).

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
  model  the full jitted step `grpo.grpo_loss_and_grads` on a Qwen-architecture model
         (tiny trunk, Qwen vocabulary, policy + reference forward, exact KL) vs the
         same step computing full [B, T, V] logits with `Qwen.apply`. The trunk's
         attention grows with T² regardless of V, so the vocabulary's share,
         temp(V=151936) - temp(V=small), is reported per prompt length.

Rows print temp bytes and growth over the shortest prompt divided by ΔT·V·4 bytes
(one float32 [ΔT, V] array): ~0 means no prompt × vocabulary term, >= 1 means at
least one full-vocabulary array per prompt token.

Usage:
  .venv/bin/python experiments/benchmarks/bench_loss_memory.py [--model] \\
      [--lengths 1024,2048,4096,8192] [--command_tokens 256] [--batch 1]
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.rl import grpo  # noqa: E402

GIB = 1024 ** 3


def _loss_batch_specs(b, l):
  i32, f32 = jnp.int32, jnp.float32
  return {'target_ids': jax.ShapeDtypeStruct((b, l), i32),
          'command_ids': jax.ShapeDtypeStruct((b, l), i32),
          'advantages': jax.ShapeDtypeStruct((b, l), f32),
          'old_logprobs': jax.ShapeDtypeStruct((b, l), f32),
          'command_positions': jax.ShapeDtypeStruct((b, l), i32)}


def _temp_bytes(fn, *specs) -> int:
  compiled = jax.jit(fn).lower(*specs).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def head_variants(v, d):
  """(gathered, naive) head+loss gradient functions of (hidden, ref_hidden, w, batch)."""
  def gathered(hidden, ref_hidden, w, batch):
    def f(hidden, w):
      h = grpo.gather_positions(hidden, batch['command_positions'])
      rh = grpo.gather_positions(ref_hidden, batch['command_positions'])
      return grpo.grpo_loss_from_logits(h @ w, rh @ w, batch, temperature=0.7)[0]
    return jax.grad(f, argnums=(0, 1))(hidden, w)

  def naive(hidden, ref_hidden, w, batch):
    def f(hidden, w):
      logits = grpo.gather_positions(hidden @ w, batch['command_positions'])
      ref = grpo.gather_positions(ref_hidden @ w, batch['command_positions'])
      return grpo.grpo_loss_from_logits(logits, ref, batch, temperature=0.7)[0]
    return jax.grad(f, argnums=(0, 1))(hidden, w)
  del v, d
  return gathered, naive


def model_variants(cfg):
  def gathered(params, ref_params, batch):
    return grpo.grpo_loss_and_grads(params, ref_params, batch, model_config=cfg,
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
      return grpo.grpo_loss_from_logits(lg, rf, batch, temperature=0.7)[0]
    return jax.value_and_grad(f)(params)
  return gathered, naive


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
  args = ap.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(',')]
  b, l = args.batch, args.command_tokens
  cfg = qwen.QwenConfig.preset('tiny', hidden_size=args.hidden)
  v, d = cfg.vocab_size, cfg.hidden_size
  print(f'backend={jax.default_backend()} vocab={v} hidden={d} batch={b} '
        f'command_tokens(L)={l} prompt lengths={lengths}')

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

  if args.model:
    # The trunk's own memory grows with T (attention scores [B, N, T, T], activations
    # [B, T, D]) whatever the vocabulary, so the vocabulary's share is isolated as
    # temp(V) - temp(V_small) at each T: constant in T means no T x V term.
    small = cfg.replace(vocab_size=args.small_vocab)
    print(f'\n== full step: Qwen trunk ({cfg.num_hidden_layers} layers) + lm_head + '
          f'loss + grads; vocabulary share = temp(V={v}) - temp(V={small.vocab_size}) ==')
    print(f'{"variant":>9} {"T":>6} {"temp GiB":>9} {"V share GiB":>12} '
          f'{"Δshare/(ΔT·ΔV·4B)":>18}')
    for name in ('gathered', 'naive'):
      shares = []
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
        denom = (t - lengths[0]) * (v - small.vocab_size) * 4
        ratio = (shares[-1] - shares[0]) / denom if denom else float('nan')
        print(f'{name:>9} {t:>6} {temps[0] / GIB:>9.3f} {shares[-1] / GIB:>12.3f} '
              f'{ratio:>18.3f}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
