"""Tests for vermem_jax.train.rl_selection: internal-dev scoring of RL checkpoints."""
import json

import pytest

from vermem_jax.envs import environment as env
from vermem_jax.envs import episode_types
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.envs.scenarios import build as scenario_build
from vermem_jax.envs.scenarios import spec as scenario_spec
from vermem_jax.envs import task_solvers as ts
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor
from vermem_jax.memory.token_count import count_whitespace_tokens as count
from vermem_jax.train import checkpoint_selection
from vermem_jax.train import internal_dev
from vermem_jax.train import phase_runner
from vermem_jax.train import rl_selection


@pytest.fixture(scope='module')
def dev_specs(hotpotqa_dir):
  examples = hotpotqa_sources.load_examples('json', 'train', data_dir=hotpotqa_dir)
  _, dev = hotpotqa.split_train_pools(examples)
  cfg = scenario_spec.ScenarioConfig(num_dev=4, context_budget=2048)
  return scenario_build.build_episodes(dev, 'B', count_tokens=count, config=cfg, split='dev'), dev


def test_reference_commands_score_higher_than_null(dev_specs):
  specs, dev = dev_specs
  oracle = ts.OracleEvidenceReader.from_examples(dev)
  cfg = mconfig.ExecutorConfig(phase='B', context_budget=2048, policy_input_limit=4096)
  kw = dict(count_tokens=count, executor_config=cfg, env_config=episode_types.EnvConfig(),
            seed=0, metric='r_task')
  null = rl_selection.dev_evaluation(specs, lambda xs, rng: ['∅'] * len(xs), oracle,
                                     **kw)
  first = {}

  def reference(xs, rng):
    out = []
    for x in xs:
      spec = next(s for s in specs if json.dumps(s.initial_state.q) in x)
      out.append(spec.reference_command if spec.episode_id not in first else '∅')
      first[spec.episode_id] = True
    return out

  ref = rl_selection.dev_evaluation(specs, reference, oracle, **kw)
  assert ref['dev/score'] == ref['dev/r_task'] and ref['dev/episodes'] == 4.0
  assert ref['dev/score'] > null['dev/score']
  assert 0.0 <= null['dev/m_ans'] <= null['dev/r_task'] <= 1.0
  assert null['dev/tool_calls'] == 0.0 and null['dev/invalid_rate'] == 0.0
  assert null['dev/op_share/Null'] == 1.0
  em = rl_selection.dev_evaluation(specs, lambda xs, rng: ['∅'] * len(xs), oracle,
                                   **dict(kw, metric='em'))
  assert em['dev/score'] == em['dev/em']


def test_dev_op_shares_count_every_decision(dev_specs):
  """dev/op_share/<kind> against a count over the same episodes run directly: a tool
  call under its tool, ∅ as Null, and text that is not a command (naming no tool, or a
  tool with a broken argument list) as Unparseable, as the evaluation counts it."""
  specs, dev = dev_specs
  oracle = ts.OracleEvidenceReader.from_examples(dev)
  cfg = mconfig.ExecutorConfig(phase='B', context_budget=2048, policy_input_limit=4096)
  calls = []

  texts = ('junk', 'Retrieve(query="capital")', 'Retrieve("capital")', '∅')

  def policy(xs, rng):  # the four texts in turn, by call and episode
    calls.append(len(xs))
    return [texts[(len(calls) - 1 + i) % len(texts)] for i in range(len(xs))]
  out = rl_selection.dev_evaluation(specs, policy, oracle, count_tokens=count,
                                    executor_config=cfg, env_config=episode_types.EnvConfig(),
                                    seed=0, metric='r_task')
  calls.clear()
  results = env.run_episodes(list(specs), lambda xs: policy(xs, None), oracle,
                             count_tokens=count, executor_config=cfg,
                             env_config=episode_types.EnvConfig())
  decisions = [d for r in results for d in r.decisions]
  kind_of = {'junk': 'Unparseable', 'Retrieve(query="capital")': 'Retrieve',
             'Retrieve("capital")': 'Unparseable', '∅': 'Null'}
  kinds = [kind_of[d.policy_output.text] for d in decisions]
  # The executor files the broken call under the tool it names; the mix does not.
  assert {d.op for d in decisions if d.policy_output.text == 'Retrieve("capital")'} == {
      'Retrieve'}
  shares = {k[len('dev/op_share/'):]: v for k, v in out.items()
            if k.startswith('dev/op_share/')}
  assert shares == {k: pytest.approx(kinds.count(k) / len(kinds)) for k in set(kinds)}
  assert set(shares) == {'Unparseable', 'Retrieve', 'Null'}, (len(decisions), shares)


