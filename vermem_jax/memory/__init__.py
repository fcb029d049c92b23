"""vermem_jax.memory."""
