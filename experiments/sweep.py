r"""The paper's protocol as one list of commands: seeds x advantage modes x curriculum,
then evaluation and the Table-2 / Table-5 style aggregation (paper C.4, C.8; SPEC §6-7).

    python experiments/sweep.py --root=runs/paper --scale=paper --dry_run
    python experiments/sweep.py --root=runs/paper --scale=paper \
        --extra='--config.model.hf_checkpoint=/ckpt/Qwen2.5-7B-Instruct'
    python experiments/sweep.py --root=runs/tiny --seeds=42 --modes=full,no_verify \
        --eval_questions=8                                   # a small local sweep
    python experiments/sweep.py --root=runs/paper --tables_only

Layout and order (each step one `experiments/run.py` command, run here in order, or
printed by --dry_run):

  1. per seed s: SFT once, `<root>/sft/seed_<s>` (SFT does not depend on the advantage
     mode; every mode starts from the same θ_SFT, paper C.4);
  2. per seed s and mode m: `<root>/<m>/seed_<s>/sft` links to that SFT run, then
     phase_a, phase_b, phase_c with `--config.advantage.mode=m --config.seed=s`;
  3. per mode m: the HotpotQA evaluation of `<root>/<m>` over all seeds (each seed
     evaluates its own `seed_<s>/` checkpoints); Base is evaluated with the first mode;
  4. the tables: `<root>/tables/table2.md`, `table5.md`, `tables.json`
     (`vermem_jax.eval.paper_tables`).

Modes are the paper's ablation rows: full (VerMem), no_verify (VerMem-noVerify),
plus_local (+Local) and plus_global (+Global). `--extra` flags are appended to every
run.py command (a checkpoint, data or tokenizer path, a judge endpoint). A finished
step is skipped by run.py itself (a complete phase returns at once), so a killed sweep
continues where it stopped when started again with the same flags.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import subprocess
import sys
from typing import Sequence

_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
  sys.path.insert(0, str(_REPO_ROOT))

RUN = 'experiments/run.py'
MODES = ('full', 'no_verify', 'plus_local', 'plus_global')
RL_PHASES = ('phase_a', 'phase_b', 'phase_c')


def _run_cmd(config: str, scale: str, workdir: str, flags: Sequence[str]) -> list[str]:
  arg = '' if scale == 'tiny' else f':scale={scale}'
  return [sys.executable, RUN, f'--config={config}.py{arg}', f'--workdir={workdir}',
          *flags]


def plan(root: str, *, seeds: Sequence[int], modes: Sequence[str], scale: str,
         extra: Sequence[str] = (), eval_questions: int | None = None
         ) -> list[tuple[str, list[str]]]:
  """The sweep's steps in order: (kind, argv) with kind 'run' (a run.py command),
  'link' (argv = [target, link name]) or 'tables' (argv = [root, *modes])."""
  steps: list[tuple[str, list[str]]] = []
  for s in seeds:
    sft_wd = os.path.join(root, 'sft', f'seed_{s}')
    steps.append(('run', _run_cmd('sft', scale, sft_wd, [f'--config.seed={s}', *extra])))
    for m in modes:
      wd = os.path.join(root, m, f'seed_{s}')
      steps.append(('link', [os.path.join(sft_wd, 'sft'), os.path.join(wd, 'sft')]))
      for phase in RL_PHASES:
        steps.append(('run', _run_cmd(phase, scale, wd, [
            f'--config.seed={s}', f'--config.advantage.mode={m}', *extra])))
  seeds_flag = '--config.eval.seeds=(' + ','.join(str(s) for s in seeds) + ',)'
  for i, m in enumerate(modes):
    policies = ('base,' if i == 0 else '') + ','.join(('sft',) + RL_PHASES)
    flags = [seeds_flag, f'--config.eval.policies={policies}']
    if eval_questions is not None:
      flags.append(f'--config.eval.num_questions={eval_questions}')
    steps.append(('run', _run_cmd('eval_hotpotqa', scale, os.path.join(root, m),
                                  [*flags, *extra])))
  steps.append(('tables', [root, *modes]))
  return steps


def describe(step: tuple[str, list[str]]) -> str:
  """The shell form of a step (what --dry_run prints)."""
  kind, argv = step
  if kind == 'link':
    return f'mkdir -p {shlex.quote(os.path.dirname(argv[1]))} && ln -sfn ' + ' '.join(
        shlex.quote(a) for a in argv)
  if kind == 'tables':
    return (f'python experiments/sweep.py --root={shlex.quote(argv[0])} --tables_only '
            f'--modes={",".join(argv[1:])}')
  return 'python ' + ' '.join(shlex.quote(a) for a in argv[1:])


def write_tables(root: str, modes: Sequence[str]) -> None:
  from vermem_jax.eval import paper_tables  # pylint: disable=import-outside-toplevel
  by_mode = paper_tables.collect(root, modes)
  if not by_mode:
    raise FileNotFoundError(f'no <mode>/eval_hotpotqa/results.json under {root} for '
                            f'modes {list(modes)}; run the evaluations first')
  paths = paper_tables.write_tables(os.path.join(root, 'tables'), by_mode)
  for key in ('table2', 'table5'):
    with open(paths[key]) as f:
      print(f.read())
  print(f'tables written to {os.path.dirname(paths["json"])}')


def execute(step: tuple[str, list[str]]) -> None:
  kind, argv = step
  if kind == 'link':
    target, link = argv
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.islink(link) or not os.path.exists(link):
      if os.path.islink(link):
        os.unlink(link)
      os.symlink(os.path.abspath(target), link)
    return
  if kind == 'tables':
    write_tables(argv[0], argv[1:])
    return
  print('+ ' + describe(step), flush=True)
  subprocess.run(argv, check=True, cwd=_REPO_ROOT)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--root', required=True, help='sweep folder (one workdir per mode)')
  p.add_argument('--scale', default='tiny', choices=('tiny', 'paper'))
  p.add_argument('--seeds', default='42,43,44', help='comma-separated (SPEC §7)')
  p.add_argument('--modes', default=','.join(MODES),
                 help=f'comma-separated advantage modes from {MODES}')
  p.add_argument('--extra', default='', help='flags appended to every run.py command')
  p.add_argument('--eval_questions', type=int, default=None,
                 help='questions per seed (default: the config scale\'s)')
  p.add_argument('--dry_run', action='store_true', help='print the commands only')
  p.add_argument('--tables_only', action='store_true',
                 help='only build the tables from finished evaluations')
  args = p.parse_args(argv)
  try:
    seeds = [int(s) for s in args.seeds.split(',') if s.strip()]
  except ValueError:
    print(f'error: --seeds={args.seeds!r}: expected integers', file=sys.stderr)
    return 2
  modes = [m.strip() for m in args.modes.split(',') if m.strip()]
  bad = [m for m in modes if m not in MODES]
  if bad or not modes or not seeds:
    print(f'error: --modes must name some of {MODES} and --seeds at least one seed; '
          f'got modes={modes}, seeds={seeds}', file=sys.stderr)
    return 2
  root = os.path.abspath(args.root)
  if args.tables_only:
    try:
      write_tables(root, modes)
    except FileNotFoundError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    return 0
  steps = plan(root, seeds=seeds, modes=modes, scale=args.scale,
               extra=shlex.split(args.extra), eval_questions=args.eval_questions)
  if args.dry_run:
    for step in steps:
      print(describe(step))
    return 0
  for step in steps:
    try:
      execute(step)
    except subprocess.CalledProcessError as e:
      print(f'error: step failed (exit {e.returncode}): {describe(step)}',
            file=sys.stderr)
      return e.returncode or 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
