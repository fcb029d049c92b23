"""Evaluation states offer recovery SelectEpisodes as training's do (issue 23):
vermem_jax.eval.recovery, the document rule (envs.documents) and T_e's admission."""
import collections

import pytest

from vermem_jax.memory import config as mconfig
from vermem_jax import paths
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.envs import task_solvers as ts
from vermem_jax.eval import episodes
from vermem_jax.eval import recovery
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import interaction
from vermem_jax.memory import state as mstate
from vermem_jax.memory.token_count import count_whitespace_tokens as count
from vermem_jax.tokenization import load_tokenizer


@pytest.fixture(scope='module')
def validation(hotpotqa_dir):
  return hotpotqa_sources.load_examples('json', 'validation', data_dir=hotpotqa_dir)


def _longest(examples, counter, n):
  """The n questions with the most passage tokens (the ones that overflow C)."""
  return sorted(examples, key=lambda ex: -sum(counter(t) for t, _ in
                                              episodes.passages(ex)))[:n]


def _counts(examples, counter, cfg, phase='C'):
  specs = [episodes.build_episode(ex, count_tokens=counter, executor_config=cfg,
                                  phase=phase) for ex in examples]
  oracle = ts.OracleEvidenceReader.from_examples(examples)
  results = episodes.run(specs, episodes.base_policy, oracle, count_tokens=counter,
                         executor_config=cfg)
  totals = collections.Counter()
  for r in results:
    totals.update(recovery.recovery_counts(r, counter, cfg))
  return totals, results


@pytest.mark.parametrize('budget,limit,local_ids,tokenizer', [
    (320, 640, True, 'hotpotqa-sp4k'),    # the tiny default (configs/parts/tiny.py)
    (2048, 8192, False, 'qwen2.5'),       # the paper's budget and g(s) limit
])
def test_validation_states_offer_an_accepted_recovery_select(validation, budget, limit,
                                                            local_ids, tokenizer):
  tok = load_tokenizer(paths.tokenizer_path(tokenizer))
  cfg = mconfig.ExecutorConfig(context_budget=budget, policy_input_limit=limit,
                             local_ids=local_ids)
  questions = _longest(validation, tok.count_tokens, 12)
  totals, results = _counts(questions, tok.count_tokens, cfg)
  # Before the document rule: 0 accepted of 300 questions at both budgets (issue 23).
  assert totals['select_accepted'] > 0 and totals['gold_select_accepted'] > 0
  assert totals['h_only_shown'] > 0  # and the policy can see what it would restore
  # An independent check of one counted state: the newest H-only observation is in
  # no C item and its tokens fit the room C has left.
  state = next(d.state for r in results for d in r.decisions
               if recovery.h_only_observations(d.state))
  ev = recovery.h_only_observations(state)[-1]
  assert ev.id not in {it.origin for it in state.C}
  assert state.context_tokens() + ev.tokens <= budget
  tr = mexec.execute(state, mcommands.Command(mcommands.SELECT_EPISODE,
                                              {'selected_refs': [ev.id]}),
                     cfg, tok.count_tokens)
  assert tr.accepted and tr.state_after.C[-1].text == ev.text
  # Every episode records its first passage in H_0.
  assert all(r.spec.initial_state.H for r in results)


def test_a_phase_a_policy_cannot_restore(validation):
  cfg = mconfig.ExecutorConfig(context_budget=320, policy_input_limit=2000)
  questions = _longest(validation, count, 4)
  tools_c, _ = _counts(questions, count, cfg)
  tools_a, _ = _counts(questions, count, cfg, phase='A')
  assert tools_c['select_accepted'] > 0
  # Phase A's op space has no SelectEpisode: the same states count as not restorable.
  assert tools_a['h_only'] == tools_c['h_only'] and tools_a['select_accepted'] == 0


def test_admission_keeps_room_for_one_chunk():
  cfg = mconfig.ExecutorConfig(context_budget=100, max_doc_tokens=320)
  assert cfg.chunk_tokens == 25  # min(320, 100 // 4)
  assert interaction.admission_limit(cfg) == 75
  assert interaction.admission_limit(cfg, evict_oldest=True) == 100
  s = mstate.new_state('t1', 'q?', count)
  s, cost = interaction.observe(s, ' '.join(['w'] * 70), count, cfg)
  assert cost == 0.0 and s.context_tokens() == 70
  # 70 + 6 > 75: kept in H only (charged as an overflow) though it fits the budget.
  s, cost = interaction.observe(s, ' '.join(['x'] * 6), count, cfg)
  assert cost == cfg.cost_context_overflow and s.context_tokens() == 70
  assert s.env_item_id is None and s.H[-1].text.startswith('x')
  # ... and SelectEpisode can bring it back into the room kept free.
  tr = mexec.execute(s, mcommands.Command(mcommands.SELECT_EPISODE,
                                          {'selected_refs': [s.H[-1].id]}), cfg, count)
  assert tr.accepted and tr.state_after.context_tokens() == 76
  counts = recovery.h_only_observations(s)
  assert [e.id for e in counts] == [s.H[-1].id]
  # Base (evict_oldest) fills the whole budget: no room is kept for a policy it lacks.
  b = mstate.new_state('t2', 'q?', count)
  b, _ = interaction.observe(b, ' '.join(['w'] * 70), count, cfg, evict_oldest=True)
  b, cost = interaction.observe(b, ' '.join(['x'] * 6), count, cfg, evict_oldest=True)
  assert cost == 0.0 and b.context_tokens() == 76
