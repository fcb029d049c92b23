r"""Runs one phase of the VerMem curriculum (SPEC §4): sft -> phase_a -> phase_b -> phase_c.

    python experiments/run.py --config=phase_b.py                 # tiny CPU scale
    python experiments/run.py --config=phase_b.py:scale=paper \
        --config.model.hf_checkpoint=/ckpt/Qwen2.5-7B-Instruct --workdir=/runs/vermem
    python experiments/run.py --config=phase_a --config.rl.learning_rate=3e-6
    python experiments/run.py --config=phase_c.py --dry_run       # print config + plan
    python experiments/run.py --config=eval_hotpotqa.py --workdir=workdir  # evaluate
    python experiments/run.py --config=eval_pddl.py --workdir=workdir      # a benchmark
    python experiments/run.py --config=table2.py --workdir=workdir         # Table 2

`--config` takes a path or a bare name (`phase_b`, `phase_b.py`) resolved against
experiments/configs/; text after ':' is the scale argument. Any field can be overridden
with `--config.<section>.<field>=value`; overrides apply to every phase this command runs.

Each phase writes to `<workdir>/<phase>/` (checkpoints, metrics.jsonl, TensorBoard
events, advantages.jsonl). A phase starts from the previous phase's parameters, so it
needs that phase to be complete (`<workdir>/<prev>/phase_complete.json`, written here
when a phase's trainer returns). At the tiny and small scales missing phases are run
first (and the log says so); at paper scale the command stops and prints the command that makes the
missing checkpoint (with this command's `--config.*` flags). A phase with checkpoints of
its own resumes from the newest one. While a phase runs, this process holds an exclusive
lock on `<workdir>/<phase>/.lock`; a second run of that phase in the same workdir stops
with exit status 2. `--dry_run` writes nothing; it prints the config and plan, then any
config problem, or a planned phase whose checkpoints were trained with other settings,
as an error (exit status 2, as the real run would).

`--config=eval_hotpotqa.py` trains nothing: it evaluates the workdir's policies (Base
and every phase with a checkpoint, or `--config.eval.policies`) on the HotpotQA
validation questions and writes tables, JSON, per-episode JSONL and figures to
`<workdir>/eval_hotpotqa/` (vermem_jax/eval/evaluate.py), printing the table.
`eval_alfworld.py`, `eval_scienceworld.py`, `eval_pddl.py` and `eval_babyai.py` do the
same on an interactive benchmark's test instances (`<workdir>/eval_<benchmark>/`), and
`table2.py` gathers the evaluations found in the workdir into Table 2 and the
efficiency frontier (`<workdir>/table2/`; vermem_jax/eval/table2.py).

Multi-host: the same command on every host, with --coordinator_address /
--num_processes / --process_id (or nothing on a TPU pod slice, SLURM or Open MPI job,
which JAX detects); see experiments/cli/processes.py and docs/distributed.md. Process 0 holds
the lock and writes markers, metrics and logs; every process stops with the same
message (exit status 2) on bad input.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import sys
from typing import Any, Callable, Sequence

_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
  sys.path.insert(0, str(_REPO_ROOT))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
import ml_collections  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments.cli import config_argv  # noqa: E402
from experiments.cli import overrides as overrides_lib  # noqa: E402
from experiments.cli import phase_plan  # noqa: E402
from experiments.cli import preflight  # noqa: E402
from experiments.cli import processes  # noqa: E402
from experiments.cli import workdir_lock  # noqa: E402
from experiments.configs.parts import curriculum  # noqa: E402
from experiments.configs.parts import validation  # noqa: E402
from vermem_jax.train import compilation  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Phase config: a path or a name in experiments/configs/ '
    '(sft, phase_a, phase_b, phase_c, eval_hotpotqa, eval_alfworld, eval_scienceworld, '
    'eval_pddl, eval_babyai, table2, pretrain), optionally with ":scale=paper".',
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory (one sub-directory per phase); default: '
    'config.workdir (./workdir).')
_DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Print the resolved config and the phases that would run, then '
    'exit without training.')
# The multi-host flags (experiments/cli/processes.py) are listed by --help, not only by
# --helpfull.
flags.adopt_module_key_flags(processes)


def _runner_sft(config: ml_collections.ConfigDict, workdir: str) -> Any:
  from vermem_jax.train import sft  # pylint: disable=g-import-not-at-top
  return sft.run_sft(config, workdir)


def _run_pretrain(config: ml_collections.ConfigDict, workdir: str, *,
                  dry_run: bool, overrides: dict[str, Any]) -> list[str]:
  """The tiny base's pretraining (outside the curriculum: no plan, no markers)."""
  from vermem_jax.train import distributed  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import run_setup  # pylint: disable=g-import-not-at-top
  if distributed.process_count() > 1:
    raise ValueError('--config=pretrain runs in one process (a CPU stand-in)')
  run_setup.RunSetup.from_config(config)  # a bad section stops a dry run too
  if dry_run:
    _print_config(config, workdir, overrides)
    print('plan: pretrain')
    return ['pretrain']
  validation.validate_config(config, check_paths=True)
  pretrain.run_pretrain(config, workdir)
  return ['pretrain']


