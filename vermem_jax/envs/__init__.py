"""vermem_jax.envs."""
