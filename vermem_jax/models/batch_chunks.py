"""Fixed batch shapes for every generate call: padding to a batch bucket, chunks.

The sampler (`models.sampling.generate`) compiles one program per batch size, so a
caller that sends whatever number of rows it has compiles a program for most sizes.
`generate_in_chunks` is the one path the policy (rollouts, internal dev, evaluation:
`rl.policy.SamplerPolicy`) and the in-process task solver
(`envs.task_solvers.LLMTaskSolver`) call it through:

  n <= max(batch_buckets)   one call at the smallest bucket >= n;
  n >  max(batch_buckets)   ceil(n / B) calls of B = max(batch_buckets) rows each,
                            the short last chunk padded to its smallest bucket (B when
                            the buckets are one size, as the trainers pass them).

When there is more than one chunk, rows are taken in order of prompt length (stable)
so that each chunk holds prompts of similar length and pads them to a small prompt
bucket (the prefill of a call pads every row to the bucket of its longest); results
come back in input order. Greedy rows decode the same whatever their chunk
(models/sampling.py). Padding rows repeat the chunk's first prompt (same length, so
the prompt bucket does not grow; with shared prefill they cost no extra prefill) and
are dropped from the result. Chunk i > 0 samples with fold_in(rng, i); chunk 0 with
`rng` itself, so a batch that fits one call samples exactly what it sampled before
chunks existed.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from vermem_jax.models import sampling

# Default batch buckets: powers of two (a bounded set of sampler shapes).
POWER_OF_TWO_BUCKETS = tuple(1 << i for i in range(16))


def check_batch_buckets(batch_buckets: Sequence[int] | None) -> tuple[int, ...]:
  """Sorted positive batch sizes (None: `POWER_OF_TWO_BUCKETS`).

  Raises:
    ValueError: empty, or a size < 1.
  """
  if batch_buckets is None:
    return POWER_OF_TWO_BUCKETS
  buckets = sorted(int(b) for b in batch_buckets)
  if not buckets or buckets[0] < 1:
    raise ValueError(f'batch_buckets must be positive sizes, got {batch_buckets}')
  return tuple(buckets)


def chunk_sizes(n: int, batch_buckets: Sequence[int]) -> list[tuple[int, int]]:
  """(real rows, padded rows) of each generate call for n rows (module docstring)."""
  largest = batch_buckets[-1]
  out = []
  while n > 0:
    real = min(n, largest)
    out.append((real, next(b for b in batch_buckets if b >= real)))
    n -= real
  return out


def generate_in_chunks(generate_fn: Callable[..., sampling.GenerationOutput],
                       config: Any, params: Any, prompts: Sequence[Sequence[int]], *,
                       rng: Any, batch_buckets: Sequence[int],
                       **kwargs: Any) -> sampling.GenerationOutput:
  """`generate_fn(config, params, rows, rng=..., **kwargs)` over `prompts` in fixed
  batch shapes (module docstring).

  Args:
    generate_fn: `models.sampling.generate` or a wrapper with its signature (e.g.
      `train.setup.generate_fn_for(mesh)`).
    config, params: the model.
    prompts: n >= 1 token-id lists.
    rng: a PRNG key or an int seed.
    batch_buckets: sorted allowed batch sizes (`check_batch_buckets`).
    **kwargs: the rest of `generate`'s arguments (max_new_tokens, temperature, ...).
  Returns:
    GenerationOutput of NumPy arrays for the n rows in order: tokens [n, N] int32,
    logprobs [n, N] float32, lengths [n] int32.
  Raises:
    ValueError: no prompts; whatever `generate_fn` raises.
  """
  if not prompts:
    raise ValueError('generate_in_chunks: no prompts')
  if isinstance(rng, (int, np.integer)):
    rng = jax.random.PRNGKey(int(rng))
  sizes = chunk_sizes(len(prompts), batch_buckets)
  order = (np.argsort([len(p) for p in prompts], kind='stable') if len(sizes) > 1
           else np.arange(len(prompts)))
  parts, start = [], 0
  for i, (real, padded) in enumerate(sizes):
    rows = [list(prompts[j]) for j in order[start:start + real]]
    rows += [rows[0]] * (padded - real)
    out = generate_fn(config, params, rows, rng=rng if i == 0 else
                      jax.random.fold_in(rng, i), **kwargs)
    parts.append(tuple(np.asarray(x)[:real]  # blocks until the device is done
                       for x in (out.tokens, out.logprobs, out.lengths)))
    start += real
  inverse = np.argsort(order)
  return sampling.GenerationOutput(*(np.concatenate(xs)[inverse] for xs in zip(*parts)))
