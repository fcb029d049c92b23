"""Table 2 and the efficiency frontier across benchmarks (paper Table 2, Table 3,
Figure 2; Appendix C.5, C.7; SPEC §7).

Inputs are finished evaluations, one `results.json` per benchmark
(`eval.aggregate.write_results`: `<workdir>/eval_<benchmark>/results.json`), each
holding per-seed summaries per policy. For every row (a policy of one workdir, or a
method of a sweep) this module computes, per seed and then mean ± std over seeds
(sample std; none with one seed):

  ALFWorld SR, SciWorld SR, BabyAI SR   success rate, percent;
  PDDL PR                               progress rate, percent (100 x mean progress);
  HotpotQA 100·J_judge                  absent without an answer judge (never
                                        replaced by another number; EM % is shown
                                        beside it, outside the Average);
  Average                               the mean of the row's scores present at each
                                        seed (the paper's is over all five; a row
                                        with fewer says "k of 5");
  frontier                              the macro-average success curve over the
                                        frontier benchmarks evaluated (paper C.7:
                                        ALFWorld, SciWorld, BabyAI), per seed, then
                                        mean ± std; TN@S* on the mean curve (first
                                        crossing, interpolated) and SR@B* (paper C.7).

Scores a stand-in task solver produced (the oracle-evidence reader, the gold-plan
solver) carry a '†' and a line naming the stand-in: they measure the plumbing, not the
method. The seed aggregation and the frontier numbers reuse `eval.aggregate` and
`eval.frontier`; the figure is `eval.plots.plot_frontier`.
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Mapping, Optional, Sequence

from vermem_jax.eval import aggregate
from vermem_jax.eval import frontier
from vermem_jax.eval import plots

# Table 2's columns in the paper's order: benchmark -> (header, summary key, scale).
COLUMNS = {
    'alfworld': ('ALFWorld SR', 'success_rate', 1.0),
    'scienceworld': ('SciWorld SR', 'success_rate', 1.0),
    'pddl': ('PDDL PR', 'progress_rate', 1.0),
    'babyai': ('BabyAI SR', 'success_rate', 1.0),
    'hotpotqa': ('HotpotQA 100·J_judge', 'j_judge', 100.0),
}
BENCHMARKS = tuple(COLUMNS)
# Paper C.7: the frontier macro-averages success over these.
FRONTIER_BENCHMARKS = ('alfworld', 'scienceworld', 'babyai')
# Solver backends whose numbers come from a stand-in, not an LLM.
STAND_IN_BACKENDS = ('oracle', 'gold_plan')
EM_KEY = 'hotpotqa_em'
AVERAGE = 'average'
STAND_IN_MARK = '†'


def results_subdir(benchmark: str) -> str:
  """The evaluation folder of a benchmark in a workdir ('eval_pddl')."""
  return f'eval_{benchmark}'


def collect_workdir(workdir: str) -> dict[str, dict[str, Any]]:
  """{benchmark: results.json} for each `<workdir>/eval_<benchmark>/results.json`
  that exists, in Table 2's column order."""
  out = {}
  for b in BENCHMARKS:
    path = os.path.join(workdir, results_subdir(b), 'results.json')
    if os.path.exists(path):
      with open(path) as f:
        out[b] = json.load(f)
  return out


def is_stand_in(results: Mapping[str, Any]) -> bool:
  """Whether an evaluation's solver is a stand-in (results meta, else its label)."""
  backend = (results.get('meta') or {}).get('solver_backend')
  if backend is not None:
    return backend in STAND_IN_BACKENDS
  label = str(results.get('solver', ''))
  return 'STAND-IN' in label or 'DIAGNOSTIC' in label


def per_seed_of(results: Mapping[str, Any], policy: str) -> dict[int, dict]:
  """{seed: summary} of one policy in one results.json ({} when not evaluated)."""
  out = {}
  for seed, by_policy in (results.get('per_seed') or {}).items():
    if policy in by_policy:
      out[int(seed)] = by_policy[policy]
  return out


