r"""vermem_jax vs google/tunix on the same Qwen2-architecture model and batch (CPU).

Measured, one process per library (each in its own Python environment), reported
together:
  (a) GRPO learner step: policy and reference log-probabilities, loss and gradients
      for one batch of B rows = prompt (left part, lengths in [P/2, P]) + completion of
      C tokens, temperature 0.7, ε 0.2, β 0.1, per-sequence token-mean loss, θ_old =
      stop_gradient(θ) (one policy iteration). Both sides with the k3 estimator
      (Tunix `kl_loss_mode='low_var_kl'`), and ours also with the exact KL over the
      vocabulary (our default). Ours: `train.loss_step.grpo_loss_and_grads` (one jitted
      program: reference forward + policy forward/backward, head and loss in
      vocabulary chunks). Tunix: `rl.common.compute_per_token_logps` for the
      reference and `nnx.value_and_grad` of `rl.algo_core.grpo_loss_fn` for the
      policy, in one jitted program. Figures: tokens/s = B·(P + C) / step seconds,
      and compile-time temp memory (`memory_analysis().temp_size_in_bytes`).
  (b) Greedy decode with a KV cache at batch 64 and 8: prompts of [P_dec/2, P_dec]
      tokens left-padded to P_dec = 512, 128 new tokens (no stop token), prefill
      inside the timing. Ours: `models.sampling.generate`; Tunix:
      `generate.sampler.Sampler` (token ids passed through an id-string tokenizer;
      its encode/decode cost is inside its timing and is negligible).
  (c) Ratios ours / Tunix.
Both run the same architecture config (Qwen2: q/k/v bias, GQA, tied embeddings, vocab
151,936), bf16 compute with float32 parameters, random weights (speed only), the same
CPU set (`--threads`). Each child warms up (compilation excluded), then times
`--repeats` runs and reports the median wall and CPU seconds (process time of all its
threads: the work done, which other jobs on a shared machine inflate far less than
wall time; figures per CPU-second are the steadier comparison there); the parent
alternates the two libraries for `--rounds` rounds, one process per library and part,
and reports the median over rounds with the load average of every child run. A
decode batch whose Tunix prefill does not fit in memory is reported, not run.

Tunix lives in its own virtual environment (google-tunix 0.1.7 pins jax < 0.11.1 and
safetensors < 0.8, which clash with this project's environment):
    python3 -m venv /work/venvs/tunix
    /work/venvs/tunix/bin/pip install google-tunix==0.1.7
This script never imports Tunix into the project's process; it runs
`--tunix_python` (default /work/venvs/tunix/bin/python) on itself.

Usage:
  .venv/bin/python experiments/benchmarks/bench_vs_tunix.py --out=vs_tunix.json
  (smoke: --vocab_size=4096 --learner_batch=2 --prompt_len=64 --completion_len=16
   --decode_batches=4 --decode_prompt_len=32 --new_tokens=4 --repeats=1 --rounds=1)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import bench_common  # noqa: E402  (this folder is on sys.path; stdlib only)

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TUNIX_PYTHON = '/work/venvs/tunix/bin/python'
GIB = 1024 ** 3


def _parser():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--vocab_size', type=int, default=151936)
  ap.add_argument('--hidden_size', type=int, default=256)
  ap.add_argument('--intermediate_size', type=int, default=768)
  ap.add_argument('--num_layers', type=int, default=4)
  ap.add_argument('--num_heads', type=int, default=4)
  ap.add_argument('--num_kv_heads', type=int, default=2)
  ap.add_argument('--head_dim', type=int, default=64)
  ap.add_argument('--learner_batch', type=int, default=2,
                  help='B rows (Tunix needs ~7 GiB of temporaries at 4 x 1,024 and '
                       '~14 GiB at 8 x 1,024; the CPU machine is shared)')
  ap.add_argument('--memory_batches', default='8',
                  help='extra B values whose learner step is compiled (not run) for '
                       'its temp memory')
  ap.add_argument('--prompt_len', type=int, default=768, help='P (learner)')
  ap.add_argument('--completion_len', type=int, default=256, help='C (learner)')
  ap.add_argument('--decode_batches', default='64,8')
  ap.add_argument('--decode_prompt_len', type=int, default=512)
  ap.add_argument('--new_tokens', type=int, default=128)
  ap.add_argument('--threads', type=int, default=2)
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--rounds', type=int, default=2)
  ap.add_argument('--skip', default='', help='parts to skip: learner, decode')
  ap.add_argument('--tunix_python', default=DEFAULT_TUNIX_PYTHON)
  bench_common.add_out_flag(ap)
  ap.add_argument('--library', choices=('ours', 'tunix'), default=None,
                  help='(internal) run one library in this process')
  ap.add_argument('--child_out', default=None, help='(internal)')
  return ap


# ------------------------------------------------------------------ shared inputs


def _inputs(args, np):
  """The learner rows and decode prompts both libraries get (token ids >= 1)."""
  rs = np.random.RandomState(0)
  b, p, c, v = args.learner_batch, args.prompt_len, args.completion_len, args.vocab_size
  prompt_lens = rs.randint(max(1, p // 2), p + 1, b)
  prompts = [rs.randint(1, v, n).tolist() for n in prompt_lens]
  completions = [rs.randint(1, v, c).tolist() for _ in range(b)]
  advantages = rs.randn(b).astype(np.float32).tolist()
  decode = {}
  for nb in (int(x) for x in args.decode_batches.split(',') if x):
    lens = rs.randint(max(1, args.decode_prompt_len // 2), args.decode_prompt_len + 1, nb)
    decode[nb] = [rs.randint(1, v, n).tolist() for n in lens]
  return prompts, completions, advantages, decode


def _available_memory() -> int:
  """MemAvailable of /proc/meminfo in bytes (a large number where unreadable)."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 1 << 50


