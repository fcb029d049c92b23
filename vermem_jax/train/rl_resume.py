"""Resume and provenance records of an RL phase (SPEC §4; DESIGN.md checkpoints).

- `trajectory_fingerprint(run)`: the config fields that determine a phase's
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
import numpy as np

from vermem_jax.train import distributed
from vermem_jax.train import rl_setup
from vermem_jax.train import run_setup
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


def trajectory_fingerprint(run: run_setup.RunSetup) -> dict[str, Any]:
  """The settings that determine an RL phase's trajectory (checked on resume; the
  keys name the config fields as stored by every earlier run).

  `rl.num_updates` is not part of it: a finished run may be extended.
  """
  r = run.rl
  opt, loss = r.opt, r.loss
  return {
      'phase': run.phase, 'seed': run.seed, 'model': run.model.identity,
      'tasks_per_update': r.rollout.tasks_per_update,
      'rollouts_per_task': r.rollout.rollouts_per_task,
      'learning_rate': opt.learning_rate, 'max_grad_norm': opt.max_grad_norm,
      'clip_epsilon': loss.clip_epsilon, 'kl_beta': loss.kl_beta,
      'kl_estimator': loss.kl_estimator, 'weight_decay': opt.weight_decay,
      'old_logprobs': loss.old_logprobs,
      'num_iterations': r.ppo.num_iterations,
      'mini_batches_per_iteration': r.ppo.mini_batches_per_iteration,
      'loss_temperature': r.loss_temperature, 'max_log_ratio': loss.max_log_ratio,
      'adam': [opt.adam_b1, opt.adam_b2, opt.adam_eps],
      'lr_schedule': [opt.lr_schedule, opt.warmup_ratio],
      'verifier_fallback': str(run.verifier.fallback),
      'global_history_tokens': int(run.verifier.global_history_tokens),
      'advantage_mode': str(run.advantage.mode),
      'rejection_floor': str(run.advantage.rejection_floor),
      'episodes_seed': int(run.scenario.seed),
      'num_train_episodes': int(run.scenario.num_train),
      'temperature': float(run.sampling.temperature),
      'top_p': float(run.sampling.top_p),
      'max_command_tokens': int(run.sampling.max_command_tokens),
      'policy_input_limit': int(run.executor.policy_input_limit),
      'context_budget': int(run.executor.context_budget),
      'rollout_limit': int(run.scenario.rollout_limit),
      'verifier': str(run.verifier.backend), 'solver': run.solver.backend,
      'loss_reduction': loss.reduction,
  }


# Fingerprint keys added after runs were stored, with the value those runs had: a
# stored fingerprint without the key is read with it, so such a run still resumes.
ADDED_KEYS = {'loss_reduction': 'decision'}


def check_resume(metadata: Mapping[str, Any], fingerprint: Mapping[str, Any],
                 directory: str, hf_checkpoint: str) -> None:
  """Refuses (ValueError) a checkpoint whose stored fingerprint differs from this one
  (a key of ADDED_KEYS missing from the stored one reads as its value there; a model
  stored as the folder path `hf_checkpoint`, as runs before the content digest were,
  reads as this model: `setup.older_identity_forms`)."""
  setup_lib.check_resume(metadata, fingerprint, directory, what='a run',
                         added_keys=ADDED_KEYS,
                         older_forms=setup_lib.older_identity_forms(hf_checkpoint))


def data_position(update: int, setup: rl_setup.PhaseSetup, seed: int) -> dict[str, int]:
  """The task sampler's position after `update` completed updates (JSON)."""
  t = setup.run.rl.rollout.tasks_per_update
  return {'update': int(update), 'tasks_consumed': int(update) * int(t),
          'num_train_episodes': len(setup.train_specs), 'seed': int(seed)}


def read_reference(phase_directory: str) -> dict[str, Any] | None:
  """`reference.json` of a phase directory (None when missing).

  Raises:
    ValueError: the file is not a JSON object (named, with what it records).
  """
  path = os.path.join(phase_directory, REFERENCE_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      reference = json.load(f)
    problem = None if isinstance(reference, dict) else str(reference)
  except ValueError as e:  # not UTF-8 text, or not JSON
    problem = str(e)
  if problem is not None:
    raise ValueError(f'{path} is not a JSON object ({problem[:80]}): it records which '
                     'checkpoint of the previous phase was loaded as π_ref (each '
                     "checkpoint's metadata holds the same record); move it aside to go "
                     'on without it')
  return reference


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