def workdir_rows(by_bench: Mapping[str, Mapping[str, Any]]
                 ) -> list[tuple[str, dict[str, dict[int, dict]]]]:
  """[(policy, {benchmark: {seed: summary}})]: one row per policy of a workdir, in
  order of first appearance (Base first when evaluated)."""
  names: list[str] = []
  for res in by_bench.values():
    for p in res.get('aggregate', {}):
      if p not in names:
        names.append(p)
  if 'base' in names:
    names.insert(0, names.pop(names.index('base')))
  return [(p, {b: per_seed_of(res, p) for b, res in by_bench.items()
               if per_seed_of(res, p)}) for p in names]


def _score(summary: Mapping[str, Any], benchmark: str) -> Optional[float]:
  _, key, scale = COLUMNS[benchmark]
  value = summary.get(key)
  return None if value is None else float(value) * scale


def _budgets(by_bench: Mapping[str, Mapping[str, Any]],
             benchmarks: Sequence[str]) -> Optional[list[int]]:
  found = {b: tuple((by_bench[b].get('meta') or {}).get('budgets') or ())
           for b in benchmarks}
  distinct = set(found.values())
  if len(distinct) > 1:
    raise ValueError(f'the frontier needs the same eval.budgets in every benchmark; '
                     f'got {found}')
  budgets = distinct.pop() if distinct else ()
  return [int(x) for x in budgets] or None


def build(rows: Sequence[tuple[str, Mapping[str, Mapping[int, Mapping[str, Any]]]]],
          by_bench: Mapping[str, Mapping[str, Any]], *, target_success: float,
          target_budget: float,
          frontier_benchmarks: Sequence[str] = FRONTIER_BENCHMARKS) -> dict[str, Any]:
  """The table's numbers (module docstring).

  Args:
    rows: [(row name, {benchmark: {seed: summary}})] (`workdir_rows`, or a sweep's).
    by_bench: {benchmark: results.json} the rows come from (solver labels, budgets).
    target_success, target_budget: S* and B* (config eval.target_success /
      eval.target_budget).
    frontier_benchmarks: the benchmarks the frontier macro-averages (those evaluated).

  Returns:
    {'aggregate': {row: {<benchmark>, 'average', 'hotpotqa_em', 'tn_at_target',
    'sr_at_budget': stats; 'frontier': curve or None}}, 'present': benchmarks with a
    score, 'average_over': {row: [benchmarks]}, 'frontier_benchmarks', 'budgets',
    'solvers': {benchmark: label}, 'stand_in': {benchmark: bool}, 'seeds'}.

  Raises:
    ValueError: no row, or frontier benchmarks evaluated with different budgets.
  """
  if not rows:
    raise ValueError('table2: no evaluated policy; run the eval_* configs first')
  fr_set = [b for b in FRONTIER_BENCHMARKS
            if b in frontier_benchmarks and b in by_bench]
  budgets = _budgets(by_bench, fr_set) if fr_set else None
  per_seed: dict[int, dict[str, dict]] = {}
  average_over: dict[str, list[str]] = {}
  for name, sources in rows:
    seeds = sorted({s for by_seed in sources.values() for s in by_seed})
    scores = {b: {s: _score(sources[b][s], b) for s in sources[b]} for b in sources}
    # The benchmarks scored at every seed of the row enter its Average.
    over = [b for b in BENCHMARKS if b in scores
            and all(scores[b].get(s) is not None for s in seeds)]
    average_over[name] = over
    for s in seeds:
      row = per_seed.setdefault(s, {}).setdefault(name, {})
      for b in BENCHMARKS:
        if b in scores:
          row[b] = scores[b].get(s)
      row[AVERAGE] = (sum(scores[b][s] for b in over) / len(over)) if over else None
      hq = sources.get('hotpotqa', {}).get(s)
      row[EM_KEY] = None if hq is None or hq.get('em') is None else 100.0 * hq['em']
      curves = [sources[b][s].get('frontier_curve') for b in fr_set
                if s in sources.get(b, {})]
      if budgets and len(curves) == len(fr_set) and all(c is not None for c in curves):
        row['frontier_curve'] = frontier.macro_average(curves)
  agg = aggregate.aggregate(per_seed, budgets=budgets or [],
                            target_success=float(target_success),
                            target_budget=float(target_budget))
  present = [b for b in BENCHMARKS
             if any(st.get(b, {}).get('n') for st in agg.values())]
  return {'aggregate': agg, 'present': present, 'average_over': average_over,
          'frontier_benchmarks': fr_set, 'budgets': budgets,
          'target_success': float(target_success), 'target_budget': float(target_budget),
          'solvers': {b: r.get('solver', '') for b, r in by_bench.items()},
          'judges': {b: r.get('judge') for b, r in by_bench.items()},
          'stand_in': {b: is_stand_in(r) for b, r in by_bench.items()},
          'seeds': sorted(per_seed)}


