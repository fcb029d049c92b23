"""vermem_jax.eval: held-out evaluation (SPEC §7; paper Appendix C).

Modules:
  episodes          HotpotQA validation episodes, the Base baseline, the batched run.
  bench_episodes    memory episodes on ALFWorld / ScienceWorld / PDDL / BabyAI
                    (an InteractiveEnv per episode, the same batched loop).
  metrics           per-episode records (EM, F1, SF recall, TN, TC, op mix; success
                    and progress) and means.
  judges            answer judge (J_judge) and memory-quality judge (MQ).
  frontier          budget-controlled efficiency frontier (TN@S*, SR@B*).
  aggregate         mean ± std over seeds; Markdown / CSV / JSON tables.
  plots             frontier and bar-chart PNGs.
  table2            Table 2 over the five benchmarks (mean ± std, Average) and the
                    macro-SR efficiency frontier (TN@S*, SR@B*, PNG).
  paper_tables      a sweep's Table-2 / Table-5 style tables (rows = methods).
  policies          which policies an evaluation runs (Base, phase checkpoints, outside
                    checkpoints) and how each is loaded; one workdir per seed.
  benchmark_suite   the interactive benchmarks' test instances as an evaluation suite.
  evaluate          run_evaluation: every policy on one suite for every seed, then
                    the files (episodes.jsonl, results.md/.csv/.json, PNGs).

The answer metrics (EM, F1, supporting-fact recall) that training's rewards share
live below both, in `vermem_jax.envs.answer_metrics`. `evaluate` and `policies` load
trained checkpoints, so this package sits above `train` in the import order.
"""
