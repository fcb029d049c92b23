"""The pretraining section: the CPU stand-in for a pretrained Qwen (issue 22).

Only the tiny scale pretrains. At paper scale the policy starts from a pretrained Qwen
checkpoint (`model.hf_checkpoint`), as in the paper; `--config=pretrain.py:scale=paper`
is refused. Fields: `vermem_jax.train.pretrain.PretrainConfig`.
"""

from __future__ import annotations

import ml_collections

# Tasks in vermem_jax.train.pretrain.TASKS order: text, copy, span, quote, cite.
TASK_WEIGHTS = (0.25, 0.2, 0.25, 0.15, 0.15)


def apply_pretrain(c: ml_collections.ConfigDict) -> None:
  """Adds `c.pretrain` and points the model at random initialization (the base is what
  this phase makes)."""
  c.model.hf_checkpoint = None
  p = c.pretrain = ml_collections.ConfigDict()
  # Copying forms in a phase change of the 'copy' task alone, so it runs first; longer
  # or mixed schedules copied no better (docs/cpu-scale.md, "Pretraining trials").
  p.copy_only_steps = 1000
  p.steps = 1800
  p.batch_size = 32
  # Four 20-token records + a question fit; 640-token rows copied evenly but gave a
  # worse SFT (docs/cpu-scale.md, "Pretraining trials").
  p.seq_len = 160
  p.copy_seq_len = 96                  # two 32-token copies + 16 of noise + markers
  p.task_weights = TASK_WEIGHTS
  # AdamW as the copy measurement: 1e-3 after 100 warmup steps, clip 1.0.
  p.learning_rate = 1e-3
  p.warmup_steps = 100
  p.weight_decay = 0.0
  p.adam_b1 = 0.9
  p.adam_b2 = 0.98
  p.adam_eps = 1e-8
  p.max_grad_norm = 1.0
  # Every ordinary piece (the 4,096-piece vocabulary less the specials, the byte pieces
  # and the user-defined symbols), so every embedding learns to be copied.
  p.alphabet = 3800
  p.copy_min_len = 10
  p.copy_max_len = 32
  p.copy_max_noise = 16
  # No ramp: the measured recipe (full alphabet and lengths from step 1).
  p.curriculum_start = 1.0
  p.curriculum_steps = 0
  p.span_min = 8
  p.span_max = 48
  p.probe_fraction = 0.05              # held-out construction-pool questions
  p.probe_rows = 64
  p.max_consecutive_skips = 3          # as sft / rl (parts/paper.py)
  p.log_every = 50
  p.probe_every = 200
  # One fixed base for every curriculum seed (the packaged one was made with 0); the
  # curriculum's own `seed` does not change it.
  p.seed = 0
