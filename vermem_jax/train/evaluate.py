"""HotpotQA held-out evaluation of a workdir's policies (paper Appendix C; SPEC §7).

`run_evaluation(config, workdir)` evaluates every policy of `config.eval.policies`
(`train.eval_policies`: Base and the workdir's selected phase checkpoints by default)
on the HotpotQA validation (distractor) questions, for each seed of `eval.seeds`:

  1. questions: `eval.num_questions` drawn with the seed (fixed order per seed;
     0 = the whole file, the paper's protocol);
  2. episodes (`eval.episodes`): one per question, all policies on the same
     questions, batched (one sampler call per step across the live episodes of a
     chunk of `eval.batch_size` questions), greedy
     policy and solver, no verifier, no label in any policy or LLM-solver input;
  3. records (`eval.metrics`): EM, F1, supporting-fact recall, TN, TC (executed /
     rejected), invalid commands, op mix; J_judge and MQ from `eval.judge` when a
     backend is set (absent otherwise); success by `eval.success_rule`;
  4. the budget frontier (`eval.frontier`): success rate at each `eval.budgets` hard
     budget, derived exactly from the unbudgeted run, or rerun per budget with
     `eval.frontier_reruns`;
then aggregates over seeds (`eval.aggregate`) and writes to `eval.output_dir`
(default `<workdir>/eval_hotpotqa/`):

  episodes.jsonl     one line per (seed, policy, budget, question): the record with
                     every decision and its tokens (budget null = unbudgeted run);
  results.md / .csv  mean ± std per policy (the solver label on top);
  results.json       every figure (per-seed summaries, frontier curves, meta);
  frontier.png, bars_<metric>.png.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

from absl import logging
import ml_collections

from vermem_jax import config_util
from vermem_jax.envs import hotpotqa
from vermem_jax.eval import aggregate
from vermem_jax.eval import episodes
from vermem_jax.eval import frontier
from vermem_jax.eval import judges
from vermem_jax.eval import metrics
from vermem_jax.eval import plots
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.train import eval_policies
from vermem_jax.train import setup as setup_lib
from vermem_jax.train import task_solver_setup

OUTPUT_SUBDIR = 'eval_hotpotqa'
TITLE = 'HotpotQA validation (distractor)'


def output_dir(config: ml_collections.ConfigDict, workdir: str) -> str:
  return config.eval.output_dir or os.path.join(workdir, OUTPUT_SUBDIR)


def _run_policy(questions, *, base, policy, solver, tok, exec_cfg, label, seed, budget,
                batch_size):
  """Records of one policy on `questions`, `batch_size` episodes advancing together
  (0 = all at once); each chunk's episode results are dropped once recorded."""
  records = []
  step = int(batch_size) or max(len(questions), 1)
  for start in range(0, len(questions), step):
    specs = [episodes.build_episode(ex, count_tokens=tok.count_tokens,
                                    context_budget=exec_cfg.context_budget, base=base,
                                    token_budget=budget)
             for ex in questions[start:start + step]]
    results = episodes.run(specs, policy, solver, count_tokens=tok.count_tokens,
                           executor_config=exec_cfg)
    records += [metrics.episode_record(r, policy=label, seed=seed, budget=budget)
                for r in results]
  return records


