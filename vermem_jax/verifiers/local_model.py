"""Verifier backend running a Flax Qwen checkpoint through the project's sampler.

The frozen verifier of Appendix F.1 served in-process: prompts from `prompts` are
rendered with the tokenizer's chat template, encoded, and decoded greedily
(`config.temperature`, 0 by default) by `vermem_jax.models.sampling.generate` in
batches of `config.batch_size`. Replies are parsed strictly; malformed ones are
re-asked with the reason appended (which changes the prompt, so greedy decoding can
answer differently), then the configured fallback applies (`llm.LLMVerifier`).

Weights: `config.checkpoint_path` (an HF folder, `load_hf_checkpoint`) or, when empty,
random weights of preset `config.chat.model` (default 'tiny') — useful only for tests.
"""

from __future__ import annotations

from typing import Any

import jax

from vermem_jax import paths
from vermem_jax import tokenization
from vermem_jax.models import batch_chunks
from vermem_jax.models import hf_io
from vermem_jax.models import qwen
from vermem_jax.models import qwen_config
from vermem_jax.models import sampling
from vermem_jax.verifiers import base
from vermem_jax.verifiers import llm

# Preset used with random weights when neither a checkpoint nor a model name is given.
DEFAULT_PRESET = "tiny"


def _truncate_ids(ids: list[int], limit: int) -> list[int]:
  """Keeps the head (system prompt) and tail (rubric, reply cue) within `limit`."""
  if len(ids) <= limit:
    return ids
  head = limit // 2
  return ids[:head] + ids[len(ids) - (limit - head):]


class LocalChatGenerator:
  """Chat replies from a Flax Qwen model through the project's sampler.

  Shared by the local-model verifier and the evaluation judges (`eval.judges`).
  Conversations are rendered with the tokenizer's chat template (thinking off),
  encoded, cut to fit the model's positions (head and tail kept), and decoded in
  calls of `batch_size` rows (the last one padded to it, `models.batch_chunks`); stop
  tokens are dropped from the reply text.

  Args:
    model_config, params: a `QwenConfig` and its parameter tree.
    tokenizer: a `vermem_jax.tokenization.Tokenizer`.
    max_new_tokens: reply limit in tokens.
    temperature: 0 = greedy.
    batch_size: prompts per `generate` call.
    seed: PRNG seed of the sampling key (unused when greedy).

  Raises:
    ValueError: max_new_tokens leaves no room for a prompt.
  """

  def __init__(self, model_config: Any, params: Any, tokenizer: Any, *,
               max_new_tokens: int, temperature: float = 0.0, batch_size: int = 16,
               seed: int = 0):
    self.model_config = model_config
    self.params = params
    self.tokenizer = tokenizer
    self.max_new_tokens = int(max_new_tokens)
    self.temperature = float(temperature)
    self.batch_size = int(batch_size)
    self._rng = jax.random.PRNGKey(seed)
    # Room for the reply inside the model's position range.
    self._max_prompt_tokens = model_config.max_position_embeddings - self.max_new_tokens
    if self._max_prompt_tokens < 1:
      raise ValueError(
          f"max_new_tokens={self.max_new_tokens} leaves no room for a prompt "
          f"within max_position_embeddings={model_config.max_position_embeddings}")

  def _encode(self, messages: list[dict]) -> list[int]:
    # enable_thinking=False: Qwen3 templates would otherwise open a <think> block,
    # which the strict parsers reject; other templates ignore the variable.
    text = self.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=False)
    return _truncate_ids(self.tokenizer.encode(text), self._max_prompt_tokens)

  def complete_many(self, conversations: list[list[dict]]) -> list[str]:
    """One reply text per conversation, in order."""
    if not conversations:
      return []
    stop = set(self.tokenizer.stop_token_ids)
    self._rng, key = jax.random.split(self._rng)
    # Chunks of batch_size, the last one padded: one batch shape (models/batch_chunks).
    out = batch_chunks.generate_in_chunks(
        sampling.generate, self.model_config, self.params,
        [self._encode(m) for m in conversations], rng=key,
        batch_buckets=(self.batch_size,), max_new_tokens=self.max_new_tokens,
        temperature=self.temperature, top_p=1.0, stop_token_ids=tuple(sorted(stop)),
        pad_token_id=self.tokenizer.pad_token_id)
    return [self.tokenizer.decode([int(t) for t in row[:int(n)] if int(t) not in stop],
                                  skip_special_tokens=True)
            for row, n in zip(out.tokens, out.lengths)]


def load_model(checkpoint_path: str, preset: str, seed: int) -> tuple[Any, Any]:
  """(QwenConfig, params) from an HF folder, else random weights of `preset` (tests).

  Raises:
    FileNotFoundError: a missing checkpoint folder.
  """
  if checkpoint_path:
    return hf_io.load_hf_checkpoint(checkpoint_path)
  model_config = qwen_config.QwenConfig.preset(preset or DEFAULT_PRESET)
  return model_config, qwen.init_params(model_config, jax.random.PRNGKey(seed))


class LocalModelVerifier(llm.LLMVerifier):
  """LLM verifier on a local Flax Qwen model (greedy by default).

  Args:
    config: verifier settings (checkpoint_path / model, tokenizer_path,
      max_new_tokens, temperature, batch_size, seed, retries, fallback).
    model_config, params: an already loaded `QwenConfig` and parameter tree, to share
      weights with the caller; both or neither.
    tokenizer: an already loaded `Tokenizer`.

  Raises:
    ValueError: only one of model_config/params given.
    FileNotFoundError: missing checkpoint or tokenizer folder.
  """

  def __init__(self, config: base.VerifierConfig, *, model_config: Any = None,
               params: Any = None, tokenizer: Any = None):
    super().__init__(config)
    if (model_config is None) != (params is None):
      raise ValueError("LocalModelVerifier: pass both model_config and params, or neither")
    if model_config is None:
      model_config, params = load_model(config.checkpoint_path, config.chat.model, config.seed)
    self.model_config = model_config
    self.params = params
    self.tokenizer = tokenizer or tokenization.load_tokenizer(
        config.tokenizer_path or paths.tokenizer_dir())
    try:
      self._generator = LocalChatGenerator(
          model_config, params, self.tokenizer, max_new_tokens=config.max_new_tokens,
          temperature=config.temperature, batch_size=config.batch_size,
          seed=config.seed)
    except ValueError as e:
      raise ValueError(f"verifier.{e}") from e

  def _complete(self, conversations):
    return self._generator.complete_many(conversations)
