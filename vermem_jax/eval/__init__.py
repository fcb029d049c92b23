"""vermem_jax.eval: evaluation metrics.

Modules:
  hotpotqa_metrics  normalize_answer, exact_match, f1_score (official HotpotQA script).
  frontier          budget-controlled efficiency frontier (SPEC §7).
"""
