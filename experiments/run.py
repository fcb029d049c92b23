r"""Runs one phase of the VerMem curriculum (SPEC §4): sft -> phase_a -> phase_b -> phase_c.

    python experiments/run.py --config=phase_b.py                 # tiny CPU scale
    python experiments/run.py --config=phase_b.py:scale=paper \
        --config.model.hf_checkpoint=/ckpt/Qwen2.5-7B-Instruct --workdir=/runs/vermem
    python experiments/run.py --config=phase_a --config.rl.learning_rate=3e-6
    python experiments/run.py --config=phase_c.py --dry_run       # print config + plan

`--config` takes a path or a bare name (`phase_b`, `phase_b.py`) resolved against
experiments/configs/; text after ':' is the scale argument. Any field can be overridden
with `--config.<section>.<field>=value`; overrides apply to every phase this command runs.

Each phase writes to `<workdir>/<phase>/` (checkpoints, metrics.jsonl, TensorBoard
events, advantages.jsonl). A phase starts from the previous phase's parameters, so it
needs that phase to be complete (`<workdir>/<prev>/phase_complete.json`, written here
when a phase's trainer returns). At the tiny scale missing phases are run first (and the
log says so); at paper scale the command stops and prints the command that makes the
missing checkpoint (with this command's `--config.*` flags). A phase with checkpoints of
its own resumes from the newest one. While a phase runs, this process holds an exclusive
lock on `<workdir>/<phase>/.lock`; a second run of that phase in the same workdir stops
with exit status 2. `--dry_run` writes nothing and reports config problems as warnings.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shlex
import shutil
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

from experiments.configs import common  # noqa: E402

CONFIG_DIR = _REPO_ROOT / 'experiments' / 'configs'

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Phase config: a path or a name in experiments/configs/ '
    '(sft, phase_a, phase_b, phase_c), optionally with ":scale=paper".',
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory (one sub-directory per phase); default: '
    'config.workdir (./workdir).')
_DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Print the resolved config and the phases that would run, then '
    'exit without training.')


class MissingPrerequisiteError(RuntimeError):
  """A phase needs a previous phase's checkpoint that the workdir does not hold."""


class PhaseLockedError(RuntimeError):
  """Another process is running the same phase in the same workdir."""


# ----------------------------------------------------------------------------- configs
def resolve_config_path(value: str) -> str:
  """Maps `--config` text to a config file path, keeping any ':arg' suffix.

  'phase_b', 'phase_b.py', 'phase_b.py:scale=paper' -> '<repo>/experiments/configs/
  phase_b.py[:scale=paper]'; an existing path is kept as given.

  Raises:
    ValueError: neither a file nor a known config name (lists the known names).
  """
  path, sep, arg = value.partition(':')
  if os.path.isfile(path):
    return value
  name = path if path.endswith('.py') else path + '.py'
  candidate = CONFIG_DIR / name
  if os.sep not in path and candidate.is_file():
    return str(candidate) + sep + arg
  known = sorted(p.stem for p in CONFIG_DIR.glob('*.py')
                 if p.stem not in ('__init__', 'common'))
  raise ValueError(f'--config={value}: no such file, and {name!r} is not in {CONFIG_DIR} '
                   f'(known configs: {", ".join(known)})')


def resolve_config_argv(argv: Sequence[str]) -> list[str]:
  """Rewrites `--config=NAME` / `--config NAME` in argv to real paths (before absl parses).

  `--config.<field>=...` overrides are left alone.
  """
  out = list(argv)
  i = 1
  while i < len(out):
    a = out[i]
    if a == '--':
      break
    if a.startswith('--config='):
      out[i] = '--config=' + resolve_config_path(a[len('--config='):])
    elif a == '--config' and i + 1 < len(out):
      out[i + 1] = resolve_config_path(out[i + 1])
      i += 1
    i += 1
  return out


