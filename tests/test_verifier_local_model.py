"""Local-model verifier: the tiny random Qwen through our sampler, and a fake generate."""
import numpy as np
import pytest

from vermem_jax.models import sampling
from vermem_jax.tokenization import load_tokenizer
from vermem_jax.verifiers import backends
from vermem_jax.verifiers import base, local_model


@pytest.fixture(scope="module")
def tokenizer(qwen25_tokenizer_dir):
  return load_tokenizer(qwen25_tokenizer_dir)


def local_inputs(n):
  return [base.LocalVerifierInput(
      question=f"This is question number {k}.", policy_input="x_t: nothing yet",
      command="Null()", op="Null") for k in range(n)]


def test_tiny_random_model_exercises_retry_and_fallback(tokenizer, qwen25_tokenizer_dir):
  # Random weights never print the score lines: every input is retried, then falls
  # back. The call goes through the real chat template, encoder and jitted sampler.
  v = backends.make_verifier(dict(
      backend="local_model", model="tiny", tokenizer_path=qwen25_tokenizer_dir,
      max_new_tokens=6, max_retries=1, fallback="midpoint", batch_size=2),
      tokenizer=tokenizer)
  out = v.score_local(local_inputs(2))
  assert all(s.fallback == "midpoint" and s.r_local == 0.5 for s in out)
  snap = v.counters.snapshot()
  assert snap["attempts"] == 4 and snap["malformed"] == 4 and snap["retries"] == 2
  assert snap["fallback_midpoint"] == 2


class FakeGenerate:
  """Replies from the prompt text; records calls. Malformed for question 1 at first."""

  def __init__(self, tok):
    self.tok, self.calls = tok, []

  def __call__(self, config, params, prompts, *, rng, max_new_tokens, temperature,
               top_p, stop_token_ids, pad_token_id):
    self.calls.append(dict(n=len(prompts), temperature=temperature,
                           max_new_tokens=max_new_tokens, stop=stop_token_ids))
    rows = []
    for ids in prompts:
      text = self.tok.decode(ids)
      assert text.rstrip().endswith("<|im_start|>assistant")  # generation prompt
      k = int(text.rsplit("question number ", 1)[1].split(".", 1)[0])
      if k == 1 and "could not be read" not in text:
        reply = "Relevance is high."
      else:
        reply = (f"relevance: {k}\ngrounding: 4\nlocal_progress: 3\n"
                 "information_fidelity: 2")
      rows.append(self.tok.encode(reply) + [self.tok.eos_token_id])
    n = max(len(r) for r in rows)
    toks = np.full((len(rows), n), pad_token_id, np.int32)
    for i, r in enumerate(rows):
      toks[i, :len(r)] = r
    return sampling.GenerationOutput(
        tokens=toks, logprobs=np.zeros(toks.shape, np.float32),
        lengths=np.array([len(r) for r in rows], np.int32))


def test_wellformed_generation_is_parsed_in_order(tokenizer, monkeypatch):
  fake = FakeGenerate(tokenizer)
  monkeypatch.setattr(sampling, "generate", fake)
  v = backends.make_verifier(dict(backend="local_model", model="tiny", max_retries=1,
                                   batch_size=2, max_new_tokens=32),
                              tokenizer=tokenizer)
  inputs = local_inputs(3)
  out = v.score_local(inputs)
  assert [s.relevance for s in out] == [0, 1, 2]
  assert all(s.fallback is None for s in out)
  assert out[0].r_local == pytest.approx((0 + 4 + 3 + 2) / 16)
  # batches of 2, then one retry for question 1; the short last batch and the retry
  # padded to 2 rows (one batch shape, models/batch_chunks); greedy decoding
  assert [c["n"] for c in fake.calls] == [2, 2, 2]
  assert all(c["temperature"] == 0.0 and c["max_new_tokens"] == 32 for c in fake.calls)
  assert set(fake.calls[0]["stop"]) == set(tokenizer.stop_token_ids)
  snap = v.counters.snapshot()
  assert snap["malformed"] == 1 and snap["retries"] == 1 and snap["attempts"] == 4


def test_long_prompts_are_truncated_to_fit():
  ids = list(range(100))
  out = local_model._truncate_ids(ids, 10)  # pylint: disable=protected-access
  assert out == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]
  assert local_model._truncate_ids(ids, 200) == ids  # pylint: disable=protected-access


def test_model_config_and_params_go_together(tokenizer):
  with pytest.raises(ValueError, match="both model_config and params"):
    local_model.LocalModelVerifier(base.VerifierConfig(backend="local_model"),
                                   params={}, tokenizer=tokenizer)
