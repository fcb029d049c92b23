"""Jitted batched generation with a KV cache (greedy or temperature + top-p).

Shapes and buckets
------------------
Prompts are LEFT-padded into a prompt-length bucket P, so the last prompt column is
every row's newest token; each row keeps its own RoPE positions (qwen.py's module
docstring has the padding/cache rules). P is the smallest of the caller's
`prompt_buckets` >= the longest prompt (a longer prompt raises), or, without
`prompt_buckets`, max(32, next power of two >= the longest prompt). Callers whose
prompts have a known maximum pass buckets ending exactly at it: a policy prompt of
policy_input_limit + chat-template tokens (8,192 + ~29) would otherwise land in the
16,384 power-of-two bucket and double the prefill. The cache has P + max_new_tokens
slots. Stop ids are padded to a bucket of max(8, next power of two) entries. The jitted
program is therefore compiled once per (batch size B, prompt bucket P, max_new_tokens,
stop-id bucket, greedy vs sampled, config); temperature, top_p, the rng and the pad id
are traced values and never recompile. `compile_count()` reports how many programs
exist.

Decoding
--------
Prefill runs the whole padded prompt through the model with the cache and keeps only
the last position's final hidden state (never [B, P, V] logits).
Rows with identical prompts share one prefill (`share_prefill`, default on): the K
rollouts of a task start from one state, so their first prompts are equal. The U
distinct prompts are prefilled as a batch of U' = min(B, next power of two >= U) rows
(so at most log2(B) + 1 prefill shapes), and the prefilled KV cache and last-position
hidden states are gathered into the B rows before decoding. Decoding, the random stream and
the sampled tokens are those of the unshared path: a row's prefill does not depend on
the other rows of the batch (`_prefill`).
Decode then runs inside one `lax.while_loop`, one token per step for all rows, until
every row has stopped or max_new_tokens tokens exist. A row stops at the first token in
stop_token_ids; that token is part of its completion (counted in `lengths`); later
columns of that row hold pad_token_id with logprob 0.

Next token
----------
Prefill and every decode step take the next token and its log-probability from the
final hidden state in one pass over the vocabulary (`decode_head.head_tokens`: the
lm_head projection fused with the pick, chunked over the vocabulary on CPU), never a
separate top-k, log-sum-exp and second projection. Sampling (temperature > 0):
logits / temperature restricted to the top-p nucleus, renormalized; the returned
logprob is the chosen token's log-probability under that renormalized distribution,
i.e. the distribution it was actually drawn from (what PPO/GRPO importance ratios
need). Greedy (temperature == 0): the first maximal logit; the returned logprob is
log_softmax(logits) of the chosen token at temperature 1 without top-p (the greedy
"distribution" is a point mass, so its log-probability would be 0 and carry no
information). `decode_head`'s module docstring has the algorithm and its cost.

Rollout copy of the weights
---------------------------
`rollout_copy` casts a float32 (FSDP-sharded) parameter tree once to the compute dtype
and lays it out for decoding: every matrix in the compute dtype, sharded over
'tensor' only (the 'fsdp' split dropped, so replicated on an fsdp-only mesh); the
1-D norm scales and biases stay in float32 (the model reads them in float32, so
decoding from the copy gives the same tokens as decoding from θ itself). The copy's
all-gather runs in the compute dtype, once (XLA:CPU alone widens bf16 collectives to
float32 late in its pipeline); `generate` on the copy then holds no parameter
collective (tests/test_rollout_copy.py counts them in the partitioned program). On an
fsdp-sharded θ without the copy, the partitioner gathers every weight inside the
token loop; XLA hoists them for a small model, not all of them at 7B (issue 38).

Randomness
----------
Step t draws with fold_in(rng, t), so a fixed rng reproduces a batch exactly; a
sampled row's stream depends on the batch shape, while greedy rows are identical alone
or batched.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vermem_jax.models import decode_head
from vermem_jax.models import kv_cache
from vermem_jax.models import qwen
from vermem_jax.models import qwen_config
from vermem_jax.models import sharding

# Smallest prompt bucket (tokens); buckets are powers of two above it, so a run sees
# at most log2(max prompt / 32) + 1 prompt shapes.
MIN_PROMPT_BUCKET = 32
# Prompt tokens per prefill step (see `_prefill`): rows are prefilled one at a time
# once the prompt bucket has this many tokens, in groups of ceil(this / P) rows below.
PREFILL_ROW_TOKENS = 256
# Smallest stop-id bucket; Qwen chat models need 2-3 stop ids (<|im_end|>,
# <|endoftext|>), so one bucket covers them.
MIN_STOP_BUCKET = 8

_TRACES: collections.Counter = collections.Counter()
# Rows asked for and prompts prefilled by `generate` in this process (prefill_counts).
_PREFILL: collections.Counter = collections.Counter()


class GenerationOutput(NamedTuple):
  """Completions of `generate`.

  tokens:   [B, N] int32 completion ids, pad_token_id after a row's stop token.
  logprobs: [B, N] float32 log-probabilities of those tokens under the sampling
            distribution (module docstring); 0 after a row's stop token.
  lengths:  [B] int32 completion lengths in tokens (stop token included).
  """
  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array


def _next_pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def check_prompt_buckets(prompt_buckets: Sequence[int] | None
                         ) -> tuple[int, ...] | None:
  """Validated prompt buckets: None, or a non-empty strictly increasing tuple of
  positive ints (tokens).

  Raises:
    ValueError: empty, non-integer, non-positive or not strictly increasing.
  """
  if prompt_buckets is None:
    return None
  buckets = tuple(prompt_buckets)
  if (not buckets or any(isinstance(b, bool) or int(b) != b or b < 1 for b in buckets)
      or list(buckets) != sorted(set(buckets))):
    raise ValueError('prompt_buckets must be positive ints in strictly increasing '
                     f'order, got {prompt_buckets!r}')
  return tuple(int(b) for b in buckets)


def prompt_bucket(length: int, prompt_buckets: Sequence[int] | None = None) -> int:
  """Prompt-length bucket P (tokens) for a longest prompt of `length` tokens.

  Args:
    length: the longest prompt in tokens.
    prompt_buckets: sorted allowed P values (`check_prompt_buckets`); None = powers of
      two from MIN_PROMPT_BUCKET.
  Raises:
    ValueError: `length` exceeds the largest of `prompt_buckets` (names both).
  """
  if prompt_buckets is None:
    return max(MIN_PROMPT_BUCKET, _next_pow2(length))
  for b in prompt_buckets:
    if length <= b:
      return int(b)
  raise ValueError(f'generate: longest prompt has {length} tokens > the largest '
                   f'prompt bucket {prompt_buckets[-1]} '
                   f'(prompt_buckets={tuple(prompt_buckets)})')


# The decoding layout: the learner's rules without the FSDP split of 'embed'.
DECODE_RULES = tuple((name, None if name == 'embed' else axes)
                     for name, axes in sharding.DEFAULT_RULES)


def decode_dtype(config: qwen_config.QwenConfig, leaf: Any) -> Any:
  """The rollout copy's dtype of one parameter: the compute dtype for matrices (ndim
  >= 2: embeddings, kernels, the head), float32 kept for 1-D norm scales and biases."""
  return config.compute_dtype if len(leaf.shape) >= 2 else leaf.dtype


def decode_shardings(config: qwen_config.QwenConfig, mesh: Any) -> Any:
  """NamedSharding of every rollout-copy parameter on `mesh` (`DECODE_RULES`: split
  over 'tensor' where it divides, otherwise replicated)."""
  return sharding.param_shardings(config, mesh, DECODE_RULES)


def _cast_for_decode(params, config):
  return jax.tree.map(lambda x: x.astype(decode_dtype(config, x)), params)


@functools.lru_cache(maxsize=None)
def _copy_program(config: qwen_config.QwenConfig, mesh: Any) -> Any:
  """The jitted cast of `rollout_copy` (one per config and mesh)."""
  out = None if mesh is None else decode_shardings(config, mesh)
  return jax.jit(functools.partial(_cast_for_decode, config=config), out_shardings=out)


def rollout_copy(config: qwen_config.QwenConfig, params: Any, mesh: Any = None) -> Any:
  """θ's rollout copy: matrices cast to `config.compute_dtype`, laid out for decoding
  (module docstring, "Rollout copy of the weights"). Call once per update (and once
  per dev evaluation); drop it before the learner step, which needs the memory.

  Args:
    config: the policy's QwenConfig.
    params: the parameter tree (float32; FSDP-sharded on `mesh`, or plain arrays).
    mesh: the ('data', 'fsdp', 'tensor') mesh θ lives on; None: cast only.
  Returns:
    A tree of the same structure: ndim >= 2 leaves in the compute dtype (bf16 at the
    paper config), 1-D leaves unchanged; sharded by `decode_shardings` on `mesh`.
    Per device it holds (compute bytes x matrix parameters) / mesh 'tensor' size.
  """
  return _copy_program(config, mesh)(params)


def lower_rollout_copy(config: qwen_config.QwenConfig, params: Any,
                       mesh: Any) -> jax.stages.Lowered:
  """`rollout_copy`'s program on `mesh`, lowered with abstract `params` (ShapeDtypeStructs
  with the trainer's shardings; nothing allocated)."""
  return _copy_program(config, mesh).lower(params)


