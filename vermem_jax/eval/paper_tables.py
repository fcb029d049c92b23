"""Paper-style result tables from a sweep's evaluations (Table 2 and Table 5 layouts).

The sweep driver (experiments/sweep.py) evaluates one workdir per advantage mode
(full, no_verify, plus_local, plus_global), each holding one curriculum per seed, on
HotpotQA and the interactive benchmarks, and writes each evaluation's `results.json`
(`eval.aggregate.write_results`, `<root>/<mode>/eval_<benchmark>/`). This module reads
them and builds:

  Table-2-style   one row per method: Base, VerMem-noVerify (no_verify's final
                  phase), VerMem (full's final phase), plus any other mode's final
                  phase; ALFWorld / SciWorld / PDDL / BabyAI / HotpotQA 100·J_judge /
                  Average and the efficiency frontier, mean ± std over seeds
                  (`eval.table2`: absent benchmarks and J_judge without a judge read
                  "absent", never another number).
  Table-5-style   one row per advantage mode (the reward-function ablation on
                  HotpotQA): J_judge, TN, MQ, TC (with EM, F1, rejected calls and
                  unparseable decisions per episode).

Both tables state the task solvers (stand-ins marked as such).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence

from vermem_jax.eval import table2

# Display names of the advantage modes (paper Table 4 / 18 rows).
MODE_NAMES = {'full': 'VerMem', 'no_verify': 'VerMem-noVerify',
              'plus_local': '+Local', 'plus_global': '+Global'}


def _cell(stats: Optional[Mapping[str, Any]], scale: float, decimals: int) -> str:
  if not stats or stats.get('mean') is None:
    return 'absent'
  text = f'{stats["mean"] * scale:.{decimals}f}'
  if stats.get('std') is not None:
    text += f' ± {stats["std"] * scale:.{decimals}f}'
  return text


def _row_source(results: Mapping[str, Any], policy: str) -> Optional[Mapping[str, Any]]:
  return results.get('aggregate', {}).get(policy)


def table_rows(by_mode: Mapping[str, Mapping[str, Any]], final_phase: str
               ) -> list[tuple[str, Mapping[str, Any]]]:
  """[(row name, aggregate entry)] in Table-2 order: Base (from the first mode that
  evaluated it), then each mode's `final_phase` policy."""
  rows = []
  for results in by_mode.values():
    base = _row_source(results, 'base')
    if base is not None:
      rows.append(('Base', base))
      break
  order = [m for m in ('no_verify', 'plus_local', 'plus_global', 'full') if m in by_mode]
  order += [m for m in by_mode if m not in order]
  for mode in order:
    entry = _row_source(by_mode[mode], final_phase)
    if entry is not None:
      rows.append((MODE_NAMES.get(mode, mode), entry))
  return rows


def _solver_line(by_mode: Mapping[str, Mapping[str, Any]]) -> str:
  solvers = sorted({r.get('solver', '') for r in by_mode.values()})
  return 'Task solver: ' + '; '.join(solvers)


def _judge_line(by_mode: Mapping[str, Mapping[str, Any]]) -> str:
  judges = sorted({str(r.get('judge')) for r in by_mode.values() if r.get('judge')})
  return 'Judge: ' + ('; '.join(judges) if judges
                      else 'none — J_judge and MQ are absent')


def table5_markdown(by_mode: Mapping[str, Mapping[str, Any]], *,
                    final_phase: str = 'phase_c') -> str:
  """Table-5-style Markdown: the reward-function ablation, one row per mode."""
  lines = ['### Table 5 style: reward ablation on HotpotQA (mean ± std over seeds)', '',
           _solver_line(by_mode), _judge_line(by_mode), '',
           '| reward | J_judge | TN | MQ | TC | EM % | F1 % | rejected calls | unparseable |',
           '|---|---|---|---|---|---|---|---|---|']
  for name, e in table_rows(by_mode, final_phase):
    if name == 'Base':
      continue
    lines.append(
        f'| {name} | {_cell(e.get("j_judge"), 1.0, 3)} | {_cell(e.get("tn"), 1.0, 0)} | '
        f'{_cell(e.get("mq"), 1.0, 3)} | {_cell(e.get("tc"), 1.0, 2)} | '
        f'{_cell(e.get("em"), 100.0, 1)} | {_cell(e.get("f1"), 100.0, 1)} | '
        f'{_cell(e.get("rejected_calls"), 1.0, 2)} | '
        f'{_cell(e.get("unparseable"), 1.0, 2)} |')
  return '\n'.join(lines) + '\n'


