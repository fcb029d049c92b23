"""Resume and provenance records of an RL phase (SPEC §4; DESIGN.md checkpoints).

- `trajectory_fingerprint(config)`: the config fields that determine a phase's
  trajectory. It is stored in every checkpoint's metadata; a workdir holding a run with
  other settings is refused on resume (`check_resume`).
- `data_position(update, setup, seed)`: the task sampler's position after `update`
  completed updates (tasks are a pure function of (seed, update),
  rl.task_selection.select_tasks), stored with each checkpoint and checked on resume.
- `<phase dir>/reference.json` (`write_reference`, `read_reference`): which checkpoint
  step of the previous phase was loaded as π_ref and a SHA-256 of the reference
  parameters (`params_fingerprint`), so anyone can check that π_ref is exactly the
  previous phase's parameters. A run whose previous phase changed since this phase
  started cannot be resumed exactly and is refused (`check_reference_unchanged`).

The reference fingerprint reads every parameter to host memory once per phase start
(on every process of a multi-host run, gathering the shards other hosts hold).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping

import jax
import ml_collections
import numpy as np

from vermem_jax.train import distributed
from vermem_jax.train import rl_learner
from vermem_jax.train import rl_setup
from vermem_jax.train import setup as setup_lib

REFERENCE_FILE = 'reference.json'


def params_fingerprint(params: Any) -> str:
  """SHA-256 hex digest of a parameter tree: every leaf's path, dtype, shape and bytes.

  Leaves are visited in `jax.tree_util.tree_flatten_with_path` order (sorted dict keys),
  each contributing `keystr(path)`, `dtype.str`, `shape` and its C-order bytes. Equal
  digests mean bit-identical trees (up to SHA-256 collisions). With several processes
  every leaf is gathered to every host (a collective: all processes call it).
  """
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    arr = np.ascontiguousarray(distributed.to_host(leaf))
    h.update(jax.tree_util.keystr(path).encode())
    h.update(arr.dtype.str.encode())
    h.update(repr(tuple(arr.shape)).encode())
    h.update(arr.tobytes())
  return h.hexdigest()


def trajectory_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Config fields that determine the phase's trajectory (checked on resume).

  `rl.num_updates` is not part of it: a finished run may be extended.
  """
  r = config.rl
  return {
      'phase': config.phase, 'seed': int(config.seed),
      'model': setup_lib.model_identity(config),
      'tasks_per_update': int(r.tasks_per_update),
      'rollouts_per_task': int(r.rollouts_per_task),
      'learning_rate': float(r.learning_rate), 'max_grad_norm': float(r.max_grad_norm),
      'clip_epsilon': float(r.clip_epsilon), 'kl_beta': float(r.kl_beta),
      'kl_estimator': str(r.kl_estimator), 'weight_decay': float(r.weight_decay),
      'old_logprobs': str(r.get('old_logprobs', rl_learner.DEFAULT_OLD_LOGPROBS)),
      'num_iterations': int(r.num_iterations),
      'mini_batches_per_iteration': int(r.mini_batches_per_iteration),
      'loss_temperature': (None if r.loss_temperature is None
                           else float(r.loss_temperature)),
      'max_log_ratio': float(r.max_log_ratio),
      'adam': [float(r.adam_b1), float(r.adam_b2), float(r.adam_eps)],
      'lr_schedule': [str(r.lr_schedule), float(r.warmup_ratio)],
      'verifier_fallback': str(config.verifier.fallback),
      'global_history_tokens': int(config.verifier.global_history_tokens),
      'advantage_mode': str(config.advantage.mode),
      'rejection_floor': str(config.advantage.rejection_floor),
      'episodes_seed': int(config.episodes.seed),
      'num_train_episodes': int(config.episodes.num_train),
      'temperature': float(config.sampling.temperature),
      'top_p': float(config.sampling.top_p),
      'max_command_tokens': int(config.sampling.max_command_tokens),
      'policy_input_limit': int(config.memory.policy_input_limit),
      'context_budget': int(config.memory.context_budget),
      'rollout_limit': int(config.episodes.rollout_limit),
      'verifier': str(config.verifier.backend), 'solver': str(config.solver.backend),
  }


def check_resume(metadata: Mapping[str, Any], fingerprint: Mapping[str, Any],
                 directory: str) -> None:
  """Refuses (ValueError) a checkpoint whose stored fingerprint differs from this one."""
  setup_lib.check_resume(metadata, fingerprint, directory, what='a run')


def data_position(update: int, setup: rl_setup.PhaseSetup, seed: int) -> dict[str, int]:
  """The task sampler's position after `update` completed updates (JSON)."""
  t = setup.rollout_config.tasks_per_update
  return {'update': int(update), 'tasks_consumed': int(update) * int(t),
          'num_train_episodes': len(setup.train_specs), 'seed': int(seed)}


def read_reference(phase_directory: str) -> dict[str, Any] | None:
  """`reference.json` of a phase directory (None when missing)."""
  path = os.path.join(phase_directory, REFERENCE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_reference(phase_directory: str, reference: Mapping[str, Any]) -> None:
  """Writes `reference.json` of a phase directory atomically (temporary file, fsync,
  rename)."""
  path = os.path.join(phase_directory, REFERENCE_FILE)
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(reference, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def check_reference_unchanged(old_ref: Mapping[str, Any], *, ref_step: int,
                              ref_sha: str, prev: str, prev_dir: str,
                              directory: str) -> None:
  """Refuses to resume a phase whose π_ref changed since the phase started.

  Args:
    old_ref: the 'reference' record stored in the restored checkpoint's metadata
      (empty: nothing to compare).
    ref_step, ref_sha: the previous phase's checkpoint step loaded now and its
      `params_fingerprint`.
    prev, prev_dir: the previous phase's name and directory; directory: this phase's.
  Raises:
    ValueError: the stored step or SHA-256 differs from the one loaded now.
  """
  if old_ref and (old_ref.get('params_sha256') != ref_sha
                  or old_ref.get('reference_step') != ref_step):
    raise ValueError(
        f'{directory} was trained against {prev} step {old_ref.get("reference_step")} '
        f'(sha256 {str(old_ref.get("params_sha256"))[:12]}…), but {prev_dir} now '
        f'gives step {ref_step} (sha256 {ref_sha[:12]}…); π_ref changed, so the run '
        'cannot be resumed exactly. Use a fresh --workdir.')
