"""Tests of the SFT examples (vermem_jax/train/sft_examples.py) on the real HotpotQA
samples and the Qwen2.5 tokenizer: prompt and command tokens, the length limits and the
data order. The fixtures here are shared with tests/test_sft_step.py and
tests/test_sft_eval.py."""

import numpy as np
import pytest

from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax.rl import policy
from vermem_jax.train import setup
from vermem_jax.train import sft_examples


@pytest.fixture(scope='module')
def tok(qwen25_tokenizer_dir):
  return setup.load_tokenizer_cached(qwen25_tokenizer_dir)


@pytest.fixture(scope='module')
def records(tok, hotpotqa_dir):
  construction, dev = episodes.load_pools(hotpotqa.DataConfig(hotpotqa_dir=hotpotqa_dir))
  cfg = sft_config.SFTDataConfig(train_per_target=1, dev_per_target=1, context_budget=256,
                               policy_input_limit=512)
  train, dev_r, _ = sft_build.build_sft_set(construction, dev, count_tokens=tok.count_tokens,
                                           config=cfg, verbose=False)
  return train, dev_r


@pytest.fixture(scope='module')
def examples(records, tok):
  ex, dropped = sft_examples.tokenize_records(records[0], tok, max_sequence_tokens=1024,
                                              max_command_tokens=128)
  assert dropped == {'command_too_long': 0, 'sequence_too_long': 0}
  return ex


# ----------------------------------------------------------------------------- prompts
def test_prompt_and_target_tokens(tok, examples):
  ex = examples[0]
  text = tok.decode(ex.prompt_tokens)
  assert text.startswith('<|im_start|>')
  assert text.endswith('<|im_start|>user\n' + ex.record.policy_input +
                       '<|im_end|>\n<|im_start|>assistant\n')
  # The prompt the RL sampler conditions on, and the tokens it records for a command.
  assert list(ex.prompt_tokens) == policy.policy_prompt_ids(tok, ex.record.policy_input)
  assert ex.command_tokens[-1] == tok.token_to_id('<|im_end|>') == 151645
  assert tok.decode(ex.command_tokens[:-1]) == ex.record.target


def test_tokenize_drops_records_over_the_limits(records, tok):
  train = records[0]
  lengths = [len(tok.encode(r.target)) + 1 for r in train]
  cap = sorted(lengths)[len(lengths) // 2]
  ex, dropped = sft_examples.tokenize_records(train, tok, max_sequence_tokens=1024,
                                              max_command_tokens=cap)
  assert dropped['command_too_long'] == sum(n > cap for n in lengths) > 0
  assert len(ex) == sum(n <= cap for n in lengths)
  _, dropped = sft_examples.tokenize_records(train, tok, max_sequence_tokens=300,
                                             max_command_tokens=128)
  assert dropped['sequence_too_long'] == len(train)  # every x_i is > 300 tokens


# ----------------------------------------------------------------------------- data order
def test_data_order_is_a_function_of_the_step():
  seen = []
  for step in range(6):
    idx, epoch, b = sft_examples.batch_indices(step, 10, 4, seed=3)
    assert (epoch, b) == divmod(step, 3)
    seen.append(idx)
  # Each epoch is a permutation (last batch smaller), epochs differ.
  for e in range(2):
    np.testing.assert_array_equal(np.sort(np.concatenate(seen[3 * e:3 * e + 3])),
                                  np.arange(10))
  assert [len(s) for s in seen] == [4, 4, 2, 4, 4, 2]
  assert not np.array_equal(np.concatenate(seen[:3]), np.concatenate(seen[3:]))
  np.testing.assert_array_equal(sft_examples.batch_indices(4, 10, 4, seed=3)[0],
                                seen[4])


def test_length_grouped_order_visits_every_record_and_pads_less():
  """sft.length_group_batches: each epoch is still a permutation (smaller last batch
  last), a function of (seed, epoch), and batches hold records of similar length."""
  rng = np.random.default_rng(0)
  n, bs, g = 203, 8, 4
  lengths = rng.integers(300, 800, n)
  spe = sft_examples.steps_per_epoch(n, bs)
  for epoch in range(2):
    batches = [sft_examples.batch_indices(epoch * spe + b, n, bs, seed=5, lengths=lengths,
                                          group_batches=g)[0] for b in range(spe)]
    np.testing.assert_array_equal(np.sort(np.concatenate(batches)), np.arange(n))
    assert [len(b) for b in batches] == [bs] * (spe - 1) + [n % bs]
    plain = [sft_examples.batch_indices(epoch * spe + b, n, bs, seed=5)[0]
             for b in range(spe)]
    pad = lambda bb: np.mean([lengths[b].max() - lengths[b].mean() for b in bb[:-1]])
    assert pad(batches) < 0.5 * pad(plain)
    # Sorted within each batch's chunk: every full batch is a run of its chunk's
    # length-sorted order, i.e. its lengths are non-increasing.
    assert all(np.all(np.diff(lengths[b]) <= 0) for b in batches[:-1])
  again = sft_examples.epoch_permutation(n, 1, 5, lengths=lengths, batch_size=bs,
                                         group_batches=g)
  np.testing.assert_array_equal(again, np.concatenate(batches))
  with pytest.raises(ValueError, match='lengths'):
    sft_examples.epoch_permutation(n, 0, 5, lengths=lengths[:-1], batch_size=bs,
                                   group_batches=g)
