"""End-to-end tests of the HotpotQA evaluation (vermem_jax.eval.evaluate, the CLI)."""
import json
import os
import shutil
import subprocess
import sys

import chat_server
import jax
import pytest

from experiments.configs import common
from vermem_jax.eval import evaluate
from vermem_jax.eval import policies as eval_policies
from vermem_jax.models import qwen
from vermem_jax.train import checkpoint_values
from vermem_jax.train import checkpoints
from vermem_jax.train import rl_resume
from vermem_jax.train import setup as setup_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def eval_config(tmp_path, **eval_fields):
  c = common.get_config('eval_hotpotqa')
  c.sampling.max_command_tokens = 16   # a random model never stops early: keep it short
  c.eval.num_questions = 2
  c.eval.seeds = (42,)
  c.eval.budgets = (1000, 2000, 4000, 8000)
  c.eval.target_budget = 2000
  c.eval.output_dir = str(tmp_path / 'out')
  for k, v in eval_fields.items():
    c.eval[k] = v
  return c


@pytest.fixture(scope='module')
def workdir(random_sft_workdir):
  return random_sft_workdir


def _jsonl(path):
  with open(path) as f:
    return [json.loads(l) for l in f]


def test_base_and_a_phase_twice_identical(tmp_path, workdir):
  c = eval_config(tmp_path)
  first = evaluate.run_evaluation(c, workdir)
  recs = _jsonl(first['paths']['jsonl'])
  again = evaluate.run_evaluation(c, workdir)
  assert _jsonl(again['paths']['jsonl']) == recs  # same seed, same results
  assert again['aggregate'] == first['aggregate']
  # Default policies: Base + every phase with a checkpoint.
  assert sorted({r['policy'] for r in recs}) == ['base', 'sft']
  assert len(recs) == 4 and {r['seed'] for r in recs} == {42}
  assert all(r['budget'] is None for r in recs)
  base = [r for r in recs if r['policy'] == 'base']
  assert all(s['op'] == 'Null' and s['policy_input_tokens'] == 0
             for r in base for s in r['steps'])
  assert all(r['tc'] == 0 and r['tn_policy'] == 0 and r['final_ltm'] == [] for r in base)
  sft = [r for r in recs if r['policy'] == 'sft']
  assert all(s['policy_input_tokens'] > 0 for r in sft for s in r['steps'])
  assert [r['question_id'] for r in base] == [r['question_id'] for r in sft]
  assert all(r['tn'] == sum(s['policy_input_tokens'] + s['policy_output_tokens']
                            + s['solver_input_tokens'] + s['solver_output_tokens']
                            for s in r['steps']) for r in recs)
  # Files and labels.
  paths = first['paths']
  for key in ('md', 'csv', 'json', 'jsonl', 'frontier'):
    assert os.path.getsize(paths[key]) > 0
  assert any(p.endswith('bars_em.png') for p in paths['bars'])
  table = first['table']
  assert 'DIAGNOSTIC' in table and 'J_judge and MQ are absent' in table
  data = json.load(open(paths['json']))
  assert data['meta']['policies']['sft'][0]['step'] == 3
  assert data['aggregate']['base']['j_judge']['mean'] is None
  curve = data['aggregate']['base']['frontier']['mean']
  assert len(curve) == 4 and curve == sorted(curve)


def test_failed_evaluation_keeps_the_previous_episodes(tmp_path, workdir, monkeypatch):
  c = eval_config(tmp_path)
  first = evaluate.run_evaluation(c, workdir)
  path = first['paths']['jsonl']
  before = open(path).read()
  real = eval_policies.load_policy

  def failing(source, *args, **kwargs):
    if source.label == 'sft':  # after Base has run and its records were written
      raise ValueError('sft checkpoint unreadable')
    return real(source, *args, **kwargs)
  monkeypatch.setattr(eval_policies, 'load_policy', failing)
  with pytest.raises(ValueError, match='unreadable'):
    evaluate.run_evaluation(c, workdir)
  assert open(path).read() == before
  assert not os.path.exists(path + '.partial')


