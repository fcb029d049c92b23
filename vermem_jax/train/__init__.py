"""vermem_jax.train."""
