"""Float32 tolerances from the arithmetic, for tests that compare two computations of
the same sums in different orders (micro-batch splits, batch shapes).

Summing n float32 terms of size up to M in two orders can differ by about
n x eps x M (eps = 2**-23, the float32 unit roundoff bound used loosely), whatever the
CPU's vector width; a tolerance tuned to one machine's rounding is not used.
"""
import jax
import numpy as np
import optax

F32_EPS = float(np.finfo(np.float32).eps)


def reassociation_atol(n_terms: int, magnitude: float) -> float:
  """n_terms x float32 eps x magnitude: the gap two orders of one float32 sum of
  n_terms terms of size `magnitude` can show."""
  return n_terms * F32_EPS * float(magnitude)


def first_step_gradients(opt_state, b1: float) -> list[np.ndarray]:
  """The (clipped) gradient an optax Adam/AdamW took its first step with: its first
  moment mu = (1 - b1) g, per leaf."""
  mu = optax.tree_utils.tree_get(opt_state, 'mu')
  return [np.asarray(m, np.float64) / (1 - b1) for m in jax.tree.leaves(mu)]


def assert_same_first_step_gradients(state_a, state_b, *, b1: float, n_terms: int):
  """Both optimizer states took their first step with the same gradient, up to the
  reassociation of n_terms summed terms, scaled by each leaf's largest entry.

  Adam's first step itself, lr g / (|g| + eps_adam), is not compared: for entries
  with |g| near eps_adam it turns rounding into a change of order lr.
  """
  for a, b in zip(first_step_gradients(state_a, b1), first_step_gradients(state_b, b1)):
    scale = np.abs(a).max()
    assert scale > 0
    np.testing.assert_allclose(b, a, rtol=0, atol=reassociation_atol(n_terms, scale))
