"""layers.matmul: forward and custom VJP against NumPy products."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from vermem_jax.models import layers


def _operands(rows, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((rows, 24)).astype(np.float32)
  w = rng.standard_normal((24, 40)).astype(np.float32)
  g = rng.standard_normal((rows, 40)).astype(np.float32)
  return x, w, g


@pytest.mark.parametrize('rows', [64, 30])  # chunked weight gradient (8 | rows) and not
def test_float32_value_and_gradients_match_numpy(rows):
  x, w, g = _operands(rows)
  y, vjp = jax.vjp(layers.matmul, jnp.asarray(x), jnp.asarray(w))
  dx, dw = vjp(jnp.asarray(g))
  x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
  assert y.dtype == jnp.float32 and dx.dtype == jnp.float32 and dw.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y), x64 @ w64, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(dx), g64 @ w64.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(dw), x64.T @ g64, rtol=1e-5, atol=1e-4)


def test_bfloat16_gradients_use_the_rounded_cotangent():
  x, w, g = _operands(64, seed=1)
  bf = ml_dtypes.bfloat16
  xb, wb = x.astype(bf), w.astype(bf)
  y, vjp = jax.vjp(layers.matmul, jnp.asarray(xb), jnp.asarray(wb))
  dx, dw = vjp(jnp.asarray(g))  # float32 cotangent, rounded to bf16 in the backward
  assert y.dtype == jnp.float32 and dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
  x64, w64 = xb.astype(np.float64), wb.astype(np.float64)
  g64 = g.astype(bf).astype(np.float64)
  np.testing.assert_allclose(np.asarray(y), x64 @ w64, rtol=1e-5, atol=1e-5)
  # float32 sums of exact bf16 products, then one rounding to bf16 (8 bits: 2^-8).
  np.testing.assert_allclose(np.asarray(dx, np.float64), g64 @ w64.T, rtol=2**-8, atol=1e-2)
  np.testing.assert_allclose(np.asarray(dw, np.float64), x64.T @ g64, rtol=2**-8, atol=1e-2)


def test_gradients_equal_autodiff_when_the_cotangent_is_bfloat16():
  """The Dense path: its bf16 output makes the cotangent bf16-valued, so the custom VJP
  computes what autodiff of the plain einsum computes."""
  x, w, _ = _operands(64, seed=2)
  xb, wb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
  target = jnp.asarray(np.random.default_rng(3).standard_normal((64, 40)), jnp.float32)

  def loss(fn):
    return lambda a, b: jnp.sum((fn(a, b).astype(jnp.bfloat16).astype(jnp.float32)
                                 - target) ** 2)

  plain = lambda a, b: jnp.einsum('nd,df->nf', a, b, preferred_element_type=jnp.float32)
  got = jax.grad(loss(layers.matmul), argnums=(0, 1))(xb, wb)
  want = jax.grad(loss(plain), argnums=(0, 1))(xb, wb)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=2**-7, atol=1e-2)
