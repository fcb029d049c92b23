"""Tests for vermem_jax.envs.sft_data (the balanced SFT set, SPEC §4, paper D.1–D.3)."""
import collections
import dataclasses
import math

import chat_server
import pytest

from vermem_jax.envs import hotpotqa
from vermem_jax.envs import scenarios as sc
from vermem_jax.envs import sft_data as sd
from vermem_jax.memory import checks
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.memory import state as mstate
from vermem_jax.memory.token_count import count_whitespace_tokens as count

CFG = sd.SFTDataConfig(train_per_target=12, dev_per_target=4)


@pytest.fixture(scope='module')
def pools(hotpotqa_dir):
  examples = hotpotqa.load_examples('json', 'train', data_dir=hotpotqa_dir)
  return hotpotqa.split_train_pools(examples)


@pytest.fixture(scope='module')
def built(pools):
  construction, dev = pools
  return sd.build_sft_set(construction, dev, count_tokens=count, config=CFG,
                          verbose=False)


def test_counts_exactly_balanced_with_boundary_share(built, pools):
  train, dev, report = built
  construction, dev_pool = pools
  for records, split, n in ((train, 'train', 12), (dev, 'dev', 4)):
    per = collections.Counter(r.op for r in records)
    assert per == {op: n for op in sd.TARGETS}
    assert set(per) == {'Add', 'Update', 'Delete', 'Retrieve', 'Filter',
                        'SelectEpisode', 'Summarize', 'Null'}
    for op in sd.TARGETS:
      boundary = sum(r.is_boundary for r in records if r.op == op)
      assert boundary == math.ceil(n * CFG.boundary_fraction)
      assert boundary >= 0.25 * n
    assert all(r.split == split for r in records)
    assert report.per_target(split) == per
  assert {r.example_id for r in train} <= {ex.id for ex in construction}
  assert {r.example_id for r in dev} <= {ex.id for ex in dev_pool}
  # The table's rows sum to the records and name every template used.
  assert sum(n for *_, n in report.table()) == len(train) + len(dev)
  used = {r.template for r in train + dev}
  assert used == {t.name for t in sd.TEMPLATES}
  text = report.format_table()
  assert 'select_not_ltm' in text and 'train: Add=12' in text
  # High-precision templates: no template candidate failed a filter.
  assert not report.filter_failures and report.duplicates == 0


def test_templates_pass_all_filters_on_every_construction_example(pools):
  """Every construction-pool example: two templates (round-robin over all 17) build a
  state whose target passes the seven filters, the executor accepting it."""
  import random
  construction, _ = pools
  tried = collections.Counter()
  for i, ex in enumerate(construction):
    view = sc.build_view(ex, count)
    for k in range(2):
      t = sd.TEMPLATES[(2 * i + k) % len(sd.TEMPLATES)]
      phase = t.phases[i % len(t.phases)]
      out = t.build(view, random.Random(i), count, 2048, phase)
      if out is None:
        continue
      state, cmd = out
      x = serialization.render_policy_input(state, count,
                                            allowed_ops=cmds.PHASE_OPS[phase])
      assert _check(state, cmds.format_command(cmd), x, phase) == [], (ex.id, t.name)
      tried[t.name] += 1
  assert set(tried) == {t.name for t in sd.TEMPLATES}
  assert sum(tried.values()) >= 0.8 * 2 * len(construction)


def test_confusable_pairs_have_boundary_templates():
  boundary = {t.name: t.op for t in sd.TEMPLATES if t.is_boundary}
  ops = set(boundary.values())
  for a, b in (('Add', 'Update'), ('Retrieve', 'SelectEpisode'),
               ('Filter', 'Summarize')):
    assert a in ops and b in ops
  assert 'Null' in ops  # an operation vs ∅
  for op in sd.TARGETS:  # every class has a standard and a boundary template
    assert sd.templates_for(op, True) and sd.templates_for(op, False)


def test_every_target_accepted_and_input_is_g_of_state(built):
  train, dev, _ = built
  keys = set()
  for r in train + dev:
    cfg = mexec.ExecutorConfig(phase=r.phase, context_budget=CFG.context_budget)
    tr = mexec.execute(r.state, r.target, cfg, count)
    assert tr.accepted and tr.op == r.op, (r.template, tr.message)
    assert r.op in cmds.PHASE_OPS[r.phase]
    assert r.policy_input == serialization.render_policy_input(
        r.state, count, allowed_ops=cmds.PHASE_OPS[r.phase],
        context_budget=CFG.context_budget)
    assert cmds.format_command(cmds.parse_command(r.target)) == r.target
    key = sd.dedupe_key(r.state, cmds.parse_command(r.target))
    assert key not in keys
    keys.add(key)
    assert r.state.context_tokens() <= CFG.context_budget
    d = r.to_dict()
    assert mstate.MemoryState.from_json(d['state']) == r.state


