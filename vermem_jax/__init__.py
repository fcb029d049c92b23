"""vermem_jax: VerMem (arXiv 2608.03137) memory-operation policy training in JAX/Flax.

Subpackages, in import order (lower layers never import higher ones):
  memory   plain-Python memory environment: M_t, C_t, H_t, commands, T_m, g(s).
  models   Qwen2/2.5/3 in Flax Linen, HF checkpoint I/O, KV-cache sampler, sharding.
  envs     HotpotQA data, SFT set, Phase A/B/C scenarios, task solvers, episode loop.
  verifiers local/global verifier backends.
  rl       rewards, advantages, GRPO loss, batching, rollout collection.
  train    SFT and RL phase trainers, checkpoints, metrics.
  eval     held-out episodes, metrics, judges, budget frontier, seed aggregation.
"""

__version__ = "0.1.0"
