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


def assert_same_adam_moments(state_a, state_b, *, n_terms: int):
  """Two optax Adam/AdamW states hold the same moments (mu, a running mean of the
  gradients, and nu, of their squares) up to the reassociation of n_terms summed
  terms, scaled by each leaf's largest entry. After one step mu = (1 - b1) g, so this
  compares the gradient the optimizer was given.

  The parameters Adam produced are not compared: its step lr m / (sqrt(v) + eps_adam)
  turns the rounding of gradient entries near eps_adam into changes of order lr.
  """
  for name, factor in (('mu', 1), ('nu', 2)):  # nu ~ g^2: twice g's relative error
    for a, b in zip(*(jax.tree.leaves(optax.tree_utils.tree_get(s, name))
                      for s in (state_a, state_b))):
      a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
      scale = np.abs(a).max()
      assert scale > 0, name
      np.testing.assert_allclose(b, a, rtol=0, err_msg=name,
                                 atol=factor * reassociation_atol(n_terms, scale))
