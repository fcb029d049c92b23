"""Learner batches: padded command sequences in a bounded set of shapes (DESIGN.md).

One row per memory decision u_{t,k}: the policy input x_t = g(s_t) (prompt tokens)
followed by the L_{t,k} generated command tokens, right-padded to a length bucket.
Only command tokens are trained (SPEC §6, paper App. F.6): the prompt (task, serialized
M/C/H, system text) and padding have loss_mask 0.

Two views of the same rows:

Full-sequence arrays `[B, T]`, aligned with the *tokens* (index j describes token j):
  input_ids      int32   prompt + command, right-padded with `pad_id`
  attention_mask int32   1 on real tokens
  positions      int32   cumsum(attention_mask) - 1 clipped at 0 (the model's default)
  loss_mask      float32 1 on command tokens only
  command_ids    int32   decision id (1-based within the update) on its command
                         tokens, 0 elsewhere
  advantages     float32 A^hier of the decision on each of its command tokens
  token_weights  float32 1 / (L_{t,k} * N) on command tokens, N = decisions in the
                         whole update, so summing weight x token loss over all
                         micro-batches gives the mean over decisions of each command's
                         mean token loss (SPEC §6)
  old_logprobs   float32 log π_θold(token j | tokens < j) from the sampler

Command-position gather arrays `[B, L]` (L = command-length bucket) for a loss that
projects only command positions onto the vocabulary (issue 5):
  command_positions int32 for the i-th command token at sequence index j, the value
                          j - 1: the hidden state at j - 1 predicts token j (the usual
                          one-token shift of causal LM logits). 0 on padding.
  target_ids        int32 the token at index j (= input_ids[b, command_positions + 1])
  command_mask      float32 1 on real command tokens
  command_ids_l, advantages_l, old_logprobs_l, token_weights_l  the full arrays'
                          values at index j.
  num_decisions     int32 scalar N (same in every micro-batch of an update).

Rows added to fill the last micro-batch have weight 0 everywhere and a single attended
pad token (so no attention row is empty and no softmax sees only masked keys).

Shapes: B = micro_batch_size; T is the smallest length bucket >= the longest row in the
micro-batch; L is the smallest command bucket >= the longest command. So jit compiles at
most len(length_buckets) x len(command_buckets) loss functions.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

import numpy as np

FULL_KEYS = ('input_ids', 'attention_mask', 'positions', 'loss_mask', 'command_ids',
             'advantages', 'token_weights', 'old_logprobs')
GATHER_KEYS = ('command_positions', 'target_ids', 'command_mask', 'command_ids_l',
               'advantages_l', 'old_logprobs_l', 'token_weights_l')


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
  """Learner batch shapes (config section `batching`).

  Attributes:
    micro_batch_size: rows B per micro-batch (decisions).
    length_buckets: increasing sequence lengths T (tokens); the last one must cover the
      longest row: policy input limit + chat-template overhead + longest command
      (8,192 (SPEC §1) + 64 + 256 = 8,512 by default;
      experiments/configs/parts/derived.py derives the same from its config).
    command_buckets: increasing command lengths L (tokens).
    sort_by_length: order decisions by length before splitting into micro-batches (less
      padding; the update's gradient sum is unchanged).
    loss_chunk_size: command positions per vocabulary chunk of the learner's head and
      loss (rl/token_stats.py; loss_step.DEFAULT_LOSS_CHUNK_SIZE); None = unchunked.
  """
  micro_batch_size: int = 8
  length_buckets: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 8512)
  command_buckets: tuple[int, ...] = (16, 32, 64, 128, 256)
  sort_by_length: bool = True
  loss_chunk_size: Optional[int] = 128

  def __post_init__(self):
    if self.micro_batch_size < 1:
      raise ValueError(f'micro_batch_size must be >= 1, got {self.micro_batch_size}')
    if self.loss_chunk_size is not None and self.loss_chunk_size < 1:
      raise ValueError(f'loss_chunk_size must be None or >= 1, got '
                       f'{self.loss_chunk_size}')
    for name in ('length_buckets', 'command_buckets'):
      b = tuple(int(x) for x in getattr(self, name))
      if not b or any(x <= 0 for x in b) or list(b) != sorted(set(b)):
        raise ValueError(f'{name} must be positive and strictly increasing, got {b}')
      object.__setattr__(self, name, b)


@dataclasses.dataclass(frozen=True)
class DecisionTokens:
  """One trainable memory decision (from a rollout record; DESIGN.md).

  Attributes:
    prompt_tokens: token ids of the policy input x_t (chat-templated g(s_t)); non-empty.
    command_tokens: token ids of the generated command u_t (L >= 1 tokens, including
      the stop token if the sampler returned it).
    old_logprobs: sampler log-probabilities of `command_tokens` under θ_old, [L].
    advantage: A^hier_{t,k} (SPEC §6); for SFT use 1.0.
  """
  prompt_tokens: Sequence[int]
  command_tokens: Sequence[int]
  old_logprobs: Sequence[float]
  advantage: float


def decision_from_policy_output(output, advantage: float) -> DecisionTokens:
  """DecisionTokens from a rollout's `envs.environment.PolicyOutput` and its A^hier.

  Args:
    output: has `prompt_ids` [T_in], `token_ids` [L] and `logprobs` [L] (the sampler
      fills them for training rollouts).
    advantage: A^hier_{t,k}.
  Raises:
    ValueError: the output lacks token ids or logprobs (a scripted / text-only policy).
  """
  missing = [k for k in ('prompt_ids', 'token_ids', 'logprobs')
             if getattr(output, k, None) is None]
  if missing:
    raise ValueError(f'policy output {getattr(output, "text", "")[:60]!r} has no '
                     f'{missing}; training rollouts need the sampler token ids and '
                     'logprobs')
  return DecisionTokens(tuple(output.prompt_ids), tuple(output.token_ids),
                        tuple(float(x) for x in output.logprobs), float(advantage))


def pick_bucket(length: int, buckets: Sequence[int], what: str = 'length') -> int:
  """Smallest bucket >= `length`.

  Raises:
    ValueError: `length` exceeds the largest bucket (names both).
  """
  for b in buckets:
    if length <= b:
      return int(b)
  raise ValueError(f'{what} {length} exceeds the largest bucket {buckets[-1]}')


def _check(i: int, d: DecisionTokens) -> None:
  if len(d.prompt_tokens) == 0:
    raise ValueError(f'decision {i}: empty prompt (a command token needs a predecessor)')
  if len(d.command_tokens) == 0:
    raise ValueError(f'decision {i}: empty command')
  if len(d.old_logprobs) != len(d.command_tokens):
    raise ValueError(f'decision {i}: {len(d.old_logprobs)} old logprobs for '
                     f'{len(d.command_tokens)} command tokens')
  if not np.isfinite(d.advantage):
    raise ValueError(f'decision {i}: advantage {d.advantage} is not finite')


def build_batch(decisions: Sequence[DecisionTokens], config: BatchingConfig, *,
                num_decisions: int, ids: Sequence[int] | None = None,
                pad_id: int = 0, batch_size: int | None = None) -> dict[str, np.ndarray]:
  """Packs decisions into one fixed-shape learner micro-batch.

  Args:
    decisions: up to `batch_size` decisions (rows).
    config: bucket sizes.
    num_decisions: N, the number of decisions in the whole update (weights divide by it).
    ids: command id of each row (>= 1, unique within the update); default 1, 2, ...
    pad_id: token id used for padding (the tokenizer's pad id).
    batch_size: rows B (default config.micro_batch_size); missing rows are padding.
  Returns:
    dict of NumPy arrays, keys FULL_KEYS ([B, T]), GATHER_KEYS ([B, L]) and
    'num_decisions' (int32 scalar); dtypes as in the module docstring.
  Raises:
    ValueError: too many decisions, malformed decisions, lengths over the buckets.
  """
  b_rows = batch_size or config.micro_batch_size
  if len(decisions) > b_rows:
    raise ValueError(f'{len(decisions)} decisions do not fit a batch of {b_rows}')
  if num_decisions < len(decisions) or num_decisions < 1:
    raise ValueError(f'num_decisions={num_decisions} < decisions in this batch '
                     f'({len(decisions)})')
  ids = list(range(1, len(decisions) + 1)) if ids is None else [int(i) for i in ids]
  if len(ids) != len(decisions) or any(i < 1 for i in ids):
    raise ValueError(f'need one command id >= 1 per decision, got {ids}')
  for i, d in zip(ids, decisions):
    _check(i - 1, d)
  max_len = max([len(d.prompt_tokens) + len(d.command_tokens) for d in decisions] + [1])
  max_cmd = max([len(d.command_tokens) for d in decisions] + [1])
  t = pick_bucket(max_len, config.length_buckets, 'sequence length')
  l = pick_bucket(max_cmd, config.command_buckets, 'command length')

  out = {
      'input_ids': np.full((b_rows, t), pad_id, np.int32),
      'attention_mask': np.zeros((b_rows, t), np.int32),
      'loss_mask': np.zeros((b_rows, t), np.float32),
      'command_ids': np.zeros((b_rows, t), np.int32),
      'advantages': np.zeros((b_rows, t), np.float32),
      'token_weights': np.zeros((b_rows, t), np.float32),
      'old_logprobs': np.zeros((b_rows, t), np.float32),
      'command_positions': np.zeros((b_rows, l), np.int32),
      'target_ids': np.zeros((b_rows, l), np.int32),
      'command_mask': np.zeros((b_rows, l), np.float32),
      'command_ids_l': np.zeros((b_rows, l), np.int32),
      'advantages_l': np.zeros((b_rows, l), np.float32),
      'old_logprobs_l': np.zeros((b_rows, l), np.float32),
      'token_weights_l': np.zeros((b_rows, l), np.float32),
  }
  for row, d in enumerate(decisions):
    p, c = len(d.prompt_tokens), len(d.command_tokens)
    cmd = slice(p, p + c)
    weight = 1.0 / (c * num_decisions)
    out['input_ids'][row, :p] = d.prompt_tokens
    out['input_ids'][row, cmd] = d.command_tokens
    out['attention_mask'][row, :p + c] = 1
    out['loss_mask'][row, cmd] = 1.0
    out['command_positions'][row, :c] = np.arange(p - 1, p + c - 1)
    out['target_ids'][row, :c] = d.command_tokens
    out['command_mask'][row, :c] = 1.0
    # Per-command values: on the command's tokens [T] and, gathered, in `key_l` [L].
    for key, value in (('command_ids', ids[row]), ('advantages', d.advantage),
                       ('token_weights', weight), ('old_logprobs', d.old_logprobs)):
      out[key][row, cmd] = value
      out[f'{key}_l'][row, :c] = value
  # Padding rows: one attended pad token, weight 0 (see module docstring).
  out['attention_mask'][len(decisions):, 0] = 1
  out['positions'] = np.maximum(np.cumsum(out['attention_mask'], axis=1) - 1,
                                0).astype(np.int32)
  out['num_decisions'] = np.asarray(num_decisions, np.int32)
  return out


def micro_batches(decisions: Sequence[DecisionTokens], config: BatchingConfig, *,
                  pad_id: int = 0) -> list[dict[str, np.ndarray]]:
  """Splits one update's decisions into padded micro-batches of config.micro_batch_size.

  Weights are normalized by the number of decisions in the whole update, so the sum
  over micro-batches of Σ token_weights x token loss is the update's loss (SPEC §6:
  each command's token losses averaged over its L tokens, then over all decisions,
  null and rejected included). Command ids are unique across the update (1..N, in input
  order, whatever the batching order).

  Args:
    decisions: all decisions of the update (N >= 1).
    config: micro-batch size and buckets.
    pad_id: padding token id.
  Returns:
    ceil(N / micro_batch_size) batches from `build_batch`.
  Raises:
    ValueError: no decisions, or a decision that is malformed / too long.
  """
  n = len(decisions)
  if n == 0:
    raise ValueError('an update needs at least one decision')
  order = list(range(n))
  if config.sort_by_length:
    order.sort(key=lambda i: (len(decisions[i].prompt_tokens) +
                              len(decisions[i].command_tokens), i))
  batches = []
  mb = config.micro_batch_size
  for start in range(0, n, mb):
    idx = order[start:start + mb]
    batches.append(build_batch([decisions[i] for i in idx], config, num_decisions=n,
                               ids=[i + 1 for i in idx], pad_id=pad_id))
  return batches


def mini_batch_partition(num_decisions: int, num_mini_batches: int,
                         rng: np.random.Generator | None) -> list[np.ndarray]:
  """Splits an update's decision indices into mini-batches for one PPO pass.

  Args:
    num_decisions: N >= 1.
    num_mini_batches: requested mini-batches per pass (>= 1); more than N gives N
      mini-batches of one decision.
    rng: shuffles the indices first (a fresh permutation per pass); None keeps them
      in order.
  Returns:
    min(num_mini_batches, N) non-empty int64 index arrays whose sizes differ by at most
    one, together a permutation of range(N).
  Raises:
    ValueError: num_decisions < 1 or num_mini_batches < 1.
  """
  if num_decisions < 1 or num_mini_batches < 1:
    raise ValueError(f'need num_decisions >= 1 and num_mini_batches >= 1, got '
                     f'{num_decisions} and {num_mini_batches}')
  order = (rng.permutation(num_decisions) if rng is not None
           else np.arange(num_decisions))
  return [np.asarray(p, np.int64)
          for p in np.array_split(order, min(num_mini_batches, num_decisions))]


def values_by_decision(batch: Mapping[str, np.ndarray],
                       values_l: np.ndarray) -> dict[int, np.ndarray]:
  """{command id: [L_d] values} from a [B, L] array aligned with `batch`'s command
  tokens (e.g. learner log-probs of `to_step_batch(batch)`); padding rows are skipped."""
  values_l = np.asarray(values_l)
  out = {}
  for row in range(values_l.shape[0]):
    mask = batch['command_mask'][row] > 0
    if mask.any():
      out[int(batch['command_ids_l'][row][mask][0])] = values_l[row][mask]
  return out


def to_step_batch(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The model-step layout of vermem_jax.rl.grpo (`STEP_BATCH_KEYS` + positions).

  Renames the gather arrays to the loss's names ('command_ids', 'advantages',
  'old_logprobs' become the [B, L] views); equal to
  `grpo.select_command_tokens(batch, L)` on the full arrays, without the host loop.
  """
  return {'input_ids': batch['input_ids'], 'attention_mask': batch['attention_mask'],
          'positions': batch['positions'],
          'command_positions': batch['command_positions'],
          'target_ids': batch['target_ids'], 'command_ids': batch['command_ids_l'],
          'advantages': batch['advantages_l'], 'old_logprobs': batch['old_logprobs_l']}


def batch_shapes(batches: Sequence[Mapping[str, np.ndarray]]) -> set[tuple[int, int, int]]:
  """Distinct (B, T, L) shapes among batches (each one is a jit compilation)."""
  return {(b['input_ids'].shape[0], b['input_ids'].shape[1], b['target_ids'].shape[1])
          for b in batches}
