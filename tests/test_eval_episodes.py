"""Tests for vermem_jax.eval.episodes: the held-out HotpotQA episodes (paper C.1-C.4)."""
import dataclasses
import json
import re

import numpy as np
import pytest

from vermem_jax.envs import environment as env
from vermem_jax.envs import episode_types
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.envs.scenarios import initial_state
from vermem_jax.envs import task_solvers as ts
from vermem_jax.eval import episodes
from vermem_jax.eval import metrics
from vermem_jax.memory import config as mconfig
from vermem_jax.memory.token_count import count_whitespace_tokens as count
from vermem_jax.models import sampling
from vermem_jax.rl import policy as policy_lib

BUDGET = 400
CFG = mconfig.ExecutorConfig(phase='C', context_budget=BUDGET, policy_input_limit=2000)


@pytest.fixture(scope='module')
def examples(hotpotqa_dir):
  return hotpotqa_sources.load_examples('json', 'validation', data_dir=hotpotqa_dir)[:6]


@pytest.fixture(scope='module')
def tok(qwen25_tokenizer_dir):
  from vermem_jax.tokenization import load_tokenizer
  return load_tokenizer(qwen25_tokenizer_dir)


def _run(specs, policy, solver, counter=count, cfg=CFG):
  return episodes.run(specs, policy, solver, count_tokens=counter, executor_config=cfg)


_ENV_ITEM = re.compile(r'current environment item "?([^";\s]+)"?;')


class LabelBlindPolicy:
  """Deterministic commands built from x_t alone: Add the current passage's first
  sentence, then a Filter of an id that does not exist (rejected), then a malformed
  command, then ∅. Records every input it is given."""

  def __init__(self):
    self.inputs = []
    self.calls = 0
    self.seen = {}

  def __call__(self, xs):
    self.calls += 1
    self.inputs.extend(xs)
    out = []
    for x in xs:
      q = json.loads(re.search(r'question: (".*")', x).group(1))
      step = self.seen[q] = self.seen.get(q, -1) + 1  # this episode's decision index
      m = _ENV_ITEM.search(x)
      if step == 0 and m:
        line = next(l for l in x.splitlines() if l.startswith(f'["{m.group(1)}" '))
        text = json.loads(line.split('] ', 1)[1])
        sentence = text.split(': ', 1)[1].split('. ')[0]
        out.append(f'Add(content={json.dumps(sentence)}, source_refs=["{m.group(1)}"])')
      elif step == 1:
        out.append('Filter(drop_refs=["c999"])')
      elif step == 2:
        out.append('please store everything')
      else:
        out.append('∅')
    return [episode_types.PolicyOutput(c, 11, 7) for c in out]


class RecordingLLMSolver(ts.TaskSolver):
  """Stands in for an LLM solver: records exactly the messages an LLM (in-process or
  HTTP) would receive, answers only when told it is the final call."""

  def __init__(self):
    self.messages = []

  def solve(self, inputs):
    out = []
    for inp in inputs:
      self.messages.append(ts.solver_messages(inp))
      out.append(ts.SolverOutput(ts.ANSWER, 'Paris', 'Answer: Paris', 5, 3)
                 if inp.final else ts.SolverOutput(ts.CONTINUE, None, 'Continue', 5, 1))
    return out


def _spec(ex, counter=count, base=False, cfg=CFG, **kw):
  return episodes.build_episode(ex, count_tokens=counter, executor_config=cfg,
                                base=base, **kw)


def _observations(ex, counter=count, cfg=CFG):
  return episodes.passage_observations(ex, count_tokens=counter,
                                       chunk_tokens=cfg.chunk_tokens)


