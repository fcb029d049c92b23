"""Held-out evaluation of a workdir's policies (paper Appendix C; SPEC §7).

`run_evaluation(config, workdir)` evaluates every policy of `config.eval.policies`
(`eval.policies`: Base and the workdir's selected phase checkpoints by default)
on one held-out task set, for each seed of `eval.seeds`. The task set is the config's
suite: HotpotQA validation (distractor) questions for `eval_hotpotqa`
(`HotpotQASuite` below), or one interactive benchmark's test instances for
`eval_alfworld` / `eval_scienceworld` / `eval_pddl` / `eval_babyai`
(`eval.benchmark_suite.BenchmarkSuite`). For each seed:

  1. tasks: `eval.num_questions` questions or instances drawn with the seed (fixed
     order per seed; 0 = all of them, the paper's protocol);
  2. episodes: one per task, all policies on the same tasks, batched (one sampler
     call per step across the live episodes of a chunk of `eval.batch_size` tasks),
     greedy policy and solver, no verifier, no label in any policy or LLM-solver input;
  3. records (`eval.metrics`): TN, TC (executed / rejected), invalid commands, op mix,
     success; HotpotQA: EM, F1, supporting-fact recall, J_judge and MQ from
     `eval.judge` when a backend is set (absent otherwise), success by
     `eval.success_rule`; benchmarks: the environment's success and progress;
  4. the budget frontier (`eval.frontier`): success rate at each `eval.budgets` hard
     budget, derived exactly from the unbudgeted run, or rerun per budget with
     `eval.frontier_reruns`;
then aggregates over seeds (`eval.aggregate`) and writes to `eval.output_dir`
(default `<workdir>/<config name>/`, e.g. `<workdir>/eval_hotpotqa/`):

  episodes.jsonl     one line per (seed, policy, budget, task): the record with
                     every decision and its tokens (budget null = unbudgeted run);
  results.md / .csv  mean ± std per policy (the solver label on top);
  results.json       every figure (per-seed summaries, frontier curves, meta, and
                     the settings that produced them);
  frontier.png, bars_<metric>.png.

An evaluation with other settings or other checkpoints than the one already in that
folder moves the earlier one's files to `previous/<its UTC time>/` first
(`keep_previous`): a second evaluation never silently replaces the results of a
different one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Mapping

from absl import logging
import ml_collections

from vermem_jax import config_util
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.eval import aggregate
from vermem_jax.eval import benchmark_suite
from vermem_jax.eval import episodes
from vermem_jax.eval import frontier
from vermem_jax.eval import judges
from vermem_jax.eval import metrics
from vermem_jax.eval import plots
from vermem_jax.eval import policies as eval_policies
from vermem_jax.eval import recovery
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.train import setup as setup_lib
from vermem_jax.train import task_solver_setup

OUTPUT_SUBDIR = 'eval_hotpotqa'
TITLE = 'HotpotQA validation (distractor)'


def output_subdir(config: ml_collections.ConfigDict) -> str:
  """The default output folder name: the config's name (eval_hotpotqa, eval_pddl)."""
  return config.phase if str(config.phase).startswith('eval_') else OUTPUT_SUBDIR


def output_dir(config: ml_collections.ConfigDict, workdir: str) -> str:
  return config.eval.output_dir or os.path.join(workdir, output_subdir(config))


# What an evaluation writes into its folder (module docstring), and where an earlier
# evaluation's files go when the settings differ.
RESULT_FILES = ('results.md', 'results.csv', 'results.json', 'episodes.jsonl',
                'frontier.png')
PREVIOUS_SUBDIR = 'previous'


def evaluation_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config as JSON values, less what does not change the results (the workdir
  and `eval.output_dir`): stored in results.json's meta as 'settings'."""
  settings = json.loads(json.dumps(config.to_dict(), default=str, sort_keys=True))
  settings.pop('workdir', None)
  settings.get('eval', {}).pop('output_dir', None)
  return settings


def _changes(old: Any, new: Any, prefix: str = '') -> list[str]:
  """'field old -> new' for each leaf that differs (dotted paths)."""
  if isinstance(old, dict) and isinstance(new, dict):
    return [c for k in sorted(set(old) | set(new))
            for c in _changes(old.get(k), new.get(k), f'{prefix}{k}.')]
  return [] if old == new else [f'{prefix[:-1]} {old!r} -> {new!r}']