def _memory_batches(args):
  return [int(x) for x in args.memory_batches.split(',') if x]


def _learner_row(b, t, sec, cpu, temp, first):
  return {'seconds': sec, 'tokens_per_s': b * t / sec, 'cpu_seconds': cpu,
          'tokens_per_cpu_s': b * t / cpu, 'temp_bytes': temp, 'first_call_s': first,
          'load_average': os.getloadavg()[0]}


def _decode_row(nb, new_tokens, sec, cpu, first):
  return {'seconds': sec, 'tokens_per_s': nb * new_tokens / sec, 'cpu_seconds': cpu,
          'tokens_per_cpu_s': nb * new_tokens / cpu, 'first_call_s': first,
          'load_average': os.getloadavg()[0]}


def _pin(threads):
  cpus = sorted(os.sched_getaffinity(0))[:threads]
  os.sched_setaffinity(0, set(cpus))
  for var in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS'):
    os.environ[var] = str(threads)


# ------------------------------------------------------------------ ours


def run_ours(args) -> dict:
  sys.path.insert(0, _REPO)
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import qwen  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import sampling  # pylint: disable=g-import-not-at-top
  from vermem_jax.rl import loss_step  # pylint: disable=g-import-not-at-top

  cfg = qwen.QwenConfig(
      vocab_size=args.vocab_size, hidden_size=args.hidden_size,
      intermediate_size=args.intermediate_size, num_hidden_layers=args.num_layers,
      num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads,
      head_dim=args.head_dim, rope_theta=1_000_000.0, tie_word_embeddings=True,
      attention_bias=True, dtype='bfloat16', param_dtype='float32')
  params = qwen.init_params(cfg, jax.random.PRNGKey(0))
  ref_params = qwen.init_params(cfg, jax.random.PRNGKey(1))
  prompts, completions, advantages, decode = _inputs(args, np)
  out = {'library': 'vermem_jax', 'jax': jax.__version__,
         'attn_implementation': cfg.attn_implementation,
         'loss_chunk_size': loss_step.DEFAULT_LOSS_CHUNK_SIZE}

  if 'learner' not in args.skip:
    b, c = len(prompts), args.completion_len
    t = args.prompt_len + c
    ids = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), np.int32)
    pos = np.zeros((b, c), np.int32)
    for r, (pr, co) in enumerate(zip(prompts, completions)):
      row = pr + co
      ids[r, :len(row)] = row
      mask[r, :len(row)] = 1
      pos[r] = np.arange(len(pr) - 1, len(row) - 1)
    batch = {'input_ids': ids, 'attention_mask': mask, 'command_positions': pos,
             'target_ids': np.asarray(completions, np.int32),
             'command_ids': np.tile(np.arange(1, b + 1, dtype=np.int32)[:, None], (1, c)),
             'advantages': np.repeat(np.asarray(advantages, np.float32)[:, None], c, 1),
             'old_logprobs': np.zeros((b, c), np.float32)}
    batch = {k: jnp.asarray(x) for k, x in batch.items()}
    out['learner'] = {}
    for est in ('k3', 'exact'):
      step = jax.jit(lambda p, r, x, est=est: loss_step.grpo_loss_and_grads(
          p, r, x, model_config=cfg, clip_epsilon=0.2, kl_beta=0.1, kl_estimator=est,
          temperature=0.7, old_from_learner=True))
      for mb in _memory_batches(args):
        specs = {k: jax.ShapeDtypeStruct((mb,) + x.shape[1:], x.dtype)
                 for k, x in batch.items()}
        out['learner'][f'{est}@B={mb}'] = {'temp_bytes': int(
            step.lower(params, ref_params, specs).compile().memory_analysis()
            .temp_size_in_bytes)}
      compiled = step.lower(params, ref_params, batch).compile()
      temp = int(compiled.memory_analysis().temp_size_in_bytes)
      first, sec, cpu = bench_common.time_median(lambda: jax.block_until_ready(
          compiled(params, ref_params, batch)), args.repeats, cpu=True)
      out['learner'][est] = _learner_row(b, t, sec, cpu, temp, first)
      print(f'[ours] learner {est}: {b * t / sec:.1f} tok/s, temp {temp / GIB:.3f} GiB',
            flush=True)

  if 'decode' not in args.skip:
    out['decode'] = {}
    for nb, rows in decode.items():
      def gen(rows=rows):
        res = sampling.generate(cfg, params, rows, rng=0, max_new_tokens=args.new_tokens,
                                temperature=0.0, stop_token_ids=(), pad_token_id=0,
                                prompt_buckets=(args.decode_prompt_len,))
        jax.block_until_ready(res.tokens)
      first, sec, cpu = bench_common.time_median(gen, args.repeats, cpu=True)
      out['decode'][str(nb)] = _decode_row(nb, args.new_tokens, sec, cpu, first)
      print(f'[ours] decode batch {nb}: {nb * args.new_tokens / sec:.1f} tok/s', flush=True)
  return out