def _runner_rl(config: ml_collections.ConfigDict, workdir: str) -> Any:
  from vermem_jax.train import rl_phase  # pylint: disable=g-import-not-at-top
  return rl_phase.run_rl_phase(config, workdir)


# phase -> runner(config, workdir); trainers are imported only when a phase runs.
PHASE_RUNNERS: dict[str, Callable[[ml_collections.ConfigDict, str], Any]] = {
    'sft': _runner_sft,
    'phase_a': _runner_rl,
    'phase_b': _runner_rl,
    'phase_c': _runner_rl,
}


def _dry_run(config: ml_collections.ConfigDict, workdir: str,
             overrides: dict[str, Any], override_args: Sequence[str]) -> list[str]:
  """Prints the config, overrides and plan, then raises ValueError naming the first
  validation problem (so a paper config without its checkpoint still prints, and the
  command still exits with status 2, as the real run would). Writes nothing."""
  problem = _validation_problem(config)
  plan = phase_plan.plan_phases(config.phase, workdir, config.scale, override_args)
  _print_config(config, workdir, overrides)
  print('plan: ' + ' -> '.join(plan))
  sys.stdout.flush()
  if problem:
    raise ValueError(problem)
  _check_before_training(config, workdir, plan, create=False)
  try:
    _check_resumable(config, workdir, plan, overrides)
  except ValueError as e:
    raise ValueError(f'{e} (a real run stops here)') from e
  return plan


