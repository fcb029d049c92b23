"""Tests for MemoryState <-> JSON (vermem_jax/memory/state.py; SPEC §1)."""
import json

import pytest

from test_memory_state import sample
from vermem_jax.memory import state as mstate


def test_json_round_trip():
  s = sample()
  text = s.to_json()
  assert json.loads(text)['schema'] == 'vermem.memory_state/1'
  back = mstate.MemoryState.from_json(text)
  assert back == s
  assert back.to_json() == text
  assert mstate.MemoryState.from_dict(s.to_dict()) == s


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
    mstate.MemoryState.from_json(json.dumps(d))


def test_from_json_rejects_non_json():
  with pytest.raises(ValueError, match='not valid JSON'):
    mstate.MemoryState.from_json('{oops')
  with pytest.raises(ValueError, match='top level'):
    mstate.MemoryState.from_json('[1]')