def _short(benchmark: str) -> str:
  return COLUMNS[benchmark][0].split()[0]


def _cell(stats: Optional[Mapping[str, Any]], decimals: int, mark: str = '') -> str:
  if not stats or stats.get('mean') is None:
    return aggregate.ABSENT
  text = f'{stats["mean"]:.{decimals}f}'
  if stats.get('std') is not None:
    text += f' ± {stats["std"]:.{decimals}f}'
  return text + mark


def markdown(table: Mapping[str, Any]) -> str:
  """Table 2 and the frontier summary in Markdown."""
  agg, stand_in = table['aggregate'], table['stand_in']
  seeds = ', '.join(str(s) for s in table['seeds'])
  lines = [f'### Table 2: success / progress by benchmark (mean ± std over seeds '
           f'{seeds})', '']
  by_label: dict[str, list[str]] = {}
  for b in BENCHMARKS:
    if b in table['solvers']:
      by_label.setdefault(table['solvers'][b], []).append(b)
  for label, benches in by_label.items():
    mark = f' {STAND_IN_MARK}' if stand_in.get(benches[0]) else ''
    lines.append('- Task solver, ' + ', '.join(_short(b) for b in benches)
                 + f'{mark}: {label}')
  missing = [_short(b) for b in BENCHMARKS if b not in table['solvers']]
  if missing:
    lines.append(f'- Not evaluated ({aggregate.ABSENT}): ' + ', '.join(missing))
  if 'hotpotqa' in table['solvers']:
    judge = table.get('judges', {}).get('hotpotqa')
    lines.append('- HotpotQA judge: ' + (judge or f'none — 100·J_judge is '
                                          f'{aggregate.ABSENT}'))
  if any(stand_in.values()):
    lines.append(f'- {STAND_IN_MARK} a stand-in task solver produced these numbers, '
                 'not an LLM: they measure the adapter, the memory plumbing and the '
                 'budget, not the method.')
  lines.append('- Average: the mean of the scores present in the row (the paper '
               'averages all five); HotpotQA EM % is shown for reference and is not '
               'averaged.')
  lines.append('')
  head = ['policy'] + [COLUMNS[b][0] for b in BENCHMARKS] + ['Average', 'HotpotQA EM %']
  lines += ['| ' + ' | '.join(head) + ' |', '|' + '|'.join(['---'] * len(head)) + '|']
  for name, entry in agg.items():
    cells = [name]
    for b in BENCHMARKS:
      cells.append(_cell(entry.get(b), 1 if b != 'hotpotqa' else 2,
                         STAND_IN_MARK if stand_in.get(b) else ''))
    over = table['average_over'].get(name, [])
    avg = _cell(entry.get(AVERAGE), 2,
                STAND_IN_MARK if any(stand_in.get(b) for b in over) else '')
    if over and len(over) < len(BENCHMARKS):
      avg += f' ({len(over)} of {len(BENCHMARKS)}: ' + ', '.join(
          _short(b) for b in over) + ')'
    cells += [avg, _cell(entry.get(EM_KEY), 1,
                         STAND_IN_MARK if stand_in.get('hotpotqa') else '')]
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines += ['', _frontier_markdown(table)]
  return '\n'.join(lines) + '\n'