def test_episode_scores_hand_case(dev_specs):
  specs, _ = dev_specs
  spec = specs[0]
  gold = spec.example.answer
  rec = episode_types.DecisionRecord(
      step=0, policy_input='x', policy_output=episode_types.PolicyOutput('junk'), op='Invalid',
      accepted=False, violations=(), cost=1.0, is_tool_call=False,
      transition_message='', state=spec.initial_state,
      state_after_memory=spec.initial_state, next_state=spec.initial_state,
      solver_output=ts.SolverOutput(ts.ANSWER, gold, f'Answer: {gold}'),
      observation=None)
  rec2 = episode_types.DecisionRecord(**{**rec.__dict__, 'step': 1, 'cost': 0.0, 'op': 'Null',
                               'accepted': True})
  res = episode_types.EpisodeResult(spec=spec, decisions=(rec, rec2),
                          final_state=spec.initial_state, final_answer=gold,
                          terminated_by='answer',
                          policy_input_tokens=0, policy_output_tokens=0,
                          solver_input_tokens=0, solver_output_tokens=0, task_steps=2,
                          tool_calls=0)
  s = internal_dev.episode_record(res)
  assert s['em'] == 1.0 and s['f1'] == 1.0 and s['r_task'] == 1.0
  assert s['m_ans'] == pytest.approx(0.5)  # 1 - mean cost (1 + 0) / 2
  assert s['p_aux'] == pytest.approx(0.5) and s['rejected'] == 1
  assert s['decisions'] == 2 and dict(s['ops']) == {'Unparseable': 1, 'Null': 1}
  # The rejected one carries no violation here, so it is neither unparseable nor
  # outside the tools.
  assert s['unparseable'] == 0 and s['not_allowed'] == 0


def test_rejected_rate_split_by_cause_hand_case(dev_specs):
  specs, _ = dev_specs
  spec = specs[0]

  def decision(step, op, accepted, *kinds):
    return episode_types.DecisionRecord(
        step=step, policy_input='x', policy_output=episode_types.PolicyOutput('t'),
        op=op, accepted=accepted,
        violations=tuple(executor.Violation(k, 1.0, k) for k in kinds),
        cost=float(bool(kinds)), is_tool_call=op not in ('Null', 'Invalid'),
        transition_message='', state=spec.initial_state,
        state_after_memory=spec.initial_state, next_state=spec.initial_state,
        solver_output=None, observation=None)

  def result(*decisions):
    return episode_types.EpisodeResult(
        spec=spec, decisions=decisions, final_state=spec.initial_state,
        final_answer=None, terminated_by='env_end', policy_input_tokens=0,
        policy_output_tokens=0, solver_input_tokens=0, solver_output_tokens=0,
        task_steps=len(decisions), tool_calls=0)

  # Episode 1: unparseable text, an unknown tool, a tool outside the phase, ∅.
  # Episode 2: an Add rejected for a missing id (neither part); an accepted Add whose
  # interaction overflowed the budget (accepted: in no part); a rejection whose first
  # (T_m's) violation is outside-the-tools and a later one a budget overflow; and one
  # carrying both kinds, counted once, by its first.
  first = internal_dev.episode_record(result(
      decision(0, 'Invalid', False, 'parse'), decision(1, 'Invalid', False, 'unknown_tool'),
      decision(2, 'Filter', False, 'op_not_allowed'), decision(3, 'Null', True)))
  second = internal_dev.episode_record(result(
      decision(0, 'Add', False, 'missing_id'), decision(1, 'Add', True, 'budget_exceeded'),
      decision(2, 'Filter', False, 'op_not_allowed', 'budget_exceeded'),
      decision(3, 'Filter', False, 'parse', 'op_not_allowed')))
  assert (first['rejected'], first['unparseable'], first['not_allowed']) == (3, 2, 1)
  assert (second['rejected'], second['unparseable'], second['not_allowed']) == (3, 1, 1)
  out = internal_dev.summary([first, second])
  # Over the 8 decisions of both episodes: 6 rejected, 3 unparseable, 2 outside.
  assert out['rejected_rate'] == pytest.approx(6 / 8)
  assert out['unparseable_rate'] == pytest.approx(3 / 8)
  assert out['not_allowed_rate'] == pytest.approx(2 / 8)


def test_metric_checks_and_eval_steps():
  with pytest.raises(ValueError, match='selection_metric'):
    rl_selection.check_metric('j_judge')  # held-out judges never select
  assert [n for n in range(1, 8) if phase_runner.itstime(n, 3, 7)] == [3, 6, 7]
  assert [n for n in range(1, 8) if phase_runner.itstime(n, 0, 7)] == [7]
  assert rl_selection.selection_metrics({'dev/score': 0.25, 'dev/invalid_rate': 0.5}, 6) == {
      checkpoint_selection.RL_SELECTION_SCORE: 0.25,
      checkpoint_selection.RL_SELECTION_INVALID: 0.5,
      checkpoint_selection.RL_SELECTION_STEP: 6}
