"""Tests for s_t = (q, M, C, H) (vermem_jax/memory/state.py; SPEC §1)."""
import dataclasses
import hashlib

import pytest

from vermem_jax.memory import commands as cmds
from vermem_jax.memory import serialization
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import interaction
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import state as st
from vermem_jax.memory import token_count

W = token_count.count_whitespace_tokens
CFG = mconfig.ExecutorConfig()


def sample():
  s = st.new_state('q-42', 'Who?', W, instruction='Do the task.', task_state='step 0',
                   forbidden=('Answer',))
  s, _ = interaction.interact(s, None, 'obs one "quoted" ∅ é', W, CFG, observation_refs=('T#0',))
  s, _ = st.add_entry(s, 'fact one', W, source_refs=('T#0',))
  t = mexec.execute(s, f'Update(memory_id="{s.ns}:m1", new_content="fact one revised", '
                 f'source_refs=["{s.ns}:c2"])', CFG, W)
  s = t.state_after
  s = mexec.execute(s, f'Delete(memory_id="{s.ns}:m1", reason="wrong")', CFG, W).state_after
  s = mexec.execute(s, 'Bogus(', CFG, W).state_after
  return s


def test_namespace_and_ids():
  s = st.new_state('q-42', 'Who?', W)
  assert s.ns == hashlib.sha1(b'q-42').hexdigest()[:6]
  assert st.task_namespace('q-43') != s.ns
  assert st.parse_id(f'{s.ns}:m12') == (s.ns, 'm', 12)
  for bad in ('m12', f'{s.ns}:x1', f'{s.ns}:m0', f'{s.ns}:m', 'ABCDEF:m1', None, 5,
              f'{s.ns}:m1 '):
    assert st.parse_id(bad) is None


def test_builders_and_lookup():
  s = st.new_state('t', 'q', W, instruction='inst ruction')
  assert len(s.C) == 1 and s.C[0].protected and s.C[0].kind == 'instruction'
  assert s.C[0].tokens == 2 and s.C[0].id == f'{s.ns}:c1'
  s, cid = st.add_context(s, 'observation', 'a b c', W, source_refs=('X#1', 'X#0'))
  assert s.item(cid).evidence == ('X#0', 'X#1') and s.item(cid).source_refs == ('X#1', 'X#0')
  s, hid = st.add_history(s, 'conclusion', 'done', W)
  assert s.event(hid).kind == 'conclusion' and s.event(hid).step == 0
  s, mid = st.add_entry(s, 'fact', W)
  assert s.entry(mid).content == 'fact' and s.entry(mid).active
  other = st.new_state('u', 'q', W)
  assert s.entry(f'{other.ns}:m1') is None and s.event(f'{other.ns}:h1') is None
  assert s.entry(f'{s.ns}:m2') is None and s.item(f'{s.ns}:c9') is None
  assert s.context_tokens() == 5
  with pytest.raises(ValueError, match='context kind'):
    st.add_context(s, 'secret', 'x', W)
  with pytest.raises(ValueError, match='history kind'):
    st.add_history(s, 'secret', 'x', W)
  with pytest.raises(ValueError, match='task_id'):
    st.new_state('', 'q', W)


def test_states_are_immutable_and_structurally_shared():
  s = sample()
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.q = 'x'
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.C[0].protected = False
  t = mexec.execute(s, f'Add(content="new fact", source_refs=["{s.ns}:c2"])', CFG, W)
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
  serialization.render_policy_input(s, W, allowed_ops=cmds.ALL_OPS)
  assert any(k.startswith('_g') for k in s.H[0].__dict__)  # cached line on the record
  assert pickle.dumps(s) == before
  back = pickle.loads(pickle.dumps(s))
  assert back == s and not any(k.startswith('_g') for k in back.H[0].__dict__)
  assert copy.deepcopy(s) == s
  assert st.MemoryState.from_json(s.to_json()) == s


def test_memory_modules_import_no_jax():
  """No module of vermem_jax/memory imports JAX: a fresh process imports all of them
  and runs T_m, T_e and g(s) without loading it. Retrieve is the exception by design:
  bm25s (imported at the first Retrieve) loads jax.lax itself when JAX is installed
  (memory/bm25_index.py), which the second half shows rather than hides."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  code = ('import importlib, pathlib, sys\n'
          'import vermem_jax.memory as pkg\n'
          'for p in sorted(pathlib.Path(pkg.__file__).parent.glob("*.py")):\n'
          '  importlib.import_module("vermem_jax.memory." + p.stem)\n'
          'from vermem_jax.memory import config, executor, serialization, state\n'
          'from vermem_jax.memory import commands, token_count\n'
          'W = token_count.count_whitespace_tokens\n'
          's = state.new_state("t", "q", W)\n'
          's, _ = state.add_entry(s, "alpha beta", W)\n'
          'cfg = config.ExecutorConfig()\n'
          't = executor.execute(s, \'Update(memory_id="m1", new_content="alpha gamma", '
          'source_refs=[])\', cfg, W)\n'
          'serialization.render_policy_input(t.state_after, W, allowed_ops=commands.ALL_OPS)\n'
          'print("jax" in sys.modules)\n'
          't = executor.execute(s, \'Retrieve(query="alpha")\', cfg, W)\n'
          'assert t.accepted and len(t.state_after.C) == 1, t\n')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       check=True, timeout=120)
  assert out.stdout.strip() == 'False', out.stderr
