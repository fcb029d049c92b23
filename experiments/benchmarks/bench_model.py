r"""Speed of vermem_jax's Qwen vs transformers PyTorch eager on this CPU.

For one model config it measures
  * train step: forward + backward of the next-token cross-entropy on all positions
    (final hidden -> lm_head -> log-softmax), tokens/s = batch * seq_len / seconds.
    vermem_jax keeps float32 parameters and computes in each of `--dtypes` (the
    headline is bfloat16 compute with float32 accumulation); PyTorch runs float32 and,
    unless --notorch_bf16, bfloat16 (whole model cast).
  * decode: greedy generation with the KV cache at batch `--decode_batch` (64), prompts
    left-padded to lengths in [prompt_len/2, prompt_len], exactly `--new_tokens` new
    tokens per row (no stop ids); tokens/s = batch * new_tokens / seconds, the prompt
    prefill inside the timed call for both. vermem_jax `sampling.generate` vs
    transformers `model.generate(use_cache=True, do_sample=False)`.
Both frameworks get the same CPU set (`--threads`, via sched_setaffinity before either
is imported, plus torch.set_num_threads). Every contender runs once to warm up
(vermem_jax: includes jit compilation, reported separately), then the contenders are
timed round-robin `--repeats` times (so load from other processes hits all alike) and
the median is reported. The PyTorch model is the vermem_jax model exported with
`save_hf_checkpoint`, so both run identical weights.

  * decode profile (--profile, default on): one decode step split into the transformer
    body (layers with the KV cache) and the head (vocabulary projection + greedy pick)
    for both frameworks, which shows what bounds decoding at this size.
Every vermem_jax / torch ratio is printed with the CPU's model and bf16 flags
(avx512f, avx512_bf16, amx_bf16): torch's bfloat16 speed depends on them.
Goals, like for like (bfloat16 compute on both sides): train step >= 1.5x and decode
>= 2x transformers eager at batch 64. --out writes every figure as JSON.

Example (the command behind docs/performance.md's figures):
  .venv/bin/python experiments/benchmarks/bench_model.py --threads=2 --out=model.json
Quick smoke run:
  .venv/bin/python experiments/benchmarks/bench_model.py --vocab_size=4096 \
      --repeats=1 --new_tokens=4 --train_seq=32
"""

import copy
import bench_common  # this folder is on sys.path
import os
import statistics
import tempfile
import time

from absl import app
from absl import flags

_PRESET = flags.DEFINE_string(
    "preset", None, "QwenConfig preset name (e.g. 'qwen2.5-0.5b-instruct'); overrides "
    "the dimension flags.")
_VOCAB = flags.DEFINE_integer("vocab_size", 151936, "V (Qwen tokenizer ids).")
_HIDDEN = flags.DEFINE_integer("hidden_size", 256, "D.")
_INTER = flags.DEFINE_integer("intermediate_size", 768, "I (SwiGLU width).")
_LAYERS = flags.DEFINE_integer("num_layers", 4, "L.")
_HEADS = flags.DEFINE_integer("num_heads", 4, "N query heads.")
_KV_HEADS = flags.DEFINE_integer("num_kv_heads", 2, "Kv heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Hd.")
_TIED = flags.DEFINE_bool("tie_word_embeddings", True, "Tied lm head (small Qwens).")
_DTYPES = flags.DEFINE_list(
    "dtypes", ["bfloat16", "float32"],
    "vermem_jax compute dtypes to time (params stay float32; the first is the "
    "headline: bf16 compute with f32 accumulation).")
_TRAIN_BATCH = flags.DEFINE_integer("train_batch", 4, "Train-step batch size.")
_TRAIN_SEQ = flags.DEFINE_integer("train_seq", 128, "Train-step sequence length.")
_DECODE_BATCH = flags.DEFINE_integer("decode_batch", 64, "Decode batch size.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Longest prompt (tokens).")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 32, "New tokens per row.")
_THREADS = flags.DEFINE_integer("threads", 2, "CPU cores for each framework.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions (median reported).")
_TORCH_BF16 = flags.DEFINE_bool("torch_bf16", True, "Also time PyTorch in bfloat16.")
_SKIP = flags.DEFINE_list("skip", [], "Parts to skip: train, decode.")
_OUT = flags.DEFINE_string("out", None, "Write the figures as JSON to this file.")
_PROFILE = flags.DEFINE_bool(
    "profile", True, "Also time one decode step split into the transformer body "
    "(one token through the layers with the KV cache) and the head (vocabulary "
    "projection + greedy pick), for both frameworks: what bounds decode.")
_PROFILE_STEPS = flags.DEFINE_integer("profile_steps", 8, "Steps per profile timing.")