def test_an_evaluation_with_other_settings_keeps_the_previous_one(tmp_path, workdir,
                                                                   caplog):
  first = evaluate.run_evaluation(eval_config(tmp_path, policies='base'), workdir)
  out = os.path.dirname(first['paths']['md'])
  assert first['previous'] is None
  # The same settings again: replaced in place (a rerun reproduces them).
  assert evaluate.run_evaluation(eval_config(tmp_path, policies='base'),
                                 workdir)['previous'] is None
  assert evaluate.PREVIOUS_SUBDIR not in os.listdir(out)
  before = {name: open(os.path.join(out, name), 'rb').read()
            for name in ('results.md', 'results.json', 'episodes.jsonl')}
  second = evaluate.run_evaluation(eval_config(tmp_path, policies='base',
                                               num_questions=1), workdir)
  kept = second['previous']
  assert os.path.dirname(kept) == os.path.join(out, evaluate.PREVIOUS_SUBDIR)
  for name, data in before.items():
    assert open(os.path.join(kept, name), 'rb').read() == data
  assert os.path.exists(os.path.join(kept, 'frontier.png'))
  assert len(_jsonl(second['paths']['jsonl'])) == 1  # the new evaluation's one question
  assert 'settings.eval.num_questions 2 -> 1' in caplog.text
  assert kept in evaluate.summary_line(second)


def test_an_evaluation_of_a_retrained_checkpoint_keeps_the_previous_one(
    tmp_path, workdir, caplog):
  """Same settings, but the evaluated phase's checkpoint was written again (its step
  folder's time changed): the earlier results are kept, the checkpoint named."""
  wd = tmp_path / 'wd'
  shutil.copytree(workdir, wd)
  config = eval_config(tmp_path, policies='sft')
  evaluate.run_evaluation(config, str(wd))
  assert evaluate.run_evaluation(config, str(wd))['previous'] is None
  step_dir = wd / 'sft' / '3'  # the fixture's one SFT checkpoint
  stat = os.stat(step_dir)
  os.utime(step_dir, (stat.st_atime, stat.st_mtime - 3600))
  again = evaluate.run_evaluation(config, str(wd))
  assert again['previous'] is not None
  assert 'policies.sft.42.written' in caplog.text


def test_frontier_reruns_match_the_derived_curve(tmp_path, workdir):
  derived = evaluate.run_evaluation(eval_config(tmp_path, policies='base'), workdir)
  derived_recs = _jsonl(derived['paths']['jsonl'])
  # One episode at a time (eval.batch_size=1) and every budget rerun.
  rerun = evaluate.run_evaluation(
      eval_config(tmp_path, policies='base', frontier_reruns=True, batch_size=1),
      workdir)
  d, r = (x['aggregate']['base']['frontier']['mean'] for x in (derived, rerun))
  assert d == r
  recs = _jsonl(rerun['paths']['jsonl'])
  assert [x for x in recs if x['budget'] is None] == derived_recs
  assert sorted({x['budget'] for x in recs if x['budget']}) == [1000, 2000, 4000, 8000]
  # Hard budgets: a rerun record never spends more than its budget on a success.
  assert all(x['tn'] <= x['budget'] for x in recs if x['budget'] and x['success'])


def test_judge_and_http_solver_over_loopback(tmp_path, workdir, monkeypatch):
  def respond(n, body):
    msgs = body['messages']
    if 'grade answers' in msgs[0]['content']:
      # A reasoning judge: other numbers inside the block, the verdict after it.
      return '<think>Paris is right; 1 city named, 0 errors.</think>\n0.8'
    if 'long-term memory' in msgs[0]['content']:
      return 'no score for you'  # malformed: retried, then the fallback
    user = msgs[1]['content']
    return 'Answer: Paris' if 'No more information' in user else 'Continue'

  server = chat_server.LoopbackChatServer(respond)
  monkeypatch.setenv('VERMEM_JUDGE_API_KEY', 'k')
  monkeypatch.setenv('VERMEM_SOLVER_API_KEY', 'k')
  try:
    c = eval_config(tmp_path, policies='base,sft')
    c.eval.judge.backend = 'openai_compatible'
    c.eval.judge.base_url = server.url
    c.eval.judge.model = 'judge'
    c.eval.judge.max_retries = 1
    c.eval.judge.backoff_s = 0.0
    c.solver.backend = 'openai_compatible'
    c.solver.base_url = server.url
    c.solver.model = 'solver'
    res = evaluate.run_evaluation(c, workdir)
  finally:
    server.close()
  base, sft = res['aggregate']['base'], res['aggregate']['sft']
  assert base['j_judge']['mean'] == pytest.approx(0.8)
  assert base['j_judge_judged']['mean'] == 2 and base['judge_fallbacks']['mean'] == 0
  # Base has no long-term memory: MQ is not judged and reads —, not a score.
  assert base['mq']['mean'] is None and base['mq_judged']['mean'] == 0
  assert sft['mq']['mean'] == 0.0 and sft['mq_fallbacks']['mean'] == 2
  recs = _jsonl(res['paths']['jsonl'])
  assert all(r['answer'] == 'Paris' and r['success'] for r in recs)  # judge rule
  assert all(r['mq'] is None for r in recs if r['policy'] == 'base')
  table = res['table']
  assert 'OpenAI-compatible server' in table and 'DIAGNOSTIC' not in table
  assert '| base | 0.800 (SE 0.000) | — |' in table  # two questions, both 0.8
  # Judged and fallback counts per policy, all seeds together.
  assert '| base | 2 | 0 | 0 | — | — |' in table
  assert '| sft | 2 | 0 | 0 | 0 | 2 |' in table
  data = json.load(open(res['paths']['json']))
  assert data['meta']['success_rule'] == 'judge'
  assert data['meta']['judge_counters']['fallbacks'] == 2


