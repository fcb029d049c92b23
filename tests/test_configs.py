"""Tests for experiments/configs (SPEC values, scales, validation, dataclass mapping)."""
import dataclasses
import importlib
import json
import os

import ml_collections
import numpy as np
import pytest

from experiments.cli import overrides as overrides_lib
from experiments.configs import common
from experiments.configs.parts import curriculum
from experiments.configs.parts import derived
from experiments.configs.parts import library
from experiments.configs.parts import paper
from experiments.configs.parts import tiny as tiny_lib
from experiments.configs.parts import validation
from vermem_jax import paths
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import config as memory_config
from vermem_jax.models import qwen_config
from vermem_jax.rl import advantages
from vermem_jax.rl import rewards
from vermem_jax.rl import running_stats
from vermem_jax.train import run_setup
from vermem_jax.verifiers import base as verifier_base

PHASES = ('sft', 'phase_a', 'phase_b', 'phase_c')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A minimal Hugging Face Qwen2 config.json (what model.hf_checkpoint folders hold).
_HF_CONFIG = {'model_type': 'qwen2', 'vocab_size': 1000, 'hidden_size': 64,
              'intermediate_size': 128, 'num_hidden_layers': 2, 'num_attention_heads': 4,
              'num_key_value_heads': 2, 'rope_theta': 10000.0, 'rms_norm_eps': 1e-6,
              'tie_word_embeddings': True, 'max_position_embeddings': 4096}


def _paper(phase):
  c = common.get_config(phase, 'scale=paper')
  c.model.hf_checkpoint = '/models/Qwen2.5-7B-Instruct'
  return c


# SPEC values that hold in every phase at paper scale: (field, value, SPEC section).
SPEC_VALUES = [
    ('memory.context_budget', 2048), ('memory.policy_input_limit', 8192),       # §1
    ('memory.retrieve_top_k', 3), ('memory.cost_cap', 1.0),                     # §2, §3
    ('memory.cost_parse', 1.0), ('memory.cost_unknown_tool', 1.0),
    ('memory.cost_bad_argument', 0.5), ('memory.cost_missing_id', 0.5),
    ('memory.cost_foreign_ref', 1.0), ('memory.cost_unsupported_write', 0.5),
    ('memory.cost_unjustified_delete', 0.5), ('memory.cost_protected_removal', 1.0),
    ('memory.cost_context_overflow', 0.5), ('memory.cost_budget_exceeded', 0.5),
    ('memory.cost_leakage', 1.0), ('episodes.context_budget', 2048),
    ('sft.train_per_target', 4000), ('sft.dev_per_target', 500),
    ('sft.template_fraction', 0.5), ('sft.min_negative_fraction', 0.25),
    ('sft.learning_rate', 2e-5), ('sft.warmup_ratio', 0.03), ('sft.max_grad_norm', 1.0),
    ('sft.batch_size', 64), ('sft.num_epochs', 3),                              # §4
    ('rl.tasks_per_update', 8), ('rl.rollouts_per_task', 8),
    ('sampling.temperature', 0.7), ('sampling.top_p', 0.95),
    ('sampling.eval_temperature', 0.0), ('eval.temperature', 0.0),
    ('reward.delta', 0.5),                                                      # §5
    ('advantage.std_floor', 0.01), ('advantage.epsilon', 1e-6),
    ('advantage.advantage_clip', 5.0), ('advantage.local_min_count', 8),
    ('advantage.running_stats_decay', 0.99), ('advantage.running_stats_init_count', 128),
    ('advantage.lambda_local', 1.0), ('advantage.lambda_global', 1.0),
    ('advantage.lambda_constraint', 1.0),
    ('advantage.mode', 'full'), ('advantage.rejection_floor', 'none'),     # Eq. 5
    ('verifier.fallback', 'skip'),                                              # §5
    ('rl.learning_rate', 1e-6), ('rl.clip_epsilon', 0.2), ('rl.kl_beta', 0.1),
    ('rl.kl_estimator', 'exact'), ('rl.max_grad_norm', 1.0), ('rl.entropy_coef', 0.0),
    ('eval.budgets', (1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000)),  # §7
    ('eval.target_success', 40.0), ('eval.target_budget', 2500),
    ('eval.seeds', (42, 43, 44)), ('seed', 42), ('data.dev_fraction', 0.1),
    ('model.preset', 'qwen2.5-7b-instruct'),
]


def _get(c, path):
  for part in path.split('.'):
    c = c[part]
  return c


@pytest.mark.parametrize('phase', PHASES)
def test_paper_scale_carries_spec_values(phase):
  c = _paper(phase)
  validation.validate_config(c)
  for path, value in SPEC_VALUES:
    assert _get(c, path) == value, path
  assert c.phase == phase and c.scale == 'paper'


def test_paper_phase_specific_values():
  expected = {'phase_a': (1000, 8000, 800, 'A', 'sft'),
              'phase_b': (1000, 8000, 800, 'B', 'phase_a'),
              'phase_c': (1500, 12000, 1200, 'C', 'phase_b')}
  for phase, (updates, train, dev, ops, ref) in expected.items():
    c = _paper(phase)
    assert (c.rl.num_updates, c.episodes.num_train, c.episodes.num_dev,
            library.library_configs(c)['memory'].phase,
            curriculum.PREVIOUS_PHASE[phase]) == (updates, train, dev, ops, ref)
  assert library.library_configs(_paper('sft'))['memory'].phase == 'C'


