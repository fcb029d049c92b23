"""Memory episodes on the interactive benchmarks (vermem_jax.eval.bench_episodes and the
interactive branch of envs.environment.run_episodes): one full episode per available
benchmark — a scripted memory policy issuing real commands, the gold-plan solver and
hard token budgets — checked against the same plan played without memory."""
import json
import re

import pytest

from bench_support import require_benchmark, require_scienceworld
from vermem_jax.envs import action_solvers as A
from vermem_jax.envs import environment as E
from vermem_jax.envs import episode_types
from vermem_jax.envs import interactive as I
from vermem_jax.envs import task_solvers as ts
from vermem_jax.eval import bench_episodes as be
from vermem_jax.eval import episodes as hq_episodes
from vermem_jax.eval import frontier
from vermem_jax.eval import metrics
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import state as mstate
from vermem_jax.memory.token_count import count_whitespace_tokens as count

CFG = mconfig.ExecutorConfig(phase='C', context_budget=400, policy_input_limit=3000)
_ENV_ITEM = re.compile(r'current environment item "?([^";\s]+)"?;')
_ITEM = re.compile(r'^\["([^"]+)" (\w+)[^\]]*\] (".*")$', re.MULTILINE)


class ScriptedMemoryPolicy:
  """Commands built from x_t alone: the first decision stores the start of the
  current observation in LTM (Add citing the env item), the second drops the oldest
  observation that is not the current one (Filter) when there is one, the third is a
  malformed command, then ∅. Token counts are those of x_t and the command."""

  def __init__(self):
    self.inputs = []

  def __call__(self, xs):
    out = []
    for x in xs:
      self.inputs.append(x)
      t = int(re.search(r'(\d+) actions played', x).group(1)) if 'actions played' in x else 0
      items = [(i, kind, json.loads(text)) for i, kind, text in _ITEM.findall(x)]
      env_item = _ENV_ITEM.search(x).group(1)
      obs = [i for i, kind, _ in items if kind == 'observation' and i != env_item]
      if t == 0 and env_item != 'none':
        text = next(txt for i, _, txt in items if i == env_item)
        cmd = f'Add(content={json.dumps(text[:40])}, source_refs=["{env_item}"])'
      elif t == 1 and obs:
        cmd = f'Filter(drop_refs=["{obs[0]}"])'
      elif t == 2:
        cmd = 'remember all of this please'
      else:
        cmd = '∅'
      out.append(episode_types.PolicyOutput(cmd, count(x), count(cmd)))
    return out


def _plan_solver(bench, plans):
  return A.GoldPlanSolver(plans, rules=bench.action_prompt)


def _run(bench, cfg, inst, plan, *, policy=None, budget=None, max_decisions=40, base=False):
  return be.run_instances(bench, cfg, [inst], policy or ScriptedMemoryPolicy(),
                          _plan_solver(bench, {inst.instance_id: plan}),
                          count_tokens=count, executor_config=CFG,
                          max_decisions=max_decisions, base=base, token_budget=budget)[0]