def evaluation_identity(settings: Mapping[str, Any],
                        infos: Mapping[str, list]) -> dict[str, Any]:
  """What makes two evaluations the same one: the `evaluation_settings` and, per
  policy and seed, the checkpoint it loaded (`policies.load_policy`'s info less its
  label and seed: path, step, and when it was written or its digest)."""
  return {'settings': dict(settings),
          'policies': {label: {str(i['seed']): {k: v for k, v in i.items()
                                                 if k not in ('label', 'seed')}
                               for i in per_seed}
                       for label, per_seed in sorted(infos.items())}}


def keep_previous(out_dir: str, identity: Mapping[str, Any]) -> str | None:
  """Moves the evaluation files in `out_dir` to `out_dir/previous/<UTC time of its
  results.json>/` when they are another evaluation (`evaluation_identity`: other
  settings or other checkpoints; or written by a version that did not record them),
  and says what differs; returns that folder, or None when there is nothing to keep
  (no results, or the same settings and checkpoints: those are replaced, as a rerun
  reproduces them)."""
  results = os.path.join(out_dir, 'results.json')
  if not os.path.exists(results):
    return None
  try:
    with open(results) as f:
      meta = json.load(f).get('meta', {})
    old = evaluation_identity(meta['settings'], meta['policies'])
  except (OSError, ValueError, AttributeError, KeyError, TypeError):
    old = None
  if old == identity:
    return None
  stamp = time.strftime('%Y%m%d-%H%M%S', time.gmtime(os.path.getmtime(results)))
  dest = os.path.join(out_dir, PREVIOUS_SUBDIR, stamp)
  n = 1
  while os.path.exists(dest):
    n += 1
    dest = os.path.join(out_dir, PREVIOUS_SUBDIR, f'{stamp}-{n}')
  os.makedirs(dest)
  for name in sorted(os.listdir(out_dir)):
    if name in RESULT_FILES or (name.startswith('bars_') and name.endswith('.png')):
      shutil.move(os.path.join(out_dir, name), os.path.join(dest, name))
  changes = (_changes(old, dict(identity)) if isinstance(old, dict)
             else ['(its settings were not recorded)'])
  logging.warning('%s held another evaluation (%s%s); its files are kept in %s',
                  out_dir, '; '.join(changes[:4]),
                  f'; {len(changes) - 4} more' if len(changes) > 4 else '', dest)
  return dest


class HotpotQASuite:
  """The HotpotQA validation questions (eval.episodes), the config's task solver and
  the answer / memory judges."""

  subdir = OUTPUT_SUBDIR
  title = TITLE
  table_metrics = aggregate.TABLE_METRICS
  judge_text = None  # the table's judge line comes from judge_label

  def __init__(self, config: ml_collections.ConfigDict, *, tok: Any, mesh: Any,
               exec_cfg: ExecutorConfig):
    ev = config.eval
    self.config = config
    self.tok = tok
    self.exec_cfg = exec_cfg
    self.judge_cfg = judges.JudgeConfig.from_config(ev.judge.to_dict())
    self.rule = metrics.resolve_success_rule(ev.success_rule, bool(self.judge_cfg.backend))
    self.examples = hotpotqa_sources.load_from_config(
        hotpotqa.DataConfig.from_config(config.data.to_dict()), hotpotqa.VALIDATION)
    self.by_id = {ex.id: ex for ex in self.examples}
    self.solver = task_solver_setup.make_task_solver(
        task_solver_setup.SolverSetup.from_config(config), tok, self.examples, mesh=mesh)
    self.solver_label = task_solver_setup.solver_label(config)
    self.judge = judges.make_judge(self.judge_cfg, tokenizer=tok)
    self.judge_label = (f'{self.judge_cfg.backend}: '
                        f'{self.judge_cfg.chat.model or self.judge_cfg.checkpoint_path}'
                        if self.judge is not None else None)

  def items(self, seed: int) -> list:
    return episodes.select_questions(self.examples, int(self.config.eval.num_questions),
                                     seed)

  def run(self, questions, *, policy, base, budget, label, seed, phase='C'
          ) -> list[dict]:
    """Records of one policy on `questions` in op space `phase`, `eval.batch_size`
    episodes advancing together; each chunk's episode results are dropped once
    recorded (each record keeps its `eval.recovery` counts)."""
    records = []
    count = self.tok.count_tokens
    for chunk in episodes.chunks(questions, self.config.eval.batch_size):
      specs = [episodes.build_episode(ex, count_tokens=count,
                                      executor_config=self.exec_cfg, base=base,
                                      token_budget=budget, phase=phase)
               for ex in chunk]
      results = episodes.run(specs, policy, self.solver, count_tokens=count,
                             executor_config=self.exec_cfg)
      for r in results:
        rec = metrics.episode_record(r, policy=label, seed=seed, budget=budget)
        rec['recovery'] = recovery.recovery_counts(r, count, self.exec_cfg)
        records.append(rec)
    return records

  def score(self, records: list[dict], *, base: bool) -> None:
    """Judges (when set; no MQ for Base, whose memory is always empty) and the
    success rule, in place."""
    if self.judge is not None:
      judges.judge_records(records, self.by_id, self.judge, memory=not base)
    metrics.apply_success_rule(records, self.rule,
                               float(self.config.eval.judge_success_threshold))

  def meta(self) -> dict[str, Any]:
    return {'success_rule': self.rule,
            'judge_counters': (dict(self.judge.counters) if self.judge is not None
                               else None)}

  def close(self) -> None:
    if self.judge is not None:
      self.judge.close()