def test_episode_layout(examples):
  ex = examples[0]
  spec = _spec(ex)
  s0 = spec.initial_state
  docs = episodes.passages(ex)
  obs = _observations(ex)
  assert s0.M == ()  # M_0 empty (SPEC §7); the first passage is H_0's one event
  assert [(h.kind, h.text, h.step) for h in s0.H] == [('observation', obs[0].text, 0)]
  assert [it.kind for it in s0.C] == ['instruction', 'observation']
  assert s0.C[0].protected and s0.C[1].text == obs[0].text
  assert docs[0][0].startswith(obs[0].text)  # its first chunk (a long passage)
  assert s0.C[1].origin == s0.H[0].id  # a copy of the H event: restorable once dropped
  assert s0.env_item_id == s0.C[1].id and s0.q == ex.question
  assert [o.text for o in spec.observations] == [o.text for o in obs[1:]]
  assert spec.max_decisions == len(obs) and spec.answer_from == 0
  assert s0.forbidden == ()  # no reference in the held-out environment
  # Passages in the file's order, titles first, every unit id of the paragraph.
  assert docs[0][0].startswith(ex.context[0].title.split('&')[0])
  assert docs[1][1][0] == hotpotqa.unit_id(ex.context[1].title, 0)
  assert not spec.evict_oldest_observations and spec.phase == 'C'
  assert _spec(ex, base=True).evict_oldest_observations
  assert _spec(ex, phase='B').phase == 'B'
  with pytest.raises(ValueError, match='phase'):
    _spec(ex, phase='D')


def test_long_passages_are_revealed_in_sentence_chunks(examples):
  """A passage over ExecutorConfig.chunk_tokens enters as consecutive sentence chunks
  (envs.documents), each within the cap, titled, naming its own units."""
  cap = CFG.chunk_tokens
  assert cap == 100  # min(max_doc_tokens 320, budget 400 // 4)
  for ex in examples:
    obs = _observations(ex)
    assert [u for o in obs for u in o.source_refs] == [
        u for _, refs in episodes.passages(ex) for u in refs]
    by_title = {}
    for o in obs:
      by_title.setdefault(o.text.split(': ', 1)[0], []).append(o)
    for (text, refs), chunks in zip(episodes.passages(ex), by_title.values()):
      if count(text) <= cap:
        assert [c.text for c in chunks] == [text]
      else:
        assert len(chunks) > 1
        assert all(count(c.text) <= cap or len(c.source_refs) == 1 for c in chunks)
        body = ' '.join(c.text.split(': ', 1)[1] for c in chunks)
        assert body == text.split(': ', 1)[1]
        assert all(re.search(r'\(part \d+ of \d+\)', c.task_state) for c in chunks)


def test_first_passage_is_kept_in_h_when_it_does_not_fit(examples):
  ex = examples[0]
  tiny = mconfig.ExecutorConfig(context_budget=40, policy_input_limit=2000)
  s0 = _spec(ex, cfg=tiny).initial_state
  # Too long for C_0 (the instruction fills it), but recorded: SelectEpisode can
  # bring it back once the policy has made room.
  assert [it.kind for it in s0.C] == ['instruction'] and s0.env_item_id is None
  assert len(s0.H) == 1 and s0.H[0].kind == 'observation'


def test_episode_ends_when_passages_run_out_and_solver_is_told(examples):
  ex = examples[1]
  spec = _spec(ex)
  solver = RecordingLLMSolver()
  (res,) = _run([spec], episodes.base_policy, solver)
  n = len(_observations(ex))
  assert res.num_decisions == n and res.terminated_by == 'answer'
  assert res.final_answer == 'Paris'
  finals = ['No more information will arrive' in m[1]['content'] for m in solver.messages]
  assert finals == [False] * (n - 1) + [True]


def test_base_issues_no_memory_command_and_keeps_newest_observations(examples):
  specs = [_spec(ex, base=True) for ex in examples]
  oracle = ts.OracleEvidenceReader.from_examples(examples)
  results = _run(specs, episodes.base_policy, oracle)
  for res in results:
    assert all(d.op == 'Null' and d.accepted and not d.is_tool_call
               for d in res.decisions)
    assert res.tool_calls == 0 and res.policy_input_tokens == 0
    assert res.policy_output_tokens == 0
    assert all(d.next_state.M == () for d in res.decisions)  # no LTM
    for d in res.decisions:
      s = d.next_state
      assert s.context_tokens() <= BUDGET
      obs = [it for it in s.C if it.kind == 'observation']
      if d.observation is not None and obs:
        assert obs[-1].text == d.observation.text  # the newest observation is in C
  # Over a whole episode the budget forces evictions: an early passage leaves C.
  evicted = [res for res in results
             if res.spec.initial_state.C[1].id not in {it.id for it in res.final_state.C}]
  assert evicted