# ------------------------------------------------------------------ tunix


class IdTokenizer:
  """Token ids as space-separated text, so Tunix's string sampler gets our exact ids."""

  def __init__(self, eos: int):
    self._eos = eos

  def encode(self, text, **_):
    return [int(x) for x in text.split()]

  def decode(self, ids, **_):
    return ' '.join(str(int(i)) for i in ids)

  def bos_id(self):
    return 0  # falsy: the sampler prepends nothing

  def eos_id(self):
    return self._eos

  def pad_id(self):
    return 0


def run_tunix(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import tunix  # pylint: disable=g-import-not-at-top
  from tunix.generate import sampler as sampler_lib  # pylint: disable=g-import-not-at-top
  from tunix.models.qwen2 import model as qwen2  # pylint: disable=g-import-not-at-top
  from tunix.rl import algo_core  # pylint: disable=g-import-not-at-top
  from tunix.rl import common  # pylint: disable=g-import-not-at-top
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top

  mc = qwen2.ModelConfig(
      num_layers=args.num_layers, vocab_size=args.vocab_size,
      embed_dim=args.hidden_size, hidden_dim=args.intermediate_size,
      num_heads=args.num_heads, head_dim=args.head_dim, num_kv_heads=args.num_kv_heads,
      rope_theta=1_000_000, norm_eps=1e-6, use_tied_embedding=True,
      dtype=jnp.bfloat16, param_dtype=jnp.float32)
  policy = qwen2.Qwen2(mc, rngs=nnx.Rngs(0))
  reference = qwen2.Qwen2(mc, rngs=nnx.Rngs(1))
  prompts, completions, advantages, decode = _inputs(args, np)
  version = getattr(tunix, '__version__', None)
  if version is None:
    from importlib import metadata  # pylint: disable=g-import-not-at-top
    version = metadata.version('google-tunix')
  out = {'library': 'tunix', 'tunix': version, 'jax': jax.__version__,
         'use_flash_attention': mc.use_flash_attention}
  pad = 0

  if 'learner' not in args.skip:
    b, c, p = len(prompts), args.completion_len, args.prompt_len
    prompt_ids = np.zeros((b, p), np.int32)  # left-padded, as Tunix's rollouts are
    for r, pr in enumerate(prompts):
      prompt_ids[r, p - len(pr):] = pr
    completion_ids = np.asarray(completions, np.int32)
    example = grpo_learner.TrainExample(
        prompt_ids=jnp.asarray(prompt_ids), prompt_mask=jnp.asarray(prompt_ids != pad),
        completion_ids=jnp.asarray(completion_ids),
        completion_mask=jnp.ones((b, c), jnp.int32),
        advantages=jnp.asarray(advantages, jnp.float32),
        ref_per_token_logps=None, old_per_token_logps=None)
    graphdef, state = nnx.split(policy)
    ref_graphdef, ref_state = nnx.split(reference)
    out['learner'] = {}
    for mode in ('low_var_kl',):  # k3
      algo = grpo_learner.GRPOConfig(num_generations=2, beta=0.1, epsilon=0.2,
                                     kl_loss_mode=mode,
                                     loss_agg_mode='sequence-mean-token-mean')
      try:
        algo.temperature = 0.7
      except AttributeError:
        object.__setattr__(algo, 'temperature', 0.7)

      def step(state, ref_state, ex, algo=algo):
        ref_logps = common.compute_per_token_logps(
            ref_graphdef, ref_state, prompt_tokens=ex.prompt_ids,
            completion_tokens=ex.completion_ids, pad_id=pad, eos_id=-1,
            stop_gradient=True, temperature=0.7)
        ex = grpo_learner.TrainExample(
            prompt_ids=ex.prompt_ids, prompt_mask=ex.prompt_mask,
            completion_ids=ex.completion_ids, completion_mask=ex.completion_mask,
            advantages=ex.advantages, ref_per_token_logps=ref_logps,
            old_per_token_logps=None)

        def loss(st):
          return algo_core.grpo_loss_fn(nnx.merge(graphdef, st), ex, algo, pad, -1)
        (value, aux), grads = jax.value_and_grad(loss, has_aux=True)(state)
        return value, aux, grads

      for mb in _memory_batches(args):
        specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct((mb,) + x.shape[1:], x.dtype),
                             example)
        out['learner'][f'k3@B={mb}'] = {'temp_bytes': int(
            jax.jit(step).lower(state, ref_state, specs).compile().memory_analysis()
            .temp_size_in_bytes)}
      compiled = jax.jit(step).lower(state, ref_state, example).compile()
      temp = int(compiled.memory_analysis().temp_size_in_bytes)
      first, sec, cpu = bench_common.time_median(lambda: jax.block_until_ready(
          compiled(state, ref_state, example)), args.repeats, cpu=True)
      t = p + c
      out['learner']['k3'] = _learner_row(b, t, sec, cpu, temp, first)
      print(f'[tunix] learner k3: {b * t / sec:.1f} tok/s, temp {temp / GIB:.3f} GiB',
            flush=True)

  if 'decode' not in args.skip:
    out['decode'] = {}
    eos = args.vocab_size + 7  # never sampled: every row decodes all new tokens
    sampler = sampler_lib.Sampler(
        policy, IdTokenizer(eos),
        sampler_lib.CacheConfig(cache_size=args.decode_prompt_len + args.new_tokens,
                                num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
                                head_dim=mc.head_dim))
    sampler.eos_ids = jnp.array([eos])  # what __call__ sets before its prefill
    for nb, rows in decode.items():
      texts = [' '.join(map(str, r)) for r in rows]
      # Compile the prefill alone first: Tunix's Qwen2 returns logits for every prompt
      # position there ([B, P, V] float32), which may not fit this machine.
      ids = np.zeros((nb, args.decode_prompt_len), np.int32)
      for i, r in enumerate(rows):
        ids[i, args.decode_prompt_len - len(r):] = r
      state = sampler.init_sample_state(
          jnp.asarray(ids), total_sampling_steps=args.decode_prompt_len + args.new_tokens,
          include_logits=False, forbidden_token_ids=None, temperature=0.0, top_p=None,
          top_k=None, seed=jax.random.PRNGKey(0), beam_size=None)
      prefill_temp = int(sampler._compiled_prefill_fn.lower(  # pylint: disable=protected-access
          sampler._flattened_transformer_state, state, None,  # pylint: disable=protected-access
          echo=False).compile().memory_analysis().temp_size_in_bytes)
      available = _available_memory()
      if prefill_temp > 0.8 * available:
        out['decode'][str(nb)] = {'skipped': True, 'prefill_temp_bytes': prefill_temp,
                                  'available_bytes': available}
        print(f'[tunix] decode batch {nb}: not run, its prefill needs '
              f'{prefill_temp / GIB:.1f} GiB of temporaries and {available / GIB:.1f} '
              'GiB are available', flush=True)
        continue

      def gen(texts=texts):
        res = sampler(texts, max_generation_steps=args.new_tokens,
                      max_prompt_length=args.decode_prompt_len, temperature=0.0,
                      eos_tokens=[eos])
        assert all(len(t) == args.new_tokens for t in res.tokens)
      first, sec, cpu = bench_common.time_median(gen, args.repeats, cpu=True)
      out['decode'][str(nb)] = dict(_decode_row(nb, args.new_tokens, sec, cpu, first),
                                    prefill_temp_bytes=prefill_temp)
      print(f'[tunix] decode batch {nb}: {nb * args.new_tokens / sec:.1f} tok/s',
            flush=True)
  return out


