r"""Does the tiny curriculum learn? SFT -> Phase A -> Phase B -> Phase C over seeds, with
the internal-dev figures of every update.

    python experiments/benchmarks/learning_curve.py                    # seeds 42 43 44
    python experiments/benchmarks/learning_curve.py --modes=full,no_verify
    python experiments/benchmarks/learning_curve.py --seeds 42 --workdir /tmp/lc \
        --dev_episodes 4 --override sft.num_epochs=1 rl.num_updates=2

For each seed the curriculum runs into `<workdir>/seed<k>/` as
`experiments/run.py --config=phase_c.py --config.seed=<k>` does (the missing phases
first), with the `--override section.field=value` settings (every phase) and four fields
set so that the run itself scores the greedy internal-dev episodes at every update:
`rl.eval_every=1`, `rl.eval_episodes` and `rl.internal_dev_episodes` = `--dev_episodes`,
`episodes.num_dev` raised to at least that (these four are this script's, not
`--override`'s). Each RL phase then writes to its `metrics.jsonl` the figures of θ_start
(step 0, `internal_dev/start/*`, train/internal_dev.py) and of θ after every update
(`dev/*`, train/rl_selection.py): r^task, m^ans, the rejected rate and the operation
mix. The phase's policy θ_A / θ_B / θ_C is its selected checkpoint (best
`rl.selection_metric` on those same dev episodes, paper C.8), the one the next phase
starts from. Because `rl.eval_every` is 1 here, a phase can select a different update
than `make run` would. θ_SFT and θ_A are also played on Phase C's dev episodes after the
run (`rl_phase.internal_dev_figures`).

It prints, as mean ± std over seeds (std: population, ddof 0):

  1. SFT on its dev records (greedy) at the checkpoint Phase A starts from: tool
     accuracy, executable rate, exact match, overall and per class (goal of issue 22:
     tool accuracy >= 0.85 and exact match >= 0.5 in every class);
  2. θ_SFT / θ_A / θ_B / θ_C on each phase's own dev episodes and on Phase C's: r^task,
     m^ans, rejected rate, operation mix;
  3. per seed, θ_phase − θ_start on the phase's own dev episodes (r^task, m^ans,
     rejected rate; r^task also for the phase's last update), and θ_C − θ_SFT on Phase
     C's, each with its goal (issue 22: the phase's policy beats its start on r^task by
     more than one std — mean Δ above the std of Δ and of the start values; θ_C above
     θ_SFT on m^ans);
  4. with `--modes=full,no_verify` (any of rl.advantages.MODES): Phase B once per
     advantage mode (config `advantage.mode`) from the same Phase A checkpoint of each
     seed, and the paper's Table-4 comparison at this scale: one row per mode, r^task,
     m^ans and rejected rate of its θ_B on Phase B's dev episodes (goal: full above
     no_verify). A mode equal to the run's own `advantage.mode` reuses
     `seed<k>/phase_b`; another one runs in `seed<k>/modes/<mode>/`, whose `sft` and
     `phase_a` are links to the seed's (nothing is retrained; Phase B's own directory
     is new, so its resume fingerprint, which holds the mode, has nothing to refuse).

It writes `<workdir>/learning_curve.png` (SFT train loss and dev tool accuracy; per RL
phase the mean ± std band over seeds of r^task, m^ans and rejected rate against the
update, 0 = θ_start; the mean operation mix per phase, stacked; the final policies'
r^task and m^ans on Phase C's dev episodes) and `<workdir>/learning_curve.json` (every
figure and curve, per seed).

r^task and m^ans come from the oracle-evidence reader and r^global (the RL signal) from
the heuristic verifier when the config uses them, as the tiny one does: CPU stand-ins,
not a model's answers or an LLM judge. The printout and the figure say so.

A workdir holding finished seeds is reused (complete phases are not retrained; the
internal-dev figures are read from their metrics.jsonl, so `--dev_episodes` must match
the run that made them). Delete it to rerun.

Run time. The default with `--modes=full,no_verify` (3 seeds) took 522 s at 7a34a5e on
the 2-core machine at a load average of 2.4, SFT included (about 100 s a seed), and
244-263 s from finished SFT checkpoints; 34 min at 1182245 at a load average of ~3.5.
Earlier,
at a load average of ~7.5: the end-to-end
test (tests/test_learning_curve.py; one seed, tests/test_curriculum_e2e.py's tiny
sizes, 2 dev episodes, one update per phase, `--modes=full,no_verify`) took 17.5 min
wall with ~10-20% of a core, almost all of it XLA compilation; each greedy pass over the
2 dev episodes took 1.8-2.4 s (`time/dev_eval_s`). Per seed the default costs `make
run`'s SFT and RL time plus one greedy pass over `--dev_episodes` dev episodes after
every update of every RL phase, two per phase (start, end) and two after the run; each
extra mode adds one Phase B.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Mapping, Sequence

_REPO = pathlib.Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
  sys.path.insert(0, str(_REPO))

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from experiments import run as run_lib  # noqa: E402
from experiments.cli import phase_plan  # noqa: E402
from experiments.cli import workdir_lock  # noqa: E402
from experiments.configs import common  # noqa: E402
from experiments.configs.parts import curriculum  # noqa: E402
from vermem_jax.envs import episode_types  # noqa: E402
from vermem_jax.memory import commands as mcommands  # noqa: E402
from vermem_jax.rl import advantages  # noqa: E402
from vermem_jax.train import checkpoint_values
from vermem_jax.train import checkpoints  # noqa: E402
from vermem_jax.train import internal_dev  # noqa: E402
from vermem_jax.train import metrics as metrics_lib  # noqa: E402
from vermem_jax.train import rl_phase  # noqa: E402
from vermem_jax.train import rl_setup  # noqa: E402
from vermem_jax.train import run_setup  # noqa: E402

SEEDS = (42, 43, 44)  # SPEC §7
RL_PHASES = curriculum.PHASE_ORDER[1:]  # phase_a, phase_b, phase_c
POLICIES = (('θ_SFT', 'sft'), ('θ_A', 'phase_a'), ('θ_B', 'phase_b'), ('θ_C', 'phase_c'))
POLICY_NAME = dict((phase, name) for name, phase in POLICIES)
# Policies played on Phase C's dev episodes after the run (θ_B and θ_C are in its log).
POSTHOC_POLICIES = ('sft', 'phase_a')
# (label, key in internal_dev figures (θ_start, step 0), key of rl_selection's dev/*
# row (after update n)): both are means over the same greedy dev episodes.
CURVE_METRICS = (('r^task', 'r_task', 'r_task'), ('m^ans', 'm_ans', 'm_ans'),
                 ('rejected rate', 'rejected_rate', 'invalid_rate'))
METRIC_LABEL = {key: label for label, key, _ in CURVE_METRICS}
START_PREFIX = rl_phase.DEV_PREFIX + 'start/'
UPDATE_PREFIX = 'dev/'
OP_PREFIX = 'op_share/'
# Set by --dev_episodes (the run scores the dev episodes at every update).
DEV_FIELDS = ('episodes.num_dev', 'rl.eval_every', 'rl.eval_episodes',
              'rl.internal_dev_episodes')
SFT_KEYS = ('tool_accuracy', 'executable_rate', 'executable_rate_non_null', 'exact_match')
SFT_GOALS = {'tool_accuracy': 0.85, 'exact_match': 0.5}  # issue 22, every class
OPS = mcommands.ALL_OPS + (episode_types.UNPARSEABLE,)

Overrides = Sequence[tuple[str, Any]]


# ----------------------------------------------------------------------------- config
def parse_override(text: str) -> tuple[str, Any]:
  """'rl.num_updates=12' -> ('rl.num_updates', 12): the value is a Python literal when
  it parses as one, else the string."""
  key, sep, value = text.partition('=')
  if not sep or '.' not in key:
    raise argparse.ArgumentTypeError(f'--override wants section.field=value, got {text!r}')
  try:
    return key, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key, value


def phase_config(phase: str, seed: int, overrides: Overrides,
                 scale: str = 'tiny') -> ml_collections.ConfigDict:
  """The config of `phase` at `scale` (default tiny) with seed `seed` and `overrides`
  ('a.b' -> value) set.

  Raises:
    ValueError: an override names no field of the config or has the wrong type.
  """
  config = common.get_config(phase, f'scale={scale}')
  config.seed = int(seed)
  for key, value in overrides:
    node = config
    *parents, leaf = key.split('.')
    try:
      for p in parents:
        node = node[p]
      if leaf not in node or isinstance(node[leaf], ml_collections.ConfigDict):
        raise KeyError(leaf)
      node[leaf] = value
    except KeyError:
      raise ValueError(f'--override {key}: no such config field (in the {phase} config)') from None
    except TypeError as e:
      raise ValueError(f'--override {key}={value!r}: {e}') from None
  return config


def dev_overrides(dev_episodes: int, seed: int, overrides: Overrides) -> list[tuple[str, Any]]:
  """DEV_FIELDS set so that every RL phase scores its first `dev_episodes` internal-dev
  episodes greedily at θ_start and after every update; `episodes.num_dev` keeps each
  phase's own value where that is larger (dev episode i does not depend on the count,
  envs/scenarios/build.py)."""
  num_dev = max([int(dev_episodes)] + [
      int(phase_config(p, seed, overrides).episodes.num_dev) for p in RL_PHASES])
  return [('episodes.num_dev', num_dev), ('rl.eval_every', 1),
          ('rl.eval_episodes', int(dev_episodes)),
          ('rl.internal_dev_episodes', int(dev_episodes))]


def override_flags(overrides: Overrides) -> list[tuple[str, str]]:
  """(field path, `--config.<path>=value` text) pairs, as `run_lib.run` takes them."""
  return [(k, f'--config.{k}={v!r}' if isinstance(v, tuple) else f'--config.{k}={v}')
          for k, v in overrides]


def stand_in_note(config: ml_collections.ConfigDict) -> str:
  """Which figures come from CPU stand-ins under `config` ('' when none do)."""
  parts = []
  if config.solver.backend == 'oracle':
    parts.append('r^task and m^ans come from the oracle-evidence reader')
  if config.verifier.backend == 'heuristic':
    parts.append('r^global (the RL signal) from the heuristic verifier')
  if not parts:
    return ''
  return ('; '.join(parts) + ': CPU stand-ins, not a model\'s answers or an LLM judge')


# ----------------------------------------------------------------------------- runs
def run_seed(seed: int, workdir: str, overrides: Overrides) -> float:
  """SFT -> A -> B -> C into `workdir` (`experiments/run.py`'s `run` with
  --config=phase_c.py); wall seconds."""
  t0 = time.time()
  run_lib.run(phase_config('phase_c', seed, overrides), workdir,
              override_args=override_flags([('seed', seed), *overrides]))
  return time.time() - t0


def mode_phase_b_dir(seed: int, seed_dir: str, mode: str,
                     overrides: Overrides) -> tuple[str, float]:
  """Phase B with `advantage.mode = mode` from the seed's Phase A checkpoint.

  The run's own mode is `seed_dir/phase_b`; another runs in `seed_dir/modes/<mode>/`
  where `sft` and `phase_a` link to the seed's directories. Returns (that Phase B
  directory, wall seconds spent).
  """
  if mode == phase_config('phase_b', seed, overrides).advantage.mode:
    return phase_plan.phase_dir(seed_dir, 'phase_b'), 0.0
  t0 = time.time()
  mode_dir = os.path.join(seed_dir, 'modes', mode)
  os.makedirs(mode_dir, exist_ok=True)
  for prev in ('sft', 'phase_a'):
    link = os.path.join(mode_dir, prev)
    if not os.path.lexists(link):
      os.symlink(os.path.join('..', '..', prev), link)
  mode_overrides = [*overrides, ('advantage.mode', mode)]
  plan = run_lib.run(phase_config('phase_b', seed, mode_overrides), mode_dir,
                     override_args=override_flags([('seed', seed), *mode_overrides]))
  if plan != ['phase_b']:  # the links must make Phase A count as done
    raise RuntimeError(f'{mode_dir}: expected to run phase_b only, ran {plan}')
  return phase_plan.phase_dir(mode_dir, 'phase_b'), time.time() - t0


def selected_step(directory: str) -> int:
  """The phase's selected checkpoint step (best selection metrics, else the newest):
  the one the next phase and the evaluation load."""
  with checkpoints.PhaseCheckpointManager(directory, max_to_keep=10**9) as mgr:
    step = mgr.best_step()
    step = mgr.latest_step() if step is None else step
  if step is None:
    raise ValueError(f'{directory} holds no checkpoint')
  return int(step)


def posthoc_figures(seed_dir: str, seed: int, overrides: Overrides,
                    dev_episodes: int) -> dict[str, dict[str, float]]:
  """{policy phase: internal_dev figures} of POSTHOC_POLICIES on Phase C's first
  `dev_episodes` dev episodes (the function that makes `internal_dev/start/*`)."""
  setup = rl_setup.build_setup(
      run_setup.RunSetup.from_config(phase_config('phase_c', seed, overrides)))
  out = {}
  for phase in POSTHOC_POLICIES:
    params, _ = checkpoints.restore_params_only(phase_plan.phase_dir(seed_dir, phase),
                                                prefer_best=True)
    out[phase] = rl_phase.internal_dev_figures(setup, params, dev_episodes)
  return out


# ----------------------------------------------------------------------------- reading
def point(values: Mapping[str, Any], prefix: str, *, start: bool) -> dict[str, Any]:
  """One dev evaluation from a flat dict: {'r_task', 'm_ans', 'rejected_rate',
  'episodes', 'ops': {op: share}}. `start`: internal_dev keys (θ_start rows and
  `rl_phase.internal_dev_figures`), else rl_selection's dev/* keys."""
  out = {key: float(values[prefix + (key if start else dev_key)])
         for _, key, dev_key in CURVE_METRICS}
  out['episodes'] = float(values[prefix + ('num_episodes' if start else 'episodes')])
  ops_prefix = prefix + OP_PREFIX
  out['ops'] = {k[len(ops_prefix):]: float(v) for k, v in values.items()
                if k.startswith(ops_prefix)}
  return out