def test_vermem_episode_keeps_old_items_and_overflows_to_history(examples):
  ex = examples[0]
  spec = _spec(ex)
  (res,) = _run([spec], episodes.base_policy, RecordingLLMSolver())
  # Without eviction the first passage stays; later passages that do not fit are in H.
  assert res.final_state.C[1].id == spec.initial_state.C[1].id
  assert any(v.kind == 'context_overflow' for d in res.decisions for v in d.violations)


def test_tc_counts_executed_calls_only_rejected_and_unparseable_apart(examples):
  ex = examples[2]
  spec = _spec(ex)
  policy = LabelBlindPolicy()
  (res,) = _run([spec], policy, RecordingLLMSolver())
  rec = metrics.episode_record(res, policy='scripted', seed=0)
  ops = [d.op for d in res.decisions]
  assert ops[:3] == ['Add', 'Filter', 'Invalid'] and set(ops[3:]) == {'Null'}
  # The Filter names an id that does not exist: rejected, still a tool call.
  assert res.decisions[0].accepted and not res.decisions[1].accepted
  assert 'c999' in res.decisions[1].transition_message
  # The paper's TC: executed non-null calls only (the Add). The rejected Retrieve, the
  # unparseable text and the ∅ decisions each count apart or not at all.
  executed = sum(d.is_tool_call and d.accepted for d in res.decisions)
  assert rec['tc'] == executed == 1
  assert rec['rejected_calls'] == 1 and rec['unparseable'] == 1
  assert rec['decisions'] == len(ops) and len(ops) > 3
  assert 'invalid' not in rec and 'tc_executed' not in rec
  assert rec['op_counts'] == {'Add': 1, episode_types.UNPARSEABLE: 1,
                              'Null': len(ops) - 3, 'Filter': 1}
  # Each step carries its kind, so the mix is recomputable from the steps alone.
  kinds = [step['kind'] for step in rec['steps']]
  assert kinds[:3] == ['Add', 'Filter', 'Unparseable'] and set(kinds[3:]) == {'Null'}
  summary = metrics.summarize([rec, metrics.episode_record(
      _run([spec], episodes.base_policy, RecordingLLMSolver())[0], policy='base',
      seed=0)])
  # Base decides ∅ throughout: no call of any kind, so the means halve.
  assert summary['tc'] == 0.5 and summary['rejected_calls'] == 0.5
  assert summary['unparseable'] == 0.5


def _fake_generate(tok, command):
  ids = tok.encode(command) + [tok.eos_token_id]

  def generate(config, params, prompts, *, rng, max_new_tokens, temperature, top_p,
               stop_token_ids, pad_token_id, prompt_buckets=None):
    assert temperature == 0.0 and top_p == 1.0  # greedy evaluation
    toks = np.full((len(prompts), max_new_tokens), pad_token_id, np.int32)
    toks[:, :len(ids)] = ids
    return sampling.GenerationOutput(
        tokens=toks, logprobs=np.zeros(toks.shape, np.float32),
        lengths=np.full((len(prompts),), len(ids), np.int32))
  return generate


