"""Tests for vermem_jax.envs.sft_data.templates (boundary and standard templates)."""
from vermem_jax.memory.commands import ALL_OPS
from vermem_jax.envs.sft_data.templates import TEMPLATES, templates_for


def test_confusable_pairs_have_boundary_templates():
  boundary = {t.name: t.op for t in TEMPLATES if t.is_boundary}
  ops = set(boundary.values())
  for a, b in (('Add', 'Update'), ('Retrieve', 'SelectEpisode'),
               ('Filter', 'Summarize')):
    assert a in ops and b in ops
  assert 'Null' in ops  # an operation vs ∅
  for op in ALL_OPS:  # every class has a standard and a boundary template
    assert templates_for(op, True) and templates_for(op, False)