def _frontier_markdown(table: Mapping[str, Any]) -> str:
  fr_set = table['frontier_benchmarks']
  if not fr_set or not table['budgets']:
    return ('### Efficiency frontier\n\nNot computed: none of '
            + ', '.join(_short(b) for b in FRONTIER_BENCHMARKS)
            + ' was evaluated (paper C.7 macro-averages their success rates).\n')
  names = ', '.join(_short(b) for b in fr_set)
  missing = [_short(b) for b in FRONTIER_BENCHMARKS if b not in fr_set]
  mark = STAND_IN_MARK if any(table['stand_in'].get(b) for b in fr_set) else ''
  s_star, b_star = table['target_success'], table['target_budget']
  lines = [f'### Efficiency frontier: macro SR over {names}'
           + (f' ({", ".join(missing)} not evaluated)' if missing else ''), '',
           f'Hard online-token budgets {table["budgets"][0]} … {table["budgets"][-1]}; '
           f'S* = {s_star:g}, B* = {b_star:g}. TN@S* is read on the mean curve '
           '("never" when it does not reach S*); figure: frontier_table2.png.', '',
           f'| policy | SR@B* % | TN@S* | SR at each budget % |', '|---|---|---|---|']
  for name, entry in table['aggregate'].items():
    fr = entry.get('frontier')
    if not fr:
      lines.append(f'| {name} | {aggregate.ABSENT} | {aggregate.ABSENT} | '
                   'not every frontier benchmark evaluated |')
      continue
    tn = entry['tn_at_target']
    tn_text = ('never' if tn['mean'] is None else _cell(tn, 0)) + mark
    curve = ' / '.join(f'{v:.0f}' for v in fr['mean'])
    lines.append(f'| {name} | {_cell(entry["sr_at_budget"], 1, mark)} | {tn_text} | '
                 f'{curve}{mark} |')
  return '\n'.join(lines) + '\n'


def write(out_dir: str, table: Mapping[str, Any]) -> dict[str, str]:
  """Writes table2.md, table2.csv, table2.json and frontier_table2.png (when a
  frontier exists); returns {kind: path}."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {'md': os.path.join(out_dir, 'table2.md'),
           'csv': os.path.join(out_dir, 'table2.csv'),
           'json': os.path.join(out_dir, 'table2.json')}
  with open(paths['md'], 'w') as f:
    f.write(markdown(table))
  keys = list(BENCHMARKS) + [AVERAGE, EM_KEY, 'sr_at_budget', 'tn_at_target']
  with open(paths['csv'], 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['policy'] + [f'{k}_{s}' for k in keys for s in ('mean', 'std')]
                    + ['average_over'])
    for name, entry in table['aggregate'].items():
      writer.writerow([name] + [(entry.get(k) or {}).get(s) for k in keys
                                for s in ('mean', 'std')]
                      + [' '.join(table['average_over'].get(name, []))])
  with open(paths['json'], 'w') as f:
    json.dump(aggregate.json_safe(dict(table)), f, indent=1, sort_keys=True)
  if table['budgets']:
    stand_in = any(table['stand_in'].get(b) for b in table['frontier_benchmarks'])
    fr = plots.plot_frontier(
        table['aggregate'], os.path.join(out_dir, 'frontier_table2.png'),
        target_success=table['target_success'], target_budget=table['target_budget'],
        title='Macro SR over ' + ', '.join(_short(b) for b in table['frontier_benchmarks'])
        + (f'\n{STAND_IN_MARK} stand-in task solver (not an LLM)' if stand_in else ''))
    if fr:
      paths['frontier'] = fr
  return paths
