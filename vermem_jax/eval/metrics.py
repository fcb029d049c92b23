"""Per-episode evaluation records and their aggregation (paper C.5; SPEC §7).

`episode_record(result, ...)` turns one finished `EpisodeResult` into a JSON-ready
dict (one JSONL line) that keeps everything a figure needs:

  question_id, policy, seed, budget (the hard online-token budget, None = none),
  answer (the solver's final answer or None), reference (the label, for scoring only),
  terminated_by;
  em, f1          official HotpotQA normalization (eval.hotpotqa_metrics);
  j_judge, mq     answer / memory-quality judge scores in [0, 1], None when no judge
                  ran (filled by `eval.judges`; never replaced by another number);
  sf_recall       supporting-fact recall of what the solver saw: the share of the
                  annotated supporting units among the evidence behind C̃_t at the
                  solver's last call (the context its final reply was made from);
  tn              online tokens (SPEC §7): input + output tokens of every policy and
                  solver call, a prompt re-sent at each call counted each time;
                  also tn_policy and tn_solver;
  tc              non-null memory-tool calls (∅ excluded; unparseable text names no
                  tool); tc_executed (accepted) and tc_rejected apart;
  decisions, invalid (decisions T_m rejected, unparseable included), op_counts;
  final_ltm       contents of the active terminal LTM entries (what MQ judges);
  success         the benchmark's success flag (`success_flag`);
  steps           one dict per decision: command, op, accepted, tool call, violation
                  kinds, cost, the four token counts, the solver's kind and answer.

`summarize(records)` gives the means over one policy's episodes of one seed:
EM, F1, J_judge, MQ (None when absent), SF recall, TN, TC (+ executed / rejected),
invalid rate (rejected / decisions), op mix (share of decisions per op), success rate
(percent), answered rate, judge fallbacks. Any benchmark with a success flag per
episode can use `summarize` and the frontier; the HotpotQA fields are optional.
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Mapping, Optional, Sequence

from vermem_jax.envs import environment
from vermem_jax.envs import hotpotqa
from vermem_jax.eval import hotpotqa_metrics

# Success rules for HotpotQA episodes (config `eval.success_rule`).
SUCCESS_RULES = ('auto', 'em', 'judge')
# Means reported by `summarize` (None entries stay None when no record has a value).
MEAN_FIELDS = ('em', 'f1', 'j_judge', 'mq', 'sf_recall', 'tn', 'tn_policy', 'tn_solver',
               'tc', 'tc_executed', 'tc_rejected', 'decisions')


def solver_seen_evidence(result: environment.EpisodeResult) -> frozenset[str]:
  """Evidence units behind what the solver read at its last call (empty if never)."""
  for d in reversed(result.decisions):
    if d.solver_called:
      return environment.context_evidence(d.state_after_memory,
                                          result.spec.answer_context)
  return frozenset()


def supporting_fact_recall(seen: Iterable[str], example: hotpotqa.Example) -> float:
  """|gold ∩ seen| / |gold| over evidence-unit ids; 0.0 without gold units."""
  gold = set(hotpotqa.supporting_unit_ids(example))
  return len(gold & set(seen)) / len(gold) if gold else 0.0


def decision_row(d: environment.DecisionRecord) -> dict[str, Any]:
  """One decision of the JSONL record (tokens of both calls of step t)."""
  b = d.solver_output
  return {'step': d.step, 'command': d.command, 'op': d.op, 'accepted': d.accepted,
          'tool_call': d.is_tool_call, 'violations': [v.kind for v in d.violations],
          'cost': d.cost, 'policy_input_tokens': d.policy_output.input_tokens,
          'policy_output_tokens': d.policy_output.output_tokens,
          'solver_called': d.solver_called, 'solver_input_tokens': b.input_tokens,
          'solver_output_tokens': b.output_tokens, 'solver_kind': b.kind,
          'solver_answer': b.answer}


def episode_record(result: environment.EpisodeResult, *, policy: str, seed: int,
                   budget: Optional[int] = None) -> dict[str, Any]:
  """The JSON record of one HotpotQA evaluation episode (module docstring); `success`
  is set to EM = 1 here and replaced by `apply_success_rule` once judges ran."""
  ex = result.spec.example
  answer = result.final_answer
  em = hotpotqa_metrics.exact_match(answer, ex.answer) if answer is not None else 0.0
  f1 = hotpotqa_metrics.f1_score(answer, ex.answer) if answer is not None else 0.0
  ops = collections.Counter(d.op for d in result.decisions)
  executed = sum(d.is_tool_call and d.accepted for d in result.decisions)
  return {
      'question_id': ex.id, 'episode_id': result.spec.episode_id, 'policy': policy,
      'seed': int(seed), 'budget': budget, 'answer': answer, 'reference': ex.answer,
      'terminated_by': result.terminated_by, 'em': em, 'f1': f1,
      'j_judge': None, 'mq': None, 'judge_fallback': None, 'mq_fallback': None,
      'sf_recall': supporting_fact_recall(solver_seen_evidence(result), ex),
      'tn': result.online_tokens,
      'tn_policy': result.policy_input_tokens + result.policy_output_tokens,
      'tn_solver': result.solver_input_tokens + result.solver_output_tokens,
      'tc': result.tool_calls, 'tc_executed': executed,
      'tc_rejected': result.tool_calls - executed,
      'decisions': result.num_decisions,
      'invalid': sum(not d.accepted for d in result.decisions),
      'op_counts': dict(sorted(ops.items())),
      'final_ltm': [e.content for e in result.final_state.active_entries()],
      'success': em == 1.0,
      'steps': [decision_row(d) for d in result.decisions],
  }


def resolve_success_rule(rule: str, judge_configured: bool) -> str:
  """'em' or 'judge': `rule`, with 'auto' = 'judge' when a judge backend is set, else
  'em'. Raises ValueError for an unknown rule or 'judge' without a judge."""
  if rule not in SUCCESS_RULES:
    raise ValueError(f'eval.success_rule={rule!r}; expected one of {SUCCESS_RULES}')
  if rule == 'auto':
    return 'judge' if judge_configured else 'em'
  if rule == 'judge' and not judge_configured:
    raise ValueError("eval.success_rule='judge' needs eval.judge.backend")
  return rule


def success_flag(record: Mapping[str, Any], rule: str, threshold: float = 0.5) -> bool:
  """HotpotQA success of one record: 'em' -> EM = 1; 'judge' -> J_judge >= threshold
  (an unscored episode, judge fallback 'skip', is unsuccessful)."""
  if rule == 'em':
    return record['em'] == 1.0
  if rule == 'judge':
    return record['j_judge'] is not None and record['j_judge'] >= threshold
  raise ValueError(f'success rule {rule!r}: expected em or judge (resolve_success_rule)')


def apply_success_rule(records: Iterable[dict], rule: str, threshold: float = 0.5
                       ) -> None:
  """Sets `success` of each record in place (`success_flag`)."""
  for r in records:
    r['success'] = success_flag(r, rule, threshold)


def _mean(values: Sequence[float]) -> Optional[float]:
  return float(sum(values) / len(values)) if values else None


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """Means over the records of one policy and seed (module docstring).

  Returns:
    {'n': episodes, <field>: mean for MEAN_FIELDS (None when no record has one; for
    j_judge / mq the mean over the scored episodes, with 'j_judge_scored' /
    'mq_scored' counts), 'success_rate' (percent), 'answered_rate' (percent),
    'invalid_rate' (rejected decisions / decisions), 'op_mix' ({op: share of
    decisions}), 'judge_fallbacks', 'mq_fallbacks' (counts)}.

  Raises:
    ValueError: no records.
  """
  if not records:
    raise ValueError('summarize: no records')
  out: dict[str, Any] = {'n': len(records)}
  for field in MEAN_FIELDS:
    out[field] = _mean([float(r[field]) for r in records
                        if r.get(field) is not None])
  out['j_judge_scored'] = sum(r.get('j_judge') is not None for r in records)
  out['mq_scored'] = sum(r.get('mq') is not None for r in records)
  out['success_rate'] = 100.0 * _mean([float(bool(r['success'])) for r in records])
  out['answered_rate'] = 100.0 * _mean([float(r.get('answer') is not None)
                                        for r in records])
  decisions = sum(int(r.get('decisions', 0)) for r in records)
  out['invalid_rate'] = (sum(int(r.get('invalid', 0)) for r in records) / decisions
                         if decisions else None)
  ops = collections.Counter()
  for r in records:
    ops.update(r.get('op_counts') or {})
  out['op_mix'] = ({op: n / decisions for op, n in sorted(ops.items())}
                   if decisions else {})
  out['judge_fallbacks'] = sum(bool(r.get('judge_fallback')) for r in records)
  out['mq_fallbacks'] = sum(bool(r.get('mq_fallback')) for r in records)
  return out
