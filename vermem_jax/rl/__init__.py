"""vermem_jax.rl: rewards, advantages, the GRPO loss, batching and rollout collection.

Modules (import them directly; this package imports nothing eagerly so the NumPy-only
parts stay free of JAX):
  rewards             r^task, r^sup, r^evid, r^state, C̄^online, r^eff, r^global,
                      R^local, P_aux, m^all, m^ans (paper Eq. 12-18; SPEC §5),
                      RewardConfig.
  advantages          A^global, A^local (per op type, batch or RunningStats), A^hier
                      and the ablation modes (Eq. 5, 9; SPEC §6), AdvantageConfig,
                      RunningStats.
  grpo                token-level clipped GRPO loss on command tokens with deferred
                      (sum, count) normalization, the jitted model step, SFT command
                      NLL (Eq. 7, 10-11; SPEC §6).
  batching            padded command batches and masks.
  rollout             K-rollout group collection of one update (collect_update).
  rollout_records     RolloutDecision / RolloutTrajectory / RolloutResult.
  task_selection      resumable task choice and PRNG keys of an update.
  running_stats_init  phase-start running statistics from internal-dev transitions.
"""