def check_full_episode(bench, cfg, inst, plan):
  """The memory episode plays the plan to success; everything it saw is what the
  environment says when the plan is played without memory; budgets cut it exactly."""
  with bench.make_env(inst, cfg) as env:
    ref = I.play(env, plan)
  assert ref.success
  res = _run(bench, cfg, inst, plan)
  assert res.terminated_by == 'env_end' and res.success and res.progress == 1.0
  assert res.env_steps == len(plan) == res.num_decisions == res.task_steps
  assert [d.action for d in res.decisions] == [I.normalize_action(a) for a in plan]
  assert [d.observation.text for d in res.decisions] == [s.observation for s in ref.steps]
  s0 = res.spec.initial_state
  assert s0.M == () and s0.H == () and s0.q == ref.reset.task  # paper C.2
  assert [it.kind for it in s0.C][:1] == ['instruction']
  if len(s0.C) > 1:
    assert s0.C[1].text == ref.reset.observation
  # H records every action and reply in order.
  h = [(e.kind, e.text) for e in res.final_state.H
       if e.kind in (mstate.EV_TASK_ACTION, mstate.EV_OBSERVATION)]
  assert [t for k, t in h if k == mstate.EV_OBSERVATION] == [s.observation
                                                              for s in ref.steps]
  # The memory commands acted: an Add (LTM holds it), a rejected malformed command.
  ops = [d.op for d in res.decisions]
  assert ops[0] == 'Add' and res.decisions[0].accepted
  added = json.loads(re.search(r'content=(".*?")', res.decisions[0].command).group(1))
  assert [e.content for e in res.final_state.active_entries()] == [added]
  assert ops[1] == 'Filter' and res.decisions[1].accepted
  assert s0.C[1].id not in {it.id for it in res.decisions[1].state_after_memory.C}
  assert ops[2] == 'Invalid' and not res.decisions[2].accepted
  assert res.tool_calls == sum(d.is_tool_call for d in res.decisions) >= 1
  # TN: every policy and solver call (the solver counts nothing here), by hand.
  assert res.online_tokens == sum(count(d.policy_input) + count(d.command)
                                  for d in res.decisions)
  rec = metrics.episode_record(res, policy='scripted', seed=0)
  assert rec['instance_id'] == inst.instance_id and rec['benchmark'] == bench.name
  assert rec['success'] and rec['progress'] == 1.0 and rec['em'] is None
  assert rec['env_steps'] == len(plan) and rec['invalid_actions'] == 0
  assert [s['action'] for s in rec['steps']] == [d.action for d in res.decisions]
  # Hard budgets: cut at k decisions' worth of tokens, the episode stops unsuccessful
  # there and never plays the action that crossed it; the derived frontier agrees.
  cum = [0]
  for d in res.decisions:
    cum.append(cum[-1] + count(d.policy_input) + count(d.command))
  k = len(plan) // 2
  cut = _run(bench, cfg, inst, plan, budget=cum[k] + 1)
  assert cut.terminated_by == 'token_budget' and not cut.success
  assert cut.env_steps == k and cut.num_decisions == k + 1
  assert cut.decisions[-1].violations[-1].kind == 'budget_exceeded'
  assert cut.success == frontier.success_within_budget(res.success, res.online_tokens,
                                                       cum[k] + 1)
  for budget in (res.online_tokens - 1, res.online_tokens):
    hard = _run(bench, cfg, inst, plan, budget=budget)
    assert hard.success == frontier.success_within_budget(res.success,
                                                          res.online_tokens, budget)
  # A decision limit below the plan ends it unsuccessful ('rollout_limit').
  short = _run(bench, cfg, inst, plan, max_decisions=k)
  assert short.terminated_by == 'rollout_limit' and not short.success
  assert short.env_steps == k
  return res


