"""Fields derived from other fields: the length buckets and the tiny tokenizer path.

`sampling.prompt_buckets`, `batching.length_buckets` and `batching.command_buckets` are
lazy `ml_collections.FieldReference`s computed from `memory.policy_input_limit`,
`sampling.prompt_overhead_tokens` and `sampling.max_command_tokens` (`derived_buckets`
gives the same values). Reading them (attribute access, `to_dict()`) yields plain
tuples, so overriding one of those three numbers (`--config.memory.policy_input_limit=
4096`) moves every bucket with it, while overriding a bucket field itself replaces the
derivation by the given tuple (checked by `validate_config`). Copies keep the references
(`copy.deepcopy`); a `FrozenConfigDict` or `copy_and_resolve_references()` freezes the
current values. The tiny scale's `tokenizer.path` follows `data.data_dir` the same way.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import ml_collections

from vermem_jax import paths


def power_of_two_buckets(min_len: int, max_len: int) -> list[int]:
  """Length buckets: powers of two from `min_len` below `max_len`, then `max_len`.

  Ends exactly at `max_len` (not the next power of two) so the longest batch is no
  larger than the longest legal sequence. Both arguments in tokens, min_len a power of 2.
  """
  if min_len <= 0 or max_len <= 0:
    raise ValueError(f'bucket bounds must be positive, got {min_len}, {max_len}')
  buckets = []
  b = min_len
  while b < max_len:
    buckets.append(b)
    b *= 2
  buckets.append(max_len)
  return buckets


# Smallest learner length bucket (tokens; decision): x_t holds the instruction block
# and the command list, a few hundred tokens at least, so smaller buckets would only
# add compilations.
MIN_LENGTH_BUCKET = 256
# Paper-scale sampler prompt buckets (`quarter_octave_buckets` from this size): a
# prompt pads by at most a quarter of its length once it has 1,024 tokens. Padded
# prefill tokens per row: 1.09-1.14x the real ones on paper-shaped Phase A/B/C dev
# episodes, 1.36-1.44x with powers of two (docs/compilation.md).
MIN_PROMPT_BUCKET = 256
MIN_COMMAND_BUCKET = 16  # decision: short commands (Null, Delete) are ~10-20 tokens

def quarter_octave_buckets(min_len: int, max_len: int) -> list[int]:
  """Length buckets that split every octave [2^k, 2^(k+1)) above `min_len` into four
  equal steps (a step of at least `min_len`), below `max_len`, then `max_len`: a
  length of n >= 4 * min_len pads to at most 1.25 n. Tokens; min_len a power of 2.
  """
  if min_len <= 0 or max_len <= 0:
    raise ValueError(f'bucket bounds must be positive, got {min_len}, {max_len}')
  buckets, b = [], min_len
  while b < max_len:
    buckets.append(b)
    b += max(min_len, (1 << (b.bit_length() - 1)) // 4)
  return buckets + [max_len]


# A lazy FieldReference operation: `fn(value, *args)` with the args dereferenced when the
# field is read. Same fields as ml_collections' (private) op record, which is what
# FieldReference's documented `op` argument expects.
_LazyOp = collections.namedtuple('_LazyOp', ['fn', 'args'])


def linear_buckets(min_len: int | None, max_len: int, step: int) -> list[int]:
  """Length buckets every `step` tokens from `min_len` below `max_len`, then `max_len`
  (just `[max_len]` when min_len is None or >= max_len). Tokens."""
  if max_len <= 0 or step <= 0:
    raise ValueError(f'bucket bound and step must be positive, got {max_len}, {step}')
  if min_len is None:
    return [max_len]
  return list(range(min_len, max_len, step)) + [max_len]


# The tiny (CPU) scale's buckets (decision): every 128 tokens from 384, one command
# bucket; on CPU a padded row costs O(T^2), so finer buckets pay for their compilations
# (docs/cpu-scale.md, "Inputs").
TINY_BUCKET_STEP = 128
TINY_MIN_BUCKET = 384


# `derived_buckets_ref(..., step=QUARTER_OCTAVE)`: quarter_octave_buckets.
QUARTER_OCTAVE = 'quarter_octave'


def _buckets_op(min_len: int | None, step: int | str | None, unused_value: Any,
                max_len: int) -> tuple[int, ...]:
  if step is None:
    return tuple(power_of_two_buckets(min_len, int(max_len)))
  if step == QUARTER_OCTAVE:
    return tuple(quarter_octave_buckets(min_len, int(max_len)))
  return tuple(linear_buckets(min_len, int(max_len), step))


def derived_buckets_ref(min_len: int | None,
                        max_len: ml_collections.FieldReference, *,
                        step: int | str | None = None) -> ml_collections.FieldReference:
  """A tuple field equal to power_of_two_buckets(min_len, max_len) whenever read (with
  `step`: linear_buckets(min_len, max_len, step); step=QUARTER_OCTAVE:
  quarter_octave_buckets(min_len, max_len)).

  Assigning a tuple to the field (command line, code) drops the derivation.
  """
  return ml_collections.FieldReference(
      (), field_type=tuple,
      op=_LazyOp(functools.partial(_buckets_op, min_len, step), [max_len]))


def install_tiny_buckets(c: ml_collections.ConfigDict) -> None:
  """Re-derives the three bucket fields of `c` with the tiny scheme (`TINY_*`)."""
  max_prompt = (c.memory.get_ref('policy_input_limit')
                + c.sampling.get_ref('prompt_overhead_tokens'))
  max_cmd = c.sampling.get_ref('max_command_tokens')
  c.sampling.prompt_buckets = derived_buckets_ref(TINY_MIN_BUCKET, max_prompt,
                                                  step=TINY_BUCKET_STEP)
  c.batching.length_buckets = derived_buckets_ref(TINY_MIN_BUCKET, max_prompt + max_cmd,
                                                  step=TINY_BUCKET_STEP)
  c.batching.command_buckets = derived_buckets_ref(None, max_cmd, step=TINY_BUCKET_STEP)


def derived_buckets(config: ml_collections.ConfigDict) -> dict[str, tuple[int, ...]]:
  """The bucket fields as derived from the config's current limits (tokens).

  Returns:
    {'sampling.prompt_buckets': quarter_octave_buckets from MIN_PROMPT_BUCKET, then
     P_max = memory.policy_input_limit + sampling.prompt_overhead_tokens;
     'batching.length_buckets': powers of two from MIN_LENGTH_BUCKET, then
     P_max + sampling.max_command_tokens;
     'batching.command_buckets': powers of two from MIN_COMMAND_BUCKET, then
     sampling.max_command_tokens}.
    At the tiny scale: `linear_buckets` every TINY_BUCKET_STEP tokens from
    TINY_MIN_BUCKET instead, and the one command bucket max_command_tokens.
    These are the values `get_config` installs (lazily, so they follow overrides of
    the three limits); a config whose bucket fields were set by hand may differ.
  """
  max_prompt = (int(config.memory.policy_input_limit)
                + int(config.sampling.prompt_overhead_tokens))
  max_cmd = int(config.sampling.max_command_tokens)
  if config.get('scale') in ('tiny', 'small'):  # small keeps tiny's buckets
    step, low = TINY_BUCKET_STEP, TINY_MIN_BUCKET
    return {
        'sampling.prompt_buckets': tuple(linear_buckets(low, max_prompt, step)),
        'batching.length_buckets': tuple(linear_buckets(low, max_prompt + max_cmd, step)),
        'batching.command_buckets': tuple(linear_buckets(None, max_cmd, step)),
    }
  return {
      'sampling.prompt_buckets': tuple(quarter_octave_buckets(MIN_PROMPT_BUCKET,
                                                              max_prompt)),
      'batching.length_buckets': tuple(power_of_two_buckets(MIN_LENGTH_BUCKET,
                                                            max_prompt + max_cmd)),
      'batching.command_buckets': tuple(power_of_two_buckets(MIN_COMMAND_BUCKET,
                                                             max_cmd)),
  }


def _tokenizer_dir_op(unused_value: Any, data_dir: str, name: str) -> str:
  return paths.tokenizer_path(name, data_dir)


def derived_tokenizer_path_ref(c: ml_collections.ConfigDict
                               ) -> ml_collections.FieldReference:
  """A str field equal to `paths.tokenizer_path(tokenizer.name, data.data_dir)` whenever
  read: the packaged SentencePiece model for a packaged name (`hotpotqa-sp4k`), else
  `<data.data_dir>/tokenizers/<tokenizer.name>`, so `--config.data.data_dir=/elsewhere`
  moves a Hugging Face tokenizer with the data.

  Assigning a path to the field (command line, code) drops the derivation. The
  initial value is '' rather than None: FieldReference skips its ops on None.
  """
  return ml_collections.FieldReference(
      '', field_type=str,
      op=_LazyOp(_tokenizer_dir_op,
                 [c.data.get_ref('data_dir'), c.tokenizer.get_ref('name')]))
