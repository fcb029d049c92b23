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


# Smallest sampler prompt bucket and learner length bucket (tokens; decision): x_t holds
# the instruction block and the command list, a few hundred tokens at least, so smaller
# buckets would only add compilations.
MIN_PROMPT_BUCKET = 256
MIN_LENGTH_BUCKET = 256
MIN_COMMAND_BUCKET = 16  # decision: short commands (Null, Delete) are ~10-20 tokens

# A lazy FieldReference operation: `fn(value, *args)` with the args dereferenced when the
# field is read. Same fields as ml_collections' (private) op record, which is what
# FieldReference's documented `op` argument expects.
_LazyOp = collections.namedtuple('_LazyOp', ['fn', 'args'])


def _buckets_op(min_len: int, unused_value: Any, max_len: int) -> tuple[int, ...]:
  return tuple(power_of_two_buckets(min_len, int(max_len)))


def derived_buckets_ref(min_len: int,
                        max_len: ml_collections.FieldReference
                        ) -> ml_collections.FieldReference:
  """A tuple field equal to power_of_two_buckets(min_len, max_len) whenever read.

  Assigning a tuple to the field (command line, code) drops the derivation.
  """
  return ml_collections.FieldReference(
      (), field_type=tuple,
      op=_LazyOp(functools.partial(_buckets_op, min_len), [max_len]))


def derived_buckets(config: ml_collections.ConfigDict) -> dict[str, tuple[int, ...]]:
  """The bucket fields as derived from the config's current limits (tokens).

  Returns:
    {'sampling.prompt_buckets': powers of two from MIN_PROMPT_BUCKET, then
     P_max = memory.policy_input_limit + sampling.prompt_overhead_tokens;
     'batching.length_buckets': powers of two from MIN_LENGTH_BUCKET, then
     P_max + sampling.max_command_tokens;
     'batching.command_buckets': powers of two from MIN_COMMAND_BUCKET, then
     sampling.max_command_tokens}.
    These are the values `get_config` installs (lazily, so they follow overrides of
    the three limits); a config whose bucket fields were set by hand may differ.
  """
  max_prompt = (int(config.memory.policy_input_limit)
                + int(config.sampling.prompt_overhead_tokens))
  max_cmd = int(config.sampling.max_command_tokens)
  return {
      'sampling.prompt_buckets': tuple(power_of_two_buckets(MIN_PROMPT_BUCKET,
                                                            max_prompt)),
      'batching.length_buckets': tuple(power_of_two_buckets(MIN_LENGTH_BUCKET,
                                                            max_prompt + max_cmd)),
      'batching.command_buckets': tuple(power_of_two_buckets(MIN_COMMAND_BUCKET,
                                                             max_cmd)),
  }


def _tokenizer_dir_op(unused_value: Any, data_dir: str, name: str) -> str:
  return paths.tokenizer_dir(name, data_dir)


def derived_tokenizer_path_ref(c: ml_collections.ConfigDict
                               ) -> ml_collections.FieldReference:
  """A str field equal to `<data.data_dir>/tokenizers/<tokenizer.name>` whenever read,
  so `--config.data.data_dir=/elsewhere` moves the tokenizer with the data.

  Assigning a path to the field (command line, code) drops the derivation. The
  initial value is '' rather than None: FieldReference skips its ops on None.
  """
  return ml_collections.FieldReference(
      '', field_type=str,
      op=_LazyOp(_tokenizer_dir_op,
                 [c.data.get_ref('data_dir'), c.tokenizer.get_ref('name')]))
