"""Tests for s_t = (q, M, C, H) (vermem_jax/memory/state.py; SPEC §1)."""
import dataclasses
import hashlib

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
