"""The curriculum's phases (SPEC §4) and the config scales."""

# The curriculum (SPEC §4): θ_SFT -> θ_A -> θ_B -> θ_C; each RL phase's reference policy
# and initial parameters are the previous phase's.
PHASE_ORDER = ('sft', 'phase_a', 'phase_b', 'phase_c')
PREVIOUS_PHASE = {'sft': None, 'phase_a': 'sft', 'phase_b': 'phase_a',
                  'phase_c': 'phase_b'}
# Configs that evaluate a workdir's policies instead of training one (SPEC §7); they
# use the full command space and have no reference policy.
EVAL_CONFIGS = ('eval_hotpotqa',)
CONFIG_NAMES = PHASE_ORDER + EVAL_CONFIGS
# Operation subspace name used by vermem_jax.memory.PHASE_OPS (SPEC §4).
PHASE_OP_SPACE = {'sft': 'C', 'phase_a': 'A', 'phase_b': 'B', 'phase_c': 'C',
                  'eval_hotpotqa': 'C'}
SCALES = ('tiny', 'paper')