@pytest.mark.parametrize('phase', PHASES)
def test_single_valued_fields_are_gone(phase):
  # The op space and π_ref follow from config.phase (SPEC §4) and the SFT targets are
  # the eight decision types: none of them is a field a flag could set.
  c = _paper(phase)
  assert 'op_space' not in c.episodes and 'reference_phase' not in c.rl
  assert 'num_targets' not in c.sft


def _leaves(c, prefix=''):
  out = {}
  for key, value in c.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_leaves(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


@pytest.mark.parametrize('phase', PHASES)
def test_every_tiny_deviation_is_named_and_in_the_docs_table(phase):
  tiny_c, paper_c = _leaves(common.get_config(phase)), _leaves(_paper(phase))
  page = open(os.path.join(REPO, 'docs', 'cpu-scale.md')).read()
  table = page.split('## Where the CPU default departs from the paper')[1]
  table = table.split('\n#')[0]
  for field in tiny_lib.DEVIATIONS:
    assert tiny_c[field] != paper_c[field], field
    assert f'`{field}`' in table, f'{field} is missing from docs/cpu-scale.md\'s table'
  # Fields that change a formula are all named (sizes and rates are free to shrink).
  formula_fields = {'sft.loss_reduction', 'rl.loss_reduction', 'advantage.mode',
                    'advantage.std_floor',
                    'advantage.local_min_count', 'advantage.rejection_floor',
                    'advantage.lambda_local', 'advantage.lambda_global',
                    'advantage.lambda_constraint', 'advantage.epsilon',
                    'advantage.advantage_clip', 'verifier.fallback', 'verifier.backend',
                    'solver.backend', 'memory.local_ids', 'model.hf_checkpoint'}
  changed = {f for f in formula_fields if f in paper_c and tiny_c[f] != paper_c[f]}
  assert changed == set(tiny_lib.DEVIATIONS), changed ^ set(tiny_lib.DEVIATIONS)


@pytest.mark.parametrize('phase', PHASES)
def test_tiny_scale_defaults_run_anywhere(phase, data_dir):
  c = common.get_config(phase)  # default arg: tiny
  assert c.scale == 'tiny'
  validation.validate_config(c, check_paths=True)
  # The packaged pretrained base (a stand-in for the pretrained Qwen; issue 22).
  assert c.model.hf_checkpoint == paths.packaged_base()
  # The packaged small-vocabulary SentencePiece model (issue 9), not a data file.
  assert c.tokenizer.name == 'hotpotqa-sp4k'
  assert c.tokenizer.path == paths.packaged_tokenizer()
  assert c.data.data_dir == data_dir
  for split in ('train', 'validation'):
    assert os.path.isfile(hotpotqa.find_split_file(split, library.hotpotqa_dir(c)))
  assert c.verifier.backend == 'heuristic' and c.solver.backend == 'oracle'
  if phase != 'sft':
    assert c.rl.tasks_per_update * c.rl.rollouts_per_task <= 32
    assert 1 <= c.rl.num_updates <= 8
  # The dev-transition count and the batch count for batch statistics shrink with the
  # batch, σ's floor is coarser, and rejections are floored below the executable
  # commands (ours, not Eq. 5); the rest is SPEC's (tiny.py says why).
  tiny_adv, paper_adv = c.advantage.to_dict(), _paper(phase).advantage.to_dict()
  for field in ('running_stats_init_count', 'local_min_count'):
    assert 1 <= tiny_adv.pop(field) <= paper_adv.pop(field)
  assert tiny_adv.pop('std_floor') >= paper_adv.pop('std_floor')
  assert (tiny_adv.pop('rejection_floor'),
          paper_adv.pop('rejection_floor')) == ('below_executable', 'none')
  assert tiny_adv == paper_adv
  assert (c.rl.clip_epsilon, c.rl.kl_beta, c.sampling.temperature) == (0.2, 0.1, 0.7)


@pytest.mark.parametrize('phase', PHASES)
def test_phase_modules_get_config(phase):
  mod = importlib.import_module(f'experiments.configs.{phase}')
  assert mod.get_config().scale == 'tiny'
  assert mod.get_config(None).phase == phase
  assert mod.get_config('scale=paper').scale == 'paper'
  assert mod.get_config('paper').scale == 'paper'
  assert mod.get_config('scale=tiny').model.preset == 'tiny-sp4k'
  assert mod.get_config('scale=small').scale == 'small'


def test_bad_scale_argument():
  with pytest.raises(ValueError, match="unknown scale 'huge'"):
    common.get_config('phase_b', 'scale=huge')
  with pytest.raises(ValueError, match="unknown config argument 'lr'"):
    common.get_config('phase_b', 'lr=3')
  with pytest.raises(ValueError, match="unknown phase 'phase_d'"):
    common.get_config('phase_d')


@pytest.mark.parametrize('field,value,match', [
    ('rl.learning_rate', -1e-6, 'config.rl.learning_rate'),
    ('sft.learning_rate', 0.0, 'config.sft.learning_rate'),
    ('verifier.backend', 'gpt', "config.verifier: verifier.backend='gpt'"),
    ('verifier.fallback', 'x', 'config.verifier: verifier.fallback'),
    ('memory.context_budget', 0, 'config.memory:'),
    ('advantage.local_min_count', 0, 'config.advantage:'),
    ('reward.delta', 1.5, 'config.reward:'),
    ('rl.rollouts_per_task', 1, 'config.rl.rollouts_per_task: K=1'),
    ('advantage.mode', 'other', 'config.advantage: AdvantageConfig.mode'),
    ('advantage.rejection_floor', 'always',
     "config.advantage: AdvantageConfig.rejection_floor='always'; expected one of "
     r"\('none', 'below_executable'\)"),
    ('rl.kl_estimator', 'k2', 'config.rl.kl_estimator'),
    ('sampling.top_p', 0.0, 'config.sampling.top_p'),
    ('advantage.running_stats_decay', 1.0, 'config.advantage.running_stats_decay'),
    ('memory.cost_parse', 2.0, 'config.memory.cost_parse'),
    ('solver.backend', 'gpt', 'config.solver.backend'),
    ('batching.length_buckets', (256, 512), 'config.batching.length_buckets'),
    ('batching.command_buckets', (32, 16), 'config.batching.command_buckets'),
    # Tiny scale: policy_input_limit 640, prompt overhead 64, max_command_tokens 192.
    ('batching.length_buckets', (256, 512, 640 + 64),
     r'config.batching.length_buckets: largest bucket 704 < .* = 896'),
    ('sampling.prompt_buckets', (256, 640),
     r'config.sampling.prompt_buckets: largest bucket 640 < .* 640 \+ 64 = 704'),
    ('sampling.prompt_buckets', (512, 256), 'config.sampling.prompt_buckets: must be'),
    ('sampling.prompt_buckets', (), 'config.sampling.prompt_buckets: must be'),
    ('sampling.prompt_overhead_tokens', -1, 'config.sampling.prompt_overhead_tokens'),
    ('eval.target_budget', 90000, 'config.eval.target_budget'),
    ('model.preset', 'qwen9', 'config.model.preset'),
    ('rl.old_logprobs', 'both', 'config.rl.old_logprobs'),
    ('sft.teacher_backend', 'gpt', 'config.sft.teacher_backend'),
    ('sft.teacher_timeout_s', 0.0, 'config.sft.teacher_timeout_s'),
    ('model.mesh_fsdp', 0, 'config.model.mesh_fsdp'),
    ('model.mesh_data', -2, 'config.model.mesh_data'),
    ('model.attn_implementation', 'flash2', 'config.model.attn_implementation'),
    ('model.attn_block_kv', 0, 'config.model.attn_block_kv'),
    ('batching.loss_chunk_size', 0, 'config.batching.loss_chunk_size'),
    ('rl.eval_every', 0, 'config.rl.eval_every'),
    ('rl.selection_metric', 'j_judge', 'config.rl.selection_metric'),
    ('rl.eval_episodes', -1, 'config.rl.eval_episodes'),
    # An RL phase with no update is refused by validation, so --dry_run refuses it too.
    ('rl.num_updates', 0, r'config.rl.num_updates: must be >= 1 in an RL phase \(phase_b\)'),
    ('rl.num_updates', -1, 'config.rl.num_updates: must be >= 1'),
    ('solver.backend', 'openai_compatible', 'config.solver.base_url'),
    ('solver.timeout_s', 0.0, 'config.solver.timeout_s'),
    ('eval.budgets', (5000, 1000), 'config.eval.budgets: must be a non-empty increasing'),
    # A command line's `--config.eval.budgets=abc` arrives as ('abc',).
    ('eval.budgets', ('abc',), r"config.eval.budgets: .*got \('abc',\)"),
    ('eval.seeds', (), 'config.eval.seeds'),
    ('eval.seeds', (42, 42), 'config.eval.seeds: repeats'),
    ('eval.temperature', 0.7, 'config.eval.temperature'),
    ('eval.num_questions', -1, 'config.eval.num_questions'),
    ('eval.batch_size', -2, 'config.eval.batch_size'),
    ('eval.success_rule', 'f1', 'config.eval.success_rule'),
    ('eval.success_rule', 'judge', "config.eval.success_rule: 'judge' needs"),
    ('eval.judge_success_threshold', 1.5, 'config.eval.judge_success_threshold'),
    ('eval.judge.backend', 'qwen-max', 'config.eval.judge'),
    ('eval.judge.fallback', 'midpoint', 'config.eval.judge'),
])
def test_validate_names_bad_field(field, value, match):
  c = common.get_config('phase_b')
  if field.startswith('model.preset'):
    c.model.hf_checkpoint = None  # a preset shapes a random init only
  *parents, leaf = field.split('.')
  node = c
  for p in parents:
    node = node[p]
  node[leaf] = value
  with pytest.raises(ValueError, match=match):
    validation.validate_config(c)


def test_eval_config_validates_and_is_greedy(data_dir):
  c = common.get_config('eval_hotpotqa')
  validation.validate_config(c)
  assert library.library_configs(c)['memory'].phase == 'C'
  assert c.eval.num_questions == 32 and c.eval.seeds == (42,)  # tiny: a short table
  paper = common.get_config('eval_hotpotqa', 'scale=paper')
  assert paper.eval.num_questions == 0 and paper.eval.seeds == (42, 43, 44)
  assert paper.eval.judge.backend == '' and paper.eval.success_rule == 'auto'
  assert paper.rl.eval_every == 50 and paper.rl.selection_metric == 'r_task'
  c.solver.temperature = 0.7
  with pytest.raises(ValueError, match='config.solver.temperature'):
    validation.validate_config(c)
  assert 'judge' in library.library_configs(common.get_config('phase_b'))


def test_paper_scale_requires_hf_checkpoint(tmp_path):
  c = common.get_config('phase_a', 'scale=paper')
  with pytest.raises(ValueError, match='config.model.hf_checkpoint: paper scale needs'):
    validation.validate_config(c)
  c.model.hf_checkpoint = str(tmp_path / 'missing')
  validation.validate_config(c)
  # The shared data root holds only the samples: paper scale refuses to train on them.
  with pytest.raises(ValueError, match='config.data.hotpotqa_dir: paper scale trains on '
                     'the full HotpotQA train split'):
    validation.validate_config(c, check_paths=True)
  (tmp_path / 'hotpotqa').mkdir()
  (tmp_path / 'hotpotqa' / paper.PAPER_TRAIN_FILE).write_text('[]')
  c.data.hotpotqa_dir = str(tmp_path / 'hotpotqa')
  with pytest.raises(ValueError, match='config.model.hf_checkpoint.*not a directory'):
    validation.validate_config(c, check_paths=True)
  c.model.hf_checkpoint = str(tmp_path)
  with pytest.raises(ValueError, match='config.model.hf_checkpoint: .*config.json'):
    validation.validate_config(c, check_paths=True)  # a folder without config.json
  (tmp_path / 'config.json').write_text(json.dumps(_HF_CONFIG))
  # tokenizer.path unset at paper scale: the checkpoint folder must hold the tokenizer.
  with pytest.raises(ValueError, match=r'config.tokenizer.path: .*holds none of .*'
                     r'read from model.hf_checkpoint'):
    validation.validate_config(c, check_paths=True)
  (tmp_path / 'tokenizer.json').write_text('{}')
  validation.validate_config(c, check_paths=True)


def test_check_paths_names_missing_data_dir(tmp_path):
  c = common.get_config('sft')
  c.data.data_dir = str(tmp_path / 'nope')
  with pytest.raises(ValueError, match='config.data.data_dir'):
    validation.validate_config(c, check_paths=True)


def test_power_of_two_buckets():
  assert derived.power_of_two_buckets(256, 8448) == [256, 512, 1024, 2048, 4096, 8192, 8448]
  assert derived.power_of_two_buckets(16, 64) == [16, 32, 64]
  with pytest.raises(ValueError):
    derived.power_of_two_buckets(0, 8)


def test_quarter_octave_buckets_pad_at_most_a_quarter():
  buckets = derived.quarter_octave_buckets(256, 8256)
  assert buckets[:9] == [256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560]
  assert buckets[-3:] == [7168, 8192, 8256]
  # Every length from 4 x min_len on pads to at most 1.25 x itself (hand bound).
  for n in range(1024, 8257):
    assert next(b for b in buckets if b >= n) <= 1.25 * n, n
  assert derived.quarter_octave_buckets(256, 300) == [256, 300]
  with pytest.raises(ValueError):
    derived.quarter_octave_buckets(0, 8)


def test_library_configs_hold_spec_defaults():
  """The config layer and the libraries agree on every SPEC number (paper scale)."""
  for phase, op_space in (('phase_a', 'A'), ('phase_b', 'B'), ('phase_c', 'C')):
    built = library.library_configs(_paper(phase))
    assert built['memory'] == memory_config.ExecutorConfig(phase=op_space)
    assert built['advantage'] == advantages.AdvantageConfig()
    assert built['reward'] == rewards.RewardConfig()
    assert built['episodes'].num_train == paper.PAPER_EPISODES[phase][0]
    assert built['env'].rollout_limit == built['episodes'].rollout_limit
  tiny = library.library_configs(common.get_config('phase_b'))
  assert tiny['verifier'].backend == 'heuristic'
  assert tiny['advantage'].rejection_floor == 'below_executable'  # ours (tiny.py)
  assert tiny['episodes'].context_budget == tiny['memory'].context_budget


@pytest.mark.parametrize('phase', ('phase_a', 'phase_b', 'phase_c'))
def test_paper_config_is_eq5_exactly_and_skips_failed_verifier_calls(phase):
  """SPEC §5-6: A^hier = A^local + A^global - c (A^local = 0 for a rejection), no
  rejection floor; a failed verifier call gives no score ('skip'), also the dataclass
  default for code that builds VerifierConfig itself."""
  built = library.library_configs(_paper(phase))
  cfg = built['advantage']
  assert (cfg.mode, cfg.lambda_local, cfg.lambda_global, cfg.lambda_constraint,
          cfg.rejection_floor) == ('full', 1.0, 1.0, 1.0, 'none')
  assert built['verifier'].fallback == 'skip'
  assert verifier_base.VerifierConfig().fallback == 'skip'
  # The issue-22 update shape by hand (ε = 0, batch statistics from 2 instances): ∅
  # scored 1.0 / 0.5 -> A^local +1 / -1; A^global +1 / -1 (r^global 0.75 / 0.25); a
  # rejected Delete (c 0.5) keeps A^global - c = 0.5, above the executable ∅ at -2.
  cfg = dataclasses.replace(cfg, epsilon=0.0, local_min_count=2)
  out = advantages.compute_advantages(
      group_ids=[0, 0], trajectory_index=[0, 1, 0], ops=['Null', 'Null', 'Delete'],
      accepted=[True, True, False], costs=[0.0, 0.0, 0.5], r_local=[1.0, 0.5, np.nan],
      r_global=[0.75, 0.25], config=cfg, running_stats=running_stats.RunningStats())
  np.testing.assert_allclose(out.a_hier, [2.0, -2.0, 0.5], rtol=0, atol=1e-12)
  assert out.metrics['advantage/rejection_preference_share'] == 0.5


def test_model_config_from_preset_or_hf_folder(tmp_path):
  tiny = library.model_config(common.get_config('sft'))
  assert tiny.vocab_size == 4096 and tiny.dtype == 'bfloat16'
  assert tiny.param_dtype == 'float32' and not tiny.scan_layers
  paper = common.get_config('phase_a', 'scale=paper')
  cfg = library.model_config(paper)  # no checkpoint set: the named preset
  assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.dtype, cfg.remat,
          cfg.scan_layers) == (3584, 28, 'bfloat16', True, True)
  (tmp_path / 'config.json').write_text(json.dumps(_HF_CONFIG))
  paper.model.hf_checkpoint = str(tmp_path)
  cfg = library.model_config(paper)
  assert (cfg.vocab_size, cfg.hidden_size, cfg.dtype, cfg.scan_layers) == (
      1000, 64, 'bfloat16', True)
  # A config written before model.scan_layers existed keeps QwenConfig's default.
  del paper.model['scan_layers']
  assert not library.model_config(paper).scan_layers
  paper.model.hf_checkpoint = str(tmp_path / 'nope')
  with pytest.raises(ValueError, match='config.model.hf_checkpoint'):
    library.model_config(paper)
  paper.model.hf_checkpoint = None
  paper.model.preset = 'qwen9'
  with pytest.raises(ValueError, match="config.model.preset: unknown Qwen preset 'qwen9'"):
    library.model_config(paper)


