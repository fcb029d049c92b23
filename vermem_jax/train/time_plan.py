"""Planned seconds per RL update, per stage, on named hardware (nothing runs).

The memory plan (`train.memory_plan`) says whether an update fits; this says how long
it takes. An update is (docs/time-plan.md has the table and its assumptions):

  prefill   every generate round prefills its rows at the round's prompt bucket (the
            first round one prompt per task, `sampling.share_prefill`);
  decode    one token step per round until the longest command of the round stops:
            memory-bound (the rollout copy's weights and the KV cache read per step);
  solver    the LLM task solver's greedy call per round (prefill + decode of its reply
            cap), on its frozen copy;
  learner   policy forward + backward (+ remat recompute) and the reference forward on
            every micro-batch, FSDP gathers and reduce-scatters beside it;
  optimizer AdamW over the float32 state, memory-bound;
  verifier  batched verifier requests at an assumed latency;
  dev       one dev evaluation (greedy, chunks of the rollout batch) every
            `rl.eval_every` updates, spread over them.

FLOPs are analytic (`forward_flops`; tests/test_plan_time.py checks them against XLA's
`cost_analysis()` of the memory plan's programs within 10 %), divided over the chips;
times are FLOPs / (peak x efficiency) or bytes / (bandwidth x efficiency), the larger
of the two where a stage is both (`Hardware`, `Efficiency`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from vermem_jax.models import qwen_config


@dataclasses.dataclass(frozen=True)
class Hardware:
  """One accelerator slice (vendors' data sheets; experiments/configs/parts/hardware.py).

  Attributes:
    name: what it is, in words.
    chips: devices the mesh spans.
    peak_flops: dense bf16 FLOP/s per chip.
    hbm_bytes_per_s: HBM bandwidth per chip (bytes/s).
    link_bytes_per_s: chip-to-chip bandwidth per chip, one direction (bytes/s).
    hbm_gb: memory per chip (decimal GB).
    device_kind: the text JAX's `device_kind` holds for this chip (gpu_check.py).
  """
  name: str
  chips: int
  peak_flops: float
  hbm_bytes_per_s: float
  link_bytes_per_s: float
  hbm_gb: float
  device_kind: str = ''


@dataclasses.dataclass(frozen=True)
class Efficiency:
  """Shares of the peaks each kind of work reaches (decisions, docs/time-plan.md)."""
  prefill_mfu: float
  learner_mfu: float
  decode_hbm: float
  collective: float


def layer_matmul_params(mc: qwen_config.QwenConfig) -> int:
  """Weights one token multiplies in one decoder layer: q, k, v, o and the gated MLP."""
  d, hd = mc.hidden_size, mc.head_dim
  attn = d * mc.num_attention_heads * hd * 2 + d * mc.num_key_value_heads * hd * 2
  return attn + 3 * d * mc.intermediate_size


def matrix_params(mc: qwen_config.QwenConfig) -> int:
  """Parameters of every matrix (layers, embedding, untied head): the rollout copy's
  compute-dtype part."""
  head = 0 if mc.tie_word_embeddings else mc.vocab_size * mc.hidden_size
  return (mc.num_hidden_layers * layer_matmul_params(mc)
          + mc.vocab_size * mc.hidden_size + head)


def forward_flops(mc: qwen_config.QwenConfig, rows: int, length: int, keys: int,
                  head_rows: int) -> float:
  """FLOPs of one forward pass (2 per multiply-add of every matmul).

  Args:
    mc: the model.
    rows: sequences; length: query tokens per sequence.
    keys: key positions each query attends over (the kernel computes the whole
      [length, keys] score block; masked entries included).
    head_rows: positions projected onto the vocabulary (all rows' last position at
      prefill, the command positions in the learner).
  """
  tokens = rows * length
  attn = 4 * tokens * keys * mc.num_attention_heads * mc.head_dim
  return (2 * tokens * layer_matmul_params(mc) + attn) * mc.num_hidden_layers + (
      2 * head_rows * mc.hidden_size * mc.vocab_size)


def generate_flops(mc: qwen_config.QwenConfig, prefill_rows: int, batch: int,
                   prompt_len: int, max_new_tokens: int, steps: int) -> float:
  """FLOPs of one generate call: the prefill of `prefill_rows` prompts of
  `prompt_len` tokens (attention over the prompt), the first token of `batch` rows,
  and `steps` decode steps over the cache of prompt_len + max_new_tokens slots."""
  slots = prompt_len + max_new_tokens
  prefill = forward_flops(mc, prefill_rows, prompt_len, prompt_len, prefill_rows)
  first = 2 * batch * mc.hidden_size * mc.vocab_size - 2 * prefill_rows * (
      mc.hidden_size * mc.vocab_size)
  return prefill + first + steps * forward_flops(mc, batch, 1, slots, batch)


def learner_flops(mc: qwen_config.QwenConfig, rows: int, length: int,
                  command_tokens: int) -> float:
  """FLOPs of one learner micro-batch (`loss_step.grpo_loss_and_grads`): the policy's
  forward, backward (2x) and, under remat, the recomputed forward; the reference's
  forward; each head on the `command_tokens` positions of every row."""
  body = forward_flops(mc, rows, length, length, 0)
  head = 2 * rows * command_tokens * mc.hidden_size * mc.vocab_size
  passes = 4 if mc.remat else 3
  return passes * body + body + 3 * head + head


def kv_bytes_per_token(mc: qwen_config.QwenConfig) -> int:
  """KV-cache bytes of one token over all layers (compute dtype)."""
  itemsize = np.dtype(mc.compute_dtype).itemsize
  return 2 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * itemsize


@dataclasses.dataclass(frozen=True)
class EpisodeShape:
  """A measured sample of episodes of one phase (plan_time.py measures it).

  decisions: [E] decisions per episode; prompts: per episode, the policy prompt
  tokens of each decision (x_t in its chat template); commands: command tokens of
  sampled decisions (stop token included); solver_prompts: solver prompt tokens per
  call; solver_calls: [E] solver calls per episode.
  """
  decisions: Sequence[int]
  prompts: Sequence[Sequence[int]]
  commands: Sequence[int]
  solver_prompts: Sequence[int]
  solver_calls: Sequence[int]


@dataclasses.dataclass(frozen=True)
class UpdateShape:
  """The shapes one update's settings fix (from the phase config)."""
  tasks: int
  rollouts: int
  prompt_buckets: tuple[int, ...]
  max_command_tokens: int
  solver_new_tokens: int
  micro_batch: int
  length_buckets: tuple[int, ...]
  command_buckets: tuple[int, ...]
  mini_batches: int
  iterations: int
  eval_every: int
  dev_episodes: int
  verifier_batch: int
  verifier_concurrency: int
  share_prefill: bool = True


def bucket(n: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= n (the largest when none is)."""
  return next((b for b in buckets if b >= n), buckets[-1])


@dataclasses.dataclass
class Work:
  """An update's work, per stage, summed over the mesh (FLOPs, bytes), averaged over
  the sampled updates."""
  flops: dict = dataclasses.field(default_factory=dict)
  hbm_bytes: dict = dataclasses.field(default_factory=dict)
  link_bytes: dict = dataclasses.field(default_factory=dict)
  calls: dict = dataclasses.field(default_factory=dict)

  def add(self, kind: str, stage: str, value: float) -> None:
    table = getattr(self, kind)
    table[stage] = table.get(stage, 0.0) + value


def _rounds(mc, s: UpdateShape, ep: EpisodeShape, rs, work: Work, rows: int,
            repeat: int, stage: str, weight: float) -> None:
  """Adds the generate rounds of `rows` episodes drawn from the sample, each task
  `repeat` times, to `work` under `stage`_prefill, _decode and _solver."""
  idx = rs.randint(len(ep.decisions), size=rows // repeat)
  group = np.repeat(idx, repeat)  # K rollouts of a task start from one state
  copy_bytes = matrix_params(mc) * np.dtype(mc.compute_dtype).itemsize
  kv = kv_bytes_per_token(mc)
  steps_of = max(ep.decisions[i] for i in group)
  solver_round = [0] * steps_of
  for t in range(steps_of):
    live = [i for i in group if ep.decisions[i] > t]
    prompts = [ep.prompts[i][t] for i in live]
    p = bucket(max(prompts), s.prompt_buckets)
    unique = len(idx) if (t == 0 and s.share_prefill) else rows
    unique = min(rows, 1 << max(0, unique - 1).bit_length())
    steps = min(s.max_command_tokens,
                max(ep.commands[j] for j in rs.randint(len(ep.commands), size=len(live))))
    slots = p + s.max_command_tokens
    work.add('flops', f'{stage}_prefill', weight * generate_flops(mc, unique, rows, p,
                                                                  s.max_command_tokens, 0))
    work.add('flops', f'{stage}_decode', weight * steps * forward_flops(mc, rows, 1, slots,
                                                                        rows))
    # Every step each chip streams the (replicated) copy and its rows' cache.
    work.add('hbm_bytes', f'{stage}_decode_per_chip', weight * steps * copy_bytes)
    work.add('hbm_bytes', f'{stage}_decode', weight * steps * rows * slots * kv)
    solver_round[t] = sum(1 for i in live if ep.solver_calls[i] > t)
  for t, callers in enumerate(solver_round):
    if not callers:
      continue
    sp = bucket(max(ep.solver_prompts[j] for j in
                    rs.randint(len(ep.solver_prompts), size=callers)), s.prompt_buckets)
    n = s.solver_new_tokens
    work.add('flops', f'{stage}_solver_prefill',
             weight * generate_flops(mc, rows, rows, sp, n, 0))
    work.add('flops', f'{stage}_solver', weight * n * forward_flops(mc, rows, 1, sp + n,
                                                                    rows))
    work.add('hbm_bytes', f'{stage}_solver_per_chip', weight * n * copy_bytes)
    work.add('hbm_bytes', f'{stage}_solver', weight * n * rows * (sp + n) * kv)
  work.add('calls', f'{stage}_decisions', weight * sum(ep.decisions[i] for i in group))


def update_work(mc: qwen_config.QwenConfig, s: UpdateShape, ep: EpisodeShape, *,
                samples: int = 64, seed: int = 0) -> Work:
  """The mean work of one update over `samples` draws of tasks from `ep`."""
  rs = np.random.RandomState(seed)
  work = Work()
  rows = s.tasks * s.rollouts
  w = 1.0 / samples
  params = matrix_params(mc) + mc.num_hidden_layers * 2 * mc.hidden_size
  for _ in range(samples):
    _rounds(mc, s, ep, rs, work, rows, s.rollouts, 'rollout', w)
    # Learner: decisions sorted by length into micro-batches, each padded to its
    # length bucket and its command bucket.
    idx = rs.randint(len(ep.decisions), size=s.tasks)
    rows_lc = sorted((ep.prompts[i][t] + c, c) for i in np.repeat(idx, s.rollouts)
                     for t in range(ep.decisions[i])
                     for c in [ep.commands[rs.randint(len(ep.commands))]])
    lengths = [n for n, _ in rows_lc]
    for k in range(0, len(rows_lc), s.micro_batch):
      part = rows_lc[k:k + s.micro_batch]
      t_len = bucket(max(n for n, _ in part), s.length_buckets)
      cmd = bucket(max(c for _, c in part), s.command_buckets)
      work.add('flops', 'learner', w * s.iterations * learner_flops(
          mc, s.micro_batch, t_len, cmd))
      # FSDP: three bf16 gathers of θ (forward, remat backward, reference) and one
      # float32 reduce-scatter of the gradient per micro-batch.
      work.add('link_bytes', 'learner', w * s.iterations * params * (3 * 2 + 4))
    # AdamW: read θ, m, v, the gradient sum; write θ, m, v (float32).
    work.add('hbm_bytes', 'optimizer', w * s.iterations * s.mini_batches * params * 4 * 7)
    work.add('calls', 'verifier', w * (math.ceil(len(lengths) / s.verifier_batch)
                                       + math.ceil(rows / s.verifier_batch)))
  # Dev: every eval_every updates, dev_episodes greedy in chunks of the rollout batch.
  chunks = math.ceil(s.dev_episodes / rows)
  w_dev = chunks / max(1, s.eval_every)
  for _ in range(samples):
    _rounds(mc, s, ep, rs, work, rows, 1, 'dev', w_dev / samples)
  return work


def stage_seconds(work: Work, hw: Hardware, eff: Efficiency,
                  verifier_call_s: float, verifier_concurrency: int) -> dict[str, float]:
  """Seconds per update of each stage on `hw` (module docstring)."""
  f, b, l = work.flops, work.hbm_bytes, work.link_bytes
  flop_s = lambda x, mfu: x / (hw.chips * hw.peak_flops * mfu)
  hbm_s = lambda x: x / (hw.chips * hw.hbm_bytes_per_s * eff.decode_hbm)
  out = {}
  # Each chip reads the whole (replicated) copy per decode step: those bytes go over
  # one chip's bandwidth, the KV cache over all chips'.
  memory_bound = lambda key: max(
      b.get(f'{key}_per_chip', 0) / (hw.hbm_bytes_per_s * eff.decode_hbm)
      + hbm_s(b.get(key, 0)), flop_s(f.get(key, 0), eff.prefill_mfu))
  for stage in ('rollout', 'dev'):
    out[f'{stage}_prefill'] = flop_s(f.get(f'{stage}_prefill', 0), eff.prefill_mfu)
    out[f'{stage}_decode'] = memory_bound(f'{stage}_decode')
    out[f'{stage}_solver'] = (flop_s(f.get(f'{stage}_solver_prefill', 0), eff.prefill_mfu)
                              + memory_bound(f'{stage}_solver'))
  link = l.get('learner', 0) * (hw.chips - 1) / hw.chips / (
      hw.link_bytes_per_s * eff.collective)
  out['learner'] = max(flop_s(f.get('learner', 0), eff.learner_mfu), link)
  out['optimizer'] = b.get('optimizer', 0) / (hw.chips * hw.hbm_bytes_per_s
                                              * eff.decode_hbm)
  out['verifier'] = (math.ceil(work.calls.get('verifier', 0) / verifier_concurrency)
                     * verifier_call_s)
  return out
