"""The default CPU scale: reductions of the paper-scale config (`paper.py`).

Most values that differ from SPEC are reduced sizes (counts, lengths, learning rates)
and CPU stand-ins (a pretrained tiny Qwen made here, the heuristic verifier, the
oracle-evidence reader). A few are different formulas: `DEVIATIONS` names each, with
its reason, and docs/cpu-scale.md's table "Where the CPU default departs from the
paper" lists them with the figures that justified them (tests/test_configs.py holds the
two together). A phase runs on a 2-core CPU in minutes. The measurements behind each
value are in docs/cpu-scale.md, "Why the tiny values are what they are".
"""

from __future__ import annotations

import ml_collections

from experiments.configs.parts import benchmarks
from experiments.configs.parts import derived
from experiments.configs.parts import paper
from vermem_jax import paths


# Fields whose tiny value is a different formula or a stand-in, not a smaller number:
# field -> why (docs/cpu-scale.md gives the measurements).
DEVIATIONS = {
    'model.hf_checkpoint': 'a tiny Qwen pretrained here (copy tasks + HotpotQA text) '
                           'stands in for the pretrained Qwen, which cannot be '
                           'downloaded',
    'memory.local_ids': 'ids shown and cited without their task namespace',
    'sft.loss_reduction': "'sqrt': each command's summed NLL over the square root of "
                          "its length, instead of Eq. 7's sum",
    'advantage.std_floor': 'a floor of 0.25 instead of 0.01 on every σ of Eq. 9-11 '
                           '(A^local, A^global and A^task)',
    'advantage.local_min_count': 'batch statistics of a type from 2 instances instead '
                                 'of 8',
    'advantage.rejection_floor': "'below_executable': every rejected decision below "
                                 'every executable one of its update (Eq. 5 changed)',
    'verifier.backend': 'the rule-based heuristic verifier stands in for the LLM '
                        'verifiers',
    'solver.backend': 'the oracle-evidence reader stands in for the LLM task solver',
}