def run_evaluation(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs the evaluation (module docstring) and returns
  {'aggregate', 'per_seed', 'paths', 'table' (the Markdown text), 'wall_time_s'}.

  Raises:
    ValueError: a bad config field (named); checkpoints.CheckpointError: a requested
    phase without a restorable checkpoint.
  """
  t0 = time.time()
  ev = config.eval
  seeds = [int(s) for s in ev.seeds]
  budgets = [int(b) for b in ev.budgets]
  judge_cfg = config_util.dataclass_from_mapping(judges.JudgeConfig, ev.judge.to_dict())
  rule = metrics.resolve_success_rule(ev.success_rule, bool(judge_cfg.backend))
  episodes.check_greedy(config.solver.temperature, config.solver.top_p,
                        'config.solver.temperature/top_p')
  mc = setup_lib.model_config_from(config)
  tok = setup_lib.load_tokenizer_for(config, mc)
  mesh = setup_lib.make_mesh_from(config)
  exec_cfg = config_util.dataclass_from_mapping(ExecutorConfig, config.memory.to_dict(),
                                                overrides={'phase': 'C'})
  examples = hotpotqa.load_from_config(
      hotpotqa.DataConfig.from_config(config.data.to_dict()), hotpotqa.VALIDATION)
  by_id = {ex.id: ex for ex in examples}
  solver = task_solver_setup.make_task_solver(config, tok, examples, mesh=mesh)
  judge = judges.make_judge(judge_cfg, tokenizer=tok)
  out_dir = output_dir(config, workdir)
  os.makedirs(out_dir, exist_ok=True)
  jsonl_path = os.path.join(out_dir, 'episodes.jsonl')
  per_seed: dict[int, dict[str, dict]] = {}
  infos: dict[str, list] = {}
  timings: dict[str, float] = {}
  loaded: dict[tuple, Any] = {}
  try:
    with open(jsonl_path, 'w') as jsonl:
      for seed in seeds:
        wd = eval_policies.seed_workdir(workdir, seed)
        questions = episodes.select_questions(examples, int(ev.num_questions), seed)
        per_seed[seed] = {}
        for source in eval_policies.parse_policies(ev.policies, wd):
          key = (source, wd if source.kind == 'phase' else '')
          if key not in loaded:
            loaded[key] = eval_policies.load_policy(source, config, wd, tok=tok,
                                                    mesh=mesh)
          make_policy, info = loaded[key]
          infos.setdefault(source.label, []).append(dict(info, seed=seed))
          run_kw = dict(base=source.kind == 'base', solver=solver, tok=tok,
                        exec_cfg=exec_cfg, label=source.label, seed=seed,
                        batch_size=int(ev.batch_size))
          t1 = time.time()
          records = _run_policy(questions, policy=make_policy(seed), budget=None,
                                **run_kw)
          runs = [records]
          if ev.frontier_reruns:
            runs += [_run_policy(questions, policy=make_policy(seed), budget=b, **run_kw)
                     for b in budgets]
          for run in runs:
            if judge is not None:
              judges.judge_records(run, by_id, judge)
            metrics.apply_success_rule(run, rule, float(ev.judge_success_threshold))
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
          logging.info('eval %s seed %d: EM %.3f, SR %.1f%%, TN %.0f (%.1fs)',
                       source.label, seed, summary['em'], summary['success_rate'],
                       summary['tn'], timings[f'{source.label}/seed_{seed}'])
  finally:
    if judge is not None:
      judge.close()
  agg = aggregate.aggregate(per_seed, budgets=budgets,
                            target_success=float(ev.target_success),
                            target_budget=float(ev.target_budget))
  judge_label = (f'{judge_cfg.backend}: {judge_cfg.model or judge_cfg.checkpoint_path}'
                 if judge is not None else None)
  num_q = {str(s): len(episodes.select_questions(examples, int(ev.num_questions), s))
           for s in seeds}
  wall = time.time() - t0
  meta = {'workdir': os.path.abspath(workdir), 'policies': infos, 'budgets': budgets,
          'target_success': float(ev.target_success),
          'target_budget': float(ev.target_budget), 'success_rule': rule,
          'frontier': 'reruns' if ev.frontier_reruns else 'derived from unbudgeted runs',
          'judge_counters': dict(judge.counters) if judge is not None else None,
          'seconds': timings, 'wall_time_s': wall, 'scale': config.get('scale')}
  solver_text = task_solver_setup.solver_label(config)
  paths = aggregate.write_results(out_dir, agg, per_seed=per_seed, meta=meta,
                                  solver_label=solver_text, judge_label=judge_label,
                                  num_questions=num_q, seeds=seeds, title=TITLE)
  paths['jsonl'] = jsonl_path
  fr = plots.plot_frontier(agg, os.path.join(out_dir, 'frontier.png'),
                           target_success=float(ev.target_success),
                           target_budget=float(ev.target_budget), title=TITLE)
  if fr:
    paths['frontier'] = fr
  paths['bars'] = plots.plot_bars(agg, out_dir, title=TITLE)
  with open(paths['md']) as f:
    table = f.read()
  return {'aggregate': agg, 'per_seed': per_seed, 'paths': paths, 'table': table,
          'wall_time_s': wall}


def summary_line(result: Mapping[str, Any]) -> str:
  """One line naming where the evaluation wrote its files."""
  p = result['paths']
  return (f'evaluation written to {os.path.dirname(p["md"])}: results.md/.csv/.json, '
          f'episodes.jsonl, {len(p.get("bars", []))} bar charts'
          + (', frontier.png' if p.get('frontier') else ''))
