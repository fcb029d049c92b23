"""Which policies an evaluation runs, and loading them (paper C.3-C.4, C.8; SPEC §7).

`config.eval.policies` is a comma-separated list; '' (the default) means Base plus every
curriculum phase that holds a checkpoint in the workdir, in curriculum order. Entries:

  base                 the Base baseline (no memory policy, no LTM; eval.episodes)
  sft | phase_a | phase_b | phase_c
                       that phase's SELECTED checkpoint in the workdir: SFT's best by
                       dev tool accuracy, an RL phase's best by its internal-dev score
                       (`checkpoints.selection_key`), else the newest
  hf:/path/to/folder   a Hugging Face Qwen folder (config.json + safetensors)
  NAME=<entry>         the same with a label of your choice (e.g. qwen7b=hf:/ckpt/q)

Per-seed runs (`seed_layout`): when the workdir holds `seed_<s>/` folders (the sweep
driver's layout), seed s evaluates the checkpoints in `seed_<s>/`: one curriculum per
seed, so the ± over seeds covers training. Without them every seed evaluates the
workdir's own checkpoints; with several seeds the results table then says that the
seeds share one set of checkpoints (their ± covers only the seeds' question draws).
A workdir holding some seeds' folders but not others is refused.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import jax
import ml_collections

from vermem_jax import config_util
from vermem_jax.envs import episode_types
from vermem_jax.eval import episodes
from vermem_jax.memory import commands
from vermem_jax.models import hf_io
from vermem_jax.rl import policy as policy_lib
from vermem_jax.rl import task_selection
from vermem_jax.train import checkpoint_values
from vermem_jax.train import checkpoints
from vermem_jax.train import rl_resume
from vermem_jax.train import run_setup
from vermem_jax.train import setup as setup_lib

PHASES = ('sft', 'phase_a', 'phase_b', 'phase_c')
OP_SPACE_NAMES = {'A': "Phase A's tools (Add, Update, Delete, ∅)",
                  'B': "Phase B's tools (Retrieve, Filter, SelectEpisode, Summarize, ∅)",
                  'C': 'all seven tools and ∅ (the paper\'s protocol)'}


@dataclasses.dataclass(frozen=True)
class PolicySource:
  """One policy to evaluate. kind: 'base' | 'phase' | 'hf'; where: phase name or HF
  folder ('' for base)."""
  label: str
  kind: str
  where: str = ''


def op_space(source: PolicySource) -> str:
  """'A', 'B' or 'C': the op space `source` is evaluated in. A phase's policy is
  evaluated in the one it was trained on (SPEC §4, `memory.commands.PHASE_OP_SPACE`:
  'C' for SFT and θ_C); Base and outside checkpoints use all seven tools ('C', the
  paper's protocol)."""
  if source.kind != 'phase':
    return 'C'
  return commands.PHASE_OP_SPACE.get(source.where, 'C')


def tool_set_note(sources: list[PolicySource]) -> str:
  """The results-table line naming each policy's tool set."""
  groups: dict[str, list[str]] = {}
  for s in sources:
    if s.kind != 'base':
      groups.setdefault(op_space(s), []).append(s.label)
  if not groups:
    return ''
  note = 'Tool sets: ' + '; '.join(
      f'{", ".join(labels)}: {OP_SPACE_NAMES[space]}'
      for space, labels in sorted(groups.items(), key=lambda kv: kv[0] != 'C'))
  if set(groups) != {'C'}:
    # A phase policy still writes the other tools' commands; say what happens to them.
    note += ('. A call to a tool outside a policy\'s set is rejected; the operation '
             'mix lists it under its tool')
  return note


def seed_workdir(workdir: str, seed: int) -> str:
  """`<workdir>/seed_<seed>` when it exists (sweep layout), else `workdir`."""
  d = os.path.join(workdir, f'seed_{seed}')
  return d if os.path.isdir(d) else workdir


@dataclasses.dataclass(frozen=True)
class SeedLayout:
  """Where each seed's checkpoints are.

  Attributes:
    workdirs: seed -> the workdir its phase checkpoints are read from.
    shared: several seeds read one workdir's checkpoints (no `seed_<s>/` folders).
  """
  workdirs: dict
  shared: bool

  def note(self, workdir: str, policies: list[str]) -> str:
    """The results-table line saying that the seeds share checkpoints ('' when they
    do not, or when no trained policy is evaluated)."""
    if not self.shared or not policies:
      return ''
    seeds = ', '.join(str(s) for s in self.workdirs)
    return (f'Checkpoints: SHARED — seeds {seeds} all evaluate the checkpoints of '
            f'{workdir} (no seed_<s>/ folders), so the ± of {", ".join(policies)} '
            'covers the seeds\' question draws only, not training runs '
            '(experiments/sweep.py trains one curriculum per seed).')


def seed_layout(workdir: str, seeds: list[int]) -> SeedLayout:
  """The workdir of each seed (module docstring).

  Raises:
    ValueError: some seeds have a `seed_<s>/` folder and others do not (naming them).
  """
  own = {s: os.path.isdir(os.path.join(workdir, f'seed_{s}')) for s in seeds}
  if any(own.values()) and not all(own.values()):
    missing = [s for s, ok in own.items() if not ok]
    raise ValueError(f'{workdir} holds seed_<s>/ folders but none for seeds {missing}: '
                     'each seed evaluates its own curriculum\'s checkpoints; train '
                     'those seeds or set config.eval.seeds to the seeds present')
  return SeedLayout({s: seed_workdir(workdir, s) for s in seeds},
                    shared=len(seeds) > 1 and not any(own.values()))


def found_phases(workdir: str) -> list[str]:
  """Curriculum phases with at least one checkpoint in `workdir`, in order."""
  return [p for p in PHASES
          if checkpoints.has_checkpoint(checkpoints.phase_dir(workdir, p))]


def parse_policies(text: str, workdir: str) -> list[PolicySource]:
  """The policies of `config.eval.policies` (module docstring).

  Raises:
    ValueError: an unknown entry, a duplicate label, or no policy at all.
  """
  entries = [e.strip() for e in (text or '').split(',') if e.strip()]
  if not entries:
    entries = ['base'] + found_phases(workdir)
  out = []
  for entry in entries:
    label, sep, spec = entry.partition('=')
    if not sep:
      label, spec = entry, entry
    if spec == 'base':
      out.append(PolicySource(label, 'base'))
    elif spec in PHASES:
      out.append(PolicySource(label, 'phase', spec))
    elif spec.startswith('hf:') and spec[3:]:
      path = os.path.expanduser(spec[3:])
      out.append(PolicySource(label if sep else 'hf:' + os.path.basename(
          path.rstrip('/')), 'hf', path))
    else:
      raise ValueError(f'config.eval.policies: unknown entry {entry!r}; use base, '
                       f'{", ".join(PHASES)}, hf:/path/to/qwen or NAME=<one of these>')
  labels = [p.label for p in out]
  if len(set(labels)) != len(labels):
    raise ValueError(f'config.eval.policies: duplicate labels in {labels}')
  return out


def check_available(sources: list[PolicySource], workdir: str) -> None:
  """Raises before any loading when a phase policy has no checkpoint in `workdir` or
  an HF folder is missing.

  Raises:
    checkpoints.CheckpointError: naming the phase and the folder.
    ValueError: an HF folder that does not exist.
  """
  for s in sources:
    if s.kind == 'phase':
      d = checkpoints.phase_dir(workdir, s.where)
      if not checkpoints.has_checkpoint(d):
        raise checkpoint_values.CheckpointError(
            f'config.eval.policies names {s.where}, but {d} holds no checkpoint')
    elif s.kind == 'hf' and not os.path.isdir(s.where):
      raise ValueError(f'config.eval.policies: {s.label}: {s.where} is not a directory')


def stale_notes(sources: list[PolicySource], workdir: str) -> list[str]:
  """One results-table line per RL-phase policy that is not the continuation of the
  curriculum as the workdir holds it now: its previous phase's selected checkpoint
  changed after it started (that phase was extended, or run again and selected another
  step), or its previous phase is itself such a phase (θ_C on a stale θ_B).

  Compares the step in the phase's `reference.json` (`rl_resume.write_reference`:
  the previous phase's step it started from) with `checkpoints.selected_step` of the
  previous phase; a phase without either says nothing. Steps only: a previous phase
  run again that selects the same step number is not seen here (resuming the later
  phase's training is refused then: its resume check hashes π_ref's parameters).
  """
  notes, stale = [], set()
  for phase in run_setup.RL_PHASES:  # curriculum order: a stale phase taints the next
    prev = run_setup.PREVIOUS_PHASE[phase]
    reference = rl_resume.read_reference(checkpoints.phase_dir(workdir, phase)) or {}
    started = reference.get('reference_step')
    if started is None:
      continue
    if prev in stale:
      stale.add(phase)
      why = f'it started from {prev}, which is itself stale'
    else:
      now = checkpoints.selected_step(checkpoints.phase_dir(workdir, prev))
      if now is None or int(started) == now:
        continue
      stale.add(phase)
      why = (f"it started from {prev} step {started}, but {prev}'s selected step is now "
             f'{now} ({prev} changed after {phase} ran)')
    notes += [f'STALE: {s.label} ({workdir}): {why}; train {phase} again in a fresh '
              '--workdir to evaluate the curriculum as it stands.'
              for s in sources if s.kind == 'phase' and s.where == phase]
  return notes


def _greedy_sampler(config: ml_collections.ConfigDict, model_config: Any, params: Any,
                    tok: Any, mesh: Any) -> policy_lib.SamplerPolicy:
  sampling_cfg = config_util.dataclass_from_mapping(
      policy_lib.PolicySamplingConfig, config.sampling.to_dict(),
      overrides={'eval_temperature': float(config.eval.temperature)})
  episodes.check_greedy(sampling_cfg.eval_temperature, 1.0, 'config.eval.temperature')
  # Episodes advance in chunks of eval.batch_size (or all the questions, when fewer):
  # every call pads to it (one batch shape).
  batch = int(config.eval.batch_size)
  if int(config.eval.num_questions) > 0:
    batch = min(batch, int(config.eval.num_questions)) if batch else int(
        config.eval.num_questions)
  return policy_lib.SamplerPolicy(model_config, params, tok,
                                  sampling_config=sampling_cfg, greedy=True,
                                  batch_buckets=(batch,) if batch > 0 else None,
                                  generate_fn=setup_lib.generate_fn_for(mesh))


def load_policy(source: PolicySource, config: ml_collections.ConfigDict, workdir: str,
                *, tok: Any, mesh: Any) -> tuple[Callable[[int], episode_types.Policy],
                                                 dict[str, Any]]:
  """(seed -> batched policy, info) for one source.

  The policy of a seed is greedy, bound to a key from the seed (unused when greedy).
  info: {'label', 'kind', 'path', 'step'} (step: the checkpoint step loaded), and
    what tells a retrained policy apart: 'written' (a phase: UTC time of that step's
    folder) or 'digest' (an HF folder: `hf_io.checkpoint_digest`).

  Raises:
    checkpoints.CheckpointError: a phase without a restorable checkpoint.
    ValueError: an HF folder whose vocabulary the tokenizer does not fit.
  """
  info = {'label': source.label, 'kind': source.kind, 'path': '', 'step': None}
  if source.kind == 'base':
    return (lambda seed: episodes.base_policy), info
  if source.kind == 'hf':
    mc, params = hf_io.load_hf_checkpoint(source.where, dtype=config.model.param_dtype,
                                          mesh=mesh)
    mc = mc.replace(dtype=config.model.dtype)
    setup_lib.check_tokenizer_fits(tok, mc, field='config.eval.policies')
    info.update(path=source.where, digest=hf_io.checkpoint_digest(source.where))
  else:
    mc = setup_lib.model_config_from(config)
    shapes, _ = setup_lib.abstract_train_state(mc, lambda p: (), mesh)
    directory = checkpoints.phase_dir(workdir, source.where)
    params, step = checkpoints.restore_params_only(directory, shapes, prefer_best=True)
    info.update(path=directory, step=int(step), written=time.strftime(
        '%Y-%m-%dT%H:%M:%SZ', time.gmtime(os.path.getmtime(os.path.join(directory,
                                                                        str(step))))))
  sampler = _greedy_sampler(config, mc, params, tok, mesh)
  def bind(seed: int) -> episode_types.Policy:
    return task_selection.BoundPolicy(sampler, jax.random.PRNGKey(int(seed)))
  return bind, info