def _load_config_file(value: str) -> ml_collections.ConfigDict:
  """Builds the config named by a resolved `--config` value the way config_flags does
  (`module.get_config(*args after ':')`), so its errors can be reported cleanly."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path, sep, arg = value.partition(':')
  spec = importlib.util.spec_from_file_location('_vermem_cli_config', path)
  if spec is None or spec.loader is None:
    raise ValueError(f'--config={value}: {path} is not a Python config file')
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not hasattr(module, 'get_config'):
      raise ValueError(f'{path} defines no get_config()')
    return module.get_config(*([arg] if sep else []))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'--config={value}: {e}') from e


def _override_path(arg: str) -> str | None:
  """'rl.learning_rate' for '--config.rl.learning_rate=3e-6' (or the bare flag)."""
  for prefix in ('--config.', '-config.'):
    if arg.startswith(prefix):
      return arg[len(prefix):].partition('=')[0]
  return None


def config_override_args(argv: Sequence[str]) -> list[tuple[str, str]]:
  """The `--config.<field>` flags in argv, as (field path, flag text) pairs in order.

  `--config.seed 1` (value as the next argument) becomes ('seed', '--config.seed=1'),
  so every flag text is one shell word that reproduces the override.
  """
  out = []
  i = 1
  while i < len(argv):
    a = argv[i]
    if a == '--':
      break
    path = _override_path(a)
    if path:
      text = '--' + a.lstrip('-')
      if '=' not in a and i + 1 < len(argv) and not argv[i + 1].startswith('-'):
        text += '=' + argv[i + 1]
        i += 1
      out.append((path, text))
    i += 1
  return out


def check_config_argv(argv: Sequence[str]) -> None:
  """Checks a resolved argv's `--config` file and `--config.<field>` names before absl.

  Without this, a bad scale argument or a misspelled field surfaces as an absl
  traceback from inside ml_collections (`AttributeError: "'nonexistent'"`).

  Raises:
    ValueError: the config file cannot be built (e.g. `:scale=huge`), or an override
      names a field the config lacks (lists the section's fields, with a close match).
  """
  import difflib  # pylint: disable=g-import-not-at-top
  value = None
  for i, a in enumerate(argv):
    if a == '--':
      break
    if a.startswith('--config='):
      value = a[len('--config='):]
    elif a == '--config' and i + 1 < len(argv):
      value = argv[i + 1]
  overrides = [p for p in map(_override_path, argv) if p]
  if value is None:
    return  # main() reports the missing --config
  config = _load_config_file(value)
  if not isinstance(config, ml_collections.ConfigDict):
    return  # not ours to check
  for path in overrides:
    node, done = config, []
    for key in path.split('.'):
      if not isinstance(node, ml_collections.ConfigDict) or key not in node:
        where = 'config' + ''.join('.' + d for d in done)
        if not isinstance(node, ml_collections.ConfigDict):
          raise ValueError(f'--config.{path}: {where} is a value, not a section')
        known = sorted(node.keys())
        close = difflib.get_close_matches(key, known, n=1)
        hint = f' (did you mean {close[0]!r}?)' if close else ''
        raise ValueError(f'--config.{path}: {where} has no field {key!r}{hint}; its '
                         f'fields: {", ".join(known)}')
      node = node[key]
      done.append(key)


def check_workdir_writable(workdir: str) -> None:
  """Creates `workdir` if needed and proves a file can be written there.

  Runs before any training so a read-only or mistyped path fails in a second, not
  after the first phase's work.

  Raises:
    ValueError: naming the path and the OS error.
  """
  import tempfile  # pylint: disable=g-import-not-at-top
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=workdir, prefix='.write_test'):
      pass
  except OSError as e:
    raise ValueError(f'--workdir={workdir}: cannot write there ({e.strerror or e}); '
                     'pass a writable --workdir') from e


def check_verifier_endpoint(config: ml_collections.ConfigDict) -> None:
  """For `verifier.backend='openai_compatible'`: builds the verifier (API key variable
  set?) and sends one request (server up, URL and model right?) before any training.

  Raises:
    ValueError: `config.verifier: ...` naming what failed.
  """
  if config.verifier.backend != 'openai_compatible':
    return
  from vermem_jax import verifiers  # pylint: disable=g-import-not-at-top
  try:
    verifier = verifiers.make_verifier(common.library_configs(config)['verifier'])
    try:
      verifier.preflight()
    finally:
      verifier.close()
  except ValueError as e:
    if str(e).startswith('config.'):
      raise
    raise ValueError(f'config.verifier: {e}') from e


def _leaves(cfg: Any, prefix: str = '') -> dict[str, Any]:
  out = {}
  for key, value in cfg.items():
    path = f'{prefix}{key}'
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_leaves(value, path + '.'))
    else:
      out[path] = value
  return out


def config_overrides(config: ml_collections.ConfigDict,
                     override_paths: Sequence[str] | None = None) -> dict[str, Any]:
  """The overridden fields of `config` -> their values.

  With `override_paths` (the `--config.<field>` flags the user passed): exactly those
  fields, even where a value equals the default. Without (a config edited in code): the
  fields that differ from the phase/scale defaults, leaving out fields derived from
  others (bucket fields, the tiny tokenizer path) whose value is still the derived one.
  """
  leaves = _leaves(config)
  if override_paths is not None:
    return {p: leaves[p] for p in dict.fromkeys(override_paths) if p in leaves}
  default = common.get_config(config.phase, f'scale={config.scale}')
  base = _leaves(default)
  derived = dict(common.derived_buckets(config))
  if config.scale == 'tiny':
    derived['tokenizer.path'] = common.paths.tokenizer_dir(config.tokenizer.name,
                                                           config.data.data_dir)
  return {k: v for k, v in leaves.items()
          if k != 'phase' and (k not in base or base[k] != v)
          and not (k in derived and derived[k] == v)}


def phase_config(phase: str, scale: str,
                 overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """The config of a prerequisite phase: its defaults + this command's overrides."""
  cfg = common.get_config(phase, f'scale={scale}')
  for path, value in overrides.items():
    node = cfg
    *parents, leaf = path.split('.')
    try:
      for p in parents:
        node = node[p]
      if leaf in node:
        node[leaf] = value
    except KeyError:
      continue
  return cfg


# ----------------------------------------------------------------------------- plan
def _runner_sft(config: ml_collections.ConfigDict, workdir: str) -> Any:
  from vermem_jax.train import sft  # pylint: disable=g-import-not-at-top
  return sft.run_sft(config, workdir)


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


def _phase_dir(workdir: str, phase: str) -> str:
  return os.path.join(workdir, phase)


def phase_is_complete(workdir: str, phase: str) -> bool:
  """Whether `<workdir>/<phase>` holds a finished phase (marker + a checkpoint)."""
  from vermem_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  d = _phase_dir(workdir, phase)
  return (checkpoints.phase_complete_step(d) is not None and
          checkpoints.has_checkpoint(d))


def command_for(phase: str, scale: str, workdir: str,
                override_args: Sequence[str] = ()) -> str:
  """The command line that runs `phase` at `scale` into `workdir`, with this command's
  `--config.<field>=...` flags (`override_args`, shell-quoted) so it can be pasted."""
  arg = '' if scale == 'tiny' else f':scale={scale}'
  words = [f'--config={phase}.py{arg}', *override_args, f'--workdir={workdir}']
  return 'python experiments/run.py ' + ' '.join(shlex.quote(w) for w in words)


@contextlib.contextmanager
def phase_lock(workdir: str, phase: str):
  """Holds an exclusive, non-blocking `fcntl.flock` on `<workdir>/<phase>/.lock`.

  Two runs writing one phase's checkpoints and metrics.jsonl would clobber each other.
  The lock dies with its process, so a lock file left by a killed run does not block.
  Creates the phase folder; if the phase leaves it holding only the lock file (it
  failed before writing anything), the folder is removed again.

  Raises:
    PhaseLockedError: another process holds the lock (names the folder and workdir).
  """
  d = _phase_dir(workdir, phase)
  os.makedirs(d, exist_ok=True)
  lock_path = os.path.join(d, '.lock')
  fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    raise PhaseLockedError(
        f'another run holds {lock_path}: it is running {phase} in workdir {workdir}. '
        'Wait for it to finish, or pass a different --workdir') from None
  try:
    os.ftruncate(fd, 0)
    os.write(fd, f'{os.getpid()}\n'.encode())
    yield lock_path
  finally:
    try:
      if os.listdir(d) == ['.lock']:
        os.unlink(lock_path)
        os.rmdir(d)
    except OSError:
      pass
    os.close(fd)  # releases the flock


def plan_phases(phase: str, workdir: str, scale: str,
                override_args: Sequence[str] = ()) -> list[str]:
  """Phases to run, in order, to produce `phase` (SPEC §4 curriculum).

  At the tiny scale, every incomplete phase before `phase` back to the last complete one
  (or sft) is run first. At paper scale nothing is run implicitly.

  Raises:
    MissingPrerequisiteError: paper scale and the previous phase is not complete (names
      its directory and the command that makes it).
  """
  order = list(common.PHASE_ORDER)
  if phase not in order:
    raise ValueError(f'unknown phase {phase!r}; expected one of {order}')
  needed = []
  for prev in reversed(order[:order.index(phase)]):
    if phase_is_complete(workdir, prev):
      break
    needed.insert(0, prev)
  if needed and scale != 'tiny':
    prev = common.PREVIOUS_PHASE[phase]
    raise MissingPrerequisiteError(
        f'{phase} starts from the {prev} parameters, but {_phase_dir(workdir, prev)} '
        f'holds no completed {prev} checkpoint. Make it first with:\n  '
        f'{command_for(prev, scale, workdir, override_args)}')
  return needed + [phase]


def _dry_run(config: ml_collections.ConfigDict, workdir: str,
             overrides: dict[str, Any], override_args: Sequence[str]) -> list[str]:
  """Prints the config, overrides and plan; validation problems become warnings (so a
  paper config without its checkpoint still prints). Writes nothing."""
  problems = []
  checks = [False] + ([True] if config.scale == 'tiny' else [])
  for check_paths in checks:  # tiny: also the data / tokenizer folders
    try:
      common.validate_config(config, check_paths=check_paths)
    except ValueError as e:
      if str(e) not in problems:
        problems.append(str(e))
      break
  plan = plan_phases(config.phase, workdir, config.scale, override_args)
  for path, value in sorted(_leaves(config).items()):
    print(f'config.{path} = {value!r}')
  print(f'workdir: {workdir}')
  print(f'overrides: {overrides}')
  print('plan: ' + ' -> '.join(plan))
  sys.stdout.flush()
  for problem in problems:
    print(f'warning: {problem} (a real run stops here)', file=sys.stderr)
  return plan


def run(config: ml_collections.ConfigDict, workdir: str, *,
        dry_run: bool = False,
        override_args: Sequence[tuple[str, str]] | None = None) -> list[str]:
  """Validates `config`, plans and runs the phases; returns the phases run (or planned).

  Args:
    config: the phase config (with the command line's overrides applied).
    workdir: run directory; one sub-directory per phase.
    dry_run: print the config and plan (validation problems as warnings) and return.
    override_args: the command line's `--config.<field>` flags as (field path, flag
      text) pairs (`config_override_args`); they are the overrides applied to earlier
      phases and repeated in printed commands. None: the fields differing from the
      defaults (for configs edited in code).

  Raises:
    ValueError: a bad config field; MissingPrerequisiteError: see plan_phases;
    PhaseLockedError: another run is writing a phase of this workdir.
  """
  workdir = os.path.abspath(os.path.expanduser(workdir))
  flag_texts = [text for _, text in override_args or ()]
  overrides = config_overrides(
      config, None if override_args is None else [p for p, _ in override_args])
  if dry_run:
    return _dry_run(config, workdir, overrides, flag_texts)
  common.validate_config(config, check_paths=True)
  plan = plan_phases(config.phase, workdir, config.scale, flag_texts)
  created = not os.path.exists(workdir)
  check_workdir_writable(workdir)
  try:
    _run_plan(config, workdir, plan, overrides)
  except BaseException:
    if created:  # a run that failed before writing anything leaves no empty folder
      with contextlib.suppress(OSError):
        os.rmdir(workdir)
    raise
  return plan


def _run_plan(config: ml_collections.ConfigDict, workdir: str, plan: list[str],
              overrides: dict[str, Any]) -> None:
  # Overrides apply to every phase, so one check covers the tokenizer/model pair.
  common.check_tokenizer_fits_model(config)
  if any(p != 'sft' for p in plan):
    check_verifier_endpoint(config)
  if len(plan) > 1:
    logging.warning('%s needs %s, which has no completed checkpoint in %s: running %s '
                    'first (tiny scale)', config.phase, common.PREVIOUS_PHASE[config.phase],
                    workdir, ', '.join(plan[:-1]))
  from vermem_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  for phase in plan:
    cfg = config if phase == config.phase else phase_config(phase, config.scale,
                                                            overrides)
    common.validate_config(cfg, check_paths=True)
    d = _phase_dir(workdir, phase)
    with phase_lock(workdir, phase):
      logging.info('running %s into %s', phase, d)
      PHASE_RUNNERS[phase](cfg, workdir)
      with checkpoints.PhaseCheckpointManager(d) as mgr:
        step = mgr.latest_step()
      if step is None:
        raise RuntimeError(f'{phase} finished without a checkpoint in {d}')
      checkpoints.mark_phase_complete(d, step, {'phase': phase, 'scale': config.scale})
    logging.info('%s complete at step %d', phase, step)


class _QuietLibraryInfo:
  """Drops INFO records of chatty libraries (Orbax logs each save/restore step in
  detail, JAX the missing TPU backend) unless `-v 1` or higher asks for them."""

  _PATHS = (f'{os.sep}orbax{os.sep}', f'{os.sep}jax{os.sep}_src{os.sep}xla_bridge')

  def filter(self, record) -> bool:  # absl/stdlib logging.Filter protocol
    if record.levelno > 20 or logging.get_verbosity() > logging.INFO:
      return True
    return not any(p in record.pathname for p in self._PATHS)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.get_absl_handler().addFilter(_QuietLibraryInfo())
  config = _CONFIG.value
  if config is None:
    raise app.UsageError('--config is required, e.g. --config=phase_b.py')
  workdir = _WORKDIR.value or config.workdir
  from vermem_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  try:
    run(config, workdir, dry_run=_DRY_RUN.value,
        override_args=config_override_args(sys.argv))
  except (ValueError, OSError, ImportError, MissingPrerequisiteError,
          PhaseLockedError, checkpoints.CheckpointError) as e:
    # ImportError: an optional package a config choice needs (data.source='hf').
    # Bad input (config, data file, checkpoint, path): the message names it; the
    # traceback is for `-v 1`. What earlier phases saved stays in the workdir.
    logging.debug('error traceback', exc_info=True)
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def entry() -> None:
  try:
    argv = resolve_config_argv(sys.argv)
    check_config_argv(argv)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  app.run(main, argv=argv)


if __name__ == '__main__':
  entry()
