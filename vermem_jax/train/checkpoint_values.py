"""How a checkpoint's non-array values are stored and how its failures are reported
(train/checkpoints.py): JSON conversion of TrainState's metadata fields and back, PRNG
key data, and the CheckpointError messages.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np


class CheckpointError(RuntimeError):
  """A checkpoint directory cannot be restored from, or a save was refused."""


def to_json(value: Any, where: str) -> Any:
  """Converts NumPy/JAX scalars and arrays to JSON values; raises on anything else."""
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, (int, float)):
    return value
  if isinstance(value, (np.generic,)):
    return value.item()
  if isinstance(value, (np.ndarray, jax.Array)):
    return np.asarray(value).tolist()
  if isinstance(value, Mapping):
    out = {}
    for k, v in value.items():
      if not isinstance(k, str):
        raise CheckpointError(f'{where}: JSON keys must be str, got {k!r}')
      out[k] = to_json(v, f'{where}.{k}')
    return out
  if isinstance(value, (list, tuple)):
    return [to_json(v, f'{where}[{i}]') for i, v in enumerate(value)]
  raise CheckpointError(f'{where}: {type(value).__name__} is not JSON-serializable')


def like_template(value: Any, template: Any) -> Any:
  """Casts JSON-restored `value` back to the container/array types of `template`."""
  if isinstance(template, (np.ndarray, jax.Array)):
    return np.asarray(value, dtype=np.asarray(template).dtype)
  if isinstance(template, np.generic):
    return template.dtype.type(value)
  if isinstance(template, Mapping) and isinstance(value, Mapping):
    return {k: like_template(v, template[k]) if k in template else v for k, v in value.items()}
  if isinstance(template, tuple) and isinstance(value, list) and len(template) == len(value):
    return tuple(like_template(v, t) for v, t in zip(value, template))
  return value


def rng_to_data(rng: Any) -> tuple[Any, str | None]:
  """(uint32 key data as a NumPy array, typed-key impl name or None). Stored as a host
  array: a key lives on one device, which a multi-process save cannot serialize."""
  if rng is None:
    return None, None
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return np.asarray(jax.random.key_data(rng)), str(jax.random.key_impl(rng))
  return np.asarray(rng), None


# Orbax's wording when a restore template's shapes / tree differ from the stored arrays.
MISMATCH_MARKERS = ('is not compatible with the stored shape',
                     'tree structures do not match')
# How PhaseCheckpointManager reports such a mismatch in the `train` item (optimizer state
# and RNG) once the parameters restored: the optimizer differs, not the model.
OPT_STATE_MISMATCH = ('the parameters fit this run but the stored optimizer state does '
                      'not fit the optimizer it builds')


def error_line(e: BaseException, limit: int = 300) -> str:
  """`Type: message` of an exception on one line (TensorStore errors carry the whole
  multi-line spec of the array), cut to `limit` characters."""
  text = ' '.join(str(e).split())
  if len(text) > limit:
    text = text[:limit] + ' …'
  return f'{type(e).__name__}: {text}'


def no_restorable_error(directory: str, errors: Sequence[str]) -> CheckpointError:
  """CheckpointError listing each step's error, with a hint when all are mismatches.

  Every step failing on shapes or tree structure almost always means the run restores
  into a different model than the one that saved (another `model.preset` or
  `model.hf_checkpoint`), not that every checkpoint is corrupt; when the parameters fit
  and only the optimizer state does not (OPT_STATE_MISMATCH), the optimizer differs
  (train/optim.py module docstring: the one known case).
  """
  msg = f'no restorable checkpoint in {directory}'
  if errors:
    msg += ':\n  ' + '\n  '.join(errors)
  if errors and all(OPT_STATE_MISMATCH in e for e in errors):
    msg += ('\nEvery step holds an optimizer state of another structure than the '
            'optimizer this run builds (train/optim.py make_optimizer): the checkpoints '
            'were written with other optimizer settings or by a version that built the '
            'optimizer differently. Known case: SFT checkpoints written before SFT and RL '
            "shared make_optimizer, with sft.lr_schedule='constant' and "
            'sft.warmup_ratio=0, hold a learning-rate schedule counter that a constant '
            'rate without warmup no longer keeps. Resume them with the version that wrote '
            f'them, or move {directory} aside and run the phase again. Nothing was '
            'deleted.')
  elif errors and all(any(m in e for m in MISMATCH_MARKERS) for e in errors):
    msg += ('\nEvery step differs from the restore template in shapes or structure: '
            'the checkpoints were written for another model (compare model.preset / '
            'model.hf_checkpoint with the run that saved them). Nothing was deleted.')
  elif errors:
    msg += (f'\nNothing was deleted. To start this phase over, move {directory} aside '
            'and run the phase that writes it again.')
  return CheckpointError(msg)