def apply_tiny(c: ml_collections.ConfigDict, phase: str) -> None:
  """Shrinks sizes so a phase runs on a 2-core CPU in minutes; the fields of
  `DEVIATIONS` also change formulas or use stand-ins."""
  c.data.data_dir = paths.default_data_dir()  # HotpotQA samples (+ HF tokenizers)
  # The packaged 4k SentencePiece model (vermem_jax.tokenizer_build); another name
  # (`--config.tokenizer.name=qwen2.5`) gives <data_dir>/tokenizers/<name>.
  c.tokenizer.name = 'hotpotqa-sp4k'
  c.tokenizer.path = derived.derived_tokenizer_path_ref(c)
  c.model.preset = 'tiny-sp4k'         # the base's shape; random init with the next line ''
  # The packaged pretrained base stands in for the pretrained Qwen (docs/cpu-scale.md,
  # "The tiny base"); `--config.model.hf_checkpoint=` (empty) starts from random weights.
  c.model.hf_checkpoint = paths.packaged_base()
  c.model.dtype = 'bfloat16'           # bf16 matmuls, float32 accumulation and params
  c.model.remat = False
  # 2 layers leave no memory to save, and the scan is slower on CPU and rounds
  # differently (docs/cpu-scale.md, "Model").
  c.model.scan_layers = False
  # Pure data parallelism: the tiny model fits on every device many times over.
  c.model.mesh_data = -1
  c.model.mesh_fsdp = 1
  # Faster than the blockwise kernel at these lengths (docs/cpu-scale.md, "Model").
  c.model.attn_implementation = 'sdpa'
  # Shorter inputs for CPU speed; the SFT builder needs >= ~512 tokens of g(s) to fit
  # the instruction block and a Summarize state. The bucket fields follow (derived).
  c.memory.context_budget = 320
  c.memory.policy_input_limit = 640
  # Ids without the task namespace (`c2`): the SFT model got the namespace wrong
  # (docs/cpu-scale.md, "Inputs"). The executor qualifies them.
  c.memory.local_ids = True
  # Every SFT target fits (longest template command: 177 tokens of the 4k model).
  c.sampling.max_command_tokens = 192
  # Every tiny program compiles in well under a second on CPU, so the paper's 1 s
  # threshold would cache none of them and every resume would compile them all again
  # (docs/compilation.md).
  c.runtime.cache_min_compile_time_secs = 0.0
  derived.install_tiny_buckets(c)      # finer length buckets, one command bucket
  c.batching.micro_batch_size = 8
  # The most the boundary Summarize template builds from the construction questions
  # (docs/cpu-scale.md, "SFT set size").
  c.sft.train_per_target = 80
  c.sft.dev_per_target = 8
  # Batch 8 at a constant rate learns as much per record as 16 with a decay, at half
  # the step time (docs/cpu-scale.md, "SFT set size, batch, schedule and rate").
  c.sft.batch_size = 8
  # Length-grouped batches pad less (sft_examples docstring).
  c.sft.length_group_batches = 16
  # Three epochs (240 steps) from the pretrained base, not yet tuned on it
  # (docs/cpu-scale.md, "SFT set size, batch, schedule and rate").
  c.sft.num_epochs = 3
  c.sft.learning_rate = 1e-3           # a small model needs a larger step
  c.sft.lr_schedule = 'constant'       # after the 3% warmup
  # Each command's summed NLL over √(its tokens): Eq. 7's sum lets the longest commands
  # dominate a small model's steps (docs/cpu-scale.md, "SFT loss reduction").
  c.sft.loss_reduction = 'sqrt'
  # Greedy decoding of the dev set is the costly part of an evaluation: once, at the end.
  c.sft.eval_every = 1000
  c.sft.eval_each_epoch = False
  # Four updates of 2 tasks x K = 8: RL's share of make run's time; fewer moved nothing,
  # more did not help (docs/cpu-scale.md, "RL updates and rollouts").
  c.rl.num_updates = 4 if phase != 'sft' else 0
  c.rl.tasks_per_update = 2
  c.rl.rollouts_per_task = 8
  c.rl.monitor_every = 1
  # The paper's 1e-6 leaves a small model unmoved; 1e-3 breaks the command grammar
  # (docs/cpu-scale.md, "RL learning rate").
  c.rl.learning_rate = 3e-4
  # rl.loss_reduction stays Eq. 11's 'decision': 'sqrt' and 'sequence' did no better
  # held out (docs/cpu-scale.md, "RL loss reduction").
  c.rl.eval_every = 1                  # score every update's checkpoint on dev
  c.advantage.running_stats_init_count = 4
  # 4 dev transitions per type leave the running σ at 0, and SPEC's 0.01 floor then
  # ranks parse failures above executed commands (docs/cpu-scale.md, "Advantage").
  c.advantage.std_floor = 0.25
  c.advantage.local_min_count = 2
  # Ours, not Eq. 5: every rejected decision below every executable one of its update
  # (rl/advantages.py; the measurements: docs/cpu-scale.md, "Rejection floor").
  c.advantage.rejection_floor = 'below_executable'
  c.verifier.backend = 'heuristic'     # CPU stand-in for the LLM verifiers
  c.solver.backend = 'oracle'          # oracle-evidence reader
  if phase in paper.PAPER_EPISODES:
    c.episodes.num_train = 16
    # 8 dev episodes: with 4, one decision moved the rejected rate by 0.08-0.17.
    c.episodes.num_dev = 8
  c.episodes.rollout_limit = 3
  c.episodes.token_budget = 16384
  c.checkpoint.save_every = 1000
  c.checkpoint.max_to_keep = 1
  # make run's held-out table: 32 questions, one seed; with 4 the Base-vs-policy gap
  # reversed (docs/cpu-scale.md, "Internal dev and the held-out table").
  c.eval.num_questions = 32
  c.eval.seeds = (42,)
  # SPEC's 1,000-5,000-token budgets are below every tiny episode (13,700-30,700
  # tokens), so the same grid is stretched over that range.
  c.eval.budgets = tuple(range(5000, 40001, 5000))
  c.eval.target_budget = 20000
  benchmarks.apply_tiny(c)             # eval_<benchmark>: short instances, gold plans