def test_policy_entries():
  wd = '/nonexistent'
  got = eval_policies.parse_policies('base, phase_b,q=hf:/ckpt/q7,hf:/x/y/', wd)
  assert [(p.label, p.kind, p.where) for p in got] == [
      ('base', 'base', ''), ('phase_b', 'phase', 'phase_b'), ('q', 'hf', '/ckpt/q7'),
      ('hf:y', 'hf', '/x/y/')]
  assert [p.label for p in eval_policies.parse_policies('', wd)] == ['base']
  with pytest.raises(ValueError, match='unknown entry'):
    eval_policies.parse_policies('base,phase_x', wd)
  with pytest.raises(ValueError, match='duplicate'):
    eval_policies.parse_policies('base,base', wd)


def test_per_seed_workdirs(tmp_path):
  os.makedirs(tmp_path / 'seed_43')
  assert eval_policies.seed_workdir(str(tmp_path), 43) == str(tmp_path / 'seed_43')
  assert eval_policies.seed_workdir(str(tmp_path), 42) == str(tmp_path)
  # Seed 43 has its own curriculum, seed 42 would silently reuse the top level: refused.
  with pytest.raises(ValueError, match=r'none for seeds \[42\]'):
    eval_policies.seed_layout(str(tmp_path), [42, 43])
  one = eval_policies.seed_layout(str(tmp_path), [43])
  assert one.workdirs == {43: str(tmp_path / 'seed_43')} and not one.shared
  shared = eval_policies.seed_layout(str(tmp_path / 'seed_43'), [42, 43])
  assert shared.shared and set(shared.workdirs.values()) == {str(tmp_path / 'seed_43')}
  assert shared.note('W', []) == ''  # Base alone: nothing trained is shared


def _random_sft_checkpoint(workdir, step, key):
  c = common.get_config('sft')
  params = qwen.init_params(setup_lib.model_config_from(c), jax.random.PRNGKey(key))
  with checkpoints.PhaseCheckpointManager(os.path.join(workdir, 'sft')) as m:
    m.save(checkpoints.TrainState(step=step, params=params))


def test_two_seeds_on_one_set_of_checkpoints_are_labelled_shared(tmp_path, workdir):
  res = evaluate.run_evaluation(
      eval_config(tmp_path, policies='base,sft', seeds=(42, 43), num_questions=1),
      workdir)
  assert 'Checkpoints: SHARED — seeds 42, 43' in res['table']
  assert 'the ± of sft covers' in res['table']
  data = json.load(open(res['paths']['json']))
  assert data['meta']['shared_checkpoints'] is True
  assert {i['path'] for i in data['meta']['policies']['sft']} == {
      os.path.join(workdir, 'sft')}


def test_each_seed_evaluates_its_own_curriculum(tmp_path):
  root = tmp_path / 'sweep'
  _random_sft_checkpoint(str(root / 'seed_42'), step=3, key=0)
  _random_sft_checkpoint(str(root / 'seed_43'), step=5, key=1)
  res = evaluate.run_evaluation(
      eval_config(tmp_path, policies='sft', seeds=(42, 43), num_questions=1), str(root))
  assert 'SHARED' not in res['table']
  data = json.load(open(res['paths']['json']))
  assert data['meta']['shared_checkpoints'] is False
  infos = data['meta']['policies']['sft']
  assert [(i['seed'], i['step']) for i in infos] == [(42, 3), (43, 5)]
  assert [i['path'] for i in infos] == [str(root / f'seed_{s}' / 'sft')
                                        for s in (42, 43)]
  # Two runs, two values per metric: the std is a real one over the two curricula.
  assert res['aggregate']['sft']['tn']['n'] == 2
  assert res['aggregate']['sft']['tn']['std'] is not None


