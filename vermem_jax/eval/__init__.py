"""vermem_jax.eval: held-out evaluation (SPEC §7; paper Appendix C).

Modules:
  hotpotqa_metrics  normalize_answer, exact_match, f1_score (official HotpotQA script).
  episodes          HotpotQA validation episodes, the Base baseline, the batched run.
  metrics           per-episode records (EM, F1, SF recall, TN, TC, op mix) and means.
  judges            answer judge (J_judge) and memory-quality judge (MQ).
  frontier          budget-controlled efficiency frontier (TN@S*, SR@B*).
  aggregate         mean ± std over seeds; Markdown / CSV / JSON tables.
  plots             frontier and bar-chart PNGs.
  paper_tables      Table-2 / Table-5 style tables from several evaluations.

The driver that loads checkpoints and writes an evaluation's files is
`vermem_jax.train.evaluate` (it sits above the trainers' checkpoint code).
"""
