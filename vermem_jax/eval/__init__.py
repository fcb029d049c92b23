"""vermem_jax.eval: held-out evaluation (SPEC §7; paper Appendix C).

Modules:
  hotpotqa_metrics  normalize_answer, exact_match, f1_score (official HotpotQA script).
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

The driver that loads checkpoints and writes an evaluation's files is
`vermem_jax.train.evaluate` (it sits above the trainers' checkpoint code), with
`vermem_jax.train.eval_benchmark` for the interactive benchmarks.
"""
