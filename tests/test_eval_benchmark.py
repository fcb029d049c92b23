"""End-to-end evaluation on the interactive benchmarks (vermem_jax.eval.benchmark_suite
through eval.evaluate) and the table2 aggregation through the CLI, on this CPU: a tiny
random policy, the gold-plan stand-in solver, a few short instances."""
import json
import os
import subprocess
import sys

import pytest

from bench_support import require_benchmark
from experiments.configs import common
from experiments.configs.parts import validation
from vermem_jax.eval import evaluate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_config(name, out_root, **benchmark):
  c = common.get_config(f'eval_{name}')
  c.sampling.max_command_tokens = 16   # a random model never stops early: keep it short
  c.eval.seeds = (42,)
  c.eval.budgets = (1000, 2000, 4000, 8000)
  c.eval.target_budget = 2000
  c.eval.output_dir = os.path.join(str(out_root), f'eval_{name}')
  for k, v in benchmark.items():
    c.benchmark[k] = v
  return c


def _jsonl(path):
  with open(path) as f:
    return [json.loads(l) for l in f]


def _cli(config, *args):
  return subprocess.run(
      [sys.executable, 'experiments/run.py', f'--config={config}', *args], cwd=REPO,
      capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(
          REPO, 'third_party')])))


def test_benchmark_evaluations_and_table2(tmp_path, random_sft_workdir):
  require_benchmark('pddl')
  require_benchmark('babyai')
  out = tmp_path / 'results'
  # PDDL: Base and the random SFT policy on two blocks problems (plans of 8 and 7).
  c = bench_config('pddl', out, problems=('blocks/problem2', 'blocks/problem6'))
  res = evaluate.run_evaluation(c, random_sft_workdir)
  recs = _jsonl(res['paths']['jsonl'])
  assert sorted({r['policy'] for r in recs}) == ['base', 'sft']
  assert sorted({r['instance_id'] for r in recs}) == ['pddl/blocks/problem2',
                                                     'pddl/blocks/problem6']
  for r in recs:  # the gold plan solves each; the memory loop ran every decision
    assert r['success'] and r['progress'] == 1.0 and r['terminated_by'] == 'env_end'
    assert r['tn'] == sum(s['policy_input_tokens'] + s['policy_output_tokens']
                          + s['solver_input_tokens'] + s['solver_output_tokens']
                          for s in r['steps'])
    assert r['decisions'] == r['env_steps'] == len(r['steps'])
  base = [r for r in recs if r['policy'] == 'base']
  sft = [r for r in recs if r['policy'] == 'sft']
  assert all(r['tn_policy'] == 0 and r['tc'] == 0 for r in base)
  assert all(s['policy_input_tokens'] > 0 for r in sft for s in r['steps'])
  data = json.load(open(res['paths']['json']))
  meta = data['meta']
  assert meta['solver_backend'] == 'gold_plan' and meta['benchmark'] == 'pddl'
  assert meta['gold_plan_lengths'] == {'pddl/blocks/problem2': 8,
                                       'pddl/blocks/problem6': 7}
  assert data['aggregate']['base']['progress_rate']['mean'] == 100.0
  # Frontier derived from the unbudgeted runs: the share of successes within budget.
  for policy in ('base', 'sft'):
    tns = [r['tn'] for r in recs if r['policy'] == policy]
    want = [100.0 * sum(t <= b for t in tns) / len(tns) for b in c.eval.budgets]
    assert data['aggregate'][policy]['frontier']['mean'] == want
  assert 'STAND-IN' in res['table'] and 'PR %' in res['table']
  assert os.path.getsize(res['paths']['frontier']) > 0
  # BabyAI, Base only, twice: the same seed gives the same records.
  c = bench_config('babyai', out, levels=('BabyAI-GoToObj-v0', 'BabyAI-PickupLoc-v0'))
  c.eval.policies = 'base'
  first = evaluate.run_evaluation(c, random_sft_workdir)
  again = evaluate.run_evaluation(c, random_sft_workdir)
  assert _jsonl(first['paths']['jsonl']) == _jsonl(again['paths']['jsonl'])
  # Table 2 from the two evaluations, through the CLI.
  cli = _cli('table2.py', f'--workdir={out}', '--config.eval.target_budget=2000',
             '--config.eval.budgets=(1000,2000,4000,8000)')
  assert cli.returncode == 0, cli.stderr
  text = cli.stdout
  assert '| base | absent | absent | 100.0† | 100.0† | absent |' in text
  assert '(2 of 5: PDDL, BabyAI)' in text and 'Not evaluated (absent): ALFWorld' in text
  assert '| sft | absent | absent | 100.0† | absent | absent |' in text
  assert 'Efficiency frontier: macro SR over BabyAI (ALFWorld, SciWorld not evaluated)' \
      in text
  table = json.load(open(out / 'table2' / 'table2.json'))
  assert table['average_over'] == {'base': ['pddl', 'babyai'], 'sft': ['pddl']}
  assert os.path.getsize(out / 'table2' / 'frontier_table2.png') > 0