def _cli(*args):
  return subprocess.run(
      [sys.executable, 'experiments/run.py', '--config=eval_hotpotqa.py', *args],
      cwd=REPO, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO))


def test_cli_runs_dry_runs_and_rejects(tmp_path, workdir):
  out = _cli(f'--workdir={workdir}', '--dry_run')
  assert out.returncode == 0, out.stderr
  assert 'plan: evaluate base, sft (seed 42' in out.stdout
  out = _cli(f'--workdir={tmp_path}', '--config.eval.policies=base',
             '--config.eval.num_questions=1', f'--config.eval.output_dir={tmp_path}/o')
  assert out.returncode == 0, out.stderr
  assert '| base |' in out.stdout and 'evaluation written to' in out.stdout
  out = _cli(f'--workdir={tmp_path}', '--config.eval.policies=base,phase_z', '--dry_run')
  assert out.returncode == 2 and 'phase_z' in out.stderr


def test_missing_phase_checkpoint_is_named(tmp_path):
  sources = eval_policies.parse_policies('base,phase_c', str(tmp_path))
  with pytest.raises(checkpoint_values.CheckpointError, match='phase_c'):
    eval_policies.check_available(sources, str(tmp_path))
  with pytest.raises(ValueError, match='not a directory'):
    eval_policies.check_available(
        eval_policies.parse_policies(f'hf:{tmp_path}/none', str(tmp_path)), str(tmp_path))


def test_tool_set_note_names_each_policys_tools_and_what_other_calls_get():
  sources = [eval_policies.PolicySource('base', 'base'),
             eval_policies.PolicySource('sft', 'phase', 'sft'),
             eval_policies.PolicySource('phase_a', 'phase', 'phase_a'),
             eval_policies.PolicySource('phase_c', 'phase', 'phase_c')]
  note = eval_policies.tool_set_note(sources)
  assert note.startswith('Tool sets: sft, phase_c: ')
  assert 'phase_a: ' in note and 'rejected' in note
  # All in the paper's protocol (all seven tools): nothing is refused for its tool.
  only_c = eval_policies.tool_set_note(sources[:2] + sources[3:])
  assert 'rejected' not in only_c
  assert eval_policies.tool_set_note(sources[:1]) == ''


def test_a_phase_started_from_an_older_selection_is_marked_stale(tmp_path):
  """Phase A started from SFT step 3; SFT then gained step 5 (its selection now):
  the table says Phase A is stale, naming both steps; before that it says nothing."""
  wd = str(tmp_path / 'wd')
  _random_sft_checkpoint(wd, step=3, key=0)
  c = common.get_config('phase_a')
  params = qwen.init_params(setup_lib.model_config_from(c), jax.random.PRNGKey(2))
  with checkpoints.PhaseCheckpointManager(os.path.join(wd, 'phase_a')) as m:
    m.save(checkpoints.TrainState(step=1, params=params))
  sources = eval_policies.parse_policies('base,sft,phase_a', wd)
  assert eval_policies.stale_notes(sources, wd) == []  # no reference.json: nothing known
  rl_resume.write_reference(os.path.join(wd, 'phase_a'), {'reference_step': 3})
  assert eval_policies.stale_notes(sources, wd) == []
  _random_sft_checkpoint(wd, step=5, key=1)
  assert checkpoints.selected_step(os.path.join(wd, 'sft')) == 5
  [note] = eval_policies.stale_notes(sources, wd)
  assert note.startswith('STALE: phase_a') and 'sft step 3' in note and 'now 5' in note
  # θ_B started from the stale θ_A (at θ_A's selected step): stale too; θ_C without a
  # reference.json says nothing.
  os.makedirs(os.path.join(wd, 'phase_b'))
  rl_resume.write_reference(os.path.join(wd, 'phase_b'), {'reference_step': 1})
  notes = eval_policies.stale_notes(
      eval_policies.parse_policies('phase_b,phase_c,phase_a', wd), wd)
  assert [n.split(' ')[1] for n in notes] == ['phase_a', 'phase_b']
  assert 'phase_a, which is itself stale' in notes[1]
  res = evaluate.run_evaluation(eval_config(tmp_path, policies='phase_a',
                                            num_questions=1), wd)
  assert 'STALE: phase_a' in res['table']
  meta = json.load(open(res['paths']['json']))['meta']
  assert [n.split(' ')[1] for n in meta['stale']] == ['phase_a']