def _phase_config(config: ml_collections.ConfigDict, phase: str,
                  overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """The config a planned phase runs with: the command's own, or that phase's default
  config with the command's overrides."""
  if phase == config.phase:
    return config
  return overrides_lib.phase_config(phase, config.scale, overrides)


def _check_resumable(config: ml_collections.ConfigDict, workdir: str, plan: list[str],
                     overrides: dict[str, Any]) -> None:
  """The settings check each planned phase's trainer makes on the checkpoints its
  folder already holds (a dry run refuses what the real run would refuse)."""
  from vermem_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import rl_phase  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import run_setup  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import sft  # pylint: disable=g-import-not-at-top
  for phase in plan:
    if not checkpoints.has_checkpoint(phase_plan.phase_dir(workdir, phase)):
      continue  # nothing to resume: the phase starts afresh
    run = run_setup.RunSetup.from_config(_phase_config(config, phase, overrides))
    (sft.check_resumable if phase == 'sft' else rl_phase.check_resumable)(run, workdir)


def _validation_problem(config: ml_collections.ConfigDict) -> str | None:
  """The first validation problem of a dry run (tiny scale: then the data and
  tokenizer folders), or None. At paper scale it prints that the config's paths
  are not checked."""
  if config.scale != 'tiny':
    print(f'dry run at {config.scale} scale: the config\'s data, tokenizer and '
          'checkpoint paths are not checked (they may exist only on the training hosts)')
  try:
    validation.validate_config(config, check_paths=False)
    if config.scale == 'tiny':
      validation.validate_config(config, check_paths=True)
  except ValueError as e:
    return f'{e} (a real run stops here)'
  return None


def _check_before_training(config: ml_collections.ConfigDict, workdir: str,
                           plan: list[str], *, create: bool) -> None:
  """The checks that take seconds and stop a run before any phase trains; a dry run
  makes the same ones (`create=False`: it writes nothing).

  Raises:
    ValueError: too few tasks per update for the processes
      (`processes.check_config`), a mesh that does not fit the devices
      (`setup.MeshConfig.shape`), a workdir that is a file or not writable
      (`preflight.check_workdir_writable`).
  """
  from vermem_jax.train import setup  # pylint: disable=g-import-not-at-top
  processes.check_config(config, plan)
  setup.MeshConfig.from_section(config.model).shape()
  preflight.check_workdir_writable(workdir, create=create)


def _print_config(config: ml_collections.ConfigDict, workdir: str,
                  overrides: dict[str, Any]) -> None:
  for path, value in sorted(overrides_lib.config_leaves(config).items()):
    print(f'config.{path} = {value!r}')
  print(f'workdir: {workdir}')
  print(f'overrides: {overrides}')


def run(config: ml_collections.ConfigDict, workdir: str, *,
        dry_run: bool = False,
        override_args: Sequence[tuple[str, str]] | None = None) -> list[str]:
  """Validates `config`, plans and runs the phases; returns the phases run (or planned).

  Args:
    config: the phase config (with the command line's overrides applied).
    workdir: run directory; one sub-directory per phase.
    dry_run: print the config and plan and return (validation problems raise
      ValueError after the printout).
    override_args: the command line's `--config.<field>` flags as (field path, flag
      text) pairs (`config_argv.config_override_args`); they are the overrides applied to earlier
      phases and repeated in printed commands. None: the fields differing from the
      defaults (for configs edited in code).

  Raises:
    ValueError: a bad config field; phase_plan.MissingPrerequisiteError: see
    phase_plan.plan_phases; workdir_lock.PhaseLockedError: another run is writing a
    phase of this workdir.
  """
  workdir = os.path.abspath(os.path.expanduser(workdir))
  flag_texts = [text for _, text in override_args or ()]
  overrides = overrides_lib.config_overrides(
      config, None if override_args is None else [p for p, _ in override_args])
  overrides.pop('workdir', None)  # the workdir argument is not a config override
  config.workdir = workdir  # what the run uses (the --workdir flag wins), also printed
  from vermem_jax.train import distributed  # pylint: disable=g-import-not-at-top
  # Before the first program: the persistent cache and the compile counter
  # (docs/compilation.md).
  compilation.CompilationCacheConfig.from_config(config.runtime).apply()
  if config.phase == curriculum.PRETRAIN_CONFIG:
    return _run_pretrain(config, workdir, dry_run=dry_run, overrides=overrides)
  if config.phase in curriculum.EVAL_CONFIGS + curriculum.AGGREGATE_CONFIGS:
    if distributed.process_count() > 1:
      raise ValueError(f'--config={config.phase}: evaluation runs in one process; start '
                       'it without --coordinator_address / --num_processes / '
                       '--process_id (or with --distributed=off inside a cluster job)')
    if config.phase in curriculum.AGGREGATE_CONFIGS:
      return _run_table2(config, workdir, dry_run=dry_run)
    return _run_eval(config, workdir, overrides, dry_run=dry_run)
  if dry_run:
    if not distributed.is_primary():
      return []  # process 0 prints the config and plan
    return _dry_run(config, workdir, overrides, flag_texts)
  # Every process checks (paths may differ between hosts); all stop with one message.
  distributed.agree(lambda: validation.validate_config(config, check_paths=True))
  # Process 0 reads the markers it writes; the plan (or its error) goes to every process.
  plan = distributed.on_primary(
      lambda: phase_plan.plan_phases(config.phase, workdir, config.scale, flag_texts))
  created = distributed.on_primary(lambda: not os.path.exists(workdir))
  distributed.agree(lambda: _check_before_training(config, workdir, plan, create=True))
  try:
    _run_plan(config, workdir, plan, overrides)
  except BaseException:
    if created and distributed.is_primary():
      # A run that failed before writing anything leaves no empty folder.
      with contextlib.suppress(OSError):
        os.rmdir(workdir)
    raise
  return plan


def _run_plan(config: ml_collections.ConfigDict, workdir: str, plan: list[str],
              overrides: dict[str, Any]) -> None:
  from vermem_jax.train import distributed  # pylint: disable=g-import-not-at-top
  # Overrides apply to every phase, so one check covers the tokenizer/model pair.
  distributed.agree(lambda: validation.check_tokenizer_fits_model(config))
  if any(p != 'sft' for p in plan):  # every process scores with the verifier
    distributed.agree(lambda: (preflight.check_verifier_endpoint(config),
                               preflight.check_local_verifier(config)))
  if len(plan) > 1:
    logging.warning('%s needs %s, which has no completed checkpoint in %s: running %s '
                    'first (%s scale)', config.phase,
                    curriculum.PREVIOUS_PHASE[config.phase], workdir, ', '.join(plan[:-1]),
                    config.scale)
  from vermem_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import nonfinite  # pylint: disable=g-import-not-at-top
  for phase in plan:
    cfg = _phase_config(config, phase, overrides)
    distributed.agree(lambda c=cfg: validation.validate_config(c, check_paths=True))
    d = phase_plan.phase_dir(workdir, phase)
    with processes.phase_lock(workdir, phase):
      logging.info('running %s into %s', phase, d)
      result = PHASE_RUNNERS[phase](cfg, workdir)
      with checkpoints.PhaseCheckpointManager(d) as mgr:
        step = mgr.latest_step()
      if step is None:
        raise RuntimeError(f'{phase} finished without a checkpoint in {d}')
      if distributed.is_primary():
        checkpoints.mark_phase_complete(d, step, {'phase': phase, 'scale': config.scale})
      distributed.barrier(f'{phase} complete')
    logging.info('%s complete at step %d', phase, step)
    if isinstance(result, dict) and distributed.is_primary():
      from vermem_jax.train import summaries  # pylint: disable=g-import-not-at-top
      print('\n' + summaries.phase_summary(phase, result, d, workdir=workdir) + '\n',
            flush=True)


def _run_eval(config: ml_collections.ConfigDict, workdir: str,
              overrides: dict[str, Any], *, dry_run: bool) -> list[str]:
  """Evaluates the workdir's policies (`eval.evaluate`); prints the table. A dry run
  prints the config and the policies that would be evaluated; a config problem then
  raises ValueError (status 2), as in the real run."""
  from vermem_jax.eval import policies as eval_policies  # pylint: disable=g-import-not-at-top
  if dry_run:
    problem = _validation_problem(config)  # raised after the printout, as `_dry_run` does
    _print_config(config, workdir, overrides)
    sys.stdout.flush()
    if problem:
      raise ValueError(problem)
    layout = eval_policies.seed_layout(workdir, [int(s) for s in config.eval.seeds])
    for seed, wd in layout.workdirs.items():
      labels = [p.label for p in eval_policies.parse_policies(config.eval.policies, wd)]
      print(f'plan: evaluate {", ".join(labels)} (seed {seed}, {wd})')
    if layout.shared:
      print('plan: the seeds share one set of checkpoints (no seed_<s>/ folders); '
            'results.md will say so')
    sys.stdout.flush()
    _check_before_eval(config, workdir, create=False)
    return [config.phase]
  validation.validate_config(config, check_paths=True)
  layout = _check_before_eval(config, workdir, create=True)
  validation.check_tokenizer_fits_model(config)
  if not config.eval.policies and not eval_policies.found_phases(
      layout.workdirs[int(config.eval.seeds[0])]):
    logging.warning('%s holds no phase checkpoint: evaluating Base only', workdir)
  from vermem_jax.eval import evaluate  # pylint: disable=g-import-not-at-top
  with workdir_lock.phase_lock(workdir, evaluate.output_subdir(config)):
    result = evaluate.run_evaluation(config, workdir)
  print(result['table'])
  print(evaluate.summary_line(result) + f' ({result["wall_time_s"]:.1f}s)')
  return [config.phase]


def _check_before_eval(config: ml_collections.ConfigDict, workdir: str, *,
                      create: bool) -> Any:
  """The checks that take seconds and stop an evaluation before any loading; a dry run
  makes the same ones (`create=False`: it writes nothing). Returns the seed layout
  (`policies.seed_layout`).

  Raises:
    checkpoints.CheckpointError / ValueError: a named policy without its checkpoint,
    an `hf:` path that is not a directory (`policies.check_available`), a mesh that
    does not fit the devices, a workdir that is a file or not writable;
    envs.interactive.BenchmarkUnavailable (an ImportError): the benchmark's optional
    extra is not installed.
  """
  from vermem_jax.envs import interactive  # pylint: disable=g-import-not-at-top
  from vermem_jax.eval import benchmark_suite  # pylint: disable=g-import-not-at-top
  from vermem_jax.eval import policies as eval_policies  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import setup  # pylint: disable=g-import-not-at-top
  layout = eval_policies.seed_layout(workdir, [int(s) for s in config.eval.seeds])
  for wd in layout.workdirs.values():
    eval_policies.check_available(
        eval_policies.parse_policies(config.eval.policies, wd), wd)
  if config.phase in curriculum.BENCHMARK_CONFIGS:
    interactive.load_benchmark(benchmark_suite.benchmark_name(config))
  setup.MeshConfig.from_section(config.model).shape()
  preflight.check_workdir_writable(workdir, create=create)
  return layout


def _run_table2(config: ml_collections.ConfigDict, workdir: str, *,
                dry_run: bool) -> list[str]:
  """Builds Table 2 and the frontier from `<workdir>/eval_*/results.json`; prints it."""
  from vermem_jax.eval import table2  # pylint: disable=g-import-not-at-top
  validation.validate_config(config)
  by_bench = table2.collect_workdir(workdir)
  if dry_run:
    print(f'plan: table2 from {", ".join(by_bench) or "no evaluation"} in {workdir}',
          flush=True)
  if not by_bench:
    raise ValueError(f'{workdir} holds no eval_<benchmark>/results.json; run '
                     'experiments/run.py --config=eval_<benchmark>.py there first')
  if dry_run:
    return [config.phase]
  table = table2.build(table2.workdir_rows(by_bench), by_bench,
                       target_success=float(config.eval.target_success),
                       target_budget=float(config.eval.target_budget),
                       frontier_benchmarks=tuple(config.eval.frontier_benchmarks))
  out_dir = config.eval.output_dir or os.path.join(workdir, 'table2')
  paths = table2.write(out_dir, table)
  print(table2.markdown(table))
  print(f'table2 written to {out_dir}: table2.md/.csv/.json'
        + (', frontier_table2.png' if paths.get('frontier') else ''))
  return [config.phase]


class _QuietLibraryInfo:
  """Drops INFO records of chatty libraries (Orbax logs each save/restore step in
  detail, JAX the missing TPU backend) unless `-v 1` or higher asks for them."""

  _PATHS = (f'{os.sep}orbax{os.sep}', f'{os.sep}jax{os.sep}_src{os.sep}xla_bridge')

  def filter(self, record) -> bool:  # absl/stdlib logging.Filter protocol
    if record.levelno > 20 or logging.get_verbosity() > logging.INFO:
      return True
    return not any(p in record.pathname for p in self._PATHS)


def main(argv: Sequence[str]) -> None:
  del argv  # entry() refuses positional arguments
  logging.get_absl_handler().addFilter(_QuietLibraryInfo())
  config = _CONFIG.value
  if config is None:
    print('error: --config is required, e.g. --config=phase_b.py (--help lists the '
          'flags)', file=sys.stderr)
    sys.exit(2)
  workdir = config.workdir if _WORKDIR.value is None else _WORKDIR.value
  if not workdir.strip():
    # An unset shell variable (`--workdir=$OUT`) must not fall back to the default run.
    print('error: --workdir is empty (give a directory, or leave the flag out for '
          f'{config.workdir!r})', file=sys.stderr)
    sys.exit(2)
  try:
    processes.start()  # before any JAX computation
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  from vermem_jax import http_chat  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import nonfinite  # pylint: disable=g-import-not-at-top
  try:
    run(config, workdir, dry_run=_DRY_RUN.value,
        override_args=config_argv.config_override_args(sys.argv))
  except (ValueError, OSError, ImportError, phase_plan.MissingPrerequisiteError,
          workdir_lock.PhaseLockedError, checkpoints.CheckpointError,
          http_chat.ChatError) as e:
    # ImportError: an optional package a config choice needs (data.source='hf').
    # Bad input (config, data file, checkpoint, path): the message names it; the
    # traceback is for `-v 1`. What earlier phases saved stays in the workdir.
    logging.debug('error traceback', exc_info=True)
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  except nonfinite.NonFiniteError as e:
    # Training diverged (not bad input): the message names the update or step; every
    # checkpoint already written holds finite parameters.
    logging.debug('error traceback', exc_info=True)
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)


