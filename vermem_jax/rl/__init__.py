"""vermem_jax.rl."""
