"""The memory-operation policy π_θ as a batched sampler callable (SPEC §4, App. D.5).

Prompt format (one definition for SFT, rollouts and evaluation)
----------------------------------------------------------------
x_t = g(s_t) (memory.render_policy_input) already holds the instruction block, the
allowed commands and the serialized state, ending in "Command:". The policy prompt is
the tokenizer's chat template applied to ONE user message whose content is x_t, with
the generation prompt appended (`policy_messages` / `policy_prompt_ids`). No system
message of ours is added: the instruction lives in x_t; a template that injects a
default system turn (Qwen2.5) does so identically in SFT, RL and evaluation. The
command u_t is the assistant reply; the tokens the learner trains on are the command
tokens followed by the stop token (`<|im_end|>` for Qwen chat models), so the policy
learns to end its command. `command_target_ids` builds the same layout for SFT targets.

Token accounting: the prompt is x_t plus the template's few fixed tokens (measured by
`prompt_overhead_tokens(tokenizer)`: 29 on Qwen2.5; 8 on Qwen3, 12 with
enable_thinking=False). The config reserves an upper bound for them,
`sampling.prompt_overhead_tokens` (64), so the longest prompt is
policy_input_limit + prompt_overhead_tokens tokens: the sampler's largest prompt bucket
(`sampling.prompt_buckets`) ends exactly there and the learner's largest length bucket
is that plus max_command_tokens (experiments/configs/parts/derived.py derives both).
`SamplerPolicy` refuses a tokenizer whose template needs more than the reserved
overhead. Prompts are never truncated (g(s) is already bounded; cutting a rendered
state would corrupt it); a prompt longer than `max_prompt_tokens` raises.

Sampling (`SamplerPolicy`)
--------------------------
`SamplerPolicy(...)(inputs, rng)` encodes all x_t of the live episodes, pads the batch
to a fixed size bucket (so the jitted sampler compiles for a bounded set of batch
sizes; more rows than the largest bucket run in chunks of it,
`models.batch_chunks`), calls `models.generate` once per chunk (temperature 0.7 / top-p 0.95 for rollouts,
greedy for evaluation), and returns one `environment.PolicyOutput` per input with
the prompt ids, the command token ids (stop token included when generated), their
sampler logprobs (under the sampling distribution, see models/sampling.py) and the
command text (decoded without the stop token, surrounding whitespace stripped). Same
params + same rng + same inputs -> same outputs. Set `policy.params` to θ_old before
each update's collection (the sampler closes over nothing else).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from vermem_jax.envs import episode_types
from vermem_jax.models import batch_chunks
from vermem_jax.models import qwen_config
from vermem_jax.models import sampling


@dataclasses.dataclass(frozen=True)
class PolicySamplingConfig:
  """Policy decoding (config section `sampling`; field names = its keys).

  Attributes:
    temperature: rollout sampling temperature (SPEC §4: 0.7).
    top_p: rollout nucleus mass (SPEC §4: 0.95).
    eval_temperature: evaluation temperature (SPEC §4: 0 = greedy).
    max_command_tokens: generation limit of one command in tokens (decision; the
      paper leaves command output limits to the configured protocol).
    prompt_overhead_tokens: tokens reserved for the chat-template framing around x_t
      (decision: 64, an upper bound; Qwen2.5 needs 29, Qwen3 8-12). `SamplerPolicy`
      checks the tokenizer's real overhead against it.
    prompt_buckets: padded prompt lengths of the sampler in tokens (strictly
      increasing; the config derives powers of two ending exactly at
      policy_input_limit + prompt_overhead_tokens). None: the sampler's power-of-two
      default (models/sampling.py).
    share_prefill: prefill each distinct prompt of a call once and share its KV cache
      among the rows that repeat it (the K rollouts' first prompts; same tokens as
      without sharing; models/sampling.py).
  """
  temperature: float = 0.7  # SPEC §4
  top_p: float = 0.95  # SPEC §4
  eval_temperature: float = 0.0  # SPEC §4: evaluation decodes greedily
  max_command_tokens: int = 256  # decision (experiments/configs/parts/paper.py)
  prompt_overhead_tokens: int = 64  # decision (experiments/configs/parts/paper.py)
  prompt_buckets: Optional[tuple[int, ...]] = None  # None: powers of two
  share_prefill: bool = True

  def __post_init__(self):
    if not self.temperature >= 0 or not self.eval_temperature >= 0:
      raise ValueError('PolicySamplingConfig: temperatures must be >= 0, got '
                       f'{self.temperature}, {self.eval_temperature}')
    if not 0 < self.top_p <= 1:
      raise ValueError(f'PolicySamplingConfig.top_p must be in (0, 1], got {self.top_p}')
    if int(self.max_command_tokens) < 1:
      raise ValueError('PolicySamplingConfig.max_command_tokens must be >= 1, got '
                       f'{self.max_command_tokens}')
    if int(self.prompt_overhead_tokens) != self.prompt_overhead_tokens or (
        self.prompt_overhead_tokens < 0):
      raise ValueError('PolicySamplingConfig.prompt_overhead_tokens must be an int >= 0, '
                       f'got {self.prompt_overhead_tokens!r}')
    try:
      buckets = sampling.check_prompt_buckets(self.prompt_buckets)
    except ValueError as e:
      raise ValueError(f'PolicySamplingConfig.prompt_buckets: {e}') from e
    object.__setattr__(self, 'prompt_buckets', buckets)


def policy_messages(policy_input: str) -> list[dict[str, str]]:
  """Chat messages of the policy prompt: one user turn holding x_t (module docstring)."""
  if not isinstance(policy_input, str) or not policy_input:
    raise ValueError('policy_messages: x_t must be a non-empty string')
  return [{'role': 'user', 'content': policy_input}]


def policy_prompt_text(tokenizer, policy_input: str,
                       chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> str:
  """The policy prompt string: chat template of x_t with the generation prompt."""
  return tokenizer.apply_chat_template(policy_messages(policy_input),
                                       add_generation_prompt=True,
                                       **dict(chat_template_kwargs or {}))


def policy_prompt_ids(tokenizer, policy_input: str,
                      chat_template_kwargs: Optional[Mapping[str, Any]] = None
                      ) -> list[int]:
  """Token ids [T_in] of the policy prompt for x_t (what SFT and RL condition on)."""
  return tokenizer.encode(policy_prompt_text(tokenizer, policy_input,
                                             chat_template_kwargs))


def command_target_ids(tokenizer, command_text: str) -> list[int]:
  """Trainable command tokens [L] for an SFT target: encode(u) + [eos] (Qwen: <|im_end|>).

  The layout equals what `SamplerPolicy` records for a command that stopped normally,
  so SFT and RL train the same tokens.
  """
  return list(tokenizer.encode(command_text)) + [int(tokenizer.eos_token_id)]


def prompt_overhead_tokens(tokenizer,
                           chat_template_kwargs: Optional[Mapping[str, Any]] = None
                           ) -> int:
  """Tokens the chat template adds around x_t (measured on a one-word x_t)."""
  probe = 'x'
  return len(policy_prompt_ids(tokenizer, probe, chat_template_kwargs)) - len(
      tokenizer.encode(probe))


class SamplerPolicy:
  """π_θ(u_t | x_t) backed by the jitted KV-cache sampler (one generate call per step).

  Args:
    model_config: QwenConfig of the policy.
    params: policy parameter tree (θ, frozen as θ_old for the update's rollouts).
    tokenizer: `vermem_jax.tokenization.Tokenizer` (chat template, stop ids).
    sampling_config: PolicySamplingConfig; its `prompt_buckets` go to every generate
      call and its `prompt_overhead_tokens` must cover the tokenizer's chat template.
    greedy: decode with eval_temperature (evaluation) instead of temperature/top_p.
    batch_buckets: allowed padded batch sizes (sorted); a step with n live episodes
      runs at the smallest bucket >= n, and more rows than the largest bucket run in
      chunks of it, the short last chunk padded (`models.batch_chunks`; padding rows
      repeat a prompt and are dropped). Default: powers of two. The trainers pass
      the rollout batch (tasks_per_update * K,) for rollouts and internal dev, so
      every call of a phase has one batch shape.
    max_prompt_tokens: a prompt longer than this raises ValueError (None: the
      smaller of the largest prompt bucket, when buckets are set, and the model's
      max_position_embeddings - max_command_tokens).
    chat_template_kwargs: extra template arguments (Qwen3: enable_thinking=False).
    generate_fn: the sampler (default `models.sampling.generate`; tests may count
      calls).
    group: collective mode for multi-process rollouts (train/distributed.py
      ProcessGroup: `index`, `count`, `allgather`). Every process's call of a
      decision step joins ONE generate call over all processes' prompts in process
      order, padded to `batch_buckets` as one process would pad them, so a batch
      split over processes samples exactly what one process would; each process gets
      its own rows back. A process whose episodes have ended keeps joining rounds with
      `idle_round` until no process has inputs (task_selection.BoundPolicy.drain).
      None: single process.

  Raises (construction):
    ValueError: the chat template adds more tokens around x_t than
      sampling_config.prompt_overhead_tokens (config key
      `sampling.prompt_overhead_tokens`), or bad batch_buckets.

  Call: `policy(inputs: Sequence[str], rng: jax PRNG key) -> list[PolicyOutput]`.
  Attributes `timings` accumulate seconds spent in 'sampling' (generate, device sync
  included) and 'tokenization' (template, encode, decode); `num_calls` counts calls.
  """

  def __init__(self, model_config: qwen_config.QwenConfig, params: Any, tokenizer, *,
               sampling_config: PolicySamplingConfig = PolicySamplingConfig(),
               greedy: bool = False,
               batch_buckets: Optional[Sequence[int]] = None,
               max_prompt_tokens: Optional[int] = None,
               chat_template_kwargs: Optional[Mapping[str, Any]] = None,
               generate_fn: Optional[Callable[..., sampling.GenerationOutput]] = None,
               group: Any = None):
    self.model_config = model_config
    self.group = group if group is not None and group.count > 1 else None
    self.params = params
    self.tokenizer = tokenizer
    self.sampling_config = sampling_config
    self.greedy = bool(greedy)
    self.batch_buckets = batch_chunks.check_batch_buckets(batch_buckets)
    n_cmd = int(sampling_config.max_command_tokens)
    self.prompt_buckets = sampling_config.prompt_buckets
    if max_prompt_tokens is not None:
      self.max_prompt_tokens = int(max_prompt_tokens)
    else:
      self.max_prompt_tokens = model_config.max_position_embeddings - n_cmd
      if self.prompt_buckets is not None:
        self.max_prompt_tokens = min(self.max_prompt_tokens, self.prompt_buckets[-1])
    self.chat_template_kwargs = dict(chat_template_kwargs or {})
    self.prompt_overhead = prompt_overhead_tokens(tokenizer, self.chat_template_kwargs)
    if self.prompt_overhead > sampling_config.prompt_overhead_tokens:
      raise ValueError(
          f'the chat template adds {self.prompt_overhead} tokens around x_t, more than '
          f'the {sampling_config.prompt_overhead_tokens} reserved by '
          'config.sampling.prompt_overhead_tokens; raise it (the prompt and learner '
          'length buckets derive from it)')
    self.generate_fn = generate_fn or sampling.generate
    self.stop_token_ids = tuple(int(i) for i in tokenizer.stop_token_ids)
    self.timings = {'sampling': 0.0, 'tokenization': 0.0}
    self.num_calls = 0

  def program_bound(self) -> dict[str, int]:
    """The most sampler programs this policy can compile (one decoding mode):
    {'prompt_buckets', 'batch_buckets', 'prefill_shapes' (rows prefilled per batch
    size: min(B, 2^k) with shared prefill, models/sampling.py; else 1), 'programs'
    (their product)}. None prompt buckets count as the powers of two up to the model's
    context (models/sampling.py's default)."""
    prompts = (len(self.prompt_buckets) if self.prompt_buckets is not None
               else self.max_prompt_tokens.bit_length())
    shapes = sum(len({min(b, 1 << k) for k in range(b.bit_length() + 1)})
                 if self.sampling_config.share_prefill else 1
                 for b in self.batch_buckets)
    return {'prompt_buckets': prompts, 'batch_buckets': len(self.batch_buckets),
            'prefill_shapes': shapes, 'programs': prompts * shapes}

  @property
  def temperature(self) -> float:
    return (self.sampling_config.eval_temperature if self.greedy
            else self.sampling_config.temperature)

  @property
  def top_p(self) -> float:
    return 1.0 if self.greedy else self.sampling_config.top_p

  def encode_prompts(self, inputs: Sequence[str]) -> list[list[int]]:
    """Prompt ids of each x_t ([T_in] lists). Raises ValueError on an over-long one."""
    texts = [policy_prompt_text(self.tokenizer, x, self.chat_template_kwargs)
             for x in inputs]
    encode_batch = getattr(self.tokenizer, 'encode_batch', None)
    ids = (encode_batch(texts) if encode_batch is not None
           else [self.tokenizer.encode(t) for t in texts])
    for i, p in enumerate(ids):
      if len(p) > self.max_prompt_tokens:
        raise ValueError(f'policy prompt {i} has {len(p)} tokens > max_prompt_tokens '
                         f'{self.max_prompt_tokens} (the largest of '
                         f'sampling.prompt_buckets={self.prompt_buckets}, or the model '
                         'context minus sampling.max_command_tokens; is x_t longer '
                         'than memory.policy_input_limit, or the buckets stale?)')
    return [list(p) for p in ids]

  def __call__(self, inputs: Sequence[str], rng: Any) -> list[episode_types.PolicyOutput]:
    inputs = list(inputs)
    if not inputs and self.group is None:
      return []
    return self._round(inputs, rng)[0]

  def idle_round(self, rng: Any) -> bool:
    """Collective mode: joins one sampler round with no inputs of its own (this
    process's episodes have ended) and returns whether any process still had inputs
    (then a generate call ran). Without a group: False."""
    if self.group is None:
      return False
    return self._round([], rng)[1]

  def _gather_prompts(self, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """(every process's prompts in process order, index of this process's first)."""
    if self.group is None:
      return prompts, 0
    parts = self.group.allgather([np.asarray(p, np.int32) for p in prompts])
    first = sum(len(part) for part in parts[:self.group.index])
    return [p.tolist() for part in parts for p in part], first

  def _round(self, inputs: list[str], rng: Any
             ) -> tuple[list[episode_types.PolicyOutput], bool]:
    t0 = time.perf_counter()
    own = self.encode_prompts(inputs) if inputs else []
    prompts, first = self._gather_prompts(own)
    if not prompts:
      return [], False
    self.num_calls += 1
    t1 = time.perf_counter()
    # Passed only when set, so a generate_fn predating prompt buckets still works.
    extra = ({} if self.prompt_buckets is None
             else {'prompt_buckets': self.prompt_buckets})
    if not self.sampling_config.share_prefill:
      extra['share_prefill'] = False
    out = batch_chunks.generate_in_chunks(
        self.generate_fn, self.model_config, self.params, prompts, rng=rng,
        batch_buckets=self.batch_buckets,
        max_new_tokens=int(self.sampling_config.max_command_tokens),
        temperature=float(self.temperature), top_p=float(self.top_p),
        stop_token_ids=self.stop_token_ids,
        pad_token_id=int(self.tokenizer.pad_token_id), **extra)
    tokens = out.tokens  # NumPy: the device is done
    logprobs = np.asarray(out.logprobs, np.float64)
    lengths = out.lengths
    t2 = time.perf_counter()

    stops = set(self.stop_token_ids)
    results = []
    for i in range(first, first + len(own)):
      length = int(lengths[i])
      ids = tuple(int(t) for t in tokens[i, :length])
      text_ids = ids[:-1] if ids and ids[-1] in stops else ids
      text = self.tokenizer.decode(text_ids, skip_special_tokens=False).strip()
      results.append(episode_types.PolicyOutput(
          text=text, input_tokens=len(prompts[i]), output_tokens=length,
          prompt_ids=tuple(prompts[i]), token_ids=ids,
          logprobs=tuple(float(v) for v in logprobs[i, :length])))
    t3 = time.perf_counter()
    self.timings['sampling'] += t2 - t1
    self.timings['tokenization'] += (t1 - t0) + (t3 - t2)
    return results, True