def test_tn_equals_a_hand_count_with_prompts_counted_at_every_call(examples, tok):
  from vermem_jax.models import qwen
  ex = examples[3]
  spec = _spec(ex, counter=tok.count_tokens)
  sampler = policy_lib.SamplerPolicy(
      qwen.QwenConfig.preset('tiny'), {}, tok, greedy=True,
      sampling_config=policy_lib.PolicySamplingConfig(max_command_tokens=8),
      generate_fn=_fake_generate(tok, '∅'))
  bound = lambda xs: sampler(xs, 0)  # noqa: E731
  oracle = ts.OracleEvidenceReader.from_examples([ex], tokenizer=tok)
  (res,) = _run([spec], bound, oracle, counter=tok.count_tokens)
  assert res.num_decisions >= 2
  hand = 0
  per_call_policy = []
  for d in res.decisions:
    prompt = policy_lib.policy_prompt_ids(tok, d.policy_input)
    per_call_policy.append(len(prompt))
    hand += len(prompt) + len(tok.encode('∅')) + 1
    inp = env.solver_input(spec, d.state_after_memory,
                           final=d.step >= len(spec.observations))
    hand += len(tok.encode(ts.render_solver_prompt(tok, inp)))
    hand += len(tok.encode(d.solver_output.text)) + 1
  rec = metrics.episode_record(res, policy='p', seed=0)
  assert rec['tn'] == hand == res.online_tokens
  # The instruction and question are re-sent at every call and counted each time.
  instruction = len(tok.encode(initial_state.INSTRUCTION_TEXT))
  assert all(n > instruction for n in per_call_policy)
  assert sum(per_call_policy) > instruction * len(per_call_policy)


def test_no_label_reaches_a_policy_or_llm_solver_input(examples):
  """Every policy input and every LLM-solver message is identical when the labels
  (answer, supporting facts) change, and a sentinel answer never appears."""
  sentinel = 'QZX-SENTINEL-ANSWER-7731'

  def relabel(ex):
    units = [u.id for u in hotpotqa.evidence_units(ex)]
    sup = tuple(hotpotqa.parse_unit_id(u) for u in units[-2:])
    return dataclasses.replace(ex, answer=sentinel, supporting_facts=sup)

  runs = []
  for exs in (examples, [relabel(ex) for ex in examples]):
    for base in (False, True):
      specs = [_spec(ex, base=base) for ex in exs]
      policy = LabelBlindPolicy()
      solver = RecordingLLMSolver()
      _run(specs, episodes.base_policy if base else policy, solver)
      runs.append((policy.inputs, solver.messages))
  assert runs[0] == runs[2] and runs[1] == runs[3]
  assert runs[0][0] and runs[0][1] and runs[1][1]
  for policy_inputs, solver_messages in runs:
    texts = policy_inputs + [m['content'] for ms in solver_messages for m in ms]
    assert not any(sentinel in t for t in texts)
  # Every policy call of the scripted run was batched across the live episodes.
  assert len(runs[0][0]) == sum(len(_observations(ex)) for ex in examples)


def test_batched_one_policy_call_per_step(examples):
  specs = [_spec(ex)
           for ex in examples]
  policy = LabelBlindPolicy()
  _run(specs, policy, RecordingLLMSolver())
  assert policy.calls == max(len(_observations(ex)) for ex in examples)


def test_select_questions_fixed_per_seed(examples):
  a = episodes.select_questions(examples, 3, seed=42)
  assert [e.id for e in a] == [e.id for e in episodes.select_questions(examples, 3, 42)]
  assert len(a) == 3 and len({e.id for e in a}) == 3
  assert [e.id for e in episodes.select_questions(examples, 0, 1)] == [
      e.id for e in examples]
  assert len(episodes.select_questions(examples, 99, 1)) == len(examples)
  assert any([e.id for e in episodes.select_questions(examples, 3, s)] !=
             [e.id for e in a] for s in (43, 44, 45))
  with pytest.raises(ValueError):
    episodes.select_questions(examples, -1, 0)


def test_check_greedy():
  episodes.check_greedy(0.0, 1.0, 'sampling')
  with pytest.raises(ValueError, match='greedily'):
    episodes.check_greedy(0.7, 1.0, 'sampling')
  with pytest.raises(ValueError, match='greedily'):
    episodes.check_greedy(0.0, 0.95, 'solver')
