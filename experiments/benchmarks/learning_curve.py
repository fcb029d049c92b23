r"""Does the default run learn? SFT -> Phase A -> Phase B at the default scale, 3 seeds.

    python experiments/benchmarks/learning_curve.py                    # seeds 42 43 44
    python experiments/benchmarks/learning_curve.py --seeds 42 --workdir /tmp/lc \
        --override rl.num_updates=12 --dev_episodes 16

For each seed the tiny curriculum runs into `<workdir>/seed<k>/` exactly as `make run`
does (`experiments/run.py --config=phase_b.py`, with `--config.seed=<k>` and any
`--override`), then every policy of the run — θ_SFT (the checkpoint Phase A starts
from), θ_A, θ_B — plays the first `--dev_episodes` internal-dev episodes of Phase A and
of Phase B greedily (`train.internal_dev`). The script prints, as mean ± std over
seeds:

  1. SFT on its dev records (greedy): tool accuracy, executable rate (all / non-∅
     predictions) and exact match, overall and per target class, at the SFT checkpoint
     Phase A starts from (goal of issue 9: tool accuracy >= 0.85 and exact match >= 0.5
     in every class);
  2. internal-dev r^task, m^ans, supporting-fact recall and rejected rate of θ_SFT,
     θ_A and θ_B on each phase's dev episodes, with θ_RL − θ_SFT per seed (goal: RL
     above SFT by more than one std);

and writes `<workdir>/learning_curve.png` (SFT loss and dev tool accuracy over steps,
the sampled r^task and m^ans over the updates of A and B, and the internal-dev r^task
of the three policies) and `<workdir>/learning_curve.json` (every figure).

r^task and m^ans come from the oracle-evidence reader and r^global from the heuristic
verifier: CPU stand-ins (the reader answers exactly when the supporting facts are where
it reads), not a model's answers. A workdir that already holds a finished seed is
reused (the phases are complete, so nothing is retrained); delete it to rerun.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Sequence

_REPO = pathlib.Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
  sys.path.insert(0, str(_REPO))

import numpy as np  # noqa: E402

from experiments import run as run_lib  # noqa: E402
from experiments.configs import common  # noqa: E402
from vermem_jax.memory import commands as mcommands  # noqa: E402
from vermem_jax.train import checkpoints  # noqa: E402
from vermem_jax.train import internal_dev  # noqa: E402
from vermem_jax.train import metrics as metrics_lib  # noqa: E402

SEEDS = (42, 43, 44)  # SPEC §7
POLICIES = (('θ_SFT', 'sft'), ('θ_A', 'phase_a'), ('θ_B', 'phase_b'))
DEV_SETS = ('phase_a', 'phase_b')
DEV_KEYS = ('r_task', 'm_ans', 'r_sup', 'rejected_rate')
SFT_KEYS = ('tool_accuracy', 'executable_rate', 'executable_rate_non_null', 'exact_match')


def parse_override(text: str) -> tuple[str, Any]:
  """'rl.num_updates=12' -> ('rl.num_updates', 12) (value parsed as a Python literal
  when it is one, else kept as a string)."""
  import ast  # pylint: disable=g-import-not-at-top
  key, sep, value = text.partition('=')
  if not sep or '.' not in key:
    raise argparse.ArgumentTypeError(f'--override wants section.field=value, got {text!r}')
  try:
    return key, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key, value


def phase_config(phase: str, seed: int, overrides: Sequence[tuple[str, Any]]):
  config = common.get_config(phase)
  config.seed = int(seed)
  for key, value in overrides:
    section, field = key.split('.', 1)
    config[section][field] = value
  return config


def run_seed(seed: int, workdir: str, overrides: Sequence[tuple[str, Any]]) -> float:
  """Runs SFT -> A -> B into `workdir` (`experiments/run.py`'s `run`); wall seconds."""
  t0 = time.time()
  flags = [(k, f'--config.{k}={v!r}' if isinstance(v, tuple) else f'--config.{k}={v}')
           for k, v in [('seed', seed), *overrides]]
  run_lib.run(phase_config('phase_b', seed, overrides), workdir, override_args=flags)
  return time.time() - t0


def sft_figures(workdir: str) -> dict[str, float]:
  """The dev row of the SFT checkpoint Phase A starts from (best step)."""
  directory = os.path.join(workdir, 'sft')
  _, step = checkpoints.restore_params_only(directory, prefer_best=True)
  rows = metrics_lib.read_jsonl(os.path.join(directory, metrics_lib.METRICS_FILE))
  dev = [r for r in rows if 'dev/tool_accuracy' in r and r['step'] == step]
  if not dev:
    raise ValueError(f'{directory}: no dev evaluation at the selected step {step}')
  out = {k[len('dev/'):]: v for k, v in dev[-1].items() if k.startswith('dev/')}
  out['step'] = float(step)
  return out


def dev_figures(workdir: str, seed: int, overrides: Sequence[tuple[str, Any]],
                episodes: int) -> dict[str, dict[str, dict[str, float]]]:
  """{dev set phase: {policy phase: internal_dev figures}} for every policy of the run."""
  from vermem_jax.train import rl_phase  # pylint: disable=g-import-not-at-top
  from vermem_jax.train import rl_setup  # pylint: disable=g-import-not-at-top
  out = {}
  for dev_phase in DEV_SETS:
    setup = rl_setup.build_setup(phase_config(dev_phase, seed, overrides))
    out[dev_phase] = {}
    for _, policy_phase in POLICIES:
      params, _ = checkpoints.restore_params_only(os.path.join(workdir, policy_phase),
                                                  prefer_best=True)
      out[dev_phase][policy_phase] = rl_phase.internal_dev_figures(setup, params, episodes)
  return out


def curves(workdir: str) -> dict[str, list[dict]]:
  return {phase: metrics_lib.read_jsonl(os.path.join(workdir, phase,
                                                     metrics_lib.METRICS_FILE))
          for phase in ('sft', 'phase_a', 'phase_b')}


def mean_std(values: Sequence[float]) -> str:
  vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
  if not vals:
    return 'n/a'
  return f'{np.mean(vals):.3f} ± {np.std(vals):.3f}'


def report(per_seed: dict[int, dict[str, Any]]) -> str:
  seeds = sorted(per_seed)
  lines = [f'learning curve over seeds {seeds} (mean ± std; {internal_dev.STAND_IN_NOTE})',
           '', '1. SFT dev records, greedy, at the checkpoint Phase A starts from']
  for key in SFT_KEYS:
    lines.append(f'   {key:<26s} {mean_std([per_seed[s]["sft"].get(key) for s in seeds])}')
  lines.append(f'   {"class":<14s} {"tool accuracy":>16s} {"exact match":>16s}')
  for op in mcommands.ALL_OPS:
    acc = mean_std([per_seed[s]['sft'].get(f'tool_accuracy/{op}') for s in seeds])
    exact = mean_std([per_seed[s]['sft'].get(f'exact_match/{op}') for s in seeds])
    lines.append(f'   {("∅" if op == mcommands.NULL else op):<14s} {acc:>16s} {exact:>16s}')
  for dev_phase in DEV_SETS:
    n = per_seed[seeds[0]]['dev'][dev_phase]['sft'].get('num_episodes', 0)
    lines += ['', f'2. internal dev, {dev_phase} episodes ({int(n)} per seed, greedy)',
              f'   {"metric":<24s}' + ''.join(f'{name:>18s}' for name, _ in POLICIES)]
    for key in DEV_KEYS:
      row = f'   {key:<24s}'
      for _, phase in POLICIES:
        row += f'{mean_std([per_seed[s]["dev"][dev_phase][phase][key] for s in seeds]):>18s}'
      lines.append(row)
    for name, phase in POLICIES[1:]:
      for key in ('r_task', 'm_ans'):
        diffs = [per_seed[s]['dev'][dev_phase][phase][key]
                 - per_seed[s]['dev'][dev_phase]['sft'][key] for s in seeds]
        sft_std = float(np.std([per_seed[s]['dev'][dev_phase]['sft'][key] for s in seeds]))
        verdict = ('above θ_SFT by more than one std' if np.mean(diffs) > max(
            sft_std, float(np.std(diffs))) else 'not above θ_SFT by more than one std')
        lines.append(f'   {name} − θ_SFT {key:<7s} {mean_std(diffs):>18s}  ({verdict})')
  lines += ['', 'wall seconds per seed: ' + ', '.join(
      f'{s}: {per_seed[s]["wall_s"]:.0f}' for s in seeds)]
  return '\n'.join(lines)


def plot(per_seed: dict[int, dict[str, Any]], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 4, figsize=(19, 3.8))
  ax2 = axes[0].twinx()
  for seed, res in sorted(per_seed.items()):
    sft = res['curves']['sft']
    tr = [r for r in sft if 'train/loss' in r]
    dev = [r for r in sft if 'dev/tool_accuracy' in r]
    axes[0].plot([r['step'] for r in tr], [r['train/loss'] for r in tr], lw=0.8,
                 label=f'loss, seed {seed}')
    ax2.plot([r['step'] for r in dev], [r['dev/tool_accuracy'] for r in dev], 'o--',
             label=f'dev tool acc, seed {seed}')
    ax2.set_ylim(0, 1)
    offset = 0
    for phase in ('phase_a', 'phase_b'):
      rows = [r for r in res['curves'][phase] if 'reward/r_task' in r]
      x = [offset + r['step'] for r in rows]
      axes[1].plot(x, [r['reward/r_task'] for r in rows], lw=0.8, label=f'{phase} s{seed}')
      axes[2].plot(x, [r['reward/m_ans'] for r in rows], lw=0.8, label=f'{phase} s{seed}')
      offset += max([r['step'] for r in rows], default=0)
  axes[0].set(title='SFT: train loss (left), dev tool accuracy (right)', xlabel='step')
  axes[1].set(title='sampled r^task per update (A then B)', xlabel='update', ylim=(0, 1))
  axes[2].set(title='sampled m^ans per update (A then B)', xlabel='update', ylim=(0, 1))
  width = 0.35
  for j, dev_phase in enumerate(DEV_SETS):
    means, stds = [], []
    for _, phase in POLICIES:
      vals = [res['dev'][dev_phase][phase]['r_task'] for res in per_seed.values()]
      means.append(np.mean(vals))
      stds.append(np.std(vals))
    axes[3].bar(np.arange(len(POLICIES)) + j * width, means, width, yerr=stds,
                label=f'{dev_phase} dev episodes', capsize=3)
  axes[3].set_xticks(np.arange(len(POLICIES)) + width / 2)
  axes[3].set_xticklabels([name for name, _ in POLICIES])
  axes[3].set(title='internal-dev r^task (greedy; oracle reader)', ylim=(0, 1))
  for ax in axes[1:]:
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', default='/tmp/vermem_learning_curve')
  parser.add_argument('--seeds', type=int, nargs='+', default=list(SEEDS))
  parser.add_argument('--dev_episodes', type=int, default=16,
                      help='internal-dev episodes per phase and policy')
  parser.add_argument('--override', type=parse_override, action='append', default=[],
                      help='config override section.field=value (every phase)')
  args = parser.parse_args(argv)
  os.makedirs(args.workdir, exist_ok=True)
  per_seed = {}
  t0 = time.time()
  for seed in args.seeds:
    wd = os.path.join(args.workdir, f'seed{seed}')
    wall = run_seed(seed, wd, args.override)
    per_seed[seed] = {'wall_s': wall, 'sft': sft_figures(wd),
                      'dev': dev_figures(wd, seed, args.override, args.dev_episodes),
                      'curves': curves(wd)}
    print(f'seed {seed}: {wall:.0f} s (run), {time.time() - t0:.0f} s so far', flush=True)
  text = report(per_seed)
  print('\n' + text)
  png = os.path.join(args.workdir, 'learning_curve.png')
  plot(per_seed, png)
  with open(os.path.join(args.workdir, 'learning_curve.json'), 'w') as f:
    json.dump({str(s): {k: v for k, v in r.items() if k != 'curves'}
               for s, r in per_seed.items()}, f, indent=1)
  print(f'\nwrote {png} and learning_curve.json; total {time.time() - t0:.0f} s '
        f'(load average {os.getloadavg()[0]:.1f})')
  return 0


if __name__ == '__main__':
  sys.exit(main())
