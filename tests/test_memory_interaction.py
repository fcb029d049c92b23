"""Tests for T_e (vermem_jax/memory/interaction.py; paper Eq. 3)."""
import pytest

from vermem_jax.memory import executor as mexec
from vermem_jax.memory import interaction
from vermem_jax.memory import state as mstate
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import token_count

W = token_count.count_whitespace_tokens


def test_appends_action_and_observation_and_builds_context():
  cfg = mconfig.ExecutorConfig()
  s = mstate.new_state('t', 'q', W, instruction='inst')
  s1, cost = interaction.interact(s, 'search Leeds', 'Leeds is a city.', W, cfg,
                         observation_refs=('Leeds#0',), task_state='2 docs left')
  assert cost == 0.0
  assert [(h.kind, h.step, h.text) for h in s1.H] == [
      ('task_action', 0, 'search Leeds'), ('observation', 1, 'Leeds is a city.')]
  assert s1.step == 1 and s1.task_state == '2 docs left'
  item = s1.C[-1]
  assert item.kind == 'observation' and item.text == 'Leeds is a city.'
  assert item.origin == s1.H[-1].id and item.evidence == ('Leeds#0',)
  assert item.tokens == 4 and not item.protected
  assert s1.env_item_id == item.id and s1.C[:1] == s.C
  # The previous observation stops being the current environment state.
  s2, _ = interaction.interact(s1, None, 'next', W, cfg, protected=True)
  assert s2.env_item_id == s2.C[-1].id != item.id and s2.C[-1].protected
  assert len(s2.H) == 3 and s2.step == 2


def test_overflowing_observation_stays_in_history_and_costs():
  cfg = mconfig.ExecutorConfig(context_budget=6, cost_context_overflow=0.25)
  s = mstate.new_state('t', 'q', W, instruction='a b')
  s1, cost = interaction.interact(s, None, 'one two three', W, cfg)
  assert cost == 0.0 and s1.context_tokens() == 5
  s2, cost = interaction.interact(s1, 'act', 'four five', W, cfg)
  assert cost == pytest.approx(0.25)
  assert s2.C is s1.C and s2.env_item_id is None
  assert [h.text for h in s2.H[-2:]] == ['act', 'four five']
  assert s2.context_tokens() <= cfg.context_budget
  # The overflowed observation can be restored once space is made.
  s3 = mexec.execute(s2, f'Filter(drop_refs=["{s1.env_item_id}"])', cfg, W)
  assert s3.accepted
  s4 = mexec.execute(s3.state_after, f'SelectEpisode(selected_refs=["{s2.H[-1].id}"])',
                  cfg, W)
  assert s4.accepted and s4.state_after.C[-1].text == 'four five'


def test_empty_action_and_observation():
  cfg = mconfig.ExecutorConfig()
  s = mstate.new_state('t', 'q', W)
  s1, cost = interaction.interact(s, '', None, W, cfg)
  assert cost == 0.0 and s1.H == () and s1.C == () and s1.step == 1


def test_evict_oldest_keeps_the_newest_observations_that_fit():
  # Budget 8: protected instruction (2) + observations of 3 tokens each.
  cfg = mconfig.ExecutorConfig(context_budget=8)
  s = mstate.new_state('t', 'q', W, instruction='a b')
  s, _ = interaction.interact(s, None, 'o1 x y', W, cfg, evict_oldest=True)
  s, _ = interaction.interact(s, None, 'o2 x y', W, cfg, evict_oldest=True)
  assert [it.text for it in s.C] == ['a b', 'o1 x y', 'o2 x y']
  s, cost = interaction.interact(s, None, 'o3 x y', W, cfg, evict_oldest=True)
  assert cost == 0.0 and [it.text for it in s.C] == ['a b', 'o2 x y', 'o3 x y']
  assert s.env_item_id == s.C[-1].id
  # Everything stays in H.
  assert [h.text for h in s.H] == ['o1 x y', 'o2 x y', 'o3 x y']
  # A larger one evicts as many as needed.
  s, _ = interaction.interact(s, None, 'o4 v w x y z', W, cfg, evict_oldest=True)
  assert [it.text for it in s.C] == ['a b', 'o4 v w x y z']
  # One that cannot fit even alone evicts nothing and stays in H only.
  s2, cost = interaction.interact(s, None, 'too long for the budget at all', W, cfg,
                         evict_oldest=True)
  assert s2.C == s.C and s2.env_item_id is None and cost == cfg.cost_context_overflow
  # Without the flag the old behaviour holds: nothing is evicted.
  s3, cost = interaction.interact(s, None, 'o5 x y', W, cfg)
  assert s3.C == s.C and cost == cfg.cost_context_overflow