def abstract_rollout_copy(config: qwen_config.QwenConfig, params: Any, mesh: Any) -> Any:
  """ShapeDtypeStructs of the rollout copy of `params` (shapes, decode dtypes and
  `decode_shardings` on `mesh`), for planning the sampler programs."""
  return jax.tree.map(
      lambda x, sh: jax.ShapeDtypeStruct(x.shape, decode_dtype(config, x), sharding=sh),
      params, decode_shardings(config, mesh))


def left_pad(prompts: Sequence[Sequence[int]], length: int,
             pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token lists to `length`. Returns (tokens [B, L] int32, mask [B, L] int32)."""
  tokens = np.full((len(prompts), length), pad_token_id, np.int32)
  mask = np.zeros((len(prompts), length), np.int32)
  for i, p in enumerate(prompts):
    if len(p):
      tokens[i, length - len(p):] = p
      mask[i, length - len(p):] = 1
  return tokens, mask


def _batch_sharded() -> bool:
  """The current mesh (if any) splits the batch over more than one device."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return False
  return any(mesh.shape.get(axis, 1) > 1 for axis in ('data', 'fsdp'))


def _prefill(model, params, tokens, mask, num_slots, config):
  """Prompt prefill -> (last-position final hidden states [U, D], cache with
  num_slots).

  Rows go through the model in groups of ceil(PREFILL_ROW_TOKENS / P) rows (one row
  per group once P >= PREFILL_ROW_TOKENS), so a row's prefill is the same program on
  the same data whatever the batch holds: a prompt gives bit-identical states and KV
  cache prefilled alone, among other rows, or once for K rows (shared prefill), and
  the sampled tokens are identical (matrix products of different batch sizes round
  differently on XLA). When a mesh splits the batch, all rows run at once instead, to
  keep the data parallelism (then equal to float32 rounding).
  """
  rows, prompt_len = tokens.shape
  variables = {'params': params}

  def run(tok, msk):
    cache = kv_cache.init_cache(config, tok.shape[0], num_slots)
    hidden, cache = model.apply(variables, tok, attention_mask=msk, cache=cache,
                                return_hidden=True)
    return hidden[:, -1], cache

  group = min(rows, -(-PREFILL_ROW_TOKENS // prompt_len))
  if _batch_sharded() or group >= rows:
    return run(tokens, mask)
  pad = -rows % group
  split = lambda x: jnp.pad(x, ((0, pad), (0, 0))).reshape(-1, group, prompt_len)
  hidden, cache = jax.lax.map(lambda xs: run(*xs), (split(tokens), split(mask)))
  index = cache.pop('index')[0]
  merge = lambda x: x.reshape((-1,) + x.shape[2:])[:rows]
  cache = jax.tree.map(merge, cache)
  cache['index'] = index
  return merge(hidden), cache


def next_tokens(config: qwen_config.QwenConfig, params: Any, hidden: jax.Array,
                rng: jax.Array, temperature: jax.Array, top_p: jax.Array, *,
                do_sample: bool) -> tuple[jax.Array, jax.Array]:
  """The next token of each row from final hidden states [B, D] in one pass over the
  vocabulary (`decode_head.head_tokens` with the model's lm_head or tied embedding).

  Returns:
    (tokens [B] int32, logprobs [B] float32; module docstring).
  """
  weight, transposed = qwen.lm_head_weight(config, params)
  return decode_head.head_tokens(hidden, weight, transposed=transposed,
                                 dtype=config.compute_dtype, rng=rng,
                                 temperature=temperature, top_p=top_p,
                                 do_sample=do_sample)


def decode_step(config: qwen_config.QwenConfig, params: Any, cache: dict, prev: jax.Array,
                done: jax.Array, rng: jax.Array, temperature: jax.Array,
                top_p: jax.Array, *, do_sample: bool
                ) -> tuple[jax.Array, jax.Array, dict]:
  """One decode step of every row: the model on the previous tokens with the cache,
  then the next token and its log-probability (`next_tokens`).

  Args:
    config, params: the model.
    cache: `qwen.init_cache` layout with B rows.
    prev: [B] int32 previous tokens; done: [B] bool rows that stopped (their slot is
      written as padding).
    rng: this step's key; temperature, top_p: float32 scalars.
  Returns:
    (tokens [B] int32, logprobs [B] float32, the cache advanced by one slot).
  """
  hidden, cache = qwen.Qwen(config).apply(
      {'params': params}, prev[:, None], attention_mask=(~done)[:, None].astype(jnp.int32),
      cache=cache, return_hidden=True)
  tok, lp = next_tokens(config, params, hidden[:, 0], rng, temperature, top_p,
                        do_sample=do_sample)
  return tok, lp, cache


@functools.partial(jax.jit,
                   static_argnames=('config', 'max_new_tokens', 'do_sample'))
def _generate_jit(params, tokens, mask, row_source, rng, temperature, top_p, stop_ids,
                  pad_id, *, config: qwen_config.QwenConfig, max_new_tokens: int,
                  do_sample: bool):
  # tokens / mask: [U, P] prompts to prefill; row_source: None (U = B rows) or [B]
  # int32, the prefilled row each output row continues from (module docstring).
  _TRACES[(tokens.shape, None if row_source is None else row_source.shape,
           max_new_tokens, stop_ids.shape, do_sample)] += 1
  prefill_batch, prompt_len = tokens.shape
  batch = prefill_batch if row_source is None else row_source.shape[0]
  model = qwen.Qwen(config)
  hidden, cache = _prefill(model, params, tokens, mask,
                           prompt_len + max_new_tokens, config)
  if row_source is not None:
    rows = lambda x: x if x.ndim == 0 else jnp.take(x, row_source, axis=0)
    hidden, cache = rows(hidden), jax.tree.map(rows, cache)
  tok, lp = next_tokens(config, params, hidden, jax.random.fold_in(rng, 0),
                        temperature, top_p, do_sample=do_sample)
  out_tokens = jnp.full((batch, max_new_tokens), pad_id, jnp.int32).at[:, 0].set(tok)
  out_logprobs = jnp.zeros((batch, max_new_tokens), jnp.float32).at[:, 0].set(lp)
  done = jnp.isin(tok, stop_ids)
  lengths = jnp.ones((batch,), jnp.int32)

  def cond(state):
    step, _, _, done, _, _, _ = state
    return (step < max_new_tokens) & ~jnp.all(done)

  def body(state):
    step, cache, prev, done, out_tokens, out_logprobs, lengths = state
    tok, lp, cache = decode_step(config, params, cache, prev, done,
                                 jax.random.fold_in(rng, step), temperature, top_p,
                                 do_sample=do_sample)
    tok = jnp.where(done, pad_id, tok)
    lp = jnp.where(done, 0.0, lp)
    out_tokens = jax.lax.dynamic_update_slice(out_tokens, tok[:, None], (0, step))
    out_logprobs = jax.lax.dynamic_update_slice(out_logprobs, lp[:, None], (0, step))
    lengths = lengths + (~done).astype(jnp.int32)
    done = done | jnp.isin(tok, stop_ids)
    return step + 1, cache, tok, done, out_tokens, out_logprobs, lengths

  state = (jnp.asarray(1, jnp.int32), cache, tok, done, out_tokens, out_logprobs,
           lengths)
  _, _, _, _, out_tokens, out_logprobs, lengths = jax.lax.while_loop(cond, body, state)
  return out_tokens, out_logprobs, lengths


def compile_count() -> int:
  """Number of compiled generation programs in this process (one per shape bucket)."""
  return _generate_jit._cache_size()  # pylint: disable=protected-access


def trace_counts() -> dict:
  """Traces of the generation program per (prefill prompt shape, shared rows shape,
  N, stop bucket, sampled)."""
  return dict(_TRACES)


def prefill_counts() -> dict:
  """{'calls', 'rows', 'prefilled'}: `generate` calls, rows sampled and prompts
  prefilled so far in this process (prefilled < rows when rows shared a prompt)."""
  return {k: _PREFILL[k] for k in ('calls', 'rows', 'prefilled')}


def generate(config: qwen_config.QwenConfig, params: Any,
             prompts: Sequence[Sequence[int]] | np.ndarray, *, rng: Any,
             max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
             stop_token_ids: Sequence[int] = (), pad_token_id: int = 0,
             prompt_lengths: Sequence[int] | None = None,
             prompt_buckets: Sequence[int] | None = None,
             share_prefill: bool = True) -> GenerationOutput:
  """Samples completions for a batch of prompts with a KV cache.

  Args:
    config: model config.
    params: parameter tree (plain arrays, possibly sharded).
    prompts: list of B token-id lists (lengths may differ), or a [B, T] int array
      whose row b holds its prompt in the first prompt_lengths[b] columns.
    rng: a jax PRNG key (or an int seed); unused when greedy.
    max_new_tokens: N, the completion capacity in tokens.
    temperature: 0 = greedy; > 0 scales the logits (SPEC §4: 0.7 for RL rollouts).
    top_p: nucleus mass in (0, 1] (SPEC §4: 0.95); ignored when greedy.
    stop_token_ids: ids that end a row (the stop token is returned).
    pad_token_id: id used for prompt padding (never attended) and for the columns
      after a row stopped.
    prompt_lengths: [B] real lengths when `prompts` is an array.
    prompt_buckets: allowed padded prompt lengths P in tokens (positive, strictly
      increasing); the batch is padded to the smallest one >= its longest prompt.
      None: max(32, next power of two). Each distinct P is one compilation (module
      docstring).
    share_prefill: prefill each distinct prompt once and share its KV cache among
      the rows that repeat it (same tokens; module docstring).
  Returns:
    GenerationOutput(tokens [B, N] int32, logprobs [B, N] float32, lengths [B] int32)
    as jax arrays; see the module docstring for the logprob definition.
  Raises:
    ValueError: empty batch or prompt, ids outside [0, vocab_size), bad temperature /
      top_p / max_new_tokens / prompt_buckets, a prompt longer than the largest
      prompt bucket, or prompt + N beyond max_position_embeddings.
  """
  prompt_buckets = check_prompt_buckets(prompt_buckets)
  if isinstance(prompts, (np.ndarray, jax.Array)):
    arr = np.asarray(prompts)
    if arr.ndim != 2:
      raise ValueError(f'generate: prompt array must be [B, T], got {arr.shape}')
    if prompt_lengths is None:
      raise ValueError('generate: a prompt array needs prompt_lengths')
    if len(prompt_lengths) != arr.shape[0]:
      raise ValueError(f'generate: {len(prompt_lengths)} prompt_lengths for '
                       f'{arr.shape[0]} prompts')
    prompts = [arr[i, :int(n)].tolist() for i, n in enumerate(prompt_lengths)]
  prompts = [list(map(int, p)) for p in prompts]
  if not prompts:
    raise ValueError('generate: no prompts')
  for i, p in enumerate(prompts):
    if not p:
      raise ValueError(f'generate: prompt {i} is empty')
    if min(p) < 0 or max(p) >= config.vocab_size:
      raise ValueError(f'generate: prompt {i} has token ids outside '
                       f'[0, {config.vocab_size})')
  if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
    raise ValueError(f'generate: max_new_tokens must be a positive int, got '
                     f'{max_new_tokens!r}')
  if not temperature >= 0:
    raise ValueError(f'generate: temperature must be >= 0, got {temperature!r}')
  if not 0 < top_p <= 1:
    raise ValueError(f'generate: top_p must be in (0, 1], got {top_p!r}')
  longest = max(len(p) for p in prompts)
  if longest + max_new_tokens > config.max_position_embeddings:
    raise ValueError(f'generate: prompt ({longest}) + max_new_tokens ({max_new_tokens}) '
                     f'exceeds max_position_embeddings ({config.max_position_embeddings})')

  bucket = prompt_bucket(longest, prompt_buckets)
  row_source = None
  prefill = prompts
  if share_prefill:
    first_row: dict[tuple[int, ...], int] = {}
    source = [first_row.setdefault(tuple(p), len(first_row)) for p in prompts]
    unique = [list(p) for p in first_row]
    rows = min(len(prompts), _next_pow2(len(unique)))
    if rows < len(prompts):  # padding rows repeat a prompt and are never read
      prefill = unique + [unique[0]] * (rows - len(unique))
      row_source = jnp.asarray(source, jnp.int32)
  tokens, mask = left_pad(prefill, bucket, pad_token_id)
  stop = sorted(set(int(s) for s in stop_token_ids))
  stop_ids = np.full((max(MIN_STOP_BUCKET, _next_pow2(len(stop))),), -1, np.int32)
  stop_ids[:len(stop)] = stop
  if isinstance(rng, (int, np.integer)):
    rng = jax.random.PRNGKey(int(rng))
  do_sample = temperature > 0
  out_tokens, out_logprobs, lengths = _generate_jit(
      params, jnp.asarray(tokens), jnp.asarray(mask), row_source, rng,
      jnp.asarray(temperature if do_sample else 1.0, jnp.float32),
      jnp.asarray(top_p, jnp.float32), jnp.asarray(stop_ids),
      jnp.asarray(pad_token_id, jnp.int32),
      config=config, max_new_tokens=int(max_new_tokens), do_sample=do_sample)
  _PREFILL['calls'] += 1
  _PREFILL['rows'] += len(prompts)
  _PREFILL['prefilled'] += len(prompts) if row_source is None else len(unique)
  return GenerationOutput(out_tokens, out_logprobs, lengths)


def _abstract(shape, dtype, sharding=None) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def lower_generate(config: qwen_config.QwenConfig, params: Any, *, batch: int,
                   prefill_rows: int, prompt_len: int, max_new_tokens: int,
                   do_sample: bool, input_sharding: Any = None,
                   stop_bucket: int = MIN_STOP_BUCKET) -> jax.stages.Lowered:
  """The program `generate` runs for these shapes, lowered with abstract inputs.

  Nothing is allocated: `params` may be `jax.ShapeDtypeStruct`s (with shardings), and
  `.compile().memory_analysis()` of the result gives the program's per-device
  argument, output and temporary bytes (the KV cache of prompt_len + max_new_tokens
  slots is a temporary). Call it under the mesh context `generate` runs in
  (`sharding.use_sharding`).

  Args:
    config: model config; params: parameter tree (arrays or ShapeDtypeStructs).
    batch: B rows sampled; prefill_rows: U' rows prefilled (B, or fewer when rows
      share a prompt: `generate`'s share_prefill).
    prompt_len: the prompt bucket P (tokens); max_new_tokens: N.
    do_sample: sampled (True) or greedy program.
    input_sharding: sharding of the token inputs (None: as jit places host arrays).
    stop_bucket: stop-id slots.
  Raises:
    ValueError: prefill_rows outside [1, batch].
  """
  if not 1 <= prefill_rows <= batch:
    raise ValueError(f'lower_generate: prefill_rows={prefill_rows} must be in [1, '
                     f'{batch}]')
  rep = lambda shape, dtype: _abstract(shape, dtype, input_sharding)
  row_source = None if prefill_rows == batch else rep((batch,), jnp.int32)
  scalar = rep((), jnp.float32)
  return _generate_jit.lower(
      params, rep((prefill_rows, prompt_len), jnp.int32),
      rep((prefill_rows, prompt_len), jnp.int32), row_source,
      jax.eval_shape(lambda: jax.random.PRNGKey(0)), scalar, scalar,
      rep((stop_bucket,), jnp.int32), rep((), jnp.int32), config=config,
      max_new_tokens=int(max_new_tokens), do_sample=do_sample)


def lower_decode_step(config: qwen_config.QwenConfig, params: Any, *, batch: int,
                      num_slots: int, do_sample: bool,
                      sharding_for: Any = None) -> jax.stages.Lowered:
  """`decode_step` on B rows and a cache of `num_slots` slots, lowered with abstract
  inputs (as `lower_generate`): the per-step temporaries beyond the cache.

  `sharding_for(shape)` gives the sharding of each row-major input (the cache, the
  previous tokens); None leaves them to jit.
  """
  rep = lambda shape, dtype: _abstract(shape, dtype, None if sharding_for is None
                                       else sharding_for(shape))
  cache = jax.tree.map(lambda x: rep(x.shape, x.dtype), jax.eval_shape(
      functools.partial(kv_cache.init_cache, config, batch, num_slots)))
  step = jax.jit(decode_step, static_argnames=('config', 'do_sample'))
  return step.lower(config, params, cache, rep((batch,), jnp.int32),
                    rep((batch,), jnp.bool_),
                    jax.eval_shape(lambda: jax.random.PRNGKey(0)),
                    rep((), jnp.float32), rep((), jnp.float32), do_sample=do_sample)
