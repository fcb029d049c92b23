"""Tests of vermem_jax.rl.rollout / rl.policy: K-group collection of one GRPO update.

Real pieces throughout: the Qwen2.5 tokenizer, HotpotQA sample rows, Phase B scenario
episodes, the executor, the oracle-evidence reader, the heuristic verifier and (for the
sampled update) a randomly initialised tiny Qwen through the jitted sampler.
"""
import copy
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vermem_jax.envs import environment
from vermem_jax.envs import hotpotqa
from vermem_jax.envs.scenarios import build as scenario_build
from vermem_jax.envs.scenarios import spec as scenario_spec
from vermem_jax.envs import task_solvers
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.memory import executor as mexec
from vermem_jax.models import qwen
from vermem_jax.models import qwen_config
from vermem_jax.models import sampling
from vermem_jax.rl import advantages as adv
from vermem_jax.rl import batching
from vermem_jax.rl import policy as pol
from vermem_jax.rl import rollout
from vermem_jax.rl import rollout_records
from vermem_jax.rl import running_stats
from vermem_jax.tokenization import load_tokenizer
from vermem_jax.train import metrics as tmetrics
from vermem_jax.verifiers import adapters
from vermem_jax.verifiers.backends import make_verifier

K = 3
# Small budgets keep every policy prompt (x_t <= SMALL_LIMIT tokens + the chat template)
# in one sampler prompt bucket on CPU: SMALL_LIMIT + the reserved template tokens, as
# experiments/configs/parts/derived.py derives it.
SMALL_BUDGET, SMALL_LIMIT = 512, 480
OVERHEAD = 64
PROMPT_BUCKETS = (SMALL_LIMIT + OVERHEAD,)
CMD_TOKENS = 6


@pytest.fixture(scope="module")
def tok(qwen25_tokenizer_dir):
  return load_tokenizer(qwen25_tokenizer_dir)


def _family_specs(pool, tok, families, budget, solved_by=None):
  """One Phase B spec per family, from the first construction examples that fit (and,
  with a solver, whose reference command alone lets that solver answer at step 0)."""
  cfg = scenario_spec.ScenarioConfig(context_budget=budget, rollout_limit=4)
  specs = []
  for fam in families:
    for ex in pool:
      spec = scenario_build.build_episode(ex, "B", fam, count_tokens=tok.count_tokens,
                                     config=cfg)
      if spec is None:
        continue
      if solved_by is not None:
        (res,) = environment.run_episodes(
            [spec], lambda xs, s=spec: [s.reference_command], solved_by,
            count_tokens=tok.count_tokens,
            executor_config=ExecutorConfig(context_budget=budget,
                                           policy_input_limit=2 * budget))
        if res.terminated_by != "answer" or res.num_decisions != 1:
          continue
      specs.append(spec)
      break
  assert len(specs) == len(families)
  return specs


@pytest.fixture(scope="module")
def oracle(pools, tok):
  construction, dev = pools
  return task_solvers.OracleEvidenceReader.from_examples(construction + dev,
                                                         tokenizer=tok)


@pytest.fixture(scope="module")
def tiny_model():
  config = qwen_config.QwenConfig.preset("tiny")
  return config, qwen.init_params(config, jax.random.PRNGKey(0))


class CountingGenerate:
  """Wraps models.generate, recording the batch size, prompt buckets and prompts
  prefilled (sampling.prefill_counts) of every call."""

  def __init__(self):
    self.batches = []
    self.prompt_buckets = []
    self.prefilled = []

  def __call__(self, *args, **kwargs):
    self.batches.append(len(args[2]))
    self.prompt_buckets.append(kwargs.get("prompt_buckets"))
    before = sampling.prefill_counts()["prefilled"]
    out = sampling.generate(*args, **kwargs)
    self.prefilled.append(sampling.prefill_counts()["prefilled"] - before)
    return out


def _collect(specs, policy, tok, oracle, *, seed=0, stats=None, budget=SMALL_BUDGET,
             limit=SMALL_LIMIT, rollouts_per_task=K, verifier=None,
             advantage_config=adv.AdvantageConfig()):
  settings = rollout.CollectConfig(
      rollouts_per_task=rollouts_per_task,
      executor_config=ExecutorConfig(phase="B", context_budget=budget,
                                     policy_input_limit=limit),
      advantage_config=advantage_config)
  return rollout.collect_update(
      specs, policy, oracle, verifier or make_verifier({"backend": "heuristic"}),
      settings, rng=jax.random.PRNGKey(seed), count_tokens=tok.count_tokens,
      running_stats=stats if stats is not None else running_stats.RunningStats(),
      phase="phase_b", update=1)


