"""vermem_jax.eval."""