def _limit_threads(n):
  """Pins this process (and threads created later) to n CPUs. Call before jax/torch."""
  cpus = sorted(os.sched_getaffinity(0))
  if n > len(cpus):
    raise app.UsageError(f"--threads={n} but only {len(cpus)} CPUs are available")
  os.sched_setaffinity(0, set(cpus[:n]))
  for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[var] = str(n)


def _interleaved(fns, repeats, warmups=None):
  """Times named blocking callables round-robin, so load changes hit all alike.

  Args:
    fns: {name: fn}; each fn() blocks until its work is done.
    repeats: timed rounds.
    warmups: optional {name: fn} run instead of fns[name] for the warm-up call.
  Returns:
    {name: (warm-up seconds, median timed seconds)}.
  """
  first = {}
  for name, fn in fns.items():
    t0 = time.perf_counter()
    (warmups or {}).get(name, fn)()
    first[name] = time.perf_counter() - t0
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      t0 = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t0)
  return {name: (first[name], statistics.median(times[name])) for name in fns}


def main(argv):
  del argv
  _limit_threads(_THREADS.value)
  # Imported after pinning so their thread pools see the CPU set.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit('bench_model.py compares against transformers PyTorch, which the '
                     "test extra installs: run `make install-test` (or pip install -e "
                     f"'.[test]') first ({e})") from e
  import transformers  # pylint: disable=g-import-not-at-top

  from vermem_jax.models import hf_io  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import qwen  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import sampling  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(_THREADS.value)
  torch.set_num_interop_threads(1)
  jax.config.update("jax_platforms", "cpu")

  if _PRESET.value:
    base = qwen.QwenConfig.preset(_PRESET.value)
  else:
    base = qwen.QwenConfig(
        vocab_size=_VOCAB.value, hidden_size=_HIDDEN.value,
        intermediate_size=_INTER.value, num_hidden_layers=_LAYERS.value,
        num_attention_heads=_HEADS.value, num_key_value_heads=_KV_HEADS.value,
        head_dim=_HEAD_DIM.value, tie_word_embeddings=_TIED.value)
  base = base.replace(param_dtype="float32", remat=False)
  configs = {f"vermem_jax[{dt}]": base.replace(dtype=dt) for dt in _DTYPES.value}
  params = qwen.init_params(base, jax.random.PRNGKey(0))
  n_params = sum(x.size for x in jax.tree.leaves(params))
  results = {"config": {k: getattr(base, k) for k in (
      "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings")},
             "params": int(n_params), "threads": _THREADS.value,
             "devices": str(jax.devices()), "torch": torch.__version__,
             "jax": jax.__version__, "transformers": transformers.__version__,
             "cpu": bench_common.cpu_description()}
  print(f"config: {results['config']}  params: {n_params / 1e6:.1f}M  "
        f"threads: {_THREADS.value}  repeats: {_REPEATS.value} (median)  "
        f"load average: {os.getloadavg()[0]:.1f}")

  with tempfile.TemporaryDirectory() as tmp:
    hf_io.save_hf_checkpoint(base, params, tmp, dtype="float32")
    torch_f32 = transformers.AutoModelForCausalLM.from_pretrained(
        tmp, dtype=torch.float32)
  torch_models = {"torch[float32]": torch_f32}
  if _TORCH_BF16.value:
    torch_models["torch[bfloat16]"] = copy.deepcopy(torch_f32).to(torch.bfloat16)
  print(f"transformers {transformers.__version__} eager (no torch.compile), "
        f"attn_implementation={torch_f32.config._attn_implementation}")  # pylint: disable=protected-access
  rng = np.random.RandomState(0)

  def report(part, timings, tokens, unit_note):
    out = {}
    for name, (first, med) in timings.items():
      out[name] = {"tok_s": tokens / med, "seconds": med, "first_call_s": first}
      if name.startswith("vermem"):
        out[name]["compile_s"] = max(0.0, first - med)
        note = f"compile ~{max(0.0, first - med):.1f} s = first call - median"
      else:
        note = f"first call {first:.1f} s"
      print(f"  {name:18s} {tokens / med:9.1f} tok/s  ({med:.3f} s {unit_note}; {note})")
    for ours in [n for n in out if n.startswith("vermem")]:
      for ref in [n for n in out if n.startswith("torch")]:
        ratio = out[ours]["tok_s"] / out[ref]["tok_s"]
        out[f"ratio {ours}/{ref}"] = ratio
        print(f"  ratio {ours} / {ref}: {ratio:.2f}x  on {results['cpu']}")
    results[part] = out

  # ------------------------------------------------------------------ train step
  if "train" not in _SKIP.value:
    b, t = _TRAIN_BATCH.value, _TRAIN_SEQ.value
    ids_np = rng.randint(0, base.vocab_size, (b, t)).astype(np.int32)
    ids = jnp.asarray(ids_np)
    ids_t = torch.from_numpy(ids_np.astype(np.int64))
    fns = {}

    def make_jax_step(config):
      model = qwen.Qwen(config)

      def loss_fn(p, ids):
        hidden = model.apply({"params": p}, ids, return_hidden=True)
        logits = qwen.lm_head_logits(config, p, hidden[:, :-1])  # [B, T-1, V] f32
        gold = jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - gold)

      grad_step = jax.jit(jax.value_and_grad(loss_fn))
      return lambda: jax.block_until_ready(grad_step(params, ids))

    def make_torch_step(tm):
      tm.train()

      def step():
        logits = tm(input_ids=ids_t).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               ids_t[:, 1:].reshape(-1))
        loss.backward()
        tm.zero_grad(set_to_none=True)
      return step

    for name, config in configs.items():
      fns[name] = make_jax_step(config)
    for name, tm in torch_models.items():
      fns[name] = make_torch_step(tm)
    print(f"\ntrain step: forward+backward, next-token loss on all positions, "
          f"batch {b} x {t} tokens (vermem_jax: params f32, compute dtype in brackets, "
          "f32 accumulation)")
    report("train", _interleaved(fns, _REPEATS.value), b * t, "per step")
    print(f"  load average now: {os.getloadavg()[0]:.1f}")

  # ------------------------------------------------------------------ decode
  if "decode" not in _SKIP.value:
    b, p_max, n = _DECODE_BATCH.value, _PROMPT_LEN.value, _NEW_TOKENS.value
    lengths = rng.randint(max(1, p_max // 2), p_max + 1, b)
    prompts = [rng.randint(0, base.vocab_size, int(k)).tolist() for k in lengths]
    pad = np.zeros((b, p_max), np.int64)
    mask = np.zeros((b, p_max), np.int64)
    for i, pr in enumerate(prompts):
      pad[i, p_max - len(pr):] = pr
      mask[i, p_max - len(pr):] = 1
    pad_t, mask_t = torch.from_numpy(pad), torch.from_numpy(mask)
    fns, warmups, outputs = {}, {}, {}

    def make_jax_decode(name, config):
      def decode():
        out = sampling.generate(config, params, prompts, rng=0, max_new_tokens=n,
                                temperature=0.0, stop_token_ids=(), pad_token_id=0)
        outputs[name] = np.asarray(jax.block_until_ready(out).tokens)
      return decode

    def make_torch_decode(name, tm):
      tm.eval()
      tm.generation_config.eos_token_id = None

      def decode(new=n):
        with torch.no_grad():
          out = tm.generate(input_ids=pad_t, attention_mask=mask_t, max_new_tokens=new,
                            min_new_tokens=new, do_sample=False, use_cache=True,
                            pad_token_id=0)
        outputs[name] = out[:, p_max:].numpy()
      # Nothing to compile: a 2-token call warms up the kernels.
      warmups[name] = lambda: decode(2)
      return decode

    for name, config in configs.items():
      fns[name] = make_jax_decode(name, config)
    for name, tm in torch_models.items():
      fns[name] = make_torch_decode(name, tm)
    print(f"\ndecode: greedy with KV cache, batch {b}, left-padded prompts of "
          f"{lengths.min()}-{lengths.max()} tokens (prefill inside the timing), {n} new "
          "tokens per row")
    report("decode", _interleaved(fns, _REPEATS.value, warmups), b * n, "per call")
    print(f"  load average now: {os.getloadavg()[0]:.1f}")
    ref = outputs.get("torch[float32]")
    if ref is not None:
      for name, toks in outputs.items():
        print(f"  greedy tokens equal to torch[float32]: {name} "
              f"{100 * np.mean(toks == ref):.0f}%")

  if _PROFILE.value and "decode" not in _SKIP.value:
    results["decode_profile"] = _decode_profile(configs, params, torch_models,
                                                _DECODE_BATCH.value, _PROMPT_LEN.value)
  print("\nGoals (like for like, bfloat16 compute on both sides): train step >= 1.5x "
        "and decode >= 2x transformers eager at batch 64.")
  bench_common.write_figures(_OUT.value, results)


def _decode_profile(configs, params, torch_models, batch, prompt_len):
  """Per-step decode time split into transformer body and vocabulary head + pick.

  One prefilled KV cache per framework (prompt_len tokens, batch rows); then
  `--profile_steps` steps of (a) the body alone: one token through every layer with
  the cache, final norm included, no head; (b) the head alone: the vocabulary
  projection of the last hidden state and the greedy pick (vermem_jax: the decode
  step's `sampling.next_tokens`, token and log-probability in one pass over the
  vocabulary; torch: lm_head then argmax, no log-probability); (c) vermem_jax's sampled
  head of a rollout step (temperature 0.7, top_p 0.95). Medians of 3 rounds,
  interleaved. Prints each vermem_jax / torch ratio of the same dtype with the CPU's
  model and bf16 flags.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import qwen  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import kv_cache  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import sampling  # pylint: disable=g-import-not-at-top
  # transformers 5 renames past_key_values; the old name still works everywhere.
  warnings.filterwarnings("ignore", message=".*past_key_values.*")
  steps = _PROFILE_STEPS.value
  rng = np.random.RandomState(1)
  ids_np = rng.randint(1, params["embed_tokens"]["embedding"].shape[0],
                       (batch, prompt_len))
  fns = {}
  for name, config in configs.items():
    model = qwen.Qwen(config)
    cache = kv_cache.init_cache(config, batch, prompt_len + steps + 1)
    _, cache = jax.jit(lambda p, x, c: model.apply({"params": p}, x, cache=c))(
        params, jnp.asarray(ids_np, jnp.int32), cache)
    tok = jnp.zeros((batch, 1), jnp.int32)
    body = jax.jit(lambda p, t, c, model=model: model.apply(
        {"params": p}, t, cache=c, return_hidden=True))
    # What a greedy decode step runs: the fused vocabulary head, token + log-prob.
    head = jax.jit(lambda p, h, config=config: sampling.next_tokens(
        config, p, h, None, None, None, do_sample=False))
    # A rollout step's sampled head (SPEC §4: temperature 0.7, top_p 0.95).
    sample = jax.jit(lambda p, h, key, config=config: sampling.next_tokens(
        config, p, h, key, jnp.float32(0.7), jnp.float32(0.95), do_sample=True))
    hidden, _ = body(params, tok, cache)
    hidden = hidden[:, 0]

    def run_body(body=body, cache=cache, tok=tok):
      c = cache
      for _ in range(steps):  # the cache grows like in decoding
        h, c = body(params, tok, c)
      jax.block_until_ready(h)

    def run_head(head=head, hidden=hidden):
      for _ in range(steps):
        out = head(params, hidden)
      jax.block_until_ready(out)

    def run_sample(sample=sample, hidden=hidden):
      for i in range(steps):
        out = sample(params, hidden, jax.random.PRNGKey(i))
      jax.block_until_ready(out)
    fns[f"{name} body"], fns[f"{name} head+pick"] = run_body, run_head
    fns[f"{name} head+sample"] = run_sample
  for name, tm in torch_models.items():
    tm.eval()
    with torch.no_grad():
      out = tm.model(input_ids=torch.from_numpy(ids_np), use_cache=True)
    past, last = out.past_key_values, out.last_hidden_state[:, -1:]
    tok_t = torch.zeros((batch, 1), dtype=torch.long)

    def run_body_t(tm=tm, past=past, tok_t=tok_t):
      import copy as copy_lib  # pylint: disable=g-import-not-at-top
      cache = copy_lib.deepcopy(past)
      with torch.no_grad():
        for _ in range(steps):
          tm.model(input_ids=tok_t, past_key_values=cache, use_cache=True)

    def run_head_t(tm=tm, last=last):
      with torch.no_grad():
        for _ in range(steps):
          tm.lm_head(last).argmax(-1)
    fns[f"{name} body"], fns[f"{name} head+pick"] = run_body_t, run_head_t
  timed = _interleaved(fns, 3)
  cpu = bench_common.cpu_description()
  print(f"\ndecode profile: batch {batch}, cache of {prompt_len} tokens, ms per step "
        "(body = layers with KV cache; head+pick = vocabulary projection + greedy "
        f"pick, vermem_jax's with the log-prob) on {cpu}")
  out = {}
  for name, (_, med) in timed.items():
    out[name] = 1e3 * med / steps
  for fw in sorted({n.rsplit(" ", 1)[0] for n in out}):
    body_ms, head_ms = out[f"{fw} body"], out[f"{fw} head+pick"]
    print(f"  {fw:18s} body {body_ms:8.2f} ms   head+pick {head_ms:8.2f} ms   "
          f"head share {100 * head_ms / (body_ms + head_ms):5.1f}%")
    if f"{fw} head+sample" in out:
      print(f"  {fw:18s} head+sample (T 0.7, top_p 0.95) {out[f'{fw} head+sample']:8.2f} ms"
            " (random weights: a wide nucleus, so the exact path runs)")
  for ours in [n for n in configs if f"{n} body" in out]:
    ref = "torch[" + ours.split("[", 1)[1]
    if f"{ref} body" not in out:
      continue
    for part in ("body", "head+pick"):
      ratio = out[f"{ref} {part}"] / out[f"{ours} {part}"]
      out[f"ratio {ours}/{ref} {part}"] = ratio
      print(f"  ratio {part} speed {ours} / {ref}: {ratio:.2f}x  on {cpu}")
  return out


if __name__ == "__main__":
  app.run(main)
