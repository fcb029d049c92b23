"""Tests for vermem_jax.envs.scenarios.perturbations (stale entry texts, paper D.1)."""
import random

from vermem_jax.envs.scenarios.perturbations import perturb_number, truncate_partial


def test_perturb_number_and_partial_hand_cases():
  rng = random.Random(0)
  out = perturb_number('Born in 1982 in Denver, aged 3.', rng)
  assert out != 'Born in 1982 in Denver, aged 3.'
  year = int(out.split()[2])
  assert year in (1983, 1984, 1985, 1981, 1980) and out.endswith('Denver, aged 3.')
  assert perturb_number('No digits here at all.', rng) is None
  assert truncate_partial('one two three four five six seven') == 'one two three'
  assert truncate_partial('too short') is None