def test_pddl_memory_episode():
  bench = require_benchmark('pddl')
  cfg = bench.config_class(problems=('blocks/problem2',))
  (inst,) = bench.instances(cfg)
  plan = bench.gold_plan(inst, cfg)
  assert plan and len(plan) <= 10
  res = check_full_episode(bench, cfg, inst, plan)
  # Progress rate: the running best of the goal fraction the env reported.
  fractions = [d.env_step.info['goal_fraction'] for d in res.decisions]
  assert [d.env_step.progress for d in res.decisions] == pytest.approx(
      [max(fractions[:i + 1]) for i in range(len(fractions))])
  # A half plan under a short decision limit keeps its partial progress (PR).
  half = _run(bench, cfg, inst, plan, max_decisions=len(plan) // 2)
  assert 0.0 < half.progress < 1.0 and half.progress == pytest.approx(
      max(fractions[:len(plan) // 2]))


def test_babyai_memory_episode_and_base():
  bench = require_benchmark('babyai')
  cfg = bench.config_class(levels=('BabyAI-PickupLoc-v0',), episodes_per_level=1)
  (inst,) = bench.instances(cfg)
  plan = bench.gold_plan(inst, cfg)
  check_full_episode(bench, cfg, inst, plan)
  # Base: no memory command, no policy token, the newest observations kept in C.
  res = _run(bench, cfg, inst, plan, policy=hq_episodes.base_policy, base=True)
  assert res.success and res.tool_calls == 0 and res.policy_input_tokens == 0
  assert {d.op for d in res.decisions} == {'Null'} and res.final_state.M == ()
  last = res.decisions[-1].observation.text
  assert res.final_state.C[-1].text == last
  assert sum(it.tokens for it in res.final_state.C) <= CFG.context_budget


def test_alfworld_tiny_game_memory_episode(tmp_path, monkeypatch):
  bench = require_benchmark('alfworld')
  monkeypatch.setenv('ALFWORLD_DATA', str(tmp_path))  # importing alfworld mkdirs it
  from vermem_benchmarks.alfworld import tiny_game
  tiny_game.build(str(tmp_path))
  cfg = bench.config_class(data_dir=str(tmp_path))
  (inst,) = bench.instances(cfg)
  check_full_episode(bench, cfg, inst, list(tiny_game.GOLD_PLAN))


@pytest.fixture(scope='module')
def scienceworld():
  yield require_scienceworld()
  from vermem_benchmarks import scienceworld as sw
  sw.POOL.close_all()


def test_scienceworld_memory_episode(scienceworld):
  # pool_size=1: the instance list, the gold plan and every episode share one JVM.
  cfg = scienceworld.config_class(tasks=('find-living-thing',), variations_per_task=1,
                                  pool_size=1)
  (inst,) = scienceworld.instances(cfg)
  plan = scienceworld.gold_plan(inst, cfg)
  check_full_episode(scienceworld, cfg, inst, plan)


class _Counter(I.InteractiveEnv):
  """A toy environment: 'inc' adds one; done at 3."""
  benchmark = 'toy'

  def _reset(self):
    self.n = 0
    return 'count to three', 'n is 0', {}

  def _step(self, action):
    if action != 'inc':
      return f'unknown action {action!r}', False, False, self.n / 3, {'valid': False}
    self.n += 1
    return f'n is {self.n}', self.n == 3, self.n == 3, self.n / 3, {'valid': True}


def test_loop_contract_on_a_toy_env():
  env = _Counter('toy/1')
  spec = be.build_env_episode(env, count_tokens=count, context_budget=100,
                              max_decisions=10)
  assert spec.example is None and spec.task_id == 'toy/1' and spec.env is env
  with pytest.raises(ValueError, match='share one interactive environment'):
    E.run_episodes([spec, spec], hq_episodes.base_policy, A.GoldPlanSolver({}),
                   count_tokens=count)
  # 'check valid actions' costs a decision, no step; a reply without 'Action:' plays
  # its raw text (here the env does not understand it, the step counts).
  replies = iter(['Action: check valid actions', 'jump', 'Action: inc', 'Action: inc',
                  'Action: inc'])

  class Scripted(ts.TaskSolver):
    def solve(self, inputs):
      outs = []
      for _ in inputs:
        text = next(replies)
        kind, action = A.parse_action_reply(text)
        outs.append(ts.SolverOutput(kind, None, text, 0, 0, action=action))
      return outs

  (res,) = E.run_episodes([spec], hq_episodes.base_policy, Scripted(),
                          count_tokens=count)
  assert [d.action for d in res.decisions] == ['check valid actions', 'jump', 'inc',
                                               'inc', 'inc']
  assert res.env_steps == 4 and res.success and res.terminated_by == 'env_end'
  assert res.decisions[0].observation.text.startswith('This environment has no list')
  assert res.decisions[-1].next_state.task_state == (
      'acting in the environment; 4 actions played, the latest: inc')
  rec = metrics.episode_record(res, policy='base', seed=1)
  assert rec['invalid_actions'] == 2  # the help command (no list here) and 'jump'
  with pytest.raises(ValueError, match='observations must be empty'):
    episode_types.EpisodeSpec('x', None, spec.initial_state, observations=(episode_types.Observation('a'),),
                  env=env)
  with pytest.raises(ValueError, match='example or an interactive environment'):
    episode_types.EpisodeSpec('x', None, spec.initial_state)
