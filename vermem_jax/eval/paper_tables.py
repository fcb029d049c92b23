"""Paper-style result tables from several evaluations (Table 2 and Table 5 layouts).

The sweep driver (experiments/sweep.py) evaluates one workdir per advantage mode
(full, no_verify, plus_local, plus_global), each holding one curriculum per seed, and
writes each evaluation's `results.json` (`eval.aggregate.write_results`). This module
reads them and builds:

  Table-2-style   one row per method: Base, VerMem-noVerify (no_verify's final
                  phase), VerMem (full's final phase), plus any other mode's final
                  phase; the HotpotQA column is 100·J_judge (mean ± std over seeds),
                  with EM and F1 beside it. Without a judge the J_judge column reads
                  "absent" and EM/F1 carry the comparison.
  Table-5-style   one row per advantage mode (the reward-function ablation): J_judge,
                  TN, MQ, TC (with EM, F1 and the invalid rate).

Both tables state the task solver (the oracle reader marked as a diagnostic).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence

# Display names of the advantage modes (paper Table 4 / 18 rows).
MODE_NAMES = {'full': 'VerMem', 'no_verify': 'VerMem-noVerify',
              'plus_local': '+Local', 'plus_global': '+Global'}


def load_results(path: str) -> dict[str, Any]:
  """A `results.json` written by `eval.aggregate.write_results`."""
  with open(path) as f:
    return json.load(f)


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


def table2_markdown(by_mode: Mapping[str, Mapping[str, Any]], *,
                    final_phase: str = 'phase_c') -> str:
  """Table-2-style Markdown (module docstring)."""
  lines = ['### Table 2 style: HotpotQA (mean ± std over seeds)', '',
           _solver_line(by_mode), _judge_line(by_mode), '',
           '| method | HotpotQA 100·J_judge | EM % | F1 % |', '|---|---|---|---|']
  for name, e in table_rows(by_mode, final_phase):
    lines.append(f'| {name} | {_cell(e.get("j_judge"), 100.0, 2)} | '
                 f'{_cell(e.get("em"), 100.0, 1)} | {_cell(e.get("f1"), 100.0, 1)} |')
  return '\n'.join(lines) + '\n'


def table5_markdown(by_mode: Mapping[str, Mapping[str, Any]], *,
                    final_phase: str = 'phase_c') -> str:
  """Table-5-style Markdown: the reward-function ablation, one row per mode."""
  lines = ['### Table 5 style: reward ablation on HotpotQA (mean ± std over seeds)', '',
           _solver_line(by_mode), _judge_line(by_mode), '',
           '| reward | J_judge | TN | MQ | TC | EM % | F1 % | invalid % |',
           '|---|---|---|---|---|---|---|---|']
  for name, e in table_rows(by_mode, final_phase):
    if name == 'Base':
      continue
    lines.append(
        f'| {name} | {_cell(e.get("j_judge"), 1.0, 3)} | {_cell(e.get("tn"), 1.0, 0)} | '
        f'{_cell(e.get("mq"), 1.0, 3)} | {_cell(e.get("tc"), 1.0, 2)} | '
        f'{_cell(e.get("em"), 100.0, 1)} | {_cell(e.get("f1"), 100.0, 1)} | '
        f'{_cell(e.get("invalid_rate"), 100.0, 1)} |')
  return '\n'.join(lines) + '\n'


def write_tables(out_dir: str, by_mode: Mapping[str, Mapping[str, Any]], *,
                 final_phase: str = 'phase_c') -> dict[str, str]:
  """Writes table2.md, table5.md and tables.json (the rows' numbers); returns paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {'table2': os.path.join(out_dir, 'table2.md'),
           'table5': os.path.join(out_dir, 'table5.md'),
           'json': os.path.join(out_dir, 'tables.json')}
  with open(paths['table2'], 'w') as f:
    f.write(table2_markdown(by_mode, final_phase=final_phase))
  with open(paths['table5'], 'w') as f:
    f.write(table5_markdown(by_mode, final_phase=final_phase))
  rows = {name: e for name, e in table_rows(by_mode, final_phase)}
  with open(paths['json'], 'w') as f:
    json.dump({'final_phase': final_phase, 'rows': rows,
               'solvers': sorted({r.get('solver', '') for r in by_mode.values()})},
              f, indent=1, sort_keys=True)
  return paths


def collect(root: str, modes: Sequence[str], subdir: str = 'eval_hotpotqa'
            ) -> dict[str, dict[str, Any]]:
  """{mode: results.json} for each mode whose `<root>/<mode>/<subdir>/results.json`
  exists."""
  out = {}
  for mode in modes:
    path = os.path.join(root, mode, subdir, 'results.json')
    if os.path.exists(path):
      out[mode] = load_results(path)
  return out
