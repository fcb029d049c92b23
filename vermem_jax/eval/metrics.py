"""Per-episode evaluation records and their aggregation (paper C.5; SPEC §7).

`episode_record(result, ...)` turns one finished `EpisodeResult` into a JSON-ready
dict (one JSONL line) that keeps everything a figure needs:

  question_id (HotpotQA) or instance_id and benchmark (interactive benchmarks),
  policy, seed, budget (the hard online-token budget, None = none),
  answer (the solver's final answer or None), reference (the label, for scoring only),
  terminated_by;
  em, f1          official HotpotQA normalization (envs.answer_metrics); None on
                  the interactive benchmarks;
  j_judge, mq     answer / memory-quality judge scores in [0, 1], None when no judge
                  ran (filled by `eval.judges`; never replaced by another number);
  sf_recall       supporting-fact recall of what the solver saw: the share of the
                  annotated supporting units among the evidence behind C̃_t at the
                  solver's last call (the context its final reply was made from);
  tn              online tokens (SPEC §7): input + output tokens of every policy and
                  solver call, a prompt re-sent at each call counted each time;
                  also tn_policy and tn_solver;
  tc              the paper's TC: executed non-null memory-tool calls (a tool call T_m
                  accepted; ∅ excluded);
  rejected_calls  tool calls T_m rejected (a parsed command naming a tool whose
                  arguments, ids or budget failed a check); never in tc;
  unparseable     decisions whose text is not a command (no known tool, a malformed
                  argument list); neither tc nor rejected_calls;
  decisions, op_counts (a tool call under its tool, executed or rejected; a valid ∅
                  as Null; unparseable text as `episode_types.UNPARSEABLE`);
  final_ltm       contents of the active terminal LTM entries (what MQ judges);
  success         the benchmark's success flag: HotpotQA `success_flag`; on the
                  interactive benchmarks the environment's own (EpisodeResult.success);
  progress        interactive benchmarks: running-best progress in [0, 1] (PDDL's
                  progress rate; 1.0 on success); env_steps (actions the environment
                  counted) and invalid_actions (actions it did not understand or
                  could not play);
  steps           one dict per decision: command, op (the executor's: broken text
                  under the tool it starts with), kind (its operation-mix name,
                  `episode_types.decision_kind`: what `op_counts` counts), accepted,
                  tool call, violation kinds, cost, the four token counts, the
                  solver's kind and answer (interactive: also the action played and
                  whether it was valid).

`summarize(records)` gives the means over one policy's episodes of one seed:
EM, F1, J_judge, MQ (None when absent), SF recall, TN, TC, rejected calls,
unparseable decisions, op mix (share of decisions per op), success rate
(percent), progress rate (percent, PR = 100 x mean progress), answered rate, judge
fallbacks. Any benchmark with a success flag per episode can use `summarize` and the
frontier; the HotpotQA fields are optional (None when absent).
"""

from __future__ import annotations

import collections
import math
from typing import Any, Iterable, Mapping, Optional, Sequence

from vermem_jax.envs import answer_metrics
from vermem_jax.envs import episode_types

# Success rules for HotpotQA episodes (config `eval.success_rule`).
SUCCESS_RULES = ('auto', 'em', 'judge')
# Means reported by `summarize` (None entries stay None when no record has a value).
MEAN_FIELDS = ('em', 'f1', 'j_judge', 'mq', 'sf_recall', 'tn', 'tn_policy', 'tn_solver',
               'tc', 'rejected_calls', 'unparseable', 'decisions', 'progress',
               'env_steps', 'invalid_actions')
# Per-episode fields whose standard error over the tasks of a seed `summarize` gives
# as '<field>_se' (success as 'success_rate_se', in percent): what a table of a few
# dozen questions can and cannot tell apart.
SE_FIELDS = ('em', 'f1', 'j_judge', 'mq', 'sf_recall', 'tn', 'tc', 'rejected_calls',
             'unparseable', 'progress')
# Summary keys of the summed `eval.recovery` counts: recovery_states,
# recovery_select_accepted, ...
RECOVERY_PREFIX = 'recovery_'


def decision_row(d: episode_types.DecisionRecord) -> dict[str, Any]:
  """One decision of the JSONL record (tokens of both calls of step t)."""
  b = d.solver_output
  row = {'step': d.step, 'command': d.command, 'op': d.op,
         'kind': episode_types.decision_kind(d), 'accepted': d.accepted,
         'tool_call': d.is_tool_call, 'violations': [v.kind for v in d.violations],
         'cost': d.cost, 'policy_input_tokens': d.policy_output.input_tokens,
         'policy_output_tokens': d.policy_output.output_tokens,
         'solver_called': d.solver_called, 'solver_input_tokens': b.input_tokens,
         'solver_output_tokens': b.output_tokens, 'solver_kind': b.kind,
         'solver_answer': b.answer}
  if d.env_step is not None:
    row.update(action=d.action, action_valid=bool(d.env_step.info.get('valid', True)),
               progress=d.env_step.progress)
  return row