def test_boundary_targets_are_the_legal_alternative(built):
  """Spot-check the semantics of boundary states: the confusable op is wrong there."""
  train, _, _ = built
  cfg = mexec.ExecutorConfig(phase='C')
  for r in train:
    if r.template == 'null_duplicate':
      # The observed fact is already stored: Add would duplicate (rejected).
      cur = r.state.item(r.state.env_item_id)
      add = cmds.Command('Add', {'content': cur.text, 'source_refs': [cur.id]})
      assert not mexec.execute(r.state, add, cfg, count).accepted
    if r.template == 'select_not_ltm':
      # Retrieve returns only distractor entries; SelectEpisode restores evidence.
      sup = set(hotpotqa.supporting_unit_ids(_example(r)))
      tr = mexec.execute(r.state, cmds.Command('Retrieve', {'query': r.state.q}),
                         cfg, count)
      got = set().union(*(it.evidence for it in tr.state_after.C))
      assert not got & sup
      tr = mexec.execute(r.state, r.target, cfg, count)
      assert set().union(*(it.evidence for it in tr.state_after.C)) & sup
    if r.template == 'update_partial':
      # The entry is a prefix of the observed sentence: Update, not a second entry.
      entry = r.state.entry(cmds.parse_command(r.target).get('memory_id'))
      new = cmds.parse_command(r.target).get('new_content')
      assert new.startswith(entry.content) and len(new) > len(entry.content)


_EXAMPLES = {}


def _example(record):
  return _EXAMPLES[record.example_id]


@pytest.fixture(scope='module', autouse=True)
def _index(pools):
  for ex in pools[0] + pools[1]:
    _EXAMPLES[ex.id] = ex


def test_deterministic_under_seed(pools, built):
  construction, dev = pools
  train, dev_records, _ = built
  again, again_dev, _ = sd.build_sft_set(construction, dev, count_tokens=count,
                                         config=CFG, verbose=False)
  assert [(r.policy_input, r.target) for r in again] == [
      (r.policy_input, r.target) for r in train]
  assert [r.target for r in again_dev] == [r.target for r in dev_records]
  other, _, _ = sd.build_sft_set(
      construction, dev, count_tokens=count, verbose=False,
      config=sd.SFTDataConfig(train_per_target=12, dev_per_target=0, seed=3))
  assert [r.target for r in other] != [r.target for r in train]


def _state_and_input(pools, template_name, phase='C'):
  construction, _ = pools
  t = sd.TEMPLATES_BY_NAME[template_name]
  import random
  for i, ex in enumerate(construction):
    out = t.build(sc.build_view(ex, count), random.Random(i), count, 2048)
    if out is not None:
      state, cmd = out
      x = serialization.render_policy_input(state, count,
                                            allowed_ops=cmds.PHASE_OPS[phase])
      return ex, state, cmd, x
  raise AssertionError(template_name)


def _check(state, text, x, phase='C'):
  _, fails = sd.check_candidate(state, text, phase=phase, count_tokens=count,
                                executor_config=mexec.ExecutorConfig(), policy_input=x)
  return [f.split(':', 1)[0] for f in fails]


def test_each_filter_rejects_its_failure(pools):
  ex, state, cmd, x = _state_and_input(pools, 'add_new_fact')
  good = cmds.format_command(cmd)
  assert _check(state, good, x) == []
  cid = cmd.get('source_refs')[0]
  # 1 one operation
  assert _check(state, good + ' ∅', x) == ['one_operation']
  assert _check(state, 'I think Add is best.', x) == ['one_operation']
  # 2 op allowed in the phase (Add in Phase B)
  assert _check(state, good, x, phase='B') == ['op_allowed']
  # 3 required arguments
  assert _check(state, f'Add(source_refs=["{cid}"])', x) == ['required_args']
  assert _check(state, f'Add(content="  ", source_refs=["{cid}"])', x) == [
      'required_args']
  # 4 referenced items exist
  missing = f'{state.ns}:c99'
  assert _check(state, good.replace(cid, missing), x) == ['refs_exist']
  # 5 same instance: an id of another task's namespace
  other = mstate.task_namespace('another-task')
  assert _check(state, good.replace(cid, f'{other}:c2'), x) == ['same_instance']
  # 6 transition valid: once stored, the same Add duplicates an active entry
  after = mexec.execute(state, good, mexec.ExecutorConfig(), count).state_after
  x_after = serialization.render_policy_input(after, count,
                                              allowed_ops=cmds.PHASE_OPS['C'])
  assert _check(after, good, x_after) == ['transition_valid']
  # 7 no leakage: writing the answer (absent from the state) or unseen words
  content = cmd.get('content') + f' So the answer is {ex.answer}.'
  leak = cmds.format_command(cmds.Command('Add', {'content': content,
                                                  'source_refs': [cid]}))
  norm = checks.normalize_answer_like
  if f' {norm(ex.answer)} ' not in f' {norm(x)} ':
    assert 'no_leakage' in _check(state, leak, x)
  made_up = cmds.format_command(cmds.Command(
      'Add', {'content': cmd.get('content') + ' zzyzx', 'source_refs': [cid]}))
  assert _check(state, made_up, x) == ['no_leakage']
  label = cmds.format_command(cmds.Command(
      'Retrieve', {'query': 'supporting fact answer: ' + state.q}))
  assert 'no_leakage' in _check(state, label, x)