def _counted_policy(config, params, tok, rows):
  """A temperature-1, top-p-1 SamplerPolicy of `rows` rows over a CountingGenerate."""
  counter = CountingGenerate()
  policy = pol.SamplerPolicy(
      config, params, tok,
      sampling_config=pol.PolicySamplingConfig(temperature=1.0, top_p=1.0,
                                               max_command_tokens=CMD_TOKENS,
                                               prompt_overhead_tokens=OVERHEAD,
                                               prompt_buckets=PROMPT_BUCKETS),
      batch_buckets=(rows,), generate_fn=counter)
  return policy, counter


@pytest.fixture(scope="module")
def sampled(pools, tok, oracle, tiny_model):
  """A 2-task x 3-rollout Phase B update sampled at temperature 1, top-p 1."""
  config, params = tiny_model
  specs = _family_specs(pools[0], tok, ("select_episode", "retrieve"), SMALL_BUDGET)
  policy, counter = _counted_policy(config, params, tok, len(specs) * K)
  result = _collect(specs, policy, tok, oracle)
  return dict(specs=specs, policy=policy, result=result,
              generate_batches=list(counter.batches),
              generate_prompt_buckets=list(counter.prompt_buckets))


def test_group_structure(sampled, tok):
  res, specs = sampled["result"], sampled["specs"]
  assert len(res.trajectories) == len(specs) * K
  assert [d.index for d in res.decisions] == list(range(res.num_decisions))
  covered = []
  for j, traj in enumerate(res.trajectories):
    assert (traj.index, traj.task, traj.rollout) == (j, j // K, j % K)
    decs = res.trajectory_decisions(j)
    assert len(decs) == traj.result.num_decisions >= 1
    covered.extend(d.index for d in decs)
    assert [d.step for d in decs] == list(range(len(decs)))
    assert all((d.task, d.rollout, d.trajectory) == (traj.task, traj.rollout, j)
               for d in decs)
    # Every rollout of task q starts from the one s_0 the generator built for q.
    assert decs[0].record.state is specs[traj.task].initial_state
    assert traj.result.spec is specs[traj.task]
    for d in decs:  # the prompt is the chat template of x_t, token for token
      assert list(d.prompt_ids) == pol.policy_prompt_ids(tok, d.policy_input)
      assert 1 <= len(d.command_ids) == len(d.logprobs) <= CMD_TOKENS
      assert d.record.next_state is not None and d.record.state_after_memory is not None
  assert covered == list(range(res.num_decisions))
  # The K rollouts of a task share x_0 (same state) yet are sampled independently.
  for q in range(len(specs)):
    firsts = [res.trajectory_decisions(q * K + k)[0] for k in range(K)]
    assert len({d.policy_input for d in firsts}) == 1
    assert len({d.command_ids for d in firsts}) == K


def test_one_generate_call_per_step(sampled):
  res, batches = sampled["result"], sampled["generate_batches"]
  steps = max(t.result.num_decisions for t in res.trajectories)
  assert steps >= 2  # the check covers more than one step
  assert len(batches) == steps == res.metrics["rollout/policy_calls"]
  assert set(batches) == {len(res.trajectories)}  # one padded batch shape
  # Every call pads prompts to the configured bucket (x_t limit + template tokens),
  # not to the next power of two (1024 here).
  assert set(sampled["generate_prompt_buckets"]) == {PROMPT_BUCKETS}
  rows = len(res.trajectories)
  assert any(shape[1] == PROMPT_BUCKETS[0] and tuple(rest) == (CMD_TOKENS, (8,), True)
             and (shared == (rows,) or (shared is None and shape[0] == rows))
             for shape, shared, *rest in sampling.trace_counts())
  longest = max(len(d.prompt_ids) for d in res.decisions)
  assert SMALL_LIMIT < longest <= PROMPT_BUCKETS[0]  # some prompt needed the overhead


def test_first_decision_prefills_once_per_task(pools, tok, oracle, tiny_model):
  """K = 8 rollouts of a task share x_0: its prompt is prefilled once, not 8 times."""
  config, params = tiny_model
  specs = _family_specs(pools[0], tok, ("select_episode", "retrieve"), SMALL_BUDGET)
  rollouts = 8
  policy, counter = _counted_policy(config, params, tok, len(specs) * rollouts)
  _collect(specs, policy, tok, oracle, rollouts_per_task=rollouts)
  assert counter.batches[0] == len(specs) * rollouts
  assert counter.prefilled[0] == len(specs)  # one prefill per task


def test_logprobs_match_full_forward(sampled, tiny_model):
  """Sampler logprobs (temperature 1, top-p 1) equal log_softmax of a full forward."""
  config, params = tiny_model
  decisions = sampled["result"].decisions[:4]
  seqs = [list(d.prompt_ids) + list(d.command_ids) for d in decisions]
  width = max(map(len, seqs))
  ids = np.zeros((len(seqs), width), np.int32)  # right padding: causal, never attended
  mask = np.zeros((len(seqs), width), np.int32)
  for i, seq in enumerate(seqs):
    ids[i, :len(seq)], mask[i, :len(seq)] = seq, 1
  forward = jax.jit(functools.partial(qwen.Qwen(config).apply, return_hidden=True))
  hidden = forward({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask))
  for i, d in enumerate(decisions):
    p = len(d.prompt_ids)
    pos = np.arange(p - 1, p - 1 + len(d.command_ids))  # hidden at j-1 predicts j
    logits = qwen.lm_head_logits(config, params, hidden[i, pos])
    ref = jax.nn.log_softmax(logits, axis=-1)[np.arange(len(pos)),
                                             np.array(d.command_ids)]
    np.testing.assert_allclose(np.array(d.logprobs), np.asarray(ref), atol=1e-3)


def test_advantage_structure(sampled):
  res = sampled["result"]
  for d in res.decisions:
    if not d.accepted:
      assert d.a_local == 0.0 and d.r_local is None and d.local_scores is None
    assert d.a_hier == pytest.approx(d.a_local + d.a_global - d.cost, abs=1e-12)
  for traj in res.trajectories:
    vals = {d.a_global for d in res.trajectory_decisions(traj.index)}
    assert vals == {traj.a_global}
  # A^global is the group-normalized r^global (NumPy reference, SPEC §6).
  r = np.array([t.rewards.r_global for t in res.trajectories]).reshape(-1, K)
  sd = np.maximum(r.std(axis=1, keepdims=True), 0.01) + 1e-6
  ref = np.where(r.max(1, keepdims=True) == r.min(1, keepdims=True), 0.0,
                 np.clip((r - r.mean(1, keepdims=True)) / sd, -5, 5))
  np.testing.assert_allclose([t.a_global for t in res.trajectories], ref.ravel())


def test_rows_and_learner_inputs(sampled, tmp_path):
  res = sampled["result"]
  rows = res.advantage_rows()
  assert len(rows) == res.num_decisions
  assert tuple(rows[0]) == tmetrics.ADVANTAGE_COLUMNS == rollout_records.ADVANTAGE_COLUMNS
  with tmetrics.AdvantageTable(str(tmp_path), "phase_b") as table:
    assert table.add_rows(rows) == len(rows)
  tokens = res.decision_tokens()
  assert [len(t.command_tokens) for t in tokens] == [r["command_tokens"] for r in rows]
  batches = batching.micro_batches(tokens, batching.BatchingConfig(micro_batch_size=4))
  adv_tokens = sum(float((b["advantages"] * b["loss_mask"]).sum()) for b in batches)
  assert adv_tokens == pytest.approx(sum(d.a_hier * d.command_tokens
                                         for d in res.decisions), abs=1e-4)
  assert set(res.timings) == set(rollout_records.TIMING_KEYS)
  assert res.timings["sampling"] > 0 and abs(sum(res.profile().values()) - 1) < 1e-6


def test_deterministic_under_the_key(sampled, tok, oracle):
  policy = sampled["policy"]
  again = _collect(sampled["specs"], policy, tok, oracle, seed=0)
  first = sampled["result"]
  key = lambda r: [(d.command_ids, d.logprobs, d.command, d.op, d.cost, d.a_hier)
                   for d in r.decisions]
  assert key(again) == key(first)
  assert ([t.rewards for t in again.trajectories]
          == [t.rewards for t in first.trajectories])
  # The key matters: the same step-0 inputs under another key sample other commands.
  firsts = [first.trajectory_decisions(j)[0] for j in range(len(first.trajectories))]
  other = policy([d.policy_input for d in firsts], jax.random.PRNGKey(1))
  assert [o.token_ids for o in other] != [d.command_ids for d in firsts]


# ---------------------------------------------------------------- scripted policy


class Scripted:
  """Step 0: rollout 0 issues the task's reference command, 1 issues ∅, 2 an unknown
  tool; later steps ∅. Inputs arrive in (task, rollout) order at step 0."""

  BAD = 'Frobnicate(x="1")'

  def __init__(self, specs):
    self.specs = specs
    self.calls = 0

  def __call__(self, inputs, rng):
    del rng
    self.calls += 1
    if self.calls > 1:
      return ["∅"] * len(inputs)
    assert len(inputs) == len(self.specs) * K
    return [(self.specs[i // K].reference_command, "∅", self.BAD)[i % K]
            for i in range(len(inputs))]


@pytest.fixture(scope="module")
def scripted(pools, tok, oracle):
  specs = _family_specs(pools[0], tok, ("select_episode", "retrieve"), 1024,
                        solved_by=oracle)
  stats = running_stats.RunningStats()
  stats.init_from({"Null": [0.2, 0.6], "SelectEpisode": [0.5, 0.9],
                   "Retrieve": [0.4, 0.8]})
  before = copy.deepcopy(stats)
  res = _collect(specs, Scripted(specs), tok, oracle, stats=stats, budget=1024,
                 limit=2048)
  return dict(specs=specs, result=res, stats=stats, before=before)


def test_scripted_rewards_by_hand(scripted):
  res = scripted["result"]
  for q, spec in enumerate(scripted["specs"]):
    good, null, bad = res.trajectories[q * K:(q + 1) * K]
    # The reference command brings the evidence into C: the oracle answers at once.
    assert good.terminated_by == "answer" and good.result.num_decisions == 1
    assert good.rewards.r_task == 1.0 and good.rewards.r_sup == 1.0
    # ∅ and the rejected command leave the evidence out of C (recovery / retrieve).
    for t in (null, bad):
      assert t.final_answer is None and t.rewards.r_task == 0.0
      assert t.result.num_decisions == 2 and t.rewards.r_eff == 0.0
    first_bad = res.trajectory_decisions(bad.index)[0]
    assert first_bad.op == "Invalid" and not first_bad.accepted
    assert first_bad.violations == ("unknown_tool",) and first_bad.cost == 1.0
    assert bad.rewards.p_aux == pytest.approx(0.5)  # (1.0 + 0.0) / 2 decisions
    assert null.rewards.p_aux == 0.0 and good.rewards.p_aux == 0.0
    assert bad.rewards.m_ans == 0.0 and good.rewards.m_ans == 1.0
    # Online cost (App. F.3): the good rollout used fewest tokens and task steps and
    # the only tool call; an unknown tool is not a tool call.
    assert (good.result.tool_calls, null.result.tool_calls,
            bad.result.tool_calls) == (1, 0, 0)
    assert good.result.task_steps == 1 and null.result.task_steps == 2
    assert good.rewards.cost_task_steps == 0.0 and good.rewards.cost_tokens == 0.0
    assert good.rewards.cost_tool_calls == 1.0
    assert good.rewards.c_bar_online == pytest.approx(1 / 3)
    assert good.rewards.r_eff == pytest.approx(2 / 3)
    for t in (good, null, bad):
      r = t.rewards
      assert r.r_evid == pytest.approx((r.r_sup + r.v_coh) / 2)
      assert r.r_global == pytest.approx(
          (r.r_task + r.r_evid + r.v_state + r.r_eff) / 4)
    assert good.a_global > max(null.a_global, bad.a_global)


def test_scripted_local_advantages_use_running_stats(scripted):
  res, before = scripted["result"], scripted["before"]
  for d in res.decisions:
    if not d.accepted:
      assert d.a_local == 0.0 and d.r_local is None
      continue
    mean, std = before.get(d.op)  # < 8 instances of every op: running statistics
    expect = np.clip((d.r_local - mean) / (max(std, 0.01) + 1e-6), -5, 5)
    assert d.a_local == pytest.approx(expect)
  # After use, the batch was folded into the statistics: one EMA step (0.99) from
  # this update's moments of the type.
  nulls = np.array([d.r_local for d in res.decisions if d.op == "Null"])
  mean, var = before.get("Null")[0], before.get("Null")[1] ** 2
  new_mean = 0.99 * mean + 0.01 * nulls.mean()
  second = 0.99 * (var + mean ** 2) + 0.01 * np.mean(nulls ** 2)
  assert scripted["stats"].get("Null")[0] == pytest.approx(new_mean)
  assert scripted["stats"].get("Null")[1] == pytest.approx(np.sqrt(second - new_mean ** 2))


def test_rejection_preference_is_logged_and_the_floor_zeroes_it(scripted, tok, oracle):
  """The update's metrics (what rl_phase writes to metrics.jsonl) carry the rejection-
  preference diagnostics of the A^hier the learner gets, with and without the floor."""
  specs = scripted["specs"]
  stats = scripted["before"]
  outs = {}
  for floor in adv.REJECTION_FLOORS:
    res = _collect(specs, Scripted(specs), tok, oracle, stats=copy.deepcopy(stats),
                   budget=1024, limit=2048,
                   advantage_config=adv.AdvantageConfig(rejection_floor=floor))
    a = np.array([d.a_hier for d in res.decisions])
    acc = np.array([d.accepted for d in res.decisions])
    assert acc.any() and (~acc).any()
    m = res.metrics
    assert m["advantage/a_hier_rejected_mean"] == pytest.approx(a[~acc].mean())
    assert m["advantage/a_hier_executable_mean"] == pytest.approx(a[acc].mean())
    assert m["advantage/rejection_preference_share"] == pytest.approx(
        np.mean(a[acc] < a[~acc].mean()))
    outs[floor] = res
  floored = outs["below_executable"]
  a = np.array([d.a_hier for d in floored.decisions])
  acc = np.array([d.accepted for d in floored.decisions])
  assert a[~acc].max() < a[acc].min()
  assert floored.metrics["advantage/rejection_preference_share"] == 0.0
  # Executable decisions keep Eq. 5's values; only rejections move, never up.
  eq5 = np.array([d.a_hier for d in outs["none"].decisions])
  np.testing.assert_array_equal(a[acc], eq5[acc])
  assert np.all(a[~acc] <= eq5[~acc])


def test_rejected_tool_calls_are_not_online_cost_calls(scripted, tok, oracle):
  """A rejected known tool costs in P_aux but is no executed call of the online cost
  (App. F.3); it is reported apart."""
  specs = scripted["specs"]
  rejected = "SelectEpisode(selected_refs=[])"  # a known tool with a bad argument

  calls = []

  def policy(inputs, rng):  # step 0: rollout 1 issues the rejected call; then ∅
    del rng
    calls.append(len(inputs))
    return [("∅", rejected, "∅")[i % K] if len(calls) == 1 else "∅"
            for i in range(len(inputs))]

  res = _collect(specs, policy, tok, oracle, budget=1024, limit=2048)
  for q in range(len(specs)):
    null, bad, _ = res.trajectories[q * K:(q + 1) * K]
    first = res.trajectory_decisions(bad.index)[0]
    assert first.is_tool_call and not first.accepted and first.cost == 0.5
    assert bad.result.tool_calls == 0 and bad.result.rejected_tool_calls == 1
    assert bad.rewards.p_aux > 0 and null.rewards.p_aux == 0
    # Same executed calls, steps and (scripted: zero) tokens: no online-cost spread.
    assert bad.rewards.cost_tool_calls == 0.0 and bad.rewards.c_bar_online == 0.0
  assert res.metrics["rollout/rejected_tool_calls"] == len(specs)


def test_rejected_rate_is_split_by_cause(scripted, tok, oracle):
  """The update's rejected rate and its two parts: unparseable text and a tool outside
  the phase's set (Phase B here, so Add); a bad argument is in neither part."""
  specs = scripted["specs"]
  first = ('Filter(drop_refs=["', 'Add(content="x", source_refs=["c2"])',
           "SelectEpisode(selected_refs=[])")  # parse, op_not_allowed, bad_argument
  calls = []

  def policy(inputs, rng):  # step 0: one of each per task; then ∅
    del rng
    calls.append(len(inputs))
    return [first[i % K] if len(calls) == 1 else "∅" for i in range(len(inputs))]

  res = _collect(specs, policy, tok, oracle, budget=1024, limit=2048)
  decisions = [d for t in res.trajectories for d in res.trajectory_decisions(t.index)]
  kinds = [d.violations[0] for d in decisions if not d.accepted]
  assert sorted(kinds) == sorted(["parse", "op_not_allowed", "bad_argument"] * len(specs))
  n = len(decisions)
  assert res.metrics["rollout/rejected_rate"] == pytest.approx(3 * len(specs) / n)
  assert res.metrics["rollout/unparseable_rate"] == pytest.approx(len(specs) / n)
  assert res.metrics["rollout/not_allowed_rate"] == pytest.approx(len(specs) / n)
  # The operation mix: the broken Filter as Unparseable (not under Filter), the Add and
  # the SelectEpisode under their tools although rejected, every other decision ∅.
  shares = {k[len("rollout/op_share_"):]: v for k, v in res.metrics.items()
            if k.startswith("rollout/op_share_")}
  assert shares == {"Unparseable": pytest.approx(len(specs) / n),
                    "Add": pytest.approx(len(specs) / n),
                    "SelectEpisode": pytest.approx(len(specs) / n),
                    "Null": pytest.approx(1 - 3 * len(specs) / n)}


def test_global_verifier_gets_labels_local_does_not(scripted, monkeypatch, tok, oracle):
  seen = {}
  verifier = make_verifier({"backend": "heuristic"})
  orig_local, orig_global = verifier.score_local, verifier.score_global

  def local(inputs):
    seen["local"] = list(inputs)
    return orig_local(inputs)

  def glob(inputs):
    seen["global"] = list(inputs)
    return orig_global(inputs)

  monkeypatch.setattr(verifier, "score_local", local)
  monkeypatch.setattr(verifier, "score_global", glob)
  specs = scripted["specs"]
  res = _collect(specs, Scripted(specs), tok, oracle, budget=1024, limit=2048,
                 verifier=verifier)
  assert len(seen["local"]) == res.num_decisions  # one batched call for the update
  assert len(seen["global"]) == len(res.trajectories)
  for g, t in zip(seen["global"], res.trajectories):
    ex = t.result.spec.example
    assert g.reference_answer == ex.answer
    assert [f.ref for f in g.supporting_facts] == list(
        hotpotqa.supporting_unit_ids(ex))
    assert all(f.text for f in g.supporting_facts)
    # Every decision, ∅ included, with its outcome; the terminal history (budgeted).
    assert len(g.memory_commands) == t.result.num_decisions
    assert g.terminal_history and g.history_omitted == 0
  assert "∅ -> no change" in seen["global"][1].memory_commands  # the ∅ rollout
  for inp in seen["local"]:
    fields = {f.name for f in dataclasses.fields(inp)}
    assert not fields & {"reference_answer", "supporting_facts"}
  # The local inputs come from the executor's own Transition kept in each record;
  # independent reference: u_t executed again on s_t.
  for inp, d in zip(seen["local"], res.decisions):
    spec = res.tasks[d.task]
    cfg = environment.executor_config_for(spec, ExecutorConfig(
        phase="B", context_budget=1024, policy_input_limit=2048))
    again = mexec.execute(d.record.state, d.command, cfg, tok.count_tokens)
    assert inp == adapters.local_input(d.record.state, again,
                                       policy_input=d.policy_input,
                                       command_text=d.command, allowed_ops=cfg.ops)
    assert d.record.transition.command == again.command
  bad = [inp for inp, d in zip(seen["local"], res.decisions) if d.op == "Invalid"]
  assert bad and all(not i.accepted and i.arguments == {} for i in bad)


def test_skipped_verifier_calls_give_no_score(scripted, monkeypatch, tok, oracle):
  """Fallback 'skip' (SPEC §5 decision): an unscored decision gets A^local = 0 and an
  unscored trajectory's verifier terms are left out of r^global, both counted."""
  verifier = make_verifier({"backend": "heuristic"})
  orig_local = verifier.score_local
  unscored = []

  def local(inputs):  # the first executable decision's call failed
    out = orig_local(inputs)
    unscored.append(next(i for i, x in enumerate(inputs) if x.accepted))
    out[unscored[0]] = None
    return out

  monkeypatch.setattr(verifier, "score_local", local)
  monkeypatch.setattr(verifier, "score_global", lambda inputs: [None] * len(inputs))
  specs = scripted["specs"]
  res = _collect(specs, Scripted(specs), tok, oracle, budget=1024, limit=2048,
                 verifier=verifier)
  d = res.decisions[unscored[0]]
  assert d.accepted and d.r_local is None and d.a_local == 0.0
  assert res.metrics["advantage/num_accepted_unscored"] == 1.0
  assert res.metrics["rollout/global_unscored"] == len(res.trajectories)
  for t in res.trajectories:
    r = t.rewards
    assert np.isnan(r.v_coh) and np.isnan(r.v_state) and np.isnan(r.r_state)
    assert r.r_evid == r.r_sup
    assert r.r_global == pytest.approx((r.r_task + r.r_sup + r.r_eff) / 3)
  # A^global normalizes those values within each task's K rollouts.
  r_global = np.array([t.rewards.r_global for t in res.trajectories])
  for q in range(len(specs)):
    g = r_global[q * K:(q + 1) * K]
    expect = ((g - g.mean()) / (max(g.std(), 0.01) + 1e-6) if g.std() > 0
              else np.zeros(K))
    np.testing.assert_allclose([t.a_global for t in res.trajectories[q * K:(q + 1) * K]],
                               np.clip(expect, -5, 5), rtol=1e-6)


class FailingGenerate:
  def __call__(self, *args, **kwargs):
    raise AssertionError("generate must not be reached")


def test_policy_checks_the_reserved_template_overhead(tok, tiny_model):
  config, params = tiny_model
  assert pol.prompt_overhead_tokens(tok) == 29  # Qwen2.5: default system turn + roles
  make = lambda **kw: pol.SamplerPolicy(
      config, params, tok, sampling_config=pol.PolicySamplingConfig(**kw),
      generate_fn=FailingGenerate())
  with pytest.raises(ValueError, match=r"adds 29 tokens around x_t, more than the 28 "
                     r"reserved by config.sampling.prompt_overhead_tokens"):
    make(prompt_overhead_tokens=28)
  policy = make(prompt_overhead_tokens=29, prompt_buckets=[64, 128])
  assert policy.prompt_overhead == 29 and policy.prompt_buckets == (64, 128)
  assert policy.max_prompt_tokens == 128  # the largest bucket
  assert make().max_prompt_tokens == config.max_position_embeddings - 256  # no buckets


def test_policy_rejects_prompts_beyond_the_largest_bucket(tok, tiny_model):
  config, params = tiny_model
  policy = pol.SamplerPolicy(
      config, params, tok,
      sampling_config=pol.PolicySamplingConfig(prompt_buckets=(48, 64)),
      generate_fn=FailingGenerate())
  x = " ".join(["word"] * 40)  # 40 tokens + 29 template tokens > 64
  n = len(pol.policy_prompt_ids(tok, x))
  assert n == len(tok.encode(x)) + 29 > 64
  with pytest.raises(ValueError, match=rf"policy prompt 0 has {n} tokens > "
                     r"max_prompt_tokens 64 \(the largest of sampling.prompt_buckets"):
    policy([x], jax.random.PRNGKey(0))


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt_buckets=(64, 32)), "PolicySamplingConfig.prompt_buckets: .*strictly"),
    (dict(prompt_buckets=()), "PolicySamplingConfig.prompt_buckets"),
    (dict(prompt_overhead_tokens=-1), "prompt_overhead_tokens must be an int >= 0"),
])
def test_sampling_config_rejects_bad_buckets(kwargs, match):
  with pytest.raises(ValueError, match=match):
    pol.PolicySamplingConfig(**kwargs)


def test_policy_program_bound(tok, tiny_model):
  """Sampler programs per decoding mode: prompt buckets x prefill shapes, hand-counted
  (shared prefill prefills min(B, 2^k) rows: 1, 2, ..., 32, then 48 or 64)."""
  config, params = tiny_model
  make = lambda batch, share: pol.SamplerPolicy(
      config, params, tok, batch_buckets=batch,
      sampling_config=pol.PolicySamplingConfig(prompt_buckets=(64, 128, 192),
                                               share_prefill=share),
      generate_fn=FailingGenerate())
  assert make((64,), True).program_bound() == {
      'prompt_buckets': 3, 'batch_buckets': 1, 'prefill_shapes': 7, 'programs': 21}
  assert make((48,), True).program_bound()['prefill_shapes'] == 7
  assert make((8, 64), False).program_bound() == {
      'prompt_buckets': 3, 'batch_buckets': 2, 'prefill_shapes': 2, 'programs': 6}