def test_context_budget_is_one_shared_field():
  # episodes.context_budget references memory.context_budget: overriding either one
  # changes both, so the scenarios always build C_0 inside the executor's budget.
  c = common.get_config('phase_b')
  c.memory.context_budget = 900
  assert c.episodes.context_budget == 900
  c.episodes.context_budget = 700
  assert c.memory.context_budget == 700
  validation.validate_config(c)


def test_library_configs_name_the_section_of_an_unknown_key():
  c = common.get_config('phase_b')
  with c.unlocked():
    c.advantage.extra_field = 1
  with pytest.raises(ValueError, match=r"config.advantage: unknown AdvantageConfig config "
                                       r"keys \['extra_field'\]"):
    library.library_configs(c)


@pytest.mark.parametrize('scale, prompt, length', [
    # tiny: every 128 tokens from 384 to policy_input_limit 640 + overhead 64; + the
    # max_command_tokens 192 for a learner row.
    ('tiny', (384, 512, 640, 704), (384, 512, 640, 768, 896)),
    # paper: prompts in quarter octaves (docs/compilation.md), rows powers of two.
    ('paper', (256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096,
               5120, 6144, 7168, 8192, 8256),
     (256, 512, 1024, 2048, 4096, 8192, 8512)),
])
def test_buckets_end_at_prompt_and_row_limits(scale, prompt, length):
  c = common.get_config('phase_c', f'scale={scale}')
  assert c.sampling.prompt_overhead_tokens == 64
  # Longest prompt = x_t limit + template framing; longest learner row adds a command.
  assert c.sampling.prompt_buckets == prompt
  assert prompt[-1] == c.memory.policy_input_limit + 64
  assert c.batching.length_buckets == length
  assert length[-1] == prompt[-1] + c.sampling.max_command_tokens
  assert derived.derived_buckets(c) == {'sampling.prompt_buckets': prompt,
                                        'batching.length_buckets': length,
                                        'batching.command_buckets':
                                            c.batching.command_buckets}
  # The plain values reach the libraries (to_dict resolves the references).
  assert c.sampling.to_dict()['prompt_buckets'] == prompt
  assert library.library_configs(c)['batching'].length_buckets == length
  # The sampling section maps 1:1 onto the policy's sampling dataclass (what the
  # trainers build), so the sampler gets the same prompt buckets and overhead.
  from vermem_jax.rl import policy  # pylint: disable=g-import-not-at-top
  pcfg = policy.PolicySamplingConfig(**c.sampling.to_dict())
  assert (pcfg.prompt_buckets, pcfg.prompt_overhead_tokens) == (prompt, 64)