def phase_curve(rows: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
  """{update: point} of an RL phase's metrics.jsonl rows: update 0 is θ_start
  (`internal_dev/start/*`), update n the dev evaluation after update n (`dev/*`). A
  step logged twice (a resumed run) keeps its last row."""
  curve = {}
  for row in rows:
    step = int(row['step'])
    if step == 0 and START_PREFIX + 'r_task' in row:
      curve[0] = point(row, START_PREFIX, start=True)
    elif UPDATE_PREFIX + 'r_task' in row:
      curve[step] = point(row, UPDATE_PREFIX, start=False)
  return dict(sorted(curve.items()))


def read_phase(directory: str, dev_episodes: int, step: int) -> dict[str, Any]:
  """{'curve': phase_curve, 'selected': step, 'last': last update} of a finished RL
  phase directory whose selected checkpoint is `step`.

  Raises:
    ValueError: no θ_start row, the selected or a scored update missing, or a dev
      evaluation over another number of episodes than `dev_episodes`.
  """
  curve = phase_curve(metrics_lib.read_jsonl(os.path.join(directory,
                                                          metrics_lib.METRICS_FILE)))
  if 0 not in curve or step not in curve:
    raise ValueError(f'{directory}: no internal-dev figures for θ_start (step 0) and the '
                     f'selected update {step} (updates found: {sorted(curve)}); was the '
                     'phase run by this script?')
  for update, p in curve.items():
    if int(p['episodes']) != int(dev_episodes):
      raise ValueError(f'{directory}: update {update} was scored on {int(p["episodes"])} '
                       f'dev episodes, not --dev_episodes {dev_episodes}; pass that value '
                       'or use a fresh --workdir')
  return {'curve': curve, 'selected': int(step), 'last': max(curve)}


def sft_figures(directory: str, step: int) -> dict[str, float]:
  """The dev row of the SFT checkpoint Phase A starts from (`step`), keys without
  'dev/'."""
  rows = metrics_lib.read_jsonl(os.path.join(directory, metrics_lib.METRICS_FILE))
  dev = [r for r in rows if 'dev/tool_accuracy' in r and int(r['step']) == step]
  if not dev:
    raise ValueError(f'{directory}: no dev evaluation at the selected step {step}')
  out = {k[len('dev/'):]: v for k, v in dev[-1].items() if k.startswith('dev/')}
  out['step'] = float(step)
  return out


def sft_loss_curve(directory: str) -> dict[int, float]:
  rows = metrics_lib.read_jsonl(os.path.join(directory, metrics_lib.METRICS_FILE))
  return {int(r['step']): float(r['train/loss']) for r in rows if 'train/loss' in r}


def policy_table(seed_run: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
  """{policy phase: {dev set phase: point}} of one seed: on each RL phase's dev
  episodes its start (the previous phase's policy) and its selected checkpoint, plus
  the post-hoc points (θ_SFT, θ_A on Phase C's)."""
  table: dict[str, dict[str, dict[str, Any]]] = {p: {} for _, p in POLICIES}
  for phase in RL_PHASES:
    run = seed_run['phases'][phase]
    table[curriculum.PREVIOUS_PHASE[phase]][phase] = run['curve'][0]
    table[phase][phase] = run['curve'][run['selected']]
  for policy, figures in seed_run.get('posthoc', {}).items():
    table[policy]['phase_c'] = figures
  return table


# ----------------------------------------------------------------------------- figures
def mean_std(values: Sequence[float | None]) -> tuple[float, float]:
  """(mean, population std) of the finite values; (nan, nan) when there are none."""
  vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
  if not vals:
    return math.nan, math.nan
  return float(np.mean(vals)), float(np.std(vals))


def fmt_mean_std(values: Sequence[float | None], sign: bool = False) -> str:
  m, s = mean_std(values)
  if math.isnan(m):
    return 'n/a'
  return f'{m:+.3f} ± {s:.3f}' if sign else f'{m:.3f} ± {s:.3f}'


def aggregate_curves(curves: Sequence[Mapping[int, Mapping[str, Any]]]
                     ) -> dict[str, Any]:
  """Mean and std over seeds at the updates every curve has.

  Returns:
    {'update': [U] ints, '<metric>': ([U] means, [U] stds) for r_task, m_ans,
     rejected_rate, 'ops': {op: [U] mean shares (0 where a seed had none)}}.
  """
  updates = sorted(set.intersection(*[set(c) for c in curves])) if curves else []
  out: dict[str, Any] = {'update': updates}
  for _, key, _ in CURVE_METRICS:
    stats = [mean_std([c[u][key] for c in curves]) for u in updates]
    out[key] = ([m for m, _ in stats], [s for _, s in stats])
  ops = sorted({op for c in curves for u in updates for op in c[u]['ops']},
               key=lambda op: (OPS.index(op) if op in OPS else len(OPS), op))
  out['ops'] = {op: [float(np.mean([c[u]['ops'].get(op, 0.0) for c in curves]))
                     for u in updates] for op in ops}
  return out


def mean_ops(points: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """The operation mix averaged over seeds (an op a seed never chose counts 0)."""
  ops = {op for p in points for op in p['ops']}
  return {op: float(np.mean([p['ops'].get(op, 0.0) for p in points])) for op in ops}


def beats_by_one_std(deltas: Sequence[float], starts: Sequence[float]) -> bool:
  """Issue 22's goal: the mean Δ exceeds both the std of Δ and the std of the start
  values over seeds (so a one-seed jump or a noisy start does not pass)."""
  m, s = mean_std(deltas)
  return bool(m > max(s, mean_std(starts)[1]))


def report(per_seed: Mapping[int, Mapping[str, Any]], *, dev_episodes: int,
           note: str, modes: Sequence[str] = ()) -> str:
  """The printed tables (module docstring, items 1-4) from the per-seed results."""
  seeds = sorted(per_seed)
  tables = {s: policy_table(per_seed[s]) for s in seeds}
  lines = [f'learning curve over seeds {seeds} (mean ± std over seeds, population std; '
           f'internal dev: {dev_episodes} greedy episodes per phase)']
  if note:
    lines.append(f'NOTE: {note}.')
  lines += ['', '1. SFT dev records, greedy, at the checkpoint Phase A starts from '
            '(goal: tool accuracy >= 0.85 and exact match >= 0.5 in every class)']
  for key in SFT_KEYS:
    lines.append(f'   {key:<26s} {fmt_mean_std([per_seed[s]["sft"].get(key) for s in seeds])}')
  lines.append(f'   {"class":<14s} {"tool accuracy":>16s} {"exact match":>16s}  '
               'goal met (every seed)')
  for op in mcommands.ALL_OPS:
    acc = [per_seed[s]['sft'].get(f'tool_accuracy/{op}') for s in seeds]
    exact = [per_seed[s]['sft'].get(f'exact_match/{op}') for s in seeds]
    met = all(a is not None and e is not None and a >= SFT_GOALS['tool_accuracy']
              and e >= SFT_GOALS['exact_match'] for a, e in zip(acc, exact))
    lines.append(f'   {("∅" if op == mcommands.NULL else op):<14s} {fmt_mean_std(acc):>16s} '
                 f'{fmt_mean_std(exact):>16s}  {"yes" if met else "no"}')

  lines += ['', '2. final policies (each phase\'s selected checkpoint) on internal dev; '
            '· = not played']
  header = f'   {"":<16s}' + ''.join(f'{p + " dev":>18s}' for p in RL_PHASES)
  for label, key, _ in CURVE_METRICS:
    lines += [f'   {label}', header]
    for name, policy in POLICIES:
      row = f'   {name:<16s}'
      for dev in RL_PHASES:
        vals = [tables[s][policy].get(dev, {}).get(key) for s in seeds]
        row += f'{fmt_mean_std(vals) if None not in vals else "·":>18s}'
      lines.append(row)
  lines.append('   operation mix (mean over seeds)')
  for name, policy in POLICIES:
    for dev in RL_PHASES:
      if all(dev in tables[s][policy] for s in seeds):
        mix = internal_dev.op_mix(mean_ops([tables[s][policy][dev] for s in seeds]), '')
        lines.append(f'   {name:<6s} on {dev + " dev":<14s} {mix}')

  lines += ['', '3. θ_phase − θ_start on the phase\'s own dev episodes, per seed '
            '(goal: r^task above by more than one std: mean Δ > std of Δ and of θ_start)',
            f'   {"":<34s}' + ''.join(f'{"seed " + str(s):>10s}' for s in seeds)
            + f'{"mean ± std":>18s}  goal']
  for phase in RL_PHASES:
    start_name = POLICY_NAME[curriculum.PREVIOUS_PHASE[phase]]
    for label, key, _ in CURVE_METRICS + (('r^task (last update)', 'r_task', None),):
      deltas, starts = [], []
      for s in seeds:
        run = per_seed[s]['phases'][phase]
        end = run['last'] if label.endswith('(last update)') else run['selected']
        deltas.append(run['curve'][end][key] - run['curve'][0][key])
        starts.append(run['curve'][0][key])
      goal = ''
      if label == 'r^task':
        goal = 'met' if beats_by_one_std(deltas, starts) else 'MISSED'
      elif key == 'rejected_rate':
        goal = 'no rise' if max(deltas) <= 0 else 'rises'
      name = f'{POLICY_NAME[phase]} − {start_name} {label}'
      lines.append(f'   {name:<34s}' + ''.join(f'{d:>+10.3f}' for d in deltas)
                   + f'{fmt_mean_std(deltas, sign=True):>18s}  {goal}')
  if all('sft' in tables[s] and 'phase_c' in tables[s]['sft'] for s in seeds):
    for label, key, _ in CURVE_METRICS:
      deltas = [tables[s]['phase_c']['phase_c'][key] - tables[s]['sft']['phase_c'][key]
                for s in seeds]
      goal = ''
      if key == 'm_ans':
        goal = 'met (θ_C above θ_SFT)' if mean_std(deltas)[0] > 0 else 'MISSED'
      name = f'θ_C − θ_SFT {label} (C dev)'
      lines.append(f'   {name:<34s}' + ''.join(f'{d:>+10.3f}' for d in deltas)
                   + f'{fmt_mean_std(deltas, sign=True):>18s}  {goal}')
  lines.append('   θ_phase is chosen on these same dev episodes (best of its updates), '
               'so its Δ includes that choice; the last update\'s Δ does not.')
  if modes:
    lines += ['', modes_report(per_seed, modes)]
  lines += ['', 'wall seconds per seed: ' + ', '.join(
      f'{s}: {per_seed[s]["wall_s"]:.0f}' for s in seeds)]
  return '\n'.join(lines)


def modes_report(per_seed: Mapping[int, Mapping[str, Any]], modes: Sequence[str]) -> str:
  """Table 4 at this scale: θ_B of each advantage mode on Phase B's dev episodes."""
  seeds = sorted(per_seed)
  lines = ['4. Table 4 at this scale: Phase B per advantage mode from the same θ_A, '
           'θ_B (selected) on Phase B dev episodes (goal: full above no_verify)',
           f'   {"mode":<14s}' + ''.join(f'{label:>18s}' for label, _, _ in CURVE_METRICS)]
  start = [per_seed[s]['modes'][modes[0]]['curve'][0] for s in seeds]
  lines.append(f'   {"θ_A (start)":<14s}' + ''.join(
      f'{fmt_mean_std([p[key] for p in start]):>18s}' for _, key, _ in CURVE_METRICS))
  for mode in modes:
    pts = [per_seed[s]['modes'][mode]['curve'][per_seed[s]['modes'][mode]['selected']]
           for s in seeds]
    lines.append(f'   {mode:<14s}' + ''.join(
        f'{fmt_mean_std([p[key] for p in pts]):>18s}' for _, key, _ in CURVE_METRICS))
  if 'full' in modes and 'no_verify' in modes:
    for key in ('r_task', 'm_ans'):
      full, nov = ([per_seed[s]['modes'][m]['curve'][per_seed[s]['modes'][m]['selected']]
                    [key] for s in seeds] for m in ('full', 'no_verify'))
      diff = [a - b for a, b in zip(full, nov)]
      verdict = 'met' if mean_std(diff)[0] > 0 else 'MISSED'
      lines.append(f'   full − no_verify {METRIC_LABEL[key]}: per seed '
                   + ', '.join(f'{d:+.3f}' for d in diff)
                   + f'; {fmt_mean_std(diff, sign=True)} (goal full above: {verdict})')
  return '\n'.join(lines)


def plot(per_seed: Mapping[int, Mapping[str, Any]], path: str, note: str) -> None:
  """Writes the PNG of the module docstring to `path`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  seeds = sorted(per_seed)
  fig, axes = plt.subplots(2, 4, figsize=(20, 8.5))
  colors = dict(zip(RL_PHASES, ('tab:blue', 'tab:orange', 'tab:green')))
  # SFT: mean ± std train loss over seeds, dev tool accuracy per seed
  ax = axes[0, 0]
  losses = [per_seed[s]['sft_loss'] for s in seeds]
  steps = sorted(set.intersection(*[set(c) for c in losses]))
  m = np.array([mean_std([c[t] for c in losses])[0] for t in steps])
  sd = np.array([mean_std([c[t] for c in losses])[1] for t in steps])
  ax.plot(steps, m, color='k', lw=1, label='train loss')
  ax.fill_between(steps, m - sd, m + sd, color='k', alpha=0.2)
  ax.set(title='SFT: train loss (left), dev tool accuracy (right)', xlabel='step')
  ax2 = ax.twinx()
  for s in seeds:
    ax2.plot([per_seed[s]['sft']['step']], [per_seed[s]['sft']['tool_accuracy']], 'o',
             label=f'dev tool acc, seed {s}')
  ax2.set_ylim(0, 1)
  ax2.legend(fontsize=7, loc='lower left')
  # internal-dev curves, one line + band per RL phase
  agg = {phase: aggregate_curves([per_seed[s]['phases'][phase]['curve'] for s in seeds])
         for phase in RL_PHASES}
  for ax, (label, key, _) in zip(axes[0, 1:], CURVE_METRICS):
    for phase in RL_PHASES:
      x = agg[phase]['update']
      mean, std = (np.array(v) for v in agg[phase][key])
      ax.plot(x, mean, '-o', ms=3, color=colors[phase], label=f'{phase} dev')
      ax.fill_between(x, mean - std, mean + std, color=colors[phase], alpha=0.2)
    ax.set(title=f'internal dev {label} (mean ± std, {len(seeds)} seeds)',
           xlabel='update (0 = θ_start)', ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
  # operation mix per phase, stacked mean shares
  cmap = plt.get_cmap('tab10')
  for ax, phase in zip(axes[1, :3], RL_PHASES):
    x, ops = agg[phase]['update'], agg[phase]['ops']
    if ops:
      ax.stackplot(x, *ops.values(), labels=[('∅' if op == mcommands.NULL else op)
                                             for op in ops],
                   colors=[cmap(OPS.index(op) % 10 if op in OPS else 9) for op in ops])
    ax.set(title=f'{phase} dev: operation mix (mean over seeds)',
           xlabel='update (0 = θ_start)', ylim=(0, 1))
    ax.legend(fontsize=7, loc='upper right')
  # final policies on Phase C's dev episodes
  ax = axes[1, 3]
  tables = [policy_table(per_seed[s]) for s in seeds]
  width = 0.35
  for j, key in enumerate(('r_task', 'm_ans')):
    stats = [mean_std([t[p].get('phase_c', {}).get(key) for t in tables])
             for _, p in POLICIES]
    ax.bar(np.arange(len(POLICIES)) + j * width, [np.nan_to_num(a) for a, _ in stats],
           width, yerr=[np.nan_to_num(b) for _, b in stats], capsize=3,
           label=METRIC_LABEL[key])
  ax.set_xticks(np.arange(len(POLICIES)) + width / 2)
  ax.set_xticklabels([name for name, _ in POLICIES])
  ax.set(title='final policies on phase_c dev (mean ± std)', ylim=(0, 1))
  ax.legend(fontsize=7)
  for ax in list(axes[0, 1:]) + list(axes[1, :3]):
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  if note:
    fig.suptitle(note, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      epilog='See the module docstring (experiments/benchmarks/learning_curve.py) for '
      'what is printed and the run time.')
  parser.add_argument('--workdir', default='/tmp/vermem_learning_curve',
                      help='one seed<k>/ run directory per seed, plus the PNG and JSON')
  parser.add_argument('--seeds', nargs='+', default=[str(s) for s in SEEDS],
                      help='seeds, space- or comma-separated (--seeds 42 43 or '
                      '--seeds=42,43 as experiments/sweep.py)')
  parser.add_argument('--dev_episodes', type=int, default=16,
                      help='internal-dev episodes each RL phase scores at θ_start and '
                      'after every update (default 16)')
  parser.add_argument('--modes', default='',
                      help='comma-separated advantage modes to run Phase B with from '
                      f'the same θ_A (Table 4), of {", ".join(advantages.MODES)}; '
                      'e.g. full,no_verify')
  parser.add_argument('--override', type=parse_override, nargs='+', action='extend',
                      default=[], metavar='SECTION.FIELD=VALUE',
                      help='config override for every phase, e.g. rl.num_updates=12 '
                      f'(not seed or {", ".join(DEV_FIELDS)}: see --seeds, '
                      '--dev_episodes)')
  return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  """Parses and checks the flags; a bad one exits with status 2 and names it."""
  parser = build_parser()
  args = parser.parse_args(argv)
  if not args.workdir.strip():
    parser.error('--workdir is empty')
  try:
    args.seeds = [int(x) for a in args.seeds for x in a.split(',') if x.strip()]
  except ValueError:
    parser.error(f'--seeds: expected integers, got {" ".join(args.seeds)!r}')
  if not args.seeds:
    parser.error('--seeds is empty')
  if min(args.seeds) < 0:
    parser.error(f'--seeds must be >= 0, got {args.seeds}')
  if len(set(args.seeds)) != len(args.seeds):
    parser.error(f'--seeds repeats a seed: {args.seeds}')
  if args.dev_episodes < 1:
    parser.error(f'--dev_episodes must be >= 1, got {args.dev_episodes}')
  args.modes = [m.strip() for m in args.modes.split(',') if m.strip()]
  for mode in args.modes:
    if mode not in advantages.MODES:
      parser.error(f'--modes: unknown advantage mode {mode!r}; expected some of '
                   f'{", ".join(advantages.MODES)}')
  if len(set(args.modes)) != len(args.modes):
    parser.error(f'--modes repeats a mode: {",".join(args.modes)}')
  for key, _ in args.override:
    if key == 'seed' or key in DEV_FIELDS:
      parser.error(f'--override {key}: set by this script (use --seeds / --dev_episodes)')
  try:
    for phase in curriculum.PHASE_ORDER:
      phase_config(phase, args.seeds[0], args.override)
  except ValueError as e:
    parser.error(str(e))
  return args


def collect_seed(seed: int, seed_dir: str, overrides: Overrides, dev_episodes: int,
                 modes: Sequence[str]) -> dict[str, Any]:
  """Runs one seed (curriculum, then the Phase B modes) and reads its figures."""
  wall = run_seed(seed, seed_dir, overrides)
  sft_dir = phase_plan.phase_dir(seed_dir, 'sft')
  out: dict[str, Any] = {
      'sft': sft_figures(sft_dir, selected_step(sft_dir)),
      'sft_loss': sft_loss_curve(sft_dir),
      'phases': {}, 'modes': {},
      'posthoc': {policy: point(figures, '', start=True) for policy, figures in
                  posthoc_figures(seed_dir, seed, overrides, dev_episodes).items()}}
  for phase in RL_PHASES:
    d = phase_plan.phase_dir(seed_dir, phase)
    out['phases'][phase] = read_phase(d, dev_episodes, selected_step(d))
  for mode in modes:
    d, mode_wall = mode_phase_b_dir(seed, seed_dir, mode, overrides)
    wall += mode_wall
    out['modes'][mode] = read_phase(d, dev_episodes, selected_step(d))
  out['wall_s'] = wall
  return out


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t0 = time.time()
  per_seed = {}
  try:
    os.makedirs(args.workdir, exist_ok=True)
    for seed in args.seeds:
      overrides = [*args.override, *dev_overrides(args.dev_episodes, seed, args.override)]
      per_seed[seed] = collect_seed(seed, os.path.join(args.workdir, f'seed{seed}'),
                                    overrides, args.dev_episodes, args.modes)
      print(f'seed {seed}: {per_seed[seed]["wall_s"]:.0f} s (runs), '
            f'{time.time() - t0:.0f} s so far', flush=True)
  except (ValueError, OSError, phase_plan.MissingPrerequisiteError,
          workdir_lock.PhaseLockedError, checkpoint_values.CheckpointError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  note = stand_in_note(phase_config('phase_c', args.seeds[0], args.override))
  text = report(per_seed, dev_episodes=args.dev_episodes, note=note, modes=args.modes)
  print('\n' + text)
  png = os.path.join(args.workdir, 'learning_curve.png')
  plot(per_seed, png, note)
  with open(os.path.join(args.workdir, 'learning_curve.json'), 'w') as f:
    json.dump({'note': note, 'dev_episodes': args.dev_episodes, 'modes': args.modes,
               'seeds': {str(s): r for s, r in per_seed.items()}}, f, indent=1)
  print(f'\nwrote {png} and learning_curve.json; total {time.time() - t0:.0f} s '
        f'(load average {os.getloadavg()[0]:.1f})'
        + (f'\nNOTE: {note}.' if note else ''))
  return 0


if __name__ == '__main__':
  sys.exit(main())
