"""The pretraining section: the CPU stand-in for a pretrained Qwen (issue 22).

Only the tiny scale pretrains. At paper scale the policy starts from a pretrained Qwen
checkpoint (`model.hf_checkpoint`), as in the paper; `--config=pretrain.py:scale=paper`
is refused. Fields: `vermem_jax.train.pretrain.PretrainConfig`.
"""

from __future__ import annotations

import ml_collections

# Tasks in vermem_jax.train.pretrain.TASKS order: text, copy, span, quote, cite.
TASK_WEIGHTS = (0.15, 0.3, 0.3, 0.125, 0.125)


def apply_pretrain(c: ml_collections.ConfigDict) -> None:
  """Adds `c.pretrain` and points the model at random initialization (the base is what
  this phase makes)."""
  c.model.hf_checkpoint = None
  p = c.pretrain = ml_collections.ConfigDict()
  # Measured on this repository's 2-core CPU while building the packaged base: the copy
  # tasks show a phase change (per-token span copy on held-out paragraphs jumps from
  # chance to > 0.9 within a few hundred steps) after ~1,000 steps at batch 32; the
  # issue's own probe of the random-token task alone saw it at ~1,100-1,250 steps.
  p.steps = 1600
  p.batch_size = 32
  p.seq_len = 160                      # four 20-token records + a question fit
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
  p.alphabet = 512
  p.copy_min_len = 10
  p.copy_max_len = 32
  p.copy_max_noise = 16
  # Short spans and a small alphabet first, the full task after 400 steps.
  p.curriculum_start = 0.25
  p.curriculum_steps = 400
  p.span_min = 8
  p.span_max = 48
  p.probe_fraction = 0.05              # held-out construction-pool questions
  p.probe_rows = 64
  p.log_every = 50
  p.probe_every = 200
  # One fixed base for every curriculum seed (the packaged one was made with 0); the
  # curriculum's own `seed` does not change it.
  p.seed = 0
