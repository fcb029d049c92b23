"""Tests for vermem_jax.rl.batching (padded learner batches, weights, gather arrays)."""
import numpy as np
import pytest

from experiments.configs import common
from experiments.configs.parts import derived
from vermem_jax import config_util
from vermem_jax.rl import batching as bt


def _cfg(**kw):
  base = dict(micro_batch_size=4, length_buckets=(4, 8, 16), command_buckets=(2, 4),
              sort_by_length=False)
  base.update(kw)
  return bt.BatchingConfig(**base)


def _hand_decisions():
  return [bt.DecisionTokens([11, 12, 13], [21, 22], [-0.1, -0.2], 1.5),
          bt.DecisionTokens([31], [41, 42, 43], [-0.3, -0.4, -0.5], -2.0)]


def test_hand_checked_small_case():
  (b,) = bt.micro_batches(_hand_decisions(), _cfg(), pad_id=0)
  np.testing.assert_array_equal(b['input_ids'], [[11, 12, 13, 21, 22, 0, 0, 0],
                                                 [31, 41, 42, 43, 0, 0, 0, 0],
                                                 [0] * 8, [0] * 8])
  np.testing.assert_array_equal(b['attention_mask'], [[1, 1, 1, 1, 1, 0, 0, 0],
                                                      [1, 1, 1, 1, 0, 0, 0, 0],
                                                      [1, 0, 0, 0, 0, 0, 0, 0],
                                                      [1, 0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(b['positions'], [[0, 1, 2, 3, 4, 4, 4, 4],
                                                 [0, 1, 2, 3, 3, 3, 3, 3],
                                                 [0] * 8, [0] * 8])
  np.testing.assert_array_equal(b['loss_mask'], [[0, 0, 0, 1, 1, 0, 0, 0],
                                                 [0, 1, 1, 1, 0, 0, 0, 0],
                                                 [0] * 8, [0] * 8])
  np.testing.assert_array_equal(b['command_ids'], [[0, 0, 0, 1, 1, 0, 0, 0],
                                                   [0, 2, 2, 2, 0, 0, 0, 0],
                                                   [0] * 8, [0] * 8])
  np.testing.assert_allclose(b['token_weights'][0], [0, 0, 0, .25, .25, 0, 0, 0])
  np.testing.assert_allclose(b['token_weights'][1], [0, 1 / 6, 1 / 6, 1 / 6, 0, 0, 0, 0])
  np.testing.assert_allclose(b['advantages'][:2], [[0, 0, 0, 1.5, 1.5, 0, 0, 0],
                                                   [0, -2, -2, -2, 0, 0, 0, 0]])
  np.testing.assert_allclose(b['old_logprobs'][:2], [[0, 0, 0, -.1, -.2, 0, 0, 0],
                                                     [0, -.3, -.4, -.5, 0, 0, 0, 0]],
                             rtol=1e-6)
  # Gather view: hidden at p predicts token p + 1.
  np.testing.assert_array_equal(b['command_positions'], [[2, 3, 0, 0], [0, 1, 2, 0],
                                                         [0] * 4, [0] * 4])
  np.testing.assert_array_equal(b['target_ids'], [[21, 22, 0, 0], [41, 42, 43, 0],
                                                  [0] * 4, [0] * 4])
  np.testing.assert_array_equal(b['command_mask'], [[1, 1, 0, 0], [1, 1, 1, 0],
                                                    [0] * 4, [0] * 4])
  np.testing.assert_array_equal(b['command_ids_l'], [[1, 1, 0, 0], [2, 2, 2, 0],
                                                     [0] * 4, [0] * 4])
  np.testing.assert_allclose(b['advantages_l'][:2], [[1.5, 1.5, 0, 0], [-2, -2, -2, 0]])
  np.testing.assert_allclose(b['token_weights_l'][:2], [[.25, .25, 0, 0],
                                                        [1 / 6, 1 / 6, 1 / 6, 0]])
  assert int(b['num_decisions']) == 2
  assert b['input_ids'].dtype == np.int32 and b['positions'].dtype == np.int32
  assert b['token_weights'].dtype == np.float32


def _random_decisions(rng, n, max_prompt=40, max_cmd=12):
  out = []
  for _ in range(n):
    p, c = int(rng.integers(1, max_prompt)), int(rng.integers(1, max_cmd))
    out.append(bt.DecisionTokens(list(rng.integers(1, 1000, p)),
                                 list(rng.integers(1, 1000, c)),
                                 list(-rng.random(c)), float(rng.normal())))
  return out


@pytest.mark.parametrize('sort', [False, True])
def test_update_weights_masks_and_gather(sort):
  rng = np.random.default_rng(0)
  decisions = _random_decisions(rng, 37)
  cfg = bt.BatchingConfig(micro_batch_size=8, length_buckets=(16, 32, 64),
                          command_buckets=(4, 8, 16), sort_by_length=sort)
  batches = bt.micro_batches(decisions, cfg, pad_id=7)
  assert len(batches) == 5
  # Weights: 1/N per decision, summing to 1 over the update across micro-batches.
  total = sum(float(b['token_weights'].sum()) for b in batches)
  assert total == pytest.approx(1.0, rel=1e-6)
  assert sum(float(b['token_weights_l'].sum()) for b in batches) == pytest.approx(1.0)
  per_id = {}
  seen_ids = []
  for b in batches:
    assert b['input_ids'].shape[0] == 8
    assert b['input_ids'].shape[1] in cfg.length_buckets
    assert b['target_ids'].shape[1] in cfg.command_buckets
    for row in range(8):
      ids = set(b['command_ids'][row][b['command_ids'][row] > 0].tolist())
      if not ids:  # padding row: nothing trained
        assert b['token_weights'][row].sum() == 0 and b['command_mask'][row].sum() == 0
        continue
      (i,) = ids
      seen_ids.append(i)
      d = decisions[i - 1]
      p, c = len(d.prompt_tokens), len(d.command_tokens)
      # Mask exactly on the command tokens, never on prompt or padding.
      expect = np.zeros(b['input_ids'].shape[1])
      expect[p:p + c] = 1
      np.testing.assert_array_equal(b['loss_mask'][row], expect)
      np.testing.assert_array_equal(b['input_ids'][row, p:p + c], d.command_tokens)
      np.testing.assert_array_equal(b['input_ids'][row, :p], d.prompt_tokens)
      assert (b['input_ids'][row, p + c:] == 7).all()
      per_id[i] = float(b['token_weights'][row].sum())
    # Gather arrays agree with the full arrays at position + 1.
    nxt = b['command_positions'] + 1
    m = b['command_mask'] > 0
    for full, gathered in (('input_ids', 'target_ids'), ('command_ids', 'command_ids_l'),
                           ('advantages', 'advantages_l'),
                           ('old_logprobs', 'old_logprobs_l'),
                           ('token_weights', 'token_weights_l'), ('loss_mask',
                                                                   'command_mask')):
      taken = np.take_along_axis(b[full], nxt, axis=1)
      np.testing.assert_array_equal(taken[m], b[gathered][m])
    assert m.sum() == b['loss_mask'].sum()
  assert sorted(seen_ids) == list(range(1, 38))
  np.testing.assert_allclose(list(per_id.values()), 1 / 37, rtol=1e-6)
  # The weighted token sum is the mean over decisions of each command's mean (SPEC §6);
  # checked with old_logprobs as the per-token quantity.
  expected = np.mean([np.mean(d.old_logprobs) for d in decisions])
  got = sum(float((b['token_weights'] * b['old_logprobs']).sum()) for b in batches)
  assert got == pytest.approx(expected, rel=1e-5)


def test_bucket_count_bounded():
  rng = np.random.default_rng(1)
  cfg = bt.BatchingConfig(micro_batch_size=4, length_buckets=(16, 32, 64, 100),
                          command_buckets=(4, 8, 16))
  shapes = set()
  for _ in range(20):
    shapes |= bt.batch_shapes(bt.micro_batches(
        _random_decisions(rng, int(rng.integers(1, 30)), max_prompt=84, max_cmd=16), cfg))
  assert len(shapes) <= len(cfg.length_buckets) * len(cfg.command_buckets)
  assert all(b == 4 for b, _, _ in shapes)
  assert len({t for _, t, _ in shapes}) > 1  # buckets really vary with the lengths


def test_errors_name_the_problem():
  cfg = _cfg()
  with pytest.raises(ValueError, match='sequence length 17 exceeds the largest bucket 16'):
    bt.micro_batches([bt.DecisionTokens([1] * 15, [2, 3], [0., 0.], 0.)], cfg)
  with pytest.raises(ValueError, match='command length 5 exceeds'):
    bt.micro_batches([bt.DecisionTokens([1], [2] * 5, [0.] * 5, 0.)], cfg)
  with pytest.raises(ValueError, match='decision 1: empty prompt'):
    bt.micro_batches([_hand_decisions()[0], bt.DecisionTokens([], [2], [0.], 0.)], cfg)
  with pytest.raises(ValueError, match='decision 0: 1 old logprobs for 2 command tokens'):
    bt.micro_batches([bt.DecisionTokens([1], [2, 3], [0.], 0.)], cfg)
  with pytest.raises(ValueError, match='not finite'):
    bt.micro_batches([bt.DecisionTokens([1], [2], [0.], float('nan'))], cfg)
  with pytest.raises(ValueError, match='at least one decision'):
    bt.micro_batches([], cfg)
  with pytest.raises(ValueError, match='strictly increasing'):
    bt.BatchingConfig(length_buckets=(8, 4))
  with pytest.raises(ValueError, match='do not fit'):
    bt.build_batch(_hand_decisions(), cfg, num_decisions=2, batch_size=1)


def test_step_batch_matches_grpo_select_command_tokens():
  # Cross-check against the loss module's own [B, T] -> [B, L] conversion.
  from vermem_jax.rl import grpo  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  cfg = bt.BatchingConfig(micro_batch_size=4, length_buckets=(16, 32, 64),
                          command_buckets=(4, 8, 16))
  for b in bt.micro_batches(_random_decisions(rng, 11), cfg):
    mine = bt.to_step_batch(b)
    ref = grpo.select_command_tokens(b, b['target_ids'].shape[1])
    assert set(mine) == set(ref)
    for k in ref:
      np.testing.assert_array_equal(mine[k], ref[k], err_msg=k)


def test_decision_from_policy_output():
  from vermem_jax.envs import environment  # pylint: disable=g-import-not-at-top
  out = environment.PolicyOutput(text='Null()', input_tokens=3, output_tokens=2,
                                 prompt_ids=(5, 6, 7), token_ids=(8, 9),
                                 logprobs=(-0.5, -0.25))
  d = bt.decision_from_policy_output(out, 0.75)
  assert d == bt.DecisionTokens((5, 6, 7), (8, 9), (-0.5, -0.25), 0.75)
  with pytest.raises(ValueError, match=r"'Null\(\)' has no \['prompt_ids', 'token_ids', "
                     r"'logprobs'\]"):
    bt.decision_from_policy_output(environment.PolicyOutput(text='Null()'), 0.0)


def test_config_section_builds_batching_config():
  for scale in ('tiny', 'paper'):
    c = common.get_config('phase_b', f'scale={scale}')
    bc = config_util.dataclass_from_mapping(bt.BatchingConfig, c.batching.to_dict(),
                                            strict=True)
    # The longest row: x_t + chat-template framing + command.
    assert bc.length_buckets[-1] == (c.memory.policy_input_limit +
                                     c.sampling.prompt_overhead_tokens +
                                     c.sampling.max_command_tokens)
    assert bc.command_buckets[-1] == c.sampling.max_command_tokens
  # SPEC §1 input limit + reserved template tokens + paper command limit.
  assert bt.BatchingConfig().length_buckets[-1] == 8192 + 64 + 256
  assert bt.BatchingConfig().length_buckets == tuple(derived.power_of_two_buckets(
      256, 8192 + 64 + 256))


def test_full_length_decision_fits_the_config_buckets():
  # A decision at the limits (x_t of policy_input_limit tokens, the chat template's
  # framing, a max-length command) packs into the largest bucket, at both scales.
  for scale in ('tiny', 'paper'):
    c = common.get_config('phase_b', f'scale={scale}')
    bc = config_util.dataclass_from_mapping(bt.BatchingConfig, c.batching.to_dict(),
                                            strict=True)
    prompt = [7] * (c.memory.policy_input_limit + c.sampling.prompt_overhead_tokens)
    cmd = [9] * c.sampling.max_command_tokens
    d = bt.DecisionTokens(prompt, cmd, [-0.1] * len(cmd), 1.0)
    b = bt.build_batch([d], bc, num_decisions=1, batch_size=1)
    assert b['input_ids'].shape[1] == bc.length_buckets[-1] == len(prompt) + len(cmd)
    too_long = bt.DecisionTokens(prompt + [7], cmd, [-0.1] * len(cmd), 1.0)
    with pytest.raises(ValueError, match='exceeds the largest bucket'):
      bt.build_batch([too_long], bc, num_decisions=1, batch_size=1)


def test_mini_batch_partition_is_a_shuffled_balanced_split():
  parts = bt.mini_batch_partition(10, 3, np.random.default_rng(0))
  assert [len(p) for p in parts] == [4, 3, 3]
  assert sorted(np.concatenate(parts).tolist()) == list(range(10))
  assert np.concatenate(parts).tolist() != list(range(10))  # shuffled
  again = bt.mini_batch_partition(10, 3, np.random.default_rng(0))
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))  # seed-determined
  (whole,) = bt.mini_batch_partition(5, 1, None)
  assert whole.tolist() == [0, 1, 2, 3, 4]
  assert len(bt.mini_batch_partition(2, 8, np.random.default_rng(1))) == 2
  with pytest.raises(ValueError):
    bt.mini_batch_partition(0, 1, None)


def test_values_by_decision_maps_rows_back_to_commands():
  decisions = [bt.DecisionTokens([1, 2, 3], [7, 8], [-0.5, -0.25], 1.0),
               bt.DecisionTokens([1], [9, 9, 9], [-1.0, -2.0, -3.0], -1.0),
               bt.DecisionTokens([4, 4], [5], [-4.0], 0.5)]
  cfg = bt.BatchingConfig(micro_batch_size=2, length_buckets=(8,), command_buckets=(4,))
  got = {}
  for b in bt.micro_batches(decisions, cfg):
    got.update(bt.values_by_decision(b, b['old_logprobs_l']))
  assert sorted(got) == [1, 2, 3]
  for i, d in enumerate(decisions):
    np.testing.assert_array_equal(got[i + 1], np.float32(d.old_logprobs))
