"""Tokenized SFT examples and the order optimizer steps visit them (SPEC §4; App. D.3).

Data. `envs.sft_data.build_sft_set` gives train and dev records (x_i, u*_i) from the
construction and internal-dev pools of the HotpotQA train split. Each record becomes
one `batching.DecisionTokens` row:

    prompt  = the policy prompt of x_i (`rl.policy.policy_prompt_ids`: the tokenizer's
              chat template with x_i as the one user message plus the assistant
              generation prompt) — the token ids the RL sampler conditions on;
    command = tokens of u*_i followed by the stop token (`rl.policy.command_target_ids`;
              Qwen: `<|im_end|>`), so the policy learns to stop after one command.

Records whose prompt + command exceed the largest length bucket, or whose command
exceeds `sampling.max_command_tokens` (the policy could never emit it), are dropped and
counted (`tokenize_records`).

Data order. Epoch e visits the train records in `np.random.default_rng([seed, e])`
order (`epoch_permutation`), seed = `config.seed`; optimizer step s (0-based) uses batch
s mod steps_per_epoch of epoch s // steps_per_epoch (`batch_indices`). The order is a
pure function of the step, so a restored step continues exactly where the killed run
stopped. The last batch of an epoch may be smaller.

Length grouping (`sft.length_group_batches` = G > 0; decision, the idea of HF's
`group_by_length`): the epoch's random order is cut into chunks of G batches, each
chunk is sorted by sequence length (longest first, ties in random order), cut into
batches, and the batches of the epoch are shuffled. A batch then pads to a length close
to its longest member's (measured at the CPU scale: 571 instead of 677 padded tokens
per row for 504 real ones), and every record is still visited once per epoch.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from vermem_jax.envs.sft_data import records as sft_records
from vermem_jax import tokenization
from vermem_jax.rl import batching
from vermem_jax.rl import policy


@dataclasses.dataclass(frozen=True)
class SFTExample:
  """A tokenized SFT record.

  Attributes:
    prompt_tokens: policy prompt ids [T_in] (`rl.policy.policy_prompt_ids(x_i)`).
    command_tokens: ids of u*_i + the stop token [L] (`rl.policy.command_target_ids`;
      the only tokens with loss).
    record: the `episodes.SFTRecord` (op, phase, state s_i, target text).
  """
  prompt_tokens: tuple[int, ...]
  command_tokens: tuple[int, ...]
  record: sft_records.SFTRecord

  def decision(self) -> batching.DecisionTokens:
    """The learner row: no old logprobs (unused by the SFT loss), advantage 1."""
    return batching.DecisionTokens(self.prompt_tokens, self.command_tokens,
                                   (0.0,) * len(self.command_tokens), 1.0)


def learner_limits(length_buckets: Sequence[int], command_buckets: Sequence[int],
                   max_command_tokens: int) -> dict[str, int]:
  """The `tokenize_records` limits of the learner shapes: the largest length bucket,
  and the smaller of the largest command bucket and `sampling.max_command_tokens`
  (tokens)."""
  return dict(max_sequence_tokens=int(length_buckets[-1]),
              max_command_tokens=min(int(command_buckets[-1]), int(max_command_tokens)))


def tokenize_records(records: Sequence[sft_records.SFTRecord],
                     tokenizer: tokenization.Tokenizer, *, max_sequence_tokens: int,
                     max_command_tokens: int) -> tuple[list[SFTExample], dict[str, int]]:
  """Tokenizes records; drops (and counts) those that do not fit the learner shapes.

  Args:
    records: SFT records.
    tokenizer: policy tokenizer.
    max_sequence_tokens: largest prompt + command length (the largest length bucket).
    max_command_tokens: largest command length incl. the stop token (min of the
      largest command bucket and `sampling.max_command_tokens`).
  Returns:
    (examples in record order, {'command_too_long': n, 'sequence_too_long': n}).
  """
  dropped = {'command_too_long': 0, 'sequence_too_long': 0}
  out = []
  for rec in records:
    prompt = policy.policy_prompt_ids(tokenizer, rec.policy_input)
    command = tuple(policy.command_target_ids(tokenizer, rec.target))
    if len(command) > max_command_tokens:
      dropped['command_too_long'] += 1
      continue
    if len(prompt) + len(command) > max_sequence_tokens:
      dropped['sequence_too_long'] += 1
      continue
    out.append(SFTExample(tuple(prompt), command, rec))
  return out, dropped


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
  """ceil(num_examples / batch_size) optimizer steps per epoch."""
  if num_examples < 1 or batch_size < 1:
    raise ValueError(f'need >= 1 example and batch size, got {num_examples}, {batch_size}')
  return -(-num_examples // batch_size)


def epoch_permutation(num_examples: int, epoch: int, seed: int, *,
                      lengths: Sequence[int] | None = None, batch_size: int = 1,
                      group_batches: int = 0) -> np.ndarray:
  """Order in which epoch `epoch` visits the examples: [num_examples] int64.

  Args:
    num_examples, epoch, seed: a seeded random permutation per epoch.
    lengths: [num_examples] sequence lengths (tokens); used when group_batches > 0.
    batch_size: records per optimizer step (the unit of the grouped order).
    group_batches: 0 for the plain permutation, else the length grouping of the module
      docstring with chunks of `group_batches` batches.
  Raises:
    ValueError: group_batches > 0 without one length per example.
  """
  rng = np.random.default_rng([int(seed), int(epoch)])
  order = rng.permutation(num_examples)
  if group_batches <= 0:
    return order
  if lengths is None or len(lengths) != num_examples:
    raise ValueError(f'length grouping needs {num_examples} lengths, got '
                     f'{None if lengths is None else len(lengths)}')
  lengths = np.asarray(lengths)
  chunk = int(group_batches) * int(batch_size)
  grouped = np.concatenate([
      c[np.argsort(-lengths[c], kind='stable')]
      for c in np.split(order, range(chunk, num_examples, chunk))])
  batches = np.split(grouped, range(batch_size, num_examples, batch_size))
  # A smaller last batch stays last, as in the plain order.
  full = [b for b in batches if len(b) == batch_size]
  rest = [b for b in batches if len(b) != batch_size]
  return np.concatenate([full[i] for i in rng.permutation(len(full))] + rest)


def batch_indices(step: int, num_examples: int, batch_size: int, seed: int, *,
                  lengths: Sequence[int] | None = None,
                  group_batches: int = 0) -> tuple[np.ndarray, int, int]:
  """Example indices of 0-based optimizer step `step`, with its (epoch, batch index).

  `lengths` / `group_batches`: the length grouping of `epoch_permutation`.
  """
  spe = steps_per_epoch(num_examples, batch_size)
  epoch, b = divmod(int(step), spe)
  order = epoch_permutation(num_examples, epoch, seed, lengths=lengths,
                            batch_size=batch_size, group_batches=group_batches)
  return order[b * batch_size:(b + 1) * batch_size], epoch, b