def test_overriding_limits_moves_derived_buckets():
  c = common.get_config('phase_b', 'scale=paper')
  c.model.hf_checkpoint = '/ckpt'  # required at paper scale; not read here
  c.memory.policy_input_limit = 1000
  c.sampling.max_command_tokens = 40
  assert c.sampling.prompt_buckets == (256, 512, 768, 1024, 1064)
  assert c.batching.length_buckets == (256, 512, 1024, 1104)
  assert c.batching.command_buckets == (16, 32, 40)
  tiny = common.get_config('phase_b')  # the tiny scheme moves the same way
  tiny.memory.policy_input_limit = 600
  tiny.sampling.max_command_tokens = 40
  assert tiny.sampling.prompt_buckets == (384, 512, 640, 664)
  assert tiny.batching.length_buckets == (384, 512, 640, 704)
  assert tiny.batching.command_buckets == (40,)
  assert derived.derived_buckets(tiny)['batching.length_buckets'] == (384, 512, 640, 704)
  c.sampling.prompt_overhead_tokens = 100
  assert c.sampling.prompt_buckets[-1] == 1100
  assert c.batching.length_buckets[-1] == 1140
  validation.validate_config(c)
  # An explicit bucket tuple replaces the derivation and no longer follows the limit.
  c.batching.length_buckets = (512, 4096)
  c.memory.policy_input_limit = 2000
  assert c.batching.length_buckets == (512, 4096)
  assert c.sampling.prompt_buckets == (256, 512, 768, 1024, 1280, 1536, 1792, 2048,
                                       2100)
  validation.validate_config(c)
  c.memory.policy_input_limit = 4000  # 4000 + 100 + 40 > 4096
  with pytest.raises(ValueError, match='config.batching.length_buckets: largest bucket '
                     '4096'):
    validation.validate_config(c)


