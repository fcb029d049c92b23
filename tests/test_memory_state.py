"""Tests for s_t = (q, M, C, H) (vermem_jax/memory/state.py; SPEC §1)."""
import dataclasses
import hashlib
import json

import pytest

from vermem_jax import memory as mm
from vermem_jax.memory import state as st

W = mm.count_whitespace_tokens
CFG = mm.ExecutorConfig()


def sample():
  s = mm.new_state('q-42', 'Who?', W, instruction='Do the task.', task_state='step 0',
                   forbidden=('Answer',))
  s, _ = mm.interact(s, None, 'obs one "quoted" ∅ é', W, CFG, observation_refs=('T#0',))
  s, _ = mm.add_entry(s, 'fact one', W, source_refs=('T#0',))
  t = mm.execute(s, f'Update(memory_id="{s.ns}:m1", new_content="fact one revised", '
                 f'source_refs=["{s.ns}:c2"])', CFG, W)
  s = t.state_after
  s = mm.execute(s, f'Delete(memory_id="{s.ns}:m1", reason="wrong")', CFG, W).state_after
  s = mm.execute(s, 'Bogus(', CFG, W).state_after
  return s


def test_namespace_and_ids():
  s = mm.new_state('q-42', 'Who?', W)
  assert s.ns == hashlib.sha1(b'q-42').hexdigest()[:6]
  assert mm.task_namespace('q-43') != s.ns
  assert st.parse_id(f'{s.ns}:m12') == (s.ns, 'm', 12)
  for bad in ('m12', f'{s.ns}:x1', f'{s.ns}:m0', f'{s.ns}:m', 'ABCDEF:m1', None, 5,
              f'{s.ns}:m1 '):
    assert st.parse_id(bad) is None


def test_builders_and_lookup():
  s = mm.new_state('t', 'q', W, instruction='inst ruction')
  assert len(s.C) == 1 and s.C[0].protected and s.C[0].kind == 'instruction'
  assert s.C[0].tokens == 2 and s.C[0].id == f'{s.ns}:c1'
  s, cid = mm.add_context(s, 'observation', 'a b c', W, source_refs=('X#1', 'X#0'))
  assert s.item(cid).evidence == ('X#0', 'X#1') and s.item(cid).source_refs == ('X#1', 'X#0')
  s, hid = mm.add_history(s, 'conclusion', 'done', W)
  assert s.event(hid).kind == 'conclusion' and s.event(hid).step == 0
  s, mid = mm.add_entry(s, 'fact', W)
  assert s.entry(mid).content == 'fact' and s.entry(mid).active
  other = mm.new_state('u', 'q', W)
  assert s.entry(f'{other.ns}:m1') is None and s.event(f'{other.ns}:h1') is None
  assert s.entry(f'{s.ns}:m2') is None and s.item(f'{s.ns}:c9') is None
  assert s.context_tokens() == 5
  with pytest.raises(ValueError, match='context kind'):
    mm.add_context(s, 'secret', 'x', W)
  with pytest.raises(ValueError, match='history kind'):
    mm.add_history(s, 'secret', 'x', W)
  with pytest.raises(ValueError, match='task_id'):
    mm.new_state('', 'q', W)


def test_states_are_immutable_and_structurally_shared():
  s = sample()
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.q = 'x'
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.C[0].protected = False
  t = mm.execute(s, f'Add(content="new fact", source_refs=["{s.ns}:c2"])', CFG, W)
  after = t.state_after
  assert after.C is s.C
  assert all(a is b for a, b in zip(after.M, s.M))
  assert all(a is b for a, b in zip(after.H, s.H))
  # s is untouched by the transition.
  assert len(s.M) == 1 and len(after.M) == 2


def test_version_history_and_soft_delete_recorded():
  s = sample()
  e = s.M[0]
  assert [v.content for v in e.versions] == ['fact one', 'fact one revised']
  assert e.status == 'deleted' and e.deletion_reason == 'wrong'
  assert [h.kind for h in s.H][-3:] == ['memory_decision', 'memory_decision',
                                       'rejected_command']


def test_json_round_trip():
  s = sample()
  text = s.to_json()
  assert json.loads(text)['schema'] == 'vermem.memory_state/1'
  back = mm.MemoryState.from_json(text)
  assert back == s
  assert back.to_json() == text
  assert mm.MemoryState.from_dict(s.to_dict()) == s


@pytest.mark.parametrize('mutate,match', [
    (lambda d: d.pop('q'), r'state\.q'),
    (lambda d: d.update(step='3'), r'state\.step must be int'),
    (lambda d: d.update(step=True), r'state\.step must be int'),
    (lambda d: d.update(schema='other'), 'schema'),
    (lambda d: d['C'][0].update(kind='evil'), r'C\[0\]\.kind'),
    (lambda d: d['C'][0].update(protected='yes'), r'C\[0\]\.protected'),
    (lambda d: d['M'][0]['versions'][0].pop('content'), r'M\[0\]\.versions\[0\]\.content'),
    (lambda d: d['M'][0].update(versions=[]), r'M\[0\]\.versions is empty'),
    (lambda d: d['M'][0].update(status='gone'), r'M\[0\]\.status'),
    (lambda d: d['H'][0].update(source_refs=[1]), r'H\[0\]\.source_refs'),
])
def test_from_json_names_the_bad_field(mutate, match):
  d = json.loads(sample().to_json())
  mutate(d)
  with pytest.raises(ValueError, match=match):
    mm.MemoryState.from_json(json.dumps(d))


def test_from_json_rejects_non_json():
  with pytest.raises(ValueError, match='not valid JSON'):
    mm.MemoryState.from_json('{oops')
  with pytest.raises(ValueError, match='top level'):
    mm.MemoryState.from_json('[1]')


def test_render_cache_is_not_part_of_records():
  import copy  # pylint: disable=import-outside-toplevel
  import pickle  # pylint: disable=import-outside-toplevel
  s = sample()
  before = pickle.dumps(s)
  mm.render_policy_input(s, W, allowed_ops=mm.ALL_OPS)
  assert any(k.startswith('_g') for k in s.H[0].__dict__)  # cached line on the record
  assert pickle.dumps(s) == before
  back = pickle.loads(pickle.dumps(s))
  assert back == s and not any(k.startswith('_g') for k in back.H[0].__dict__)
  assert copy.deepcopy(s) == s
  assert mm.MemoryState.from_json(s.to_json()) == s


def test_memory_package_never_imports_jax():
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  code = ('import sys\n'
          'from vermem_jax import memory as mm\n'
          'W = mm.count_whitespace_tokens\n'
          's = mm.new_state("t", "q", W)\n'
          's, _ = mm.add_entry(s, "alpha beta", W)\n'
          't = mm.execute(s, \'Retrieve(query="alpha")\', mm.ExecutorConfig(), W)\n'
          'assert t.accepted and len(t.state_after.C) == 1, t\n'
          'mm.render_policy_input(t.state_after, W, allowed_ops=mm.ALL_OPS)\n'
          'print("jax" in sys.modules)\n')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       check=True, timeout=120)
  assert out.stdout.strip() == 'False', out.stderr
