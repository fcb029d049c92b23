"""Tests for vermem_jax.eval.metrics: per-episode records and their means."""
import pytest

from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.envs import task_solvers as ts
from vermem_jax.eval import episodes
from vermem_jax.eval import metrics
from vermem_jax.memory import config as mconfig
from vermem_jax.memory.token_count import count_whitespace_tokens as count


@pytest.fixture(scope='module')
def examples(hotpotqa_dir):
  return hotpotqa_sources.load_examples('json', 'validation', data_dir=hotpotqa_dir)[:4]


def _rec(**kw):
  base = dict(question_id='q', answer='a', em=0.0, f1=0.0, j_judge=None, mq=None,
              sf_recall=0.0, tn=0, tn_policy=0, tn_solver=0, tc=0, rejected_calls=0,
              unparseable=0, decisions=1, op_counts={'Null': 1},
              success=False, judge_fallback=None, mq_fallback=None)
  base.update(kw)
  return base


def test_summarize_hand_case():
  recs = [_rec(em=1.0, f1=1.0, tn=100, tc=1, rejected_calls=1, unparseable=1,
               decisions=4, op_counts={'Add': 1, 'Unparseable': 1, 'Null': 2},
               success=True, j_judge=0.9, judge_fallback=False),
          _rec(em=0.0, f1=0.5, tn=300, decisions=4, op_counts={'Null': 4}, answer=None,
               j_judge=0.0, judge_fallback=True)]
  s = metrics.summarize(recs)
  assert s['n'] == 2 and s['em'] == 0.5 and s['f1'] == 0.75 and s['tn'] == 200.0
  assert s['tc'] == 0.5 and s['rejected_calls'] == 0.5 and s['unparseable'] == 0.5
  assert s['op_mix'] == {'Add': 1 / 8, 'Unparseable': 1 / 8, 'Null': 6 / 8}
  assert s['success_rate'] == 50.0 and s['answered_rate'] == 50.0
  assert s['j_judge'] == pytest.approx(0.45) and s['j_judge_scored'] == 2
  # Standard errors over the questions: sample std / sqrt(n), by hand for n = 2:
  # EM (1, 0) -> 0.7071 / 1.4142 = 0.5; TN (100, 300) -> 141.42 / 1.4142 = 100.
  assert s['em_se'] == pytest.approx(0.5) and s['tn_se'] == pytest.approx(100.0)
  assert s['success_rate_se'] == pytest.approx(50.0) and s['mq_se'] is None
  assert metrics.standard_error([0.2]) is None
  assert s['judge_fallbacks'] == 1
  # No judge ran: MQ is absent, never another number.
  assert s['mq'] is None and s['mq_scored'] == 0
  with pytest.raises(ValueError):
    metrics.summarize([])


def test_success_rules():
  assert metrics.resolve_success_rule('auto', False) == 'em'
  assert metrics.resolve_success_rule('auto', True) == 'judge'
  with pytest.raises(ValueError, match='judge'):
    metrics.resolve_success_rule('judge', False)
  with pytest.raises(ValueError):
    metrics.resolve_success_rule('f1', True)
  assert metrics.success_flag(_rec(em=1.0), 'em')
  assert not metrics.success_flag(_rec(em=0.0, j_judge=1.0), 'em')
  assert metrics.success_flag(_rec(j_judge=0.5), 'judge')
  assert not metrics.success_flag(_rec(j_judge=0.49), 'judge')
  assert not metrics.success_flag(_rec(j_judge=None), 'judge')
  recs = [_rec(j_judge=0.8), _rec(j_judge=0.1)]
  metrics.apply_success_rule(recs, 'judge', 0.5)
  assert [r['success'] for r in recs] == [True, False]


def test_episode_record_from_an_oracle_run(examples):
  ex = examples[0]
  # Unbounded context and documents: one observation per passage, all in C.
  cfg = mconfig.ExecutorConfig(context_budget=100000, policy_input_limit=100000,
                             max_doc_tokens=100000)
  spec = episodes.build_episode(ex, count_tokens=count, executor_config=cfg)
  oracle = ts.OracleEvidenceReader.from_examples([ex])
  (res,) = episodes.run([spec], episodes.base_policy, oracle, count_tokens=count,
                        executor_config=cfg)
  rec = metrics.episode_record(res, policy='base', seed=42, budget=None)
  # With an unbounded context the oracle answers once both gold passages arrived.
  sup = hotpotqa.supporting_unit_ids(ex)
  titles = [t for t, _ in episodes.passages(ex)]
  last_gold = max(i for i, (_, refs) in enumerate(episodes.passages(ex))
                  if set(refs) & set(sup))
  assert rec['answer'] == ex.answer and rec['em'] == 1.0 and rec['f1'] == 1.0
  assert rec['decisions'] == last_gold + 1 and rec['success']
  assert rec['sf_recall'] == 1.0 and rec['tc'] == 0 and len(titles) >= rec['decisions']
  assert rec['question_id'] == ex.id and rec['seed'] == 42 and rec['policy'] == 'base'
  assert len(rec['steps']) == rec['decisions']
  assert rec['steps'][0]['op'] == 'Null' and rec['steps'][0]['solver_called']
  assert rec['j_judge'] is None and rec['mq'] is None