def _parse_flags(config_file, *overrides):
  """Parses `--config=<file> overrides...` as experiments/run.py does."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(common.__file__), config_file)
  argv = ['prog', f'--config={path}', *overrides]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=fv, sys_argv=argv)
  fv(argv)
  return fv.config


def test_sft_teacher_fields_reach_the_sft_data_config():
  """--config.sft.teacher_* flags (config_flags) end up in envs.sft_data's config."""
  from vermem_jax.envs.sft_data import config as sft_data_config  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import sft  # pylint: disable=g-import-not-at-top
  c = common.get_config('sft')
  assert c.sft.teacher_backend is None
  defaults = sft_data_config.SFTDataConfig()
  for name in ('teacher_max_tokens', 'teacher_temperature'):
    assert c.sft[name] == getattr(defaults, name), name
  for name in ('api_key_env', 'timeout_s', 'base_url', 'model'):
    assert c.sft['teacher_' + name] == getattr(defaults.teacher, name), name
  c = _parse_flags('sft.py', '--config.sft.teacher_backend=openai_compatible',
                   '--config.sft.teacher_base_url=http://127.0.0.1:9/v1',
                   '--config.sft.teacher_model=qwen-teacher',
                   '--config.sft.teacher_timeout_s=5', '--config.sft.teacher_max_tokens=99')
  validation.validate_config(c)
  run = run_setup.RunSetup.from_config(c)
  data_cfg = run.sft.data
  assert data_cfg.teacher_backend == 'openai_compatible'
  assert data_cfg.teacher.base_url == 'http://127.0.0.1:9/v1'
  assert data_cfg.teacher.model == 'qwen-teacher'
  assert data_cfg.teacher.timeout_s == 5.0 and data_cfg.teacher_max_tokens == 99
  assert sft.trajectory_fingerprint(run)['teacher_backend'] == 'openai_compatible'
  c = _parse_flags('sft.py', '--config.sft.teacher_backend=openai_compatible')
  with pytest.raises(ValueError, match='config.sft.teacher_base_url'):
    validation.validate_config(c)


