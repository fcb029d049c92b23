"""Tests for vermem_jax.envs.scenarios.needs (needs recomputed from s_0, SPEC §4)."""
from vermem_jax.envs.scenarios.build import build_episode
from vermem_jax.envs.scenarios.needs import needs_of
from vermem_jax.envs.scenarios.spec import FAMILIES, ScenarioConfig
from vermem_jax.envs.scenarios.views import build_view
from vermem_jax.memory import commands as cmds
from vermem_jax.memory.token_count import count_whitespace_tokens as count

CFG = ScenarioConfig()


def _views(examples):
  return {ex.id: build_view(ex, count) for ex in examples}


def test_phase_c_needs_ltm_and_stm_operation(pools):
  construction, _ = pools
  views = _views(construction[:150])
  for ex in construction[:150]:
    for fam in FAMILIES['C']:
      spec = build_episode(ex, 'C', fam, count_tokens=count, config=CFG,
                           view=views[ex.id])
      if spec is None:
        continue
      needs = set(needs_of(spec, views[ex.id]))
      assert needs & set(cmds.LTM_OPS), (ex.id, fam, needs)
      assert needs & set(cmds.STM_OPS), (ex.id, fam, needs)


def test_family_needs_match_their_operation(pools):
  """Each family's defining op is a need recomputed from the state (not metadata)."""
  construction, _ = pools
  expect = {('A', 'add'): 'Add', ('A', 'update'): 'Update', ('A', 'delete'): 'Delete',
            ('B', 'retrieve'): 'Retrieve', ('B', 'filter'): 'Filter',
            ('B', 'select_episode'): 'SelectEpisode', ('B', 'summarize'): 'Summarize'}
  for ex in construction[:60]:
    view = build_view(ex, count)
    for (phase, fam), op in expect.items():
      spec = build_episode(ex, phase, fam, count_tokens=count, config=CFG,
                           view=view)
      if spec is not None:
        assert op in needs_of(spec, view), (ex.id, phase, fam)
    null_b = build_episode(ex, 'B', 'null', count_tokens=count, config=CFG,
                           view=view)
    assert needs_of(null_b, view) == ()  # nothing to do: ∅ is right
