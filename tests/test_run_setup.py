"""The typed setup of a phase (vermem_jax/train/run_setup.py)."""
import dataclasses

import pytest

from experiments.configs import common
from vermem_jax.memory import commands
from vermem_jax.train import rl_resume
from vermem_jax.train import run_setup
from vermem_jax.train import setup as setup_lib
from vermem_jax.train import sft


@pytest.mark.parametrize('phase,op_space', [('sft', 'C'), ('phase_a', 'A'),
                                            ('phase_b', 'B'), ('phase_c', 'C')])
def test_sections_follow_the_config(phase, op_space):
  c = common.get_config(phase)
  run = run_setup.RunSetup.from_config(c)
  assert run.phase == phase and run.seed == c.seed
  assert run.executor.phase == op_space == commands.PHASE_OP_SPACE[phase]
  assert run.executor.policy_input_limit == c.memory.policy_input_limit
  assert run.scenario.num_train == c.episodes.num_train
  assert run.sampling.temperature == c.sampling.temperature
  assert tuple(run.batching.length_buckets) == tuple(c.batching.length_buckets)
  assert run.model.config == setup_lib.model_config_from(c)
  assert run.model.tokenizer_path == c.tokenizer.path
  assert run.loop.save_every == c.checkpoint.save_every
  assert run.solver.backend == c.solver.backend
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.seed = 0  # built once, read everywhere
  if phase == 'sft':
    assert run.rl is None
    assert run.sft.batch_size == c.sft.batch_size
    assert run.sft.data.seed == c.episodes.seed  # the set does not follow the run seed
    assert run.sft.optimizer(40).total_steps == 40
    assert run.sft.optimizer(40).learning_rate == c.sft.learning_rate
  else:
    assert run.sft is None
    r = run.rl
    assert (r.rollout.tasks_per_update, r.rollout.rollouts_per_task) == (
        c.rl.tasks_per_update, c.rl.rollouts_per_task)
    steps = c.rl.num_updates * c.rl.num_iterations * c.rl.mini_batches_per_iteration
    assert r.opt.total_steps == steps and r.opt.learning_rate == c.rl.learning_rate
    # loss_temperature None: the loss runs at the sampling temperature.
    assert c.rl.loss_temperature is None and r.loss_temperature is None
    assert r.loss.temperature == c.sampling.temperature
    assert r.running_stats_sft_data.dev_per_target == c.advantage.running_stats_init_count
    assert r.running_stats_sft_data.train_per_target == 1
    assert r.running_stats_sft_data.teacher_backend is None


@pytest.mark.parametrize('field,value,match', [
    ('rl.entropy_coef', 0.01, 'config.rl.entropy_coef'),
    ('rl.num_updates', 0, 'config.rl.num_updates'),
    ('sampling.temperature', 0.0, 'config.sampling.temperature'),
    ('rl.selection_metric', 'j_judge', 'selection_metric'),
])
def test_cross_section_checks_name_the_field(field, value, match):
  c = common.get_config('phase_b')
  section, name = field.split('.')
  c[section][name] = value
  with pytest.raises(ValueError, match=match):
    run_setup.RunSetup.from_config(c)


def test_fingerprints_read_the_typed_setup():
  c = common.get_config('phase_b')
  c.rl.loss_temperature = 0.9
  fp = rl_resume.trajectory_fingerprint(run_setup.RunSetup.from_config(c))
  assert fp['loss_temperature'] == 0.9 and fp['temperature'] == c.sampling.temperature
  assert fp['adam'] == [c.rl.adam_b1, c.rl.adam_b2, c.rl.adam_eps]  # a list, as stored
  assert fp['model'] == setup_lib.model_identity(c) and fp['phase'] == 'phase_b'
  s = common.get_config('sft')
  fp = sft.trajectory_fingerprint(run_setup.RunSetup.from_config(s))
  assert fp['max_sequence_tokens'] == s.batching.length_buckets[-1]
  assert fp['train_per_target'] == s.sft.train_per_target
  assert fp['episodes_seed'] == s.episodes.seed


def test_a_missing_tokenizer_is_refused_when_loaded():
  c = common.get_config('phase_b')
  c.tokenizer.path = None
  c.model.hf_checkpoint = None
  run = run_setup.RunSetup.from_config(c)  # typing needs no tokenizer
  assert run.model.tokenizer_path == ''
  with pytest.raises(ValueError, match='config.tokenizer.path: no tokenizer folder'):
    setup_lib.load_tokenizer(run.model.tokenizer_path)