def sweep_rows(by_mode_bench: Mapping[str, Mapping[str, Mapping[str, Any]]],
               final_phase: str = 'phase_c'
               ) -> list[tuple[str, dict[str, dict[int, dict]]]]:
  """Table 2's rows from {mode: {benchmark: results.json}} (`table2.build` input):
  Base (per benchmark, from the first mode that evaluated it), then each mode's
  `final_phase` policy, named as in the paper."""
  base: dict[str, dict[int, dict]] = {}
  for by_bench in by_mode_bench.values():
    for bench, res in by_bench.items():
      if bench not in base and table2.per_seed_of(res, 'base'):
        base[bench] = table2.per_seed_of(res, 'base')
  rows = [('Base', base)] if base else []
  order = [m for m in ('no_verify', 'plus_local', 'plus_global', 'full')
           if m in by_mode_bench]
  order += [m for m in by_mode_bench if m not in order]
  for mode in order:
    sources = {b: table2.per_seed_of(res, final_phase)
               for b, res in by_mode_bench[mode].items()
               if table2.per_seed_of(res, final_phase)}
    if sources:
      rows.append((MODE_NAMES.get(mode, mode), sources))
  return rows


def write_tables(out_dir: str, by_mode_bench: Mapping[str, Mapping[str, Any]], *,
                 final_phase: str = 'phase_c',
                 frontier_benchmarks: Sequence[str] = table2.FRONTIER_BENCHMARKS
                 ) -> dict[str, str]:
  """Writes table2.md/.csv/.json (+ frontier_table2.png), table5.md and tables.json
  (the Table-5 rows' numbers); returns their paths. S* and B* are the evaluations'
  own (results meta: eval.target_success / eval.target_budget).

  Raises:
    ValueError: no evaluation, or evaluations with different budgets / S* / B*.
  """
  first: dict[str, Any] = {}
  for by_bench in by_mode_bench.values():
    for bench, res in by_bench.items():
      first.setdefault(bench, res)
  if not first:
    raise ValueError('no evaluation results to tabulate')
  targets = {(float(r.get('meta', {}).get('target_success', 40.0)),
              float(r.get('meta', {}).get('target_budget', 2500.0)))
             for bb in by_mode_bench.values() for r in bb.values()}
  if len(targets) > 1:
    raise ValueError(f'evaluations disagree on (S*, B*): {sorted(targets)}')
  s_star, b_star = targets.pop()
  table = table2.build(sweep_rows(by_mode_bench, final_phase), first,
                       target_success=s_star, target_budget=b_star,
                       frontier_benchmarks=frontier_benchmarks)
  paths = {'table2_' + k: v for k, v in table2.write(out_dir, table).items()}
  paths['table2'] = paths['table2_md']
  by_mode = {m: bb['hotpotqa'] for m, bb in by_mode_bench.items() if 'hotpotqa' in bb}
  paths['table5'] = os.path.join(out_dir, 'table5.md')
  paths['json'] = os.path.join(out_dir, 'tables.json')
  with open(paths['table5'], 'w') as f:
    f.write(table5_markdown(by_mode, final_phase=final_phase) if by_mode else
            '### Table 5 style: reward ablation on HotpotQA\n\nNo HotpotQA '
            'evaluation found.\n')
  rows = {name: e for name, e in table_rows(by_mode, final_phase)}
  with open(paths['json'], 'w') as f:
    json.dump({'final_phase': final_phase, 'table5_rows': rows,
               'solvers': sorted({r.get('solver', '') for r in by_mode.values()})},
              f, indent=1, sort_keys=True)
  return paths


def collect(root: str, modes: Sequence[str]) -> dict[str, dict[str, Any]]:
  """{mode: {benchmark: results.json}} for each mode with at least one
  `<root>/<mode>/eval_<benchmark>/results.json` (`table2.collect_workdir`)."""
  out = {}
  for mode in modes:
    found = table2.collect_workdir(os.path.join(root, mode))
    if found:
      out[mode] = found
  return out
