"""The curriculum's phases (SPEC §4) and the config scales."""

from vermem_jax.memory import commands

# The curriculum (SPEC §4): θ_SFT -> θ_A -> θ_B -> θ_C; each RL phase's reference policy
# and initial parameters are the previous phase's.
PHASE_ORDER = ('sft', 'phase_a', 'phase_b', 'phase_c')
PREVIOUS_PHASE = {'sft': None, 'phase_a': 'sft', 'phase_b': 'phase_a',
                  'phase_c': 'phase_b'}
# The interactive benchmarks' evaluation configs -> the benchmark's registry name
# (vermem_jax.envs.interactive), in the paper's Table 2 column order.
BENCHMARK_CONFIGS = {'eval_alfworld': 'alfworld', 'eval_scienceworld': 'scienceworld',
                     'eval_pddl': 'pddl', 'eval_babyai': 'babyai'}
# Configs that evaluate a workdir's policies instead of training one (SPEC §7); they
# use the full command space and have no reference policy.
EVAL_CONFIGS = ('eval_hotpotqa',) + tuple(BENCHMARK_CONFIGS)
# Configs that only aggregate finished evaluations (Table 2 and its frontier).
AGGREGATE_CONFIGS = ('table2',)
# The tiny scale's pretraining of its base model (a stand-in for the pretrained Qwen;
# vermem_jax.train.pretrain): before the curriculum, and outside it.
PRETRAIN_CONFIG = 'pretrain'
CONFIG_NAMES = PHASE_ORDER + EVAL_CONFIGS + AGGREGATE_CONFIGS + (PRETRAIN_CONFIG,)
# Operation subspace (vermem_jax.memory.commands.PHASE_OPS) of every config: the
# training phases' (SPEC §4); evaluation, aggregation and pretraining use all tools.
PHASE_OP_SPACE = {**commands.PHASE_OP_SPACE,
                  **{name: 'C' for name in EVAL_CONFIGS + AGGREGATE_CONFIGS
                     + (PRETRAIN_CONFIG,)}}
SCALES = ('tiny', 'small', 'paper')
# Scales whose runs make the earlier phases they need (tiny's sizes; paper scale asks
# for each phase's command instead).
IMPLICIT_PHASE_SCALES = ('tiny', 'small')
