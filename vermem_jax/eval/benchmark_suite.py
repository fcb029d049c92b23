"""The interactive benchmarks as an evaluation suite (paper Appendix C.1-C.2, C.5).

`BenchmarkSuite` is what `eval.evaluate.run_evaluation` runs for `eval_alfworld`,
`eval_scienceworld`, `eval_pddl` and `eval_babyai`:

  tasks     the adapter's instance list from section `benchmark` (its keys are the
            fields of `Benchmark.config_class`; the official test split by default),
            `eval.num_questions` of them drawn per seed (0 = all, in list order);
  episodes  `eval.bench_episodes.run_instances`: memory episodes through the shared
            batched loop, `eval.batch_size` instances at a time, each with its own
            environment (closed after its chunk), decision limit `eval.max_decisions`
            (0 = `benchmark.max_steps`);
  solver    `task_solver_setup.make_action_solver`: the in-process Qwen or an
            OpenAI-compatible server with the benchmark's action prompt, or the
            gold-plan stand-in (tiny default; its plans are computed once per
            instance, only for the instances evaluated, and every table says it is a
            stand-in);
  metrics   success and progress are the environment's (SR; PDDL's PR = 100 x mean
            progress); there is no judge (J_judge / MQ are HotpotQA's).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from vermem_jax.envs import interactive
from vermem_jax.eval import bench_episodes
from vermem_jax.eval import episodes
from vermem_jax.eval import metrics
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.train import task_solver_setup

# Table columns of a benchmark's results.md: (summary key, header, scale, decimals).
TABLE_METRICS = (
    ('success_rate', 'SR %', 1.0, 1),
    ('progress_rate', 'PR %', 1.0, 1),
    ('tn', 'TN', 1.0, 0),
    ('tc', 'TC', 1.0, 2),
    ('rejected_calls', 'rejected calls', 1.0, 2),
    ('unparseable', 'unparseable', 1.0, 2),
    ('decisions', 'decisions', 1.0, 1),
    ('env_steps', 'actions', 1.0, 1),
    ('invalid_actions', 'invalid actions', 1.0, 1),
    ('sr_at_budget', 'SR@B* %', 1.0, 1),
    ('tn_at_target', 'TN@S*', 1.0, 0),
)
# Display names (paper Table 2 column headers).
TITLES = {'alfworld': 'ALFWorld', 'scienceworld': 'SciWorld', 'pddl': 'PDDL',
          'babyai': 'BabyAI'}


def benchmark_name(config: ml_collections.ConfigDict) -> str:
  """The registry name of an eval_<benchmark> config ('eval_pddl' -> 'pddl')."""
  return str(config.phase)[len('eval_'):]


class BenchmarkSuite:
  """One interactive benchmark's test instances (module docstring).

  Raises (constructor):
    envs.interactive.BenchmarkUnavailable: the extra, Java or the data is missing (the
      message names what to install or set).
    ValueError: a bad `benchmark` field, an unknown instance, or a solver backend
      that cannot act ('oracle').
  """

  judge_label = None
  table_metrics = TABLE_METRICS

  def __init__(self, config: ml_collections.ConfigDict, *, tok: Any, mesh: Any,
               exec_cfg: ExecutorConfig):
    self.config = config
    self.tok = tok
    self.exec_cfg = exec_cfg
    self.name = benchmark_name(config)
    self.subdir = f'eval_{self.name}'
    self.bench = interactive.load_benchmark(self.name)
    try:
      self.bench_config = self.bench.config_class.from_config(config.benchmark.to_dict())
    except (TypeError, ValueError) as e:
      raise ValueError(f'config.benchmark: {e}') from e
    self.instances = list(self.bench.instances(self.bench_config))
    if not self.instances:
      raise ValueError(f'config.benchmark: no {self.name} instance selected')
    self.max_decisions = (int(config.eval.max_decisions)
                          or int(self.bench_config.max_steps))
    self.solver = task_solver_setup.make_action_solver(
        task_solver_setup.SolverSetup.from_config(config), tok, self.bench.action_prompt,
        mesh=mesh)
    self.gold_plan = config.solver.backend == 'gold_plan'
    self.solver_label = task_solver_setup.solver_label(config)
    self.title = (f'{TITLES.get(self.name, self.name)} ({self._split_text()})'
                  + (' — gold-plan stand-in solver' if self.gold_plan else ''))
    self.judge_text = (f'Judge: none (success and progress are the {self.name} '
                       "environment's own)")
    self._planned: dict[str, int] = {}
    self._no_plan: list[str] = []

  def _split_text(self) -> str:
    """Where the instances come from, for the table title."""
    cfg = self.bench_config
    if getattr(cfg, 'split', None):
      where = f'{cfg.split} split'
    elif getattr(cfg, 'problem_dir', None):
      where = ', '.join(cfg.problem_dir.format(domain=d) for d in cfg.domains)
    else:
      where = 'test seeds'
    return f'{where}; {len(self.instances)} instances'

  def items(self, seed: int) -> list:
    return episodes.select_questions(self.instances, int(self.config.eval.num_questions),
                                     seed)

  def _prepare_solver(self, instances) -> None:
    """Gold-plan stand-in: computes missing plans and rewinds every plan."""
    if not self.gold_plan:
      return
    for inst in instances:
      iid = inst.instance_id
      if iid not in self._planned:
        plan = self.bench.gold_plan(inst, self.bench_config)
        self._planned[iid] = len(plan) if plan else 0
        if not plan:
          self._no_plan.append(iid)
        self.solver.set_plan(iid, plan)
    self.solver.restart()

  def run(self, instances, *, policy, base, budget, label, seed, phase='C'
          ) -> list[dict]:
    """Records of one policy on `instances` in op space `phase`, `eval.batch_size`
    episodes advancing together (their environments closed after each chunk)."""
    records = []
    for chunk in episodes.chunks(instances, self.config.eval.batch_size):
      self._prepare_solver(chunk)
      results = bench_episodes.run_instances(
          self.bench, self.bench_config, chunk, policy, self.solver,
          count_tokens=self.tok.count_tokens, executor_config=self.exec_cfg,
          max_decisions=self.max_decisions, base=base, token_budget=budget,
          phase=phase)
      records += [metrics.episode_record(r, policy=label, seed=seed, budget=budget)
                  for r in results]
    return records

  def score(self, records: list[dict], *, base: bool) -> None:
    """Nothing to add: success and progress came from the environment."""
    del records, base

  def meta(self) -> dict[str, Any]:
    return {'benchmark': self.name,
            'benchmark_config': dataclasses.asdict(self.bench_config),
            'instances': [i.instance_id for i in self.instances],
            'max_decisions': self.max_decisions,
            'gold_plan_lengths': dict(self._planned) if self.gold_plan else None,
            'instances_without_gold_plan': list(self._no_plan)}

  def close(self) -> None:
    """Nothing is held between chunks (environments close after each)."""
