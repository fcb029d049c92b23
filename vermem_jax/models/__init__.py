"""vermem_jax.models."""
