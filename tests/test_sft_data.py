"""Tests for vermem_jax.envs.sft_data.build (the balanced SFT set, SPEC §4, D.1–D.3)."""
import collections
import math

import pytest

from vermem_jax.envs import hotpotqa
from vermem_jax.envs.sft_data.build import build_sft_set
from vermem_jax.envs.sft_data.config import SFTDataConfig
from vermem_jax.envs.sft_data.filters import dedupe_key
from vermem_jax.memory.commands import ALL_OPS
from vermem_jax.envs.sft_data.templates import TEMPLATES
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.memory import state as mstate
from vermem_jax.memory.token_count import count_whitespace_tokens as count

CFG = SFTDataConfig(train_per_target=12, dev_per_target=4)


@pytest.fixture(scope='module')
def built(pools):
  construction, dev = pools
  return build_sft_set(construction, dev, count_tokens=count, config=CFG,
                       verbose=False)


def test_counts_exactly_balanced_with_boundary_share(built, pools):
  train, dev, report = built
  construction, dev_pool = pools
  for records, split, n in ((train, 'train', 12), (dev, 'dev', 4)):
    per = collections.Counter(r.op for r in records)
    assert per == {op: n for op in ALL_OPS}
    assert set(per) == {'Add', 'Update', 'Delete', 'Retrieve', 'Filter',
                        'SelectEpisode', 'Summarize', 'Null'}
    for op in ALL_OPS:
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
  assert used == {t.name for t in TEMPLATES}
  text = report.format_table()
  assert 'select_not_ltm' in text and 'train: Add=12' in text
  # High-precision templates: no template candidate failed a filter.
  assert not report.filter_failures and report.duplicates == 0


def test_every_target_accepted_and_input_is_g_of_state(built):
  train, dev, _ = built
  keys = set()
  for r in train + dev:
    cfg = mconfig.ExecutorConfig(phase=r.phase, context_budget=CFG.context_budget)
    tr = mexec.execute(r.state, r.target, cfg, count)
    assert tr.accepted and tr.op == r.op, (r.template, tr.message)
    assert r.op in cmds.PHASE_OPS[r.phase]
    assert r.policy_input == serialization.render_policy_input(
        r.state, count, allowed_ops=cmds.PHASE_OPS[r.phase],
        context_budget=CFG.context_budget)
    assert cmds.format_command(cmds.parse_command(r.target)) == r.target
    key = dedupe_key(r.state, cmds.parse_command(r.target))
    assert key not in keys
    keys.add(key)
    assert r.state.context_tokens() <= CFG.context_budget
    d = r.to_dict()
    assert mstate.MemoryState.from_json(d['state']) == r.state


def test_local_ids_records_are_the_qualified_ones_without_namespace(built, pools):
  """SFTDataConfig.local_ids: the same states and commands, with x_i and u*_i citing
  ids as `c2`; each target executes to the qualified target's transition."""
  import dataclasses
  construction, dev = pools
  train, _, _ = built
  local, _, _ = build_sft_set(construction, dev, count_tokens=count,
                              config=dataclasses.replace(CFG, local_ids=True),
                              verbose=False)
  assert len(local) == len(train)
  for q, r in zip(train, local):
    assert r.state == q.state and r.op == q.op
    ns = r.state.ns
    assert r.target == q.target.replace(f'{ns}:', '') and f'{ns}:' not in r.policy_input
    assert r.policy_input == serialization.render_policy_input(
        r.state, count, allowed_ops=cmds.PHASE_OPS[r.phase],
        context_budget=CFG.context_budget, local_ids=True)
    cfg = mconfig.ExecutorConfig(phase=r.phase, context_budget=CFG.context_budget)
    a, b = mexec.execute(r.state, r.target, cfg, count), mexec.execute(
        q.state, q.target, cfg, count)
    assert a.accepted and a.op == b.op
    for name in mexec.REF_ARGS:  # free text (a Delete reason) may quote an id too
      assert a.command.get(name) == b.command.get(name)
    assert a.state_after.C == b.state_after.C
    assert [(e.id, e.status, e.versions[-1].source_refs) for e in a.state_after.M] == [
        (e.id, e.status, e.versions[-1].source_refs) for e in b.state_after.M]


def test_boundary_targets_are_the_legal_alternative(built):
  """Spot-check the semantics of boundary states: the confusable op is wrong there."""
  train, _, _ = built
  cfg = mconfig.ExecutorConfig(phase='C')
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
  again, again_dev, _ = build_sft_set(construction, dev, count_tokens=count,
                                      config=CFG, verbose=False)
  assert [(r.policy_input, r.target) for r in again] == [
      (r.policy_input, r.target) for r in train]
  assert [r.target for r in again_dev] == [r.target for r in dev_records]
  other, _, _ = build_sft_set(
      construction, dev, count_tokens=count, verbose=False,
      config=SFTDataConfig(train_per_target=12, dev_per_target=0, seed=3))
  assert [r.target for r in other] != [r.target for r in train]


def test_pool_too_small_raises_naming_target(pools):
  construction, _ = pools
  with pytest.raises(ValueError, match='valid Add states'):
    build_sft_set(construction[:1], [], count_tokens=count, verbose=False,
                  config=SFTDataConfig(train_per_target=30, dev_per_target=0,
                                       max_attempts_per_record=2))
  with pytest.raises(ValueError, match='empty'):
    build_sft_set([], [], count_tokens=count, verbose=False)
