"""The `small` scale: the tiny curriculum's sizes with a real pretrained policy.

`--config=<phase>.py:scale=small` is the tiny scale (`tiny.py`: its sizes, stand-ins
and `tiny.DEVIATIONS`) with SmolLM2-135M-Instruct as the policy and its tokenizer, the
numbers a pretrained 30-layer model needs in place of those measured on the 2-layer
tiny base. SmolLM2 comes from `make install-small` (a GGUF file converted into
`paths.small_model_dir()`); docs/real-weights.md gives the install, the parity figures
and the measured reduced run. One GPU runs the curriculum in well under an hour; on a
2-core CPU a step takes seconds, so only reduced runs are practical there.
"""

from __future__ import annotations

import ml_collections

from experiments.configs.parts import tiny
from vermem_jax import paths


def apply_small(c: ml_collections.ConfigDict, phase: str) -> None:
  """The tiny reductions, then the fields that differ for the pretrained SmolLM2."""
  tiny.apply_tiny(c, phase)
  # The converted SmolLM2 folder holds its weights, config.json and tokenizer; the
  # preset has the same shapes, for plans made without the weights
  # (plan_memory.py --scale=small). docs/real-weights.md
  c.model.preset = 'smollm2-135m-instruct'
  c.model.hf_checkpoint = paths.small_model_dir()
  c.tokenizer.name = 'smollm2-135m-instruct'
  c.tokenizer.path = paths.small_model_dir()
  # 30 layers: scanned, so the learner step compiles one layer body instead of 30
  # (the tiny base unrolls its 2). Attention kernel by backend (cuDNN flash on GPU).
  c.model.scan_layers = True
  c.model.attn_implementation = 'auto'
  # A pretrained model's fine-tuning rate, not tiny's 1e-3 for a random 2-layer model
  # (1e-3 on SmolLM2 would erase what it knows); 1e-4 is not yet tuned by measurement.
  c.sft.learning_rate = 1e-4
  # RL from a pretrained policy: 3e-5 between the paper's 1e-6 (7B) and tiny's 3e-4
  # (2-layer model), not yet tuned by measurement. docs/real-weights.md
  c.rl.learning_rate = 3e-5