def make_suite(config: ml_collections.ConfigDict, **kwargs: Any) -> Any:
  """The suite of `config.phase` (module docstring); kwargs: tok, mesh, exec_cfg."""
  if config.phase == 'eval_hotpotqa':
    return HotpotQASuite(config, **kwargs)
  return benchmark_suite.BenchmarkSuite(config, **kwargs)


def run_evaluation(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs the evaluation (module docstring) and returns
  {'aggregate', 'per_seed', 'paths', 'table' (the Markdown text), 'wall_time_s',
  'previous' (where an earlier evaluation with other settings or checkpoints was moved,
  `keep_previous`; None when there was none)}.

  Raises:
    ValueError: a bad config field (named); checkpoints.CheckpointError: a requested
    phase without a restorable checkpoint; envs.interactive.BenchmarkUnavailable (an
    ImportError): a benchmark whose extra, runtime or data is missing.
  """
  t0 = time.time()
  ev = config.eval
  seeds = [int(s) for s in ev.seeds]
  budgets = [int(b) for b in ev.budgets]
  episodes.check_greedy(config.solver.temperature, config.solver.top_p,
                        'config.solver.temperature/top_p')
  mc = setup_lib.model_config_from(config)
  tok = setup_lib.load_tokenizer_for(config, mc)
  mesh = setup_lib.make_mesh(setup_lib.MeshConfig.from_section(config.model))
  exec_cfg = config_util.dataclass_from_mapping(ExecutorConfig, config.memory.to_dict(),
                                                overrides={'phase': 'C'})
  suite = make_suite(config, tok=tok, mesh=mesh, exec_cfg=exec_cfg)
  out_dir = output_dir(config, workdir)
  os.makedirs(out_dir, exist_ok=True)
  jsonl_path = os.path.join(out_dir, 'episodes.jsonl')
  # Written beside and moved into place once every policy has run: an evaluation that
  # fails part-way (e.g. on a corrupt checkpoint) leaves the previous results whole.
  partial_path = jsonl_path + '.partial'
  layout = eval_policies.seed_layout(workdir, seeds)
  stale = [n for wd in dict.fromkeys(layout.workdirs.values())
           for n in eval_policies.stale_notes(eval_policies.parse_policies(ev.policies, wd),
                                              wd)]
  for note in stale:
    logging.warning('%s', note)
  sources: dict[str, eval_policies.PolicySource] = {}
  per_seed: dict[int, dict[str, dict]] = {}
  infos: dict[str, list] = {}
  timings: dict[str, float] = {}
  loaded: dict[tuple, Any] = {}
  num_items: dict[str, int] = {}
  try:
    with open(partial_path, 'w') as jsonl:
      for seed in seeds:
        wd = layout.workdirs[seed]
        items = suite.items(seed)
        num_items[str(seed)] = len(items)
        per_seed[seed] = {}
        for source in eval_policies.parse_policies(ev.policies, wd):
          sources.setdefault(source.label, source)
          key = (source, wd if source.kind == 'phase' else '')
          if key not in loaded:
            loaded[key] = eval_policies.load_policy(source, config, wd, tok=tok,
                                                    mesh=mesh)
          make_policy, info = loaded[key]
          infos.setdefault(source.label, []).append(dict(info, seed=seed))
          run_kw = dict(base=source.kind == 'base', label=source.label, seed=seed,
                        phase=eval_policies.op_space(source))
          t1 = time.time()
          records = suite.run(items, policy=make_policy(seed), budget=None, **run_kw)
          runs = [records]
          if ev.frontier_reruns:
            runs += [suite.run(items, policy=make_policy(seed), budget=b, **run_kw)
                     for b in budgets]
          for run in runs:
            suite.score(run, base=source.kind == 'base')
            for r in run:
              jsonl.write(json.dumps(r, sort_keys=True) + '\n')
          summary = metrics.summarize(records)
          if ev.frontier_reruns:
            summary['frontier_curve'] = [
                100.0 * sum(r['success'] for r in run) / len(run) for run in runs[1:]]
          else:
            summary['frontier_curve'] = frontier.success_curve(
                [(r['success'], r['tn']) for r in records], budgets)
          per_seed[seed][source.label] = summary
          timings[f'{source.label}/seed_{seed}'] = time.time() - t1
          logging.info('eval %s %s seed %d: SR %.1f%%, TN %.0f (%.1fs)', suite.subdir,
                       source.label, seed, summary['success_rate'], summary['tn'],
                       timings[f'{source.label}/seed_{seed}'])
  except BaseException:
    if os.path.exists(partial_path):
      os.remove(partial_path)
    raise
  finally:
    suite.close()
  settings = evaluation_settings(config)
  previous = keep_previous(out_dir, evaluation_identity(settings, infos))
  os.replace(partial_path, jsonl_path)
  agg = aggregate.aggregate(per_seed, budgets=budgets,
                            target_success=float(ev.target_success),
                            target_budget=float(ev.target_budget))
  wall = time.time() - t0
  trained = [label for label, info in infos.items() if info[0]['kind'] == 'phase']
  checkpoint_note = layout.note(os.path.abspath(workdir), trained)
  meta = {'workdir': os.path.abspath(workdir), 'config': config.phase,
          'seed_workdirs': {str(s): os.path.abspath(w)
                            for s, w in layout.workdirs.items()},
          'shared_checkpoints': bool(checkpoint_note),
          'op_spaces': {label: eval_policies.op_space(src)
                        for label, src in sources.items()},
          'policies': infos, 'budgets': budgets,
          'target_success': float(ev.target_success),
          'target_budget': float(ev.target_budget),
          'frontier': 'reruns' if ev.frontier_reruns else 'derived from unbudgeted runs',
          'solver_backend': config.solver.backend, 'stale': stale,
          'seconds': timings, 'wall_time_s': wall, 'scale': config.get('scale'),
          'settings': settings, **suite.meta()}
  paths = aggregate.write_results(out_dir, agg, per_seed=per_seed, meta=meta,
                                  solver_label=suite.solver_label,
                                  judge_label=suite.judge_label,
                                  num_questions=num_items, seeds=seeds, title=suite.title,
                                  metrics=suite.table_metrics,
                                  judge_text=suite.judge_text,
                                  notes=[n for n in (
                                      checkpoint_note,
                                      eval_policies.tool_set_note(list(sources.values())),
                                      *stale) if n])
  paths['jsonl'] = jsonl_path
  # A figure copied out of the workdir keeps the solver caveat (the part of the label
  # before its explanation: 'oracle-evidence reader — DIAGNOSTIC stand-in, not an LLM').
  figure_title = f'{suite.title}\nsolver: {suite.solver_label.split(":")[0]}'
  fr = plots.plot_frontier(agg, os.path.join(out_dir, 'frontier.png'),
                           target_success=float(ev.target_success),
                           target_budget=float(ev.target_budget), title=figure_title)
  if fr:
    paths['frontier'] = fr
  paths['bars'] = plots.plot_bars(agg, out_dir, title=figure_title)
  with open(paths['md']) as f:
    table = f.read()
  return {'aggregate': agg, 'per_seed': per_seed, 'paths': paths, 'table': table,
          'wall_time_s': wall, 'previous': previous}


def summary_line(result: Mapping[str, Any]) -> str:
  """One line naming where the evaluation wrote its files."""
  p = result['paths']
  return (f'evaluation written to {os.path.dirname(p["md"])}: results.md/.csv/.json, '
          f'episodes.jsonl, {len(p.get("bars", []))} bar charts'
          + (', frontier.png' if p.get('frontier') else '')
          + (f'; the earlier evaluation there (other settings or checkpoints) is kept '
             f'in {result["previous"]}' if result.get('previous') else ''))