def test_old_logprobs_field():
  from vermem_jax.train import rl_learner  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import rl_resume  # pylint: disable=g-import-not-at-top
  for phase in ('phase_a', 'phase_b', 'phase_c'):
    assert _paper(phase).rl.old_logprobs == 'learner'
  assert common.get_config('phase_b').rl.old_logprobs == 'learner'
  assert common.get_config('phase_b').rl.old_logprobs == rl_learner.DEFAULT_OLD_LOGPROBS
  assert validation.OLD_LOGPROBS_SOURCES == rl_learner.OLD_LOGPROBS_SOURCES
  c = _parse_flags('phase_b.py', '--config.rl.old_logprobs=sampler')
  validation.validate_config(c)
  run = run_setup.RunSetup.from_config(c)
  assert rl_resume.trajectory_fingerprint(run)['old_logprobs'] == 'sampler'


def test_loss_reduction_field():
  from vermem_jax.rl import grpo  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import rl_resume  # pylint: disable=g-import-not-at-top
  for phase in ('phase_a', 'phase_b', 'phase_c'):
    assert _paper(phase).rl.loss_reduction == 'decision'  # Eq. 11
  assert validation.GRPO_REDUCTIONS == grpo.GRPO_REDUCTIONS
  eq11 = run_setup.RunSetup.from_config(
      _parse_flags('phase_b.py', '--config.rl.loss_reduction=decision'))
  assert eq11.rl.loss.reduction == 'decision'
  # A run stored before the field existed has no key: it resumes under Eq. 11 only.
  fp = rl_resume.trajectory_fingerprint(eq11)
  older = {k: v for k, v in fp.items() if k != 'loss_reduction'}
  rl_resume.check_resume({'fingerprint': older}, fp, '/ckpt', eq11.model.hf_checkpoint)
  c = _parse_flags('phase_b.py', '--config.rl.loss_reduction=sqrt')
  validation.validate_config(c)
  run = run_setup.RunSetup.from_config(c)
  assert run.rl.loss.reduction == 'sqrt'
  assert rl_resume.trajectory_fingerprint(run)['loss_reduction'] == 'sqrt'
  with pytest.raises(ValueError, match="loss_reduction: 'decision' -> 'sqrt'"):
    rl_resume.check_resume({'fingerprint': older}, rl_resume.trajectory_fingerprint(run),
                           '/ckpt', run.model.hf_checkpoint)
  c = _parse_flags('phase_b.py', '--config.rl.loss_reduction=tokens')
  with pytest.raises(ValueError, match='rl.loss_reduction'):
    validation.validate_config(c)


