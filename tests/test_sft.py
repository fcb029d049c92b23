"""Tests of the SFT trainer (vermem_jax/train/sft.py) on the real HotpotQA samples and
the Qwen2.5 tokenizer, with the tiny random Qwen and one learner shape (few compiles)."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from experiments.configs import common
from experiments.configs.parts import validation
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import sft_data
from vermem_jax.memory import commands as cmds
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.models import qwen
from vermem_jax.rl import batching
from vermem_jax.rl import policy
from vermem_jax.train import checkpoints
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import sft

# Learner shapes (each one is a compilation; the Qwen vocabulary makes every command
# token cost a 151,936-way projection, so commands are kept short):
#   unit tests: B=4 rows, T=64 (the last prompt tokens of real records), L=32;
#   run_sft:    B=4, T=608 (x_i limited to 512 tokens + chat template), L=32.
UNIT = batching.BatchingConfig(micro_batch_size=4, length_buckets=(64,),
                               command_buckets=(32,))
MODEL = qwen.QwenConfig.preset('tiny')
PAD = 151643


def tiny_config():
  c = common.get_config('sft')
  c.memory.context_budget = 256
  c.memory.policy_input_limit = 512
  c.sampling.max_command_tokens = 32   # longer targets are dropped (counted)
  c.batching.micro_batch_size = 4
  c.batching.length_buckets = (608,)
  c.batching.command_buckets = (32,)
  c.sft.train_per_target = 1
  c.sft.dev_per_target = 1
  c.sft.batch_size = 4
  c.sft.num_epochs = 2
  c.sft.eval_every = 100               # dev evaluation at the epoch ends only
  c.checkpoint.save_every = 1
  c.metrics.progress_bar = False
  c.metrics.tensorboard = False
  validation.validate_config(c)
  return c


@pytest.fixture(scope='module')
def tok(qwen25_tokenizer_dir):
  return sft._tokenizer(qwen25_tokenizer_dir)  # pylint: disable=protected-access


@pytest.fixture(scope='module')
def records(tok, hotpotqa_dir):
  construction, dev = episodes.load_pools(hotpotqa.DataConfig(hotpotqa_dir=hotpotqa_dir))
  cfg = sft_data.SFTDataConfig(train_per_target=1, dev_per_target=1, context_budget=256,
                               policy_input_limit=512)
  train, dev_r, _ = sft_data.build_sft_set(construction, dev, count_tokens=tok.count_tokens,
                                           config=cfg, verbose=False)
  return train, dev_r


@pytest.fixture(scope='module')
def examples(records, tok):
  ex, dropped = sft.tokenize_records(records[0], tok, max_sequence_tokens=1024,
                                     max_command_tokens=128)
  assert dropped == {'command_too_long': 0, 'sequence_too_long': 0}
  return ex


@pytest.fixture(scope='module')
def short(examples):
  """Learner rows of the records with commands <= 24 tokens: the command and the last
  prompt tokens (T = 64), so the unit tests share one small shape."""
  rows = []
  for e in sorted(examples, key=lambda e: len(e.command_tokens)):
    c = len(e.command_tokens)
    if c <= 24:
      rows.append(batching.DecisionTokens(e.prompt_tokens[-(64 - c):], e.command_tokens,
                                          (0.0,) * c, 1.0))
  assert len(rows) >= 4
  return rows


@pytest.fixture(scope='module')
def params():
  return qwen.init_params(MODEL, jax.random.PRNGKey(0))


def _loss(params, batches):
  acc = sft.zero_accumulator(params)
  for mb in batches:
    acc = sft.accumulate_micro_batch(params, acc, mb, model_config=MODEL)
  return acc


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
  ex, dropped = sft.tokenize_records(train, tok, max_sequence_tokens=1024,
                                     max_command_tokens=cap)
  assert dropped['command_too_long'] == sum(n > cap for n in lengths) > 0
  assert len(ex) == sum(n <= cap for n in lengths)
  _, dropped = sft.tokenize_records(train, tok, max_sequence_tokens=300,
                                    max_command_tokens=128)
  assert dropped['sequence_too_long'] == len(train)  # every x_i is > 300 tokens


# ----------------------------------------------------------------------------- loss
def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_is_command_token_cross_entropy(params, short):
  dec = short[:3]
  mb = batching.build_batch(dec, UNIT, num_decisions=3, pad_id=PAD, batch_size=4)
  acc = _loss(params, [mb])
  assert float(acc['count']) == 3.0
  # NumPy reference on the model's full-sequence logits (no gather, no lm_head shortcut).
  full_logits = jax.jit(lambda p, ids, mask: qwen.Qwen(MODEL).apply(
      {'params': p}, ids, attention_mask=mask))
  logits = np.asarray(full_logits(params, mb['input_ids'], mb['attention_mask']))
  per_cmd, per_seq = [], []
  for row, d in enumerate(dec):
    p, c = len(d.prompt_tokens), len(d.command_tokens)
    logp = _log_softmax(logits[row, :p + c - 1].astype(np.float64))
    ids = mb['input_ids'][row]
    nll = np.array([-logp[t - 1, ids[t]] for t in range(1, p + c)])
    per_cmd.append(nll[p - 1:].mean())   # predictions of tokens p .. p+c-1 (the command)
    per_seq.append(nll.mean())           # prompt tokens included
  want = float(np.mean(per_cmd))
  np.testing.assert_allclose(float(acc['loss_sum'] / acc['count']), want, rtol=1e-5)
  # A loss that also counted prompt tokens would be outside the tolerance above (the
  # random model's NLLs all sit near log V, so the gap is small but far from rtol).
  assert abs(float(np.mean(per_seq)) - want) > 20 * 1e-5 * want
  assert float(acc['tokens']) == sum(len(d.command_tokens) for d in dec)

  # Padding columns and padding rows carry no loss, whatever their token ids.
  noisy = dict(mb)
  noisy['input_ids'] = mb['input_ids'].copy()
  for row, d in enumerate(dec):
    noisy['input_ids'][row, len(d.prompt_tokens) + len(d.command_tokens):] = 777
  noisy['input_ids'][3, :] = 4242
  acc2 = _loss(params, [noisy])
  np.testing.assert_allclose(float(acc2['loss_sum']), float(acc['loss_sum']), rtol=1e-6)
  assert float(acc2['count']) == 3.0


def test_loss_is_mean_per_command_then_over_commands(params, short):
  # The shortest and the longest command weigh equally in the step loss.
  pair = (short[0], short[-1])
  assert len(pair[1].command_tokens) >= 4 * len(pair[0].command_tokens)
  each = [float(_loss(params, [batching.build_batch([d], UNIT, num_decisions=1,
                                                    pad_id=PAD)])['loss_sum'])
          for d in pair]
  acc = _loss(params, [batching.build_batch(list(pair), UNIT, num_decisions=2,
                                            pad_id=PAD)])
  np.testing.assert_allclose(float(acc['loss_sum'] / acc['count']), np.mean(each),
                             rtol=1e-5)
  token_mean = (each[0] * len(pair[0].command_tokens) +
                each[1] * len(pair[1].command_tokens)) / sum(
                    len(d.command_tokens) for d in pair)
  assert abs(np.mean(each) - token_mean) > 1e-3  # not a per-token mean


def test_gradient_accumulation_over_unequal_micro_batches(params, short):
  dec = short[:4]
  full = batching.build_batch(dec, UNIT, num_decisions=4, pad_id=PAD)
  # 3 rows + 1 row (padding rows fill the fixed shape).
  parts = [batching.build_batch(dec[:3], UNIT, num_decisions=4, pad_id=PAD),
           batching.build_batch(dec[3:], UNIT, num_decisions=4, pad_id=PAD)]
  opt = sft.OptimizerConfig(learning_rate=1e-3, total_steps=10, warmup_ratio=0.0)
  state = sft.init_optimizer(params, opt=opt)
  p_full, _, m_full = sft.train_step(params, state, [full], model_config=MODEL, opt=opt)
  p_parts, _, m_parts = sft.train_step(params, state, parts, model_config=MODEL, opt=opt)
  np.testing.assert_allclose(m_parts['loss'], m_full['loss'], rtol=1e-5)
  np.testing.assert_allclose(m_parts['grad_norm'], m_full['grad_norm'], rtol=1e-5)
  assert m_full['num_commands'] == m_parts['num_commands'] == 4
  acc_full, acc_parts = _loss(params, [full]), _loss(params, parts)
  for a, b in zip(jax.tree.leaves(acc_full['grads']), jax.tree.leaves(acc_parts['grads'])):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
  # Adam's first step is ~lr * g / |g| per element, which magnifies float rounding
  # where g ~ 0: the updated params agree to 0.1% of the step size (lr = 1e-3).
  for a, b in zip(jax.tree.leaves(p_full), jax.tree.leaves(p_parts)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-6)


def test_overfits_a_handful_of_records(params, short):
  mbs = [batching.build_batch(short[:4], UNIT, num_decisions=4, pad_id=PAD)]
  opt = sft.OptimizerConfig(learning_rate=3e-2, total_steps=12, warmup_ratio=0.0)
  state = sft.init_optimizer(params, opt=opt)
  p, losses = params, []
  for _ in range(opt.total_steps):
    p, state, m = sft.train_step(p, state, mbs, model_config=MODEL, opt=opt)
    losses.append(m['loss'])
  assert losses[0] > 10.0                 # ~log(151936) for a random model
  assert losses[-1] < 0.3 * losses[0], losses


# ----------------------------------------------------------------------------- optimizer
def test_linear_warmup_then_linear_decay():
  opt = sft.OptimizerConfig(learning_rate=2e-5, total_steps=100, warmup_ratio=0.03)
  assert opt.warmup_steps == 3
  sched = sft.lr_schedule(opt)
  got = [float(sched(s)) for s in (0, 1, 3, 50, 99, 100)]
  want = [0.0, 2e-5 / 3, 2e-5, 2e-5 * 50 / 97, 2e-5 * 1 / 97, 0.0]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_data_order_is_a_function_of_the_step():
  seen = []
  for step in range(6):
    idx, epoch, b = sft.batch_indices(step, 10, 4, seed=3)
    assert (epoch, b) == divmod(step, 3)
    seen.append(idx)
  # Each epoch is a permutation (last batch smaller), epochs differ.
  for e in range(2):
    np.testing.assert_array_equal(np.sort(np.concatenate(seen[3 * e:3 * e + 3])),
                                  np.arange(10))
  assert [len(s) for s in seen] == [4, 4, 2, 4, 4, 2]
  assert not np.array_equal(np.concatenate(seen[:3]), np.concatenate(seen[3:]))
  np.testing.assert_array_equal(sft.batch_indices(4, 10, 4, seed=3)[0], seen[4])


# ----------------------------------------------------------------------------- dev metrics
def test_dev_metrics_on_hand_made_predictions(records, tok):
  dev = records[1]
  by_op = {r.op: r for r in dev}
  add, delete, null = by_op['Add'], by_op['Delete'], by_op['Null']
  # The Update state offered in the LTM phase subspace (A): Retrieve is not allowed.
  phase_a = dataclasses.replace(by_op['Update'], phase='A')
  recs = [add, add, add, delete, null, phase_a]
  preds = [add.target,                                  # exact, executable
           'Add(content="never closed',                 # unparseable: invalid, op wrong
           cmds.NULL_SYMBOL,                            # wrong op, but executable
           'Delete(memory_id="no-such-id", reason="x")',  # right op, rejected
           'Null()',                                    # exact (same command as ∅)
           'Retrieve(query="anything")']                # op not allowed in phase A
  m = sft.dev_metrics(recs, preds, executor_config=ExecutorConfig(
      context_budget=256, policy_input_limit=512), count_tokens=tok.count_tokens)
  assert m['tool_accuracy'] == pytest.approx(3 / 6)     # add, delete, null
  assert m['invalid_rate'] == pytest.approx(3 / 6)      # unparseable, missing id, phase
  assert m['executable_rate'] == pytest.approx(3 / 6)
  assert m['exact_match'] == pytest.approx(2 / 6)
  assert m['unparseable_rate'] == pytest.approx(1 / 6)
  assert m['tool_accuracy/Add'] == pytest.approx(1 / 3)
  assert m['num_dev'] == 6
  with pytest.raises(ValueError, match='predictions'):
    sft.dev_metrics(recs, preds[:2], executor_config=ExecutorConfig(),
                    count_tokens=tok.count_tokens)


# ----------------------------------------------------------------------------- end to end
def _params_of(directory, step):
  with checkpoints.PhaseCheckpointManager(directory) as mgr:
    return mgr.restore(step=step)


def test_run_sft_end_to_end_and_exact_resume(tmp_path):
  config = tiny_config()
  full_dir = str(tmp_path / 'full')
  result = sft.run_sft(config, full_dir)
  # 8 train / 8 dev records; those with commands over 32 tokens are dropped.
  assert result['num_train'] + result['num_dropped_train'] == 8
  assert result['num_dev'] + result['num_dropped_dev'] == 8
  assert 5 <= result['num_train'] <= 8 and result['num_dev'] >= 4
  assert result['step'] == result['total_steps'] == 4 and result['complete']
  for key in ('tool_accuracy', 'invalid_rate', 'executable_rate', 'exact_match',
              'dev_loss', 'train_loss'):
    assert np.isfinite(result[key]), key
  assert result['executable_rate'] == pytest.approx(1 - result['invalid_rate'])
  d = os.path.join(full_dir, 'sft')
  assert os.path.isfile(os.path.join(d, sft.COUNTS_FILE))
  with checkpoints.PhaseCheckpointManager(d) as mgr:
    assert mgr.latest_step() == 4
    assert mgr.best_step() in (2, 4) and mgr.best_step() == result['best_step']
    meta = mgr.read_meta(4)
  assert set(meta['selection_metrics']) == {'tool_accuracy', 'invalid_rate'}
  assert meta['data_position'] == {'epoch': 2, 'batch': 0, 'shuffle_seed': 42,
                                   'steps_per_epoch': 2,
                                   'num_train': result['num_train']}
  rows = metrics_lib.read_jsonl(os.path.join(d, metrics_lib.METRICS_FILE))
  assert [r['step'] for r in rows if 'train/loss' in r] == [1, 2, 3, 4]
  assert [r['step'] for r in rows if 'dev/tool_accuracy' in r] == [2, 4]
  lrs = [r['train/lr'] for r in rows if 'train/lr' in r]
  np.testing.assert_allclose(lrs, [0.0, 1e-3, 1e-3 * 2 / 3, 1e-3 / 3], rtol=1e-6)

  # Running the complete phase again does nothing.
  again = sft.run_sft(config, full_dir)
  assert again['step'] == 4 and again['best_step'] == result['best_step']
  with checkpoints.PhaseCheckpointManager(d) as mgr:
    assert mgr.all_steps()[-1] == 4

  # Killed after step 3 with checkpoints every 2 steps: resumes from step 2 (epoch 1,
  # batch 0), redoes step 3, and ends bit-identical to the uninterrupted run.
  config.checkpoint.save_every = 2
  part_dir = str(tmp_path / 'killed')
  part = sft.run_sft(config, part_dir, stop_after_step=3)
  assert part['step'] == 3 and not part['complete']
  pd = os.path.join(part_dir, 'sft')
  with checkpoints.PhaseCheckpointManager(pd) as mgr:
    assert mgr.latest_step() == 2
    assert mgr.read_meta(2)['data_position']['epoch'] == 1
    assert mgr.read_meta(2)['data_position']['batch'] == 0
  resumed = sft.run_sft(config, part_dir)
  assert resumed['step'] == 4 and resumed['complete']
  rows = metrics_lib.read_jsonl(os.path.join(pd, metrics_lib.METRICS_FILE))
  assert [r['step'] for r in rows if 'train/loss' in r] == [1, 2, 3, 4]
  a, b = _params_of(d, 4), _params_of(pd, 4)
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for x, y in zip(jax.tree.leaves(a.opt_state), jax.tree.leaves(b.opt_state)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert resumed['train_loss'] == result['train_loss']
  assert resumed['tool_accuracy'] == result['tool_accuracy']


def test_resume_refuses_other_settings(tmp_path):
  config = tiny_config()
  d = checkpoints.phase_dir(str(tmp_path), 'sft')
  with checkpoints.PhaseCheckpointManager(d) as mgr:
    mgr.save(checkpoints.TrainState(
        step=1, params={'w': np.zeros(2, np.float32)},
        metadata={'fingerprint': dict(sft.trajectory_fingerprint(config), seed=7)}))
  with pytest.raises(ValueError, match='seed: 7 -> 42'):
    sft.run_sft(config, str(tmp_path))
  json.dumps(sft.trajectory_fingerprint(config))  # stored as JSON metadata