# absl's help flags exit with status 1, and app.run defines them only after entry()
# has parsed the flags; help is not an error, so it is answered here with status 0.
_HELP_FLAGS = {'-h': True, '-?': True, '--help': True, '--helpshort': True,
               '-help': True, '-helpshort': True, '--helpfull': False, '-helpfull': False}


def entry() -> None:
  for a in sys.argv[1:]:
    if a == '--':
      break
    if a in _HELP_FLAGS:
      app.usage(shorthelp=_HELP_FLAGS[a], writeto_stdout=True, exitcode=0)
  try:
    argv = config_argv.resolve_config_argv(sys.argv)
    config_argv.check_config_argv(argv)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  try:
    # Parsed here first so a value the field cannot take (`--config.rl.learning_rate=
    # abc`) is one error line with status 2, like every other bad input (app.run
    # would print a usage error with status 1).
    remaining = flags.FLAGS(argv)
  except flags.Error as e:
    # absl shows a bad boolean as a raw tuple: ('Non-boolean argument ...', 'maybe').
    msg = re.sub(r"\('Non-boolean argument to boolean flag', (.*)\)$",
                 r'expected true or false, got \1', str(e))
    print(f'error: {msg}', file=sys.stderr)
    sys.exit(2)
  if len(remaining) > 1:  # app.run would print the whole usage text with status 1
    print(f'error: unexpected arguments {remaining[1:]} (every setting is a flag: '
          '--config=..., --workdir=..., --config.<section>.<field>=...)', file=sys.stderr)
    sys.exit(2)
  app.run(main, argv=argv, flags_parser=lambda unused_argv: remaining)


if __name__ == '__main__':
  entry()