# ------------------------------------------------------------------ parent


def _child(args, library, argv):
  python = sys.executable if library == 'ours' else args.tunix_python
  with tempfile.NamedTemporaryFile(suffix='.json', delete=False) as f:
    path = f.name
  cmd = [python, os.path.abspath(__file__), f'--library={library}',
         f'--child_out={path}'] + argv
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  if library == 'ours':
    env['PYTHONPATH'] = _REPO + os.pathsep + env.get('PYTHONPATH', '')
  else:
    env.pop('PYTHONPATH', None)  # nothing of this project in Tunix's process
  load = os.getloadavg()[0]
  proc = subprocess.run(cmd, env=env, text=True, capture_output=True)
  sys.stdout.write(proc.stdout)
  if proc.returncode != 0:  # e.g. killed for memory: recorded, the others go on
    sys.stderr.write(proc.stderr[-3000:])
    print(f'[{library}] run failed (exit {proc.returncode})', flush=True)
    os.unlink(path)
    return {'failed': proc.returncode, 'load_average_at_start': load}
  with open(path) as f:
    res = json.load(f)
  os.unlink(path)
  res['load_average_at_start'] = load
  return res


def _median(runs, *keys):
  vals = []
  for r in runs:
    x = r
    for k in keys:
      x = x.get(k) if isinstance(x, dict) else None
    if x is not None:
      vals.append(x)
  return statistics.median(vals) if vals else None


