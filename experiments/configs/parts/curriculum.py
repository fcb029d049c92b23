"""The curriculum's phases (SPEC §4) and the config scales."""

# The curriculum (SPEC §4): θ_SFT -> θ_A -> θ_B -> θ_C; each RL phase's reference policy
# and initial parameters are the previous phase's.
PHASE_ORDER = ('sft', 'phase_a', 'phase_b', 'phase_c')
PREVIOUS_PHASE = {'sft': None, 'phase_a': 'sft', 'phase_b': 'phase_a',
                  'phase_c': 'phase_b'}
# Operation subspace name used by vermem_jax.memory.PHASE_OPS (SPEC §4).
PHASE_OP_SPACE = {'sft': 'C', 'phase_a': 'A', 'phase_b': 'B', 'phase_c': 'C'}
SCALES = ('tiny', 'paper')