def test_cli_errors_name_the_problem(tmp_path, monkeypatch):
  out = _cli('table2.py', f'--workdir={tmp_path}')
  assert out.returncode == 2 and 'eval_<benchmark>/results.json' in out.stderr
  require_benchmark('alfworld')
  empty = tmp_path / 'alf'
  monkeypatch.setenv('ALFWORLD_DATA', str(empty))
  out = _cli('eval_alfworld.py', f'--workdir={tmp_path}', '--config.eval.policies=base')
  assert out.returncode == 2
  assert 'ALFWORLD_DATA' in out.stderr and 'alfworld-download' in out.stderr
  out = _cli('eval_pddl.py', f'--workdir={tmp_path}', '--dry_run')
  assert out.returncode == 0 and 'plan: evaluate base (seed 42' in out.stdout


def test_benchmark_configs_validate():
  for name in ('alfworld', 'scienceworld', 'pddl', 'babyai'):
    c = common.get_config(f'eval_{name}')
    validation.validate_config(c)
    assert c.solver.backend == 'gold_plan' and c.eval.max_decisions == 0
    paper = common.get_config(f'eval_{name}', 'scale=paper')
    assert paper.solver.backend == 'llm' and paper.eval.num_questions == 0
  paper = common.get_config('eval_scienceworld', 'scale=paper')
  assert paper.benchmark.split == 'test' and paper.benchmark.tasks == ()
  assert paper.benchmark.pool_size == paper.eval.batch_size == 16
  assert common.get_config('eval_alfworld', 'paper').benchmark.split == 'valid_unseen'
  c = common.get_config('eval_pddl')
  c.solver.backend = 'oracle'
  with pytest.raises(ValueError, match='config.solver.backend.*HotpotQA only'):
    validation.validate_config(c)
  c = common.get_config('eval_hotpotqa')
  c.solver.backend = 'gold_plan'
  with pytest.raises(ValueError, match='interactive benchmarks only'):
    validation.validate_config(c)
  c = common.get_config('table2', 'scale=paper')
  validation.validate_config(c)  # aggregation needs no checkpoint


def test_http_action_solver_plays_the_benchmark(tmp_path, random_sft_workdir,
                                                monkeypatch):
  """An OpenAI-compatible server as the task solver: it gets the benchmark's action
  prompt with q and C only, and its 'Action: ...' replies are what the env plays."""
  bench = require_benchmark('pddl')
  import chat_server  # pylint: disable=import-outside-toplevel
  cfg = bench.config_class(problems=('blocks/problem6',))
  (inst,) = bench.instances(cfg)
  plan = bench.gold_plan(inst, cfg)
  server = chat_server.LoopbackChatServer(
      lambda n, body: f'I will go on.\nAction: {plan[min(n, len(plan)) - 1]}')
  monkeypatch.setenv('VERMEM_SOLVER_API_KEY', 'k')
  try:
    c = bench_config('pddl', tmp_path, problems=('blocks/problem6',))
    c.eval.policies = 'base'
    c.solver.backend = 'openai_compatible'
    c.solver.base_url = server.url
    c.solver.model = 'solver'
    res = evaluate.run_evaluation(c, random_sft_workdir)
  finally:
    server.close()
  (rec,) = _jsonl(res['paths']['jsonl'])
  assert rec['success'] and [s['action'] for s in rec['steps']] == plan
  assert len(server.requests) == len(plan)
  first = server.requests[0]['body']['messages']
  assert 'PDDL planning problem' in first[0]['content'] and "'Action: <action>'" in \
      first[0]['content']
  assert first[1]['content'].startswith('Task: ') and 'Goal: reach a state' in \
      first[1]['content']
  assert 'OpenAI-compatible server' in res['table'] and 'STAND-IN' not in res['table']