def _ratio(a, b):
  return None if a is None or not b else a / b


def _fmt(x):
  return '    n/a' if x is None else f'{x:7.2f}' if x < 100 else f'{x:7.1f}'


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  args = _parser().parse_args(argv)
  if args.library:
    _pin(args.threads)
    res = run_ours(args) if args.library == 'ours' else run_tunix(args)
    with open(args.child_out, 'w') as f:
      json.dump(res, f)
    return 0

  if not os.path.exists(args.tunix_python):
    print(f'no Tunix environment at {args.tunix_python}; create it with\n'
          '  python3 -m venv /work/venvs/tunix\n'
          '  /work/venvs/tunix/bin/pip install google-tunix==0.1.7\n'
          'or pass --tunix_python=/path/to/python', file=sys.stderr)
    return 2
  # Children get the parsed model/shape flags as --name=value (filtering argv would
  # leave the value of a space-separated flag such as `--rounds 1` behind).
  parent_only = ('out', 'rounds', 'tunix_python', 'skip', 'library', 'child_out')
  passthrough = [f'--{k}={v}' for k, v in vars(args).items() if k not in parent_only]
  parts = [p for p in ('learner', 'decode') if p not in args.skip]
  runs = {'ours': [], 'tunix': []}
  for rnd in range(args.rounds):
    for lib in (('ours', 'tunix') if rnd % 2 == 0 else ('tunix', 'ours')):
      # One process per library and part, so a part's memory is gone before the next.
      merged = {}
      for part in parts:
        print(f'--- round {rnd + 1}: {lib} {part} (load average '
              f'{os.getloadavg()[0]:.1f})', flush=True)
        skip = ','.join(p for p in ('learner', 'decode') if p != part)
        res = _child(args, lib, passthrough + [f'--skip={skip}'])
        loads = merged.get('load_averages', []) + [res.pop('load_average_at_start')]
        if 'failed' in res:
          res = {f'{part}_failed': res['failed']}
        merged.update(res, load_averages=loads)
      runs[lib].append(merged)

  b, t = args.learner_batch, args.prompt_len + args.completion_len
  print(f'\nvermem_jax vs Tunix {runs["tunix"][0].get("tunix")} (jax '
        f'{runs["tunix"][0].get("jax")} / {runs["ours"][0].get("jax")}), Qwen2 architecture '
        f'V={args.vocab_size} D={args.hidden_size} I={args.intermediate_size} '
        f'layers={args.num_layers} heads={args.num_heads}/{args.num_kv_heads} '
        f'head_dim={args.head_dim}, bf16 compute, {args.threads} CPU threads; median '
        f'of {args.rounds} alternating rounds x {args.repeats} repeats; load averages '
        f'{[round(x, 1) for v in runs.values() for r in v for x in r["load_averages"]]}')
  report = {'args': vars(args), 'runs': runs, 'summary': {}}
  if 'learner' not in args.skip:
    print(f'\n(a) GRPO learner step, B={b} rows x T={t} tokens (prompt <= '
          f'{args.prompt_len}, completion {args.completion_len})')
    rows = [('ours k3', 'ours', 'k3'), ('ours exact KL', 'ours', 'exact'),
            ('tunix k3', 'tunix', 'k3')]
    summary = {}
    for name, lib, est in rows:
      tps = _median(runs[lib], 'learner', est, 'tokens_per_s')
      cps = _median(runs[lib], 'learner', est, 'tokens_per_cpu_s')
      temp = _median(runs[lib], 'learner', est, 'temp_bytes')
      summary[name] = {'tokens_per_s': tps, 'tokens_per_cpu_s': cps,
                       'temp_gib': temp and temp / GIB}
      print(f'  {name:14s} {_fmt(tps)} tokens/s  {_fmt(cps)} tokens/CPU-s   temp '
            f'{_fmt(temp and temp / GIB)} GiB')
    for name in ('ours k3', 'ours exact KL'):
      ratio = _ratio(summary[name]['tokens_per_s'], summary['tunix k3']['tokens_per_s'])
      cpu_ratio = _ratio(summary[name]['tokens_per_cpu_s'],
                         summary['tunix k3']['tokens_per_cpu_s'])
      mem = _ratio(summary[name]['temp_gib'], summary['tunix k3']['temp_gib'])
      summary[f'ratio {name} / tunix k3'] = {'speed': ratio, 'speed_per_cpu_s': cpu_ratio,
                                             'temp_memory': mem}
      print(f'  (c) {name} / tunix k3: {_fmt(ratio)}x tokens/s, {_fmt(cpu_ratio)}x '
            f'tokens/CPU-s, {_fmt(mem)}x temp memory')
    for mb in _memory_batches(args):
      mem = {name: _median(runs[lib], 'learner', f'{est}@B={mb}', 'temp_bytes')
             for name, lib, est in rows}
      summary[f'temp GiB at B={mb} (compiled only)'] = {
          k: v and v / GIB for k, v in mem.items()}
      print(f'  compiled only, B={mb} x T={t}: temp ' + ', '.join(
          f'{k} {_fmt(v and v / GIB)} GiB' for k, v in mem.items()))
    report['summary']['learner'] = summary
  if 'decode' not in args.skip:
    print(f'\n(b) greedy decode, KV cache, prompts <= {args.decode_prompt_len} tokens, '
          f'{args.new_tokens} new tokens per row')
    summary = {}
    for nb in args.decode_batches.split(','):
      ours = _median(runs['ours'], 'decode', nb, 'tokens_per_s')
      theirs = _median(runs['tunix'], 'decode', nb, 'tokens_per_s')
      ours_cpu = _median(runs['ours'], 'decode', nb, 'tokens_per_cpu_s')
      theirs_cpu = _median(runs['tunix'], 'decode', nb, 'tokens_per_cpu_s')
      summary[nb] = {'ours_tokens_per_s': ours, 'tunix_tokens_per_s': theirs,
                     'ratio': _ratio(ours, theirs),
                     'ours_tokens_per_cpu_s': ours_cpu,
                     'tunix_tokens_per_cpu_s': theirs_cpu,
                     'ratio_per_cpu_s': _ratio(ours_cpu, theirs_cpu)}
      note = ''
      need = _median(runs['tunix'], 'decode', nb, 'prefill_temp_bytes')
      if theirs is None and need:
        note = (f'  (Tunix not run: its prefill needs {need / GIB:.1f} GiB of '
                'temporaries, [B, P, V] float32 logits of every prompt position)')
        summary[nb]['tunix_prefill_temp_gib'] = need / GIB
      print(f'  batch {nb:>3}: ours {_fmt(ours)} tok/s   tunix {_fmt(theirs)} tok/s   '
            f'(c) ratio {_fmt(_ratio(ours, theirs))}x; per CPU-second '
            f'{_fmt(_ratio(ours_cpu, theirs_cpu))}x{note}')
    report['summary']['decode'] = summary
  print('\nGoals: learner >= 1.3x Tunix tokens/s with the same estimator (k3); decode '
        '>= 1.0x at both batch sizes.')
  bench_common.write_figures(args.out, report)
  return 0


if __name__ == '__main__':
  sys.exit(main())
