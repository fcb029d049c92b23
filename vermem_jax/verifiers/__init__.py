"""vermem_jax.verifiers."""
