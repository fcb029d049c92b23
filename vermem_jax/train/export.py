"""A phase's selected checkpoint as a Hugging Face folder (issue 23).

`export` writes what `transformers.AutoModelForCausalLM.from_pretrained`, vLLM and
SGLang load: `config.json` and `model.safetensors` (`models.hf_io.save_hf_checkpoint`),
the run's tokenizer files with a chat template, and `vermem_export.json` (phase,
checkpoint step, source workdir). The checkpoint is the one evaluation loads: the
phase's SELECTED checkpoint (best internal-dev score, `train.checkpoints`), else its
newest. `experiments/export.py` is the command line; `eval.policies` loads the
folder back as an `hf:DIR` policy.
"""

from __future__ import annotations

import json
import os
import shutil

import ml_collections

from vermem_jax.models import hf_io
from vermem_jax.train import checkpoint_values
from vermem_jax.train import checkpoints
from vermem_jax.train import setup as setup_lib

PHASES = ('sft', 'phase_a', 'phase_b', 'phase_c')
# The ChatML layout of `tokenization.render_chatml` as a Jinja template (what
# transformers' apply_chat_template and vLLM's server render for a SentencePiece
# tokenizer, which carries no template of its own).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Files of an HF tokenizer folder that travel with the export.
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'vocab.json',
                   'merges.txt', 'special_tokens_map.json', 'added_tokens.json',
                   'chat_template.jinja', 'generation_config.json', 'tokenizer.model')


def check_phase(phase: str) -> None:
  """Raises ValueError naming `--phase` when it is not a curriculum phase."""
  if phase not in PHASES:
    raise ValueError(f'--phase={phase}: expected one of {", ".join(PHASES)}')


def export(config: ml_collections.ConfigDict, workdir: str, phase: str, out: str,
           dtype: str = 'float32') -> dict:
  """Writes the HF folder (module docstring); returns the export metadata
  {'phase', 'step', 'workdir', 'dtype', 'tokenizer', 'prompt'}.

  Args:
    config: the run's ConfigDict (model and tokenizer sections).
    workdir: the run directory holding `<phase>/`.
    phase: one of PHASES.
    out: the output folder (created; must be empty if it exists).
    dtype: storage dtype.

  Raises:
    ValueError: unknown phase, an `out` that is a file or a non-empty folder.
    train.checkpoints.CheckpointError: no restorable checkpoint of `phase`.
  """
  check_phase(phase)
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f'--out={out!r} is a file; pass a new or empty folder')
  if os.path.isdir(out) and os.listdir(out):
    raise ValueError(f'--out={out!r} exists and is not empty')
  directory = checkpoints.phase_dir(workdir, phase)
  if not checkpoints.has_checkpoint(directory):
    raise checkpoint_values.CheckpointError(f'{directory} holds no checkpoint of {phase}')
  mc = setup_lib.model_config_from(config)
  tok = setup_lib.load_tokenizer_for(config, mc)
  shapes, _ = setup_lib.abstract_train_state(mc, lambda p: (),
                                            setup_lib.make_mesh(
                                                setup_lib.MeshConfig.from_section(config.model)))
  params, step = checkpoints.restore_params_only(directory, shapes, prefer_best=True)
  hf_io.save_hf_checkpoint(mc, params, out, dtype=dtype)
  write_tokenizer(tok, out)
  meta = {'phase': phase, 'step': int(step), 'workdir': os.path.abspath(workdir),
          'dtype': dtype, 'tokenizer': getattr(tok, 'path', ''),
          'prompt': 'chat template around x_t = g(s_t) as the one user message; '
                    'the reply is one memory command'}
  with open(os.path.join(out, 'vermem_export.json'), 'w') as f:
    json.dump(meta, f, indent=2, sort_keys=True)
  return meta


def write_tokenizer(tok, out: str) -> None:
  """Copies the run's tokenizer into `out` with a chat template: an HF folder's files
  as they are (a template is added when the folder has none); a SentencePiece model
  as `tokenizer.model` with a `tokenizer_config.json` naming its special tokens and
  the ChatML template the policy was trained with (its ids come from sentencepiece,
  not from a transformers tokenizer class)."""
  path = getattr(tok, 'path', '')
  if os.path.isdir(path):
    for name in TOKENIZER_FILES:
      if os.path.exists(os.path.join(path, name)):
        shutil.copy2(os.path.join(path, name), os.path.join(out, name))
    cfg_path = os.path.join(out, 'tokenizer_config.json')
    cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    if not cfg.get('chat_template') and not os.path.exists(
        os.path.join(out, 'chat_template.jinja')):
      cfg['chat_template'] = CHATML_TEMPLATE
      with open(cfg_path, 'w') as f:
        json.dump(cfg, f, indent=2)
    return
  shutil.copy2(path, os.path.join(out, 'tokenizer.model'))
  # No tokenizer_class: transformers' SentencePiece-based classes normalize text
  # differently and give other ids than `sentencepiece` itself (docs/serving.md).
  cfg = {'eos_token': tok.decode([tok.eos_token_id]),
         'pad_token': tok.decode([tok.pad_token_id]),
         'chat_template': CHATML_TEMPLATE,
         'vermem_note': 'encode with sentencepiece (vermem_jax.tokenization); '
                        'transformers tokenizers give other ids for this model'}
  with open(os.path.join(out, 'tokenizer_config.json'), 'w') as f:
    json.dump(cfg, f, indent=2)