def test_leaking_answer_rejected_even_if_words_seen(pools):
  """A forbidden phrase (the answer) written by Summarize is leakage even when each of
  its words is visible, as long as the phrase itself is not in the state."""
  _, state, cmd, x = _state_and_input(pools, 'summarize_long_evidence', 'B')
  norm = checks.normalize_answer_like
  words = norm(x).split()
  w1, w2 = words[-3], words[5]
  phrase = f'{w1} {w2}'
  assert f' {phrase} ' not in f' {norm(x)} '
  secret = dataclasses.replace(state, forbidden=(phrase,))
  summary = cmd.get('summary') + f' {w1} {w2}.'
  bad = cmds.format_command(cmds.Command(
      'Summarize', {'source_refs': list(cmd.get('source_refs')), 'summary': summary}))
  assert _check(secret, bad, x, 'B') == ['no_leakage']
  # The same text with no forbidden phrase passes every filter but leakage's word test.
  assert _check(state, bad, x, 'B') == []


def test_pool_too_small_raises_naming_target(pools):
  construction, _ = pools
  with pytest.raises(ValueError, match='valid Add states'):
    sd.build_sft_set(construction[:1], [], count_tokens=count, verbose=False,
                     config=sd.SFTDataConfig(train_per_target=30, dev_per_target=0,
                                             max_attempts_per_record=2))
  with pytest.raises(ValueError, match='empty'):
    sd.build_sft_set([], [], count_tokens=count, verbose=False)


def test_config_validation():
  with pytest.raises(ValueError, match='boundary_fraction'):
    sd.SFTDataConfig(boundary_fraction=0.1)
  with pytest.raises(ValueError, match='teacher_backend'):
    sd.SFTDataConfig(teacher_backend='grpc')
  with pytest.raises(ValueError, match='teacher_base_url'):
    sd.SFTDataConfig(teacher_backend='openai_compatible')
  cfg = sd.SFTDataConfig.from_config({'train_per_target': 8, 'dev_per_target': 4,
                                      'learning_rate': 2e-5, 'template_fraction': 0.5})
  assert cfg.train_per_target == 8 and cfg.teacher_fraction == 0.5


def _alternating_teacher(n, body):
  del body
  # Alternate: a valid ∅, then a malformed command.
  return '∅' if n % 2 == 1 else 'Add(content="unterminated'


def test_teacher_candidates_pass_the_same_filters(pools, monkeypatch, capsys):
  construction, dev = pools
  server = chat_server.LoopbackChatServer(_alternating_teacher)
  try:
    monkeypatch.setenv('VERMEM_TEST_TEACHER_KEY', 'sk-test-secret-123')
    cfg = sd.SFTDataConfig(
        train_per_target=2, dev_per_target=0, template_fraction=0.5,
        teacher_backend='openai_compatible',
        teacher_base_url=server.url,
        teacher_model='teacher-test', teacher_api_key_env='VERMEM_TEST_TEACHER_KEY')
    train, _, report = sd.build_sft_set(construction, dev, count_tokens=count,
                                        config=cfg, verbose=True)
  finally:
    server.close()
  printed = capsys.readouterr().out
  seen = [(r['path'], r['auth'], r['body']) for r in server.requests]
  assert seen and all(p == '/v1/chat/completions' for p, _, _ in seen)
  assert all(a == 'Bearer sk-test-secret-123' for _, a, _ in seen)
  assert seen[0][2]['model'] == 'teacher-test'
  user = seen[0][2]['messages'][1]['content']
  assert 'STATE BEGIN' in user and 'Allowed operations' in user
  assert 'sk-test-secret-123' not in printed
  # One teacher ∅ is kept for the Null class; malformed replies are discarded.
  teacher = [r for r in train if r.source == 'teacher']
  assert [r.op for r in teacher] == ['Null'] and teacher[0].target == '∅'
  assert report.teacher_accepted == 1 and report.teacher_rejected >= 1
  assert collections.Counter(r.op for r in train) == {op: 2 for op in sd.TARGETS}
  assert all(mexec.execute(r.state, r.target, mexec.ExecutorConfig(phase=r.phase),
                           count).accepted for r in train)


def test_unreachable_teacher_falls_back_to_templates(pools):
  construction, _ = pools
  teacher = sd.OpenAICompatibleTeacher('http://127.0.0.1:9/v1', 'm', timeout_s=2.0)
  cfg = sd.SFTDataConfig(train_per_target=2, dev_per_target=0)
  train, _, report = sd.build_sft_set(construction, [], count_tokens=count,
                                      config=cfg, teacher=teacher, verbose=False)
  assert len(train) == 16 and all(r.source == 'template' for r in train)
  assert report.teacher_errors >= 1
