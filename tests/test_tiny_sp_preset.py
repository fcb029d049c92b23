"""The CPU default policy: the `tiny-sp4k` Qwen preset with the packaged 4k
SentencePiece tokenizer (experiments/configs/parts/tiny.py). A short SFT on a handful of
real SFT records drives greedy decoding to the exact target commands, through the same
SFT step, sampler policy and dev metrics as `make run`."""

import jax
import pytest

from experiments.configs import common
from vermem_jax.models import qwen_config
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax import paths
from vermem_jax import tokenization
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.models import qwen
from vermem_jax.rl import batching
from vermem_jax.rl import policy
from vermem_jax.train import optim
from vermem_jax.train import setup
from vermem_jax.train import sft_eval
from vermem_jax.train import sft_examples
from vermem_jax.train import sft_step

CONTEXT_BUDGET = 256
INPUT_LIMIT = 512
NUM_RECORDS = 4
STEPS = 60


def test_default_config_is_the_sp_preset():
  c = common.get_config('phase_b')
  mc = setup.model_config_from(c)
  assert c.model.preset == 'tiny-sp4k' and mc == qwen_config.QwenConfig.preset(
      'tiny-sp4k', dtype='bfloat16', param_dtype='float32', remat=False,
      attn_implementation='sdpa')
  assert c.tokenizer.path == paths.packaged_tokenizer()
  tok = setup.load_tokenizer_for(c, mc)  # fits the model's vocabulary
  assert tok.vocab_size == mc.vocab_size == 4096


@pytest.fixture(scope='module')
def tok():
  return tokenization.load_tokenizer(paths.packaged_tokenizer())


@pytest.fixture(scope='module')
def records(tok, hotpotqa_dir):
  construction, dev = episodes.load_pools(hotpotqa.DataConfig(hotpotqa_dir=hotpotqa_dir))
  cfg = sft_config.SFTDataConfig(train_per_target=1, dev_per_target=1,
                               context_budget=CONTEXT_BUDGET,
                               policy_input_limit=INPUT_LIMIT)
  train, _, _ = sft_build.build_sft_set(construction, dev, count_tokens=tok.count_tokens,
                                       config=cfg, verbose=False)
  # Four classes with short commands keep the learner shape small.
  by_op = {r.op: r for r in train}
  return [by_op[op] for op in ('Null', 'SelectEpisode', 'Filter', 'Delete')]


@pytest.mark.slow  # ~30 s of SFT steps
def test_short_sft_overfits_a_handful_of_records_to_exact_match(tok, records):
  mc = qwen_config.QwenConfig.preset('tiny-sp4k')
  examples, dropped = sft_examples.tokenize_records(
      records, tok, max_sequence_tokens=INPUT_LIMIT + 64 + 64, max_command_tokens=64)
  assert not any(dropped.values()) and len(examples) == NUM_RECORDS
  bcfg = batching.BatchingConfig(micro_batch_size=NUM_RECORDS,
                                 length_buckets=(INPUT_LIMIT + 64 + 64,),
                                 command_buckets=(64,))
  mbs = batching.micro_batches([e.decision() for e in examples], bcfg,
                               pad_id=tok.pad_token_id)
  params = qwen.init_params(mc, jax.random.PRNGKey(0))
  opt = optim.OptimizerConfig(learning_rate=3e-3, total_steps=STEPS, warmup_ratio=0.1,
                              lr_schedule='linear', section='sft')
  state = optim.init_optimizer(params, opt=opt)
  losses = []
  for _ in range(STEPS):
    params, state, m = sft_step.train_step(params, state, mbs, model_config=mc, opt=opt)
    losses.append(m['loss'])
  assert losses[-1] < 0.05 * losses[0], losses
  sampling_config = policy.PolicySamplingConfig(max_command_tokens=64,
                                                prompt_buckets=(INPUT_LIMIT + 64,))
  preds = sft_eval.predict_commands(params, mc, records, tok, batch_size=NUM_RECORDS,
                                    sampling_config=sampling_config)
  assert preds == [r.target for r in records]
  metrics = sft_eval.dev_metrics(records, preds, executor_config=ExecutorConfig(
      context_budget=CONTEXT_BUDGET, policy_input_limit=INPUT_LIMIT),
                                 count_tokens=tok.count_tokens)
  assert metrics['exact_match'] == metrics['tool_accuracy'] == 1.0
  assert metrics['executable_rate'] == metrics['executable_rate_non_null'] == 1.0