def episode_record(result: episode_types.EpisodeResult, *, policy: str, seed: int,
                   budget: Optional[int] = None) -> dict[str, Any]:
  """The JSON record of one evaluation episode (module docstring). HotpotQA:
  `success` is set to EM = 1 here and replaced by `apply_success_rule` once judges
  ran. Interactive benchmark (no example): success and progress are the
  environment's, the HotpotQA fields None."""
  ex = result.spec.example
  answer = result.final_answer
  if ex is not None:
    em = answer_metrics.exact_match(answer, ex.answer) if answer is not None else 0.0
    f1 = answer_metrics.f1_score(answer, ex.answer) if answer is not None else 0.0
    task = {'question_id': ex.id, 'reference': ex.answer, 'em': em, 'f1': f1,
            'sf_recall': answer_metrics.supporting_fact_recall(
                answer_metrics.solver_seen_evidence(result), ex),
            'success': em == 1.0}
  else:
    env = result.spec.env
    task = {'instance_id': result.spec.task_id,
            'benchmark': getattr(env, 'benchmark', ''), 'em': None, 'f1': None,
            'sf_recall': None, 'success': bool(result.success),
            'progress': float(result.progress), 'env_steps': int(result.env_steps),
            'invalid_actions': sum(d.env_step is not None and not d.env_step.info.get(
                'valid', True) for d in result.decisions)}
  ops = collections.Counter(episode_types.decision_kind(d) for d in result.decisions)
  return {
      **task, 'episode_id': result.spec.episode_id, 'policy': policy,
      'seed': int(seed), 'budget': budget, 'answer': answer,
      'terminated_by': result.terminated_by,
      'j_judge': None, 'mq': None, 'judge_fallback': None, 'mq_fallback': None,
      'tn': result.online_tokens,
      'tn_policy': result.policy_input_tokens + result.policy_output_tokens,
      'tn_solver': result.solver_input_tokens + result.solver_output_tokens,
      # EpisodeResult.tool_calls counts executed non-null calls: the paper's TC.
      'tc': result.tool_calls, 'rejected_calls': result.rejected_tool_calls,
      'unparseable': ops.get(episode_types.UNPARSEABLE, 0),
      'decisions': result.num_decisions,
      'op_counts': dict(sorted(ops.items())),
      'final_ltm': [e.content for e in result.final_state.active_entries()],
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


def standard_error(values: Sequence[float]) -> Optional[float]:
  """Standard error of the mean: sample std (ddof=1) / sqrt(n); None for n < 2."""
  n = len(values)
  if n < 2:
    return None
  mean = sum(values) / n
  return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """Means over the records of one policy and seed (module docstring).

  Returns:
    {'n': episodes, <field>: mean for MEAN_FIELDS (None when no record has one; for
    j_judge / mq the mean over the scored episodes, with 'j_judge_scored' /
    'mq_scored' counts), 'success_rate' (percent), 'progress_rate' (percent, 100 x
    mean progress; None without progress), 'answered_rate' (percent; None when no
    record is a question),
    'op_mix' ({op: share of decisions}), counts of episodes: 'j_judge_judged' (the
    judge's own reply), 'j_judge_no_answer' (0 without a call), 'judge_fallbacks',
    'mq_judged', 'mq_fallbacks', '<field>_se' for SE_FIELDS and 'success_rate_se'
    (standard error over the episodes; None below two), and the `eval.recovery`
    counts summed over the
    episodes that have them ('recovery_states', 'recovery_select_accepted', ...)}.

  Raises:
    ValueError: no records.
  """
  if not records:
    raise ValueError('summarize: no records')
  out: dict[str, Any] = {'n': len(records)}
  for field in MEAN_FIELDS:
    out[field] = _mean([float(r[field]) for r in records
                        if r.get(field) is not None])
  for field in SE_FIELDS:
    out[field + '_se'] = standard_error([float(r[field]) for r in records
                                         if r.get(field) is not None])
  se = standard_error([100.0 * bool(r['success']) for r in records])
  out['success_rate_se'] = se
  out['j_judge_scored'] = sum(r.get('j_judge') is not None for r in records)
  out['mq_scored'] = sum(r.get('mq') is not None for r in records)
  # What the judge itself scored: a reply it gave (no fallback) on an answer it saw;
  # an episode without an answer gets J_judge 0 without a call.
  out['j_judge_judged'] = sum(r.get('judge_fallback') is False
                              and r.get('answer') is not None for r in records)
  out['j_judge_no_answer'] = sum(r.get('judge_fallback') is False
                                 and r.get('answer') is None for r in records)
  out['mq_judged'] = sum(r.get('mq_fallback') is False for r in records)
  out['success_rate'] = 100.0 * _mean([float(bool(r['success'])) for r in records])
  out['progress_rate'] = (None if out['progress'] is None
                          else 100.0 * out['progress'])
  questions = [r for r in records if 'instance_id' not in r]  # not a benchmark's
  out['answered_rate'] = (100.0 * _mean([float(r.get('answer') is not None)
                                         for r in questions]) if questions else None)
  decisions = sum(int(r.get('decisions', 0)) for r in records)
  ops = collections.Counter()
  for r in records:
    ops.update(r.get('op_counts') or {})
  out['op_mix'] = ({op: n / decisions for op, n in sorted(ops.items())}
                   if decisions else {})
  with_counts = [r['recovery'] for r in records if r.get('recovery')]
  for field in (with_counts[0] if with_counts else ()):
    out[RECOVERY_PREFIX + field] = sum(int(c[field]) for c in with_counts)
  out['judge_fallbacks'] = sum(bool(r.get('judge_fallback')) for r in records)
  out['mq_fallbacks'] = sum(bool(r.get('mq_fallback')) for r in records)
  return out
