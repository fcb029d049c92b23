"""Tests for vermem_jax.envs.sft_data.filters (the seven filters of paper D.3)."""
import collections
import dataclasses

from vermem_jax.envs.scenarios.views import build_view
from vermem_jax.envs.sft_data.filters import check_candidate
from vermem_jax.envs.sft_data.templates import TEMPLATES, TEMPLATES_BY_NAME
from vermem_jax.memory import checks
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.memory import state as mstate
from vermem_jax.memory.token_count import count_whitespace_tokens as count


def _state_and_input(pools, template_name, phase='C'):
  construction, _ = pools
  t = TEMPLATES_BY_NAME[template_name]
  import random
  for i, ex in enumerate(construction):
    out = t.build(build_view(ex, count), random.Random(i), count, 2048)
    if out is not None:
      state, cmd = out
      x = serialization.render_policy_input(state, count,
                                            allowed_ops=cmds.PHASE_OPS[phase])
      return ex, state, cmd, x
  raise AssertionError(template_name)


def _check(state, text, x, phase='C'):
  _, fails = check_candidate(state, text, phase=phase, count_tokens=count,
                             executor_config=mconfig.ExecutorConfig(), policy_input=x)
  return [f.split(':', 1)[0] for f in fails]


def test_templates_pass_all_filters_on_every_construction_example(pools):
  """Every construction-pool example: two templates (round-robin over all 17) build a
  state whose target passes the seven filters, the executor accepting it."""
  import random
  construction, _ = pools
  tried = collections.Counter()
  for i, ex in enumerate(construction):
    view = build_view(ex, count)
    for k in range(2):
      t = TEMPLATES[(2 * i + k) % len(TEMPLATES)]
      phase = t.phases[i % len(t.phases)]
      out = t.build(view, random.Random(i), count, 2048, phase)
      if out is None:
        continue
      state, cmd = out
      x = serialization.render_policy_input(state, count,
                                            allowed_ops=cmds.PHASE_OPS[phase])
      assert _check(state, cmds.format_command(cmd), x, phase) == [], (ex.id, t.name)
      tried[t.name] += 1
  assert set(tried) == {t.name for t in TEMPLATES}
  assert sum(tried.values()) >= 0.8 * 2 * len(construction)


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
  after = mexec.execute(state, good, mconfig.ExecutorConfig(), count).state_after
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
