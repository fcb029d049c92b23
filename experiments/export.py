r"""Exports a phase's selected checkpoint as a Hugging Face folder (issue 23).

    python experiments/export.py --workdir=workdir --phase=phase_c --out=export/phase_c
    python experiments/export.py --workdir=/runs/vermem --phase=phase_c \
        --out=/ckpt/vermem \
        --config=phase_c.py:scale=paper \
        --config.model.hf_checkpoint=/ckpt/Qwen2.5-7B-Instruct --dtype=bfloat16

The folder holds what `transformers.AutoModelForCausalLM.from_pretrained` and vLLM /
SGLang load: `config.json` and `model.safetensors` (models.hf_io.save_hf_checkpoint),
the run's tokenizer files with a chat template (`tokenizer_config.json` carries it),
and `vermem_export.json` (phase, checkpoint step, source workdir). The checkpoint is
the one evaluation loads: the phase's SELECTED checkpoint (best internal-dev score,
`train.checkpoints`), else its newest. `--config` (default `<phase>.py`, tiny scale)
with any `--config.*` override must describe the run's model and tokenizer, as for
`experiments/run.py`. The evaluation takes the folder as a policy:

    python experiments/run.py --config=eval_hotpotqa.py --workdir=workdir \
        --config.eval.policies=base,exported=hf:export/phase_c

The policy's prompt is the chat template around x_t = g(s_t) as the one user message
(`rl.policy.policy_prompt_text`); its reply is one memory command. Bad input (an
unknown phase or config, a workdir without that phase's checkpoint, an --out that is a file or
a non-empty folder) is one error line with status 2.
"""

from __future__ import annotations

import pathlib
import sys

_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
  sys.path.insert(0, str(_REPO_ROOT))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments.cli import config_argv  # noqa: E402
from vermem_jax.train import checkpoint_values
from vermem_jax.train import export as export_lib  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'The run config (default: <phase>.py at the tiny scale).',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The run directory.', required=True)
_PHASE = flags.DEFINE_enum('phase', 'phase_c', export_lib.PHASES, 'The phase to export.')
_OUT = flags.DEFINE_string('out', None, 'Output folder (new or empty).', required=True)
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ('float32', 'bfloat16', 'float16'),
                           'Storage dtype of the weights.')


def main(argv) -> int:
  del argv
  config = _CONFIG.value
  try:
    meta = export_lib.export(config, _WORKDIR.value, _PHASE.value, _OUT.value,
                             _DTYPE.value)
  except (ValueError, OSError, checkpoint_values.CheckpointError) as e:
    # OSError: an --out that is a file, or a folder that cannot be written.
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'exported {meta["phase"]} step {meta["step"]} to {_OUT.value} '
        f'(config.json, model.safetensors, tokenizer files, chat template); evaluate '
        f'it with --config.eval.policies=exported=hf:{_OUT.value}')
  return 0


def _with_default_config(argv: list[str]) -> list[str]:
  """argv with `--config=<phase>.py` added when no --config is given, resolved like
  run.py's (bare names against experiments/configs/).

  Raises:
    ValueError: an unknown --phase, or a --config that is neither a file nor a known
      config name.
  """
  phase = 'phase_c'
  for i, a in enumerate(argv):
    if a.startswith('--phase='):
      phase = a.split('=', 1)[1]
    elif a == '--phase' and i + 1 < len(argv):
      phase = argv[i + 1]
  export_lib.check_phase(phase)  # before it names a default config file
  if not any(a == '--config' or a.startswith('--config=') for a in argv):
    argv = argv[:1] + [f'--config={phase}.py'] + argv[1:]
  return config_argv.resolve_config_argv(argv)


if __name__ == '__main__':
  try:
    sys.argv = _with_default_config(sys.argv)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  app.run(lambda argv: sys.exit(main(argv)))