def test_model_config_is_the_trainers():
  from vermem_jax.train import setup  # pylint: disable=g-import-not-at-top
  c = common.get_config('phase_b')
  assert library.model_config(c) == setup.model_config_from(c)


def test_command_line_override_keeps_buckets_consistent():
  """--config.memory.policy_input_limit through ml_collections' config_flags (the same
  parsing experiments/run.py does) moves the derived buckets; an explicit bucket flag
  wins over the derivation."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(common.__file__), 'phase_a.py')

  def parse(*overrides):
    argv = ['prog', f'--config={path}', *overrides]
    fv = flags.FlagValues()
    # sys_argv: config_flags registers one flag per override it finds there.
    config_flags.DEFINE_config_file('config', flag_values=fv, sys_argv=argv)
    fv(argv)
    return fv.config

  c = parse('--config.memory.policy_input_limit=3000')
  # The tiny scheme: every 128 tokens from 384, then 3064 (+ max_command_tokens 192).
  assert c.sampling.prompt_buckets == tuple(range(384, 3064, 128)) + (3064,)
  assert c.batching.length_buckets == tuple(range(384, 3256, 128)) + (3256,)
  validation.validate_config(c)
  c = parse('--config.memory.policy_input_limit=3000',
            '--config.sampling.prompt_buckets=(1024, 3064)',
            '--config.sampling.max_command_tokens=32')
  assert c.sampling.prompt_buckets == (1024, 3064)
  assert c.batching.length_buckets == tuple(range(384, 3096, 128)) + (3096,)
  assert c.batching.command_buckets == (32,)
  validation.validate_config(c)
  c = parse('--config.sampling.prompt_buckets=(256, 512)')  # tiny needs 640 + 64
  with pytest.raises(ValueError, match='config.sampling.prompt_buckets: largest bucket '
                     '512 < '):
    validation.validate_config(c)


def test_check_paths_names_missing_split_file_and_bad_tokenizer(tmp_path):
  """Caught by validation, before a trainer starts (was a FileNotFoundError traceback
  from inside the SFT data loader / a transformers error)."""
  c = common.get_config('sft')
  c.data.data_dir = str(tmp_path)
  (tmp_path / 'hotpotqa').mkdir()  # exists, but holds no split file
  with pytest.raises(ValueError, match=r"config.data.hotpotqa_dir: no HotpotQA train "
                     r"file in .*hotpot_train_v1.1.json"):
    validation.validate_config(c, check_paths=True)
  (tmp_path / 'hotpotqa' / 'train_sample.json').write_text('[]')
  c.tokenizer.path = str(tmp_path / 'missing_tok')
  with pytest.raises(ValueError, match='config.tokenizer.path: .*does not exist'):
    validation.validate_config(c, check_paths=True)
  (tmp_path / 'empty_tok').mkdir()
  c.tokenizer.path = str(tmp_path / 'empty_tok')
  with pytest.raises(ValueError, match='config.tokenizer.path: .*holds none of'):
    validation.validate_config(c, check_paths=True)
  sp = tmp_path / 'tok.model'  # a SentencePiece file is a valid tokenizer path
  sp.write_bytes(b'x')
  c.tokenizer.path = str(sp)
  validation.validate_config(c, check_paths=True)


def test_tokenizer_must_fit_model_vocab(tmp_path, qwen25_tokenizer_dir):
  c = common.get_config('sft')
  validation.check_tokenizer_fits_model(c)  # tiny-sp4k: 4,096 rows, 4,096 pieces
  c.tokenizer.path = qwen25_tokenizer_dir
  with pytest.raises(ValueError, match=r"config.tokenizer.path: tokenizer .* has 151665 "
                     r"ids but the model's vocab_size \(embedding rows\) is 4096"):
    validation.check_tokenizer_fits_model(c)
  c.model.preset = 'tiny'
  c.model.hf_checkpoint = None  # the preset, not the packaged base
  validation.check_tokenizer_fits_model(c)  # tiny preset: Qwen's 151,936 rows
  small = dict(_HF_CONFIG, vocab_size=1000)
  (tmp_path / 'config.json').write_text(json.dumps(small))
  c.model.hf_checkpoint = str(tmp_path)
  with pytest.raises(ValueError, match=r"config.tokenizer.path: tokenizer .* has 151665 "
                     r"ids but the model's vocab_size \(embedding rows\) is 1000"):
    validation.check_tokenizer_fits_model(c)


def test_check_paths_names_missing_solver_and_verifier_checkpoints(tmp_path):
  c = common.get_config('phase_a')
  c.solver.hf_checkpoint = str(tmp_path / 'no_solver')
  with pytest.raises(ValueError, match=r"config.solver.hf_checkpoint: '.*no_solver' is "
                     'not a directory'):
    validation.validate_config(c, check_paths=True)
  c.solver.hf_checkpoint = None
  c.verifier.backend = 'local_model'
  c.verifier.checkpoint_path = str(tmp_path / 'no_judge')
  with pytest.raises(ValueError, match='config.verifier.checkpoint_path: .*no_judge'):
    validation.validate_config(c, check_paths=True)
  c.verifier.checkpoint_path = ''  # random-init verifier (tests): allowed
  validation.validate_config(c, check_paths=True)


def test_tiny_tokenizer_path_follows_data_dir_and_name(tmp_path):
  """`--config.data.data_dir=/elsewhere` (what the data-dir error suggests) moves the
  tokenizer too; an explicit tokenizer.path wins; paper scale keeps None."""
  c = common.get_config('phase_a')
  c.data.data_dir = str(tmp_path)
  assert c.tokenizer.path == paths.packaged_tokenizer()  # packaged: not under data_dir
  c.tokenizer.name = 'qwen2.5'
  assert c.tokenizer.path == os.path.join(str(tmp_path), 'tokenizers', 'qwen2.5')
  c.tokenizer.name = 'qwen3'
  assert c.tokenizer.path == os.path.join(str(tmp_path), 'tokenizers', 'qwen3')
  assert c.to_dict()['tokenizer']['path'] == c.tokenizer.path
  c.tokenizer.path = '/my/tok'
  c.data.data_dir = '/other'
  assert c.tokenizer.path == '/my/tok'
  assert common.get_config('phase_a', 'scale=paper').tokenizer.path is None


def test_tiny_tokenizer_path_follows_data_dir_on_command_line(tmp_path, data_dir):
  import pathlib  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  other = tmp_path / 'elsewhere'  # a second data root (links, not copies)
  other.mkdir()
  for name in ('hotpotqa', 'tokenizers'):
    os.symlink(os.path.join(data_dir, name), other / name)
  repo = pathlib.Path(__file__).resolve().parent.parent
  res = subprocess.run(
      [sys.executable, str(repo / 'experiments' / 'run.py'), '--config=sft',
       f'--config.data.data_dir={other}', '--config.tokenizer.name=qwen2.5',
       '--config.model.preset=tiny', f'--workdir={tmp_path / "wd"}', '--dry_run'],
      capture_output=True, text=True, timeout=120,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert res.returncode == 0, res.stderr
  assert f"config.tokenizer.path = '{other}/tokenizers/qwen2.5'" in res.stdout
  assert 'error' not in res.stderr  # the moved tokenizer passes the path checks


def test_issue11_fields_defaults_mirrors_and_errors():
  from vermem_jax.rl import grpo  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import optim  # pylint: disable=g-import-not-at-top
  assert validation.LR_SCHEDULES == optim.LR_SCHEDULES
  assert validation.NLL_REDUCTIONS == grpo.NLL_REDUCTIONS
  for phase in ('phase_a', 'phase_b', 'phase_c'):
    r = _paper(phase).rl
    assert (r.num_iterations, r.mini_batches_per_iteration) == (1, 1)
    assert r.loss_temperature is None and r.max_log_ratio == 20.0
    assert (r.adam_b1, r.adam_b2, r.adam_eps) == (0.9, 0.999, 1e-8)
    assert (r.lr_schedule, r.warmup_ratio) == ('constant', 0.0)
  s = _paper('sft').sft
  assert s.loss_reduction == 'sequence' and s.lr_schedule == 'linear'
  assert common.get_config('sft').sft.loss_reduction == 'sqrt'  # tiny
  assert _paper('phase_b').verifier.global_history_tokens == 4096
  c = _parse_flags('phase_b.py', '--config.rl.num_iterations=2',
                   '--config.rl.loss_temperature=1.0')
  validation.validate_config(c)
  assert c.rl.num_iterations == 2 and c.rl.loss_temperature == 1.0
  assert c.sampling.temperature == 0.7  # independent fields
  for flag, field in (('--config.rl.num_iterations=0', 'rl.num_iterations'),
                      ('--config.rl.lr_schedule=step', 'rl.lr_schedule'),
                      ('--config.sft.loss_reduction=mean', 'sft.loss_reduction'),
                      ('--config.sft.adam_b2=1.0', 'sft.adam_b2'),
                      ('--config.rl.max_consecutive_skips=0', 'rl.max_consecutive_skips'),
                      ('--config.advantage.mode=local_only', 'advantage')):
    cfg = _parse_flags('phase_b.py' if flag.startswith('--config.rl') or 'advantage'
                       in flag else 'sft.py', flag)
    with pytest.raises(ValueError, match=f'config.{field}'):
      validation.validate_config(cfg)


# The fields parts/small.py sets on top of the tiny scale (issue 37).
SMALL_FIELDS = {'model.preset', 'model.hf_checkpoint', 'tokenizer.name', 'tokenizer.path',
                'model.scan_layers', 'model.attn_implementation', 'sft.learning_rate',
                'rl.learning_rate', 'scale'}


@pytest.mark.parametrize('phase', ['sft', 'phase_a', 'phase_c', 'eval_hotpotqa'])
def test_small_scale_is_tiny_with_smollm2(phase, monkeypatch, tmp_path):
  monkeypatch.setenv(paths.SMALL_MODEL_DIR_ENV, str(tmp_path / 'smol'))
  small = overrides_lib.config_leaves(common.get_config(phase, 'scale=small'))
  tiny = overrides_lib.config_leaves(common.get_config(phase))
  assert small.keys() == tiny.keys()
  assert {k for k in small if small[k] != tiny[k]} == SMALL_FIELDS
  assert small['model.hf_checkpoint'] == small['tokenizer.path'] == str(tmp_path / 'smol')
  assert small['sft.learning_rate'] < tiny['sft.learning_rate']
  # The preset is SmolLM2's shape (a Llama model), so plans need no weights.
  preset = qwen_config.QwenConfig.preset(small['model.preset'])
  assert (preset.model_type, preset.num_hidden_layers, preset.vocab_size) == (
      'llama', 30, 49152)
  with pytest.raises(ValueError, match='pretrain builds'):
    common.get_config('pretrain', 'scale=small')
