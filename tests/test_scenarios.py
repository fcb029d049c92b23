"""Tests for vermem_jax.envs.scenarios.build: Phase A/B/C episodes (SPEC §4)."""
import collections
import dataclasses
import json
import re

import pytest

from vermem_jax.envs import answer_metrics
from vermem_jax.envs import environment as env
from vermem_jax.envs import episode_types
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import task_solvers as ts
from vermem_jax.envs.scenarios.build import build_episode, build_episodes
from vermem_jax.envs.scenarios.initial_state import validate_initial_state
from vermem_jax.envs.scenarios.needs import _same_sentence
from vermem_jax.envs.scenarios.spec import FAMILIES, PHASES, ScenarioConfig
from vermem_jax.envs.scenarios.views import build_view
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import state as mstate
from vermem_jax.memory.token_count import count_whitespace_tokens as count

CFG = ScenarioConfig()


def test_every_construction_example_builds_valid_initial_states(pools):
  """Each phase builds an episode for every construction-pool example; s_0 passes the
  structural checks and the reference command is accepted by the executor."""
  construction, _ = pools
  built = collections.Counter()
  for i, ex in enumerate(construction):
    view = build_view(ex, count)
    for phase in PHASES:
      fams = FAMILIES[phase]
      spec = None
      for k in range(len(fams)):  # round-robin family; the next one if inapplicable
        fam = fams[(i + k) % len(fams)]
        spec = build_episode(ex, phase, fam, count_tokens=count, config=CFG,
                             view=view)
        if spec is not None:
          break
      assert spec is not None, (ex.id, phase)
      built[(phase, spec.family)] += 1
      s0 = spec.initial_state
      assert validate_initial_state(s0, count, CFG.context_budget, example=ex) == []
      assert s0.context_tokens() <= CFG.context_budget
      assert s0.q == ex.question and s0.task_id == ex.id
      assert s0.C[0].kind == mstate.INSTRUCTION and s0.C[0].protected
      tr = mexec.execute(s0, spec.reference_command,
                         mconfig.ExecutorConfig(phase=phase), count)
      assert tr.accepted, (ex.id, phase, spec.family, tr.message)
      assert tr.op in cmds.PHASE_OPS[phase]
      # The delayed query is the last observation and reachable in the rollout limit.
      assert spec.observations[-1].text.endswith(ex.question)
      assert spec.max_decisions == len(spec.observations) + 1
      assert spec.delayed_query.observation_index == len(spec.observations) - 1
      for ob in spec.observations[:-1]:
        assert ob.source_refs and set(ob.source_refs) <= {
            u.id for u in hotpotqa.evidence_units(ex)}
  for phase in PHASES:  # round-robin reached every family
    assert {f for p, f in built if p == phase} == set(FAMILIES[phase])


def test_phase_b_recovery_evidence_only_in_history(pools):
  construction, _ = pools
  for ex in construction[:80]:
    view = build_view(ex, count)
    spec = build_episode(ex, 'B', 'select_episode', count_tokens=count, config=CFG,
                         view=view)
    s0 = spec.initial_state
    sup = set(hotpotqa.supporting_unit_ids(ex))
    in_c = set().union(*(it.evidence for it in s0.C))
    in_m = set().union(*(e.current.evidence for e in s0.M))
    gold_events = [i for i, h in enumerate(s0.H) if set(h.evidence) & sup]
    assert spec.is_recovery and gold_events
    assert not (in_c | in_m) & sup
    # Related distractors are more recent than every gold event, and are in C.
    later = [h for h in s0.H[max(gold_events) + 1:] if h.kind == 'observation']
    assert later and all(not set(h.evidence) & sup for h in later)
    assert all(h.id in {it.origin for it in s0.C} for h in later)
    # M_0 holds distractor entries, so Retrieve cannot bring the evidence.
    assert s0.M and all(not set(e.current.evidence) & sup for e in s0.M)


def _scripted(specs):
  scripts = {json.dumps(s.initial_state.q, ensure_ascii=False): [s.reference_command]
             for s in specs}

  def policy(xs):
    out = []
    for x in xs:
      (q,) = [q for q in scripts if q in x]
      out.append(scripts[q].pop(0) if scripts[q] else '∅')
    return out
  return policy


def test_recovery_scripted_policy_answers_null_policy_does_not(pools):
  construction, _ = pools
  specs = [s for s in build_episodes(construction, 'B', count_tokens=count,
                                     config=CFG, num=40) if s.is_recovery]
  assert len(specs) >= 4
  oracle = ts.OracleEvidenceReader.from_examples(construction)
  cfg = mconfig.ExecutorConfig()
  results = env.run_episodes(specs, _scripted(specs), oracle, count_tokens=count,
                             executor_config=cfg)
  for res in results:
    ex = res.spec.example
    r_task = 0.5 * (answer_metrics.exact_match(res.final_answer, ex.answer)
                    + answer_metrics.f1_score(res.final_answer, ex.answer))
    assert res.decisions[0].op == 'SelectEpisode' and res.decisions[0].accepted
    assert r_task == 1.0 and res.terminated_by == 'answer'
  nulls = env.run_episodes(specs, lambda xs: ['∅'] * len(xs), oracle,
                           count_tokens=count, executor_config=cfg)
  for res in nulls:
    assert res.final_answer is None and res.terminated_by == 'env_end'


_CURRENT = re.compile(r'current environment item "?([^";\s]+)"?;')


def add_current_observation(xs):
  """Scripted Phase A policy: Add the current environment item's text (from x_t)."""
  out = []
  for x in xs:
    m = _CURRENT.search(x)
    cid = m.group(1) if m else 'none'
    line = re.search(r'^\["' + re.escape(cid) + r'" observation\] (".*")$', x, re.M)
    if line is None:
      out.append('∅')
      continue
    text = json.loads(line.group(1))
    out.append(cmds.format_command(cmds.Command(
        cmds.ADD, {'content': text, 'source_refs': [cid]})))
  return out


def test_phase_a_delayed_query_reads_ltm(pools):
  """Phase A: the solver is first asked after the delayed query and reads the active
  LTM; storing every revealed sentence gets the answer, ∅ throughout does not."""
  construction, _ = pools
  specs = [s for s in build_episodes(construction, 'A', count_tokens=count,
                                     config=CFG, num=24) if s.family == 'add']
  assert len(specs) >= 3
  oracle = ts.OracleEvidenceReader.from_examples([s.example for s in specs])
  cfg = mconfig.ExecutorConfig(phase='A')
  for s in specs:
    assert s.answer_context == episode_types.SOLVER_READS_LTM
    assert s.answer_from == len(s.observations)
    assert s.delayed_query.context_source == 'ltm'
  results = env.run_episodes(specs, add_current_observation, oracle,
                             count_tokens=count, executor_config=cfg)
  for s, res in zip(specs, results):
    sup = set(hotpotqa.supporting_unit_ids(s.example))
    revealed = set(s.initial_state.C[-1].evidence).union(
        *(ob.source_refs for ob in s.observations))
    assert sup <= revealed  # the rollout limit kept every fact in the schedule
    assert res.final_answer == s.example.answer, s.episode_id
    assert res.task_steps == 1  # asked once, after the query
  nulls = env.run_episodes(specs, lambda xs: ['∅'] * len(xs), oracle,
                           count_tokens=count, executor_config=cfg)
  assert all(r.final_answer is None for r in nulls)


def test_families_sampled_uniformly_and_deterministic(pools):
  construction, dev = pools
  specs = build_episodes(construction, 'B', count_tokens=count, config=CFG,
                         num=250)
  fams = collections.Counter(s.family for s in specs)
  assert set(fams) == set(FAMILIES['B'])
  assert all(30 <= n <= 70 for n in fams.values()), fams  # 50 expected each
  again = build_episodes(construction, 'B', count_tokens=count, config=CFG,
                         num=250)
  assert [s.episode_id for s in again] == [s.episode_id for s in specs]
  assert [s.initial_state.to_json() for s in again] == [
      s.initial_state.to_json() for s in specs]
  assert [s.observations for s in again] == [s.observations for s in specs]
  other = build_episodes(construction, 'B', count_tokens=count,
                         config=ScenarioConfig(seed=1), num=250)
  assert [s.episode_id for s in other] != [s.episode_id for s in specs]
  dev_specs = build_episodes(dev, 'C', count_tokens=count, config=CFG, split='dev',
                             num=20)
  dev_ids = {ex.id for ex in dev}
  assert all(s.example.id in dev_ids and s.split == 'dev' for s in dev_specs)


def test_bad_arguments_raise(pools):
  construction, _ = pools
  ex = construction[0]
  with pytest.raises(ValueError, match='phase'):
    build_episode(ex, 'D', 'add', count_tokens=count)
  with pytest.raises(ValueError, match='family'):
    build_episode(ex, 'A', 'retrieve', count_tokens=count)
  with pytest.raises(ValueError, match='split'):
    build_episodes(construction, 'A', count_tokens=count, split='test')
  with pytest.raises(ValueError, match='empty'):
    build_episodes([], 'A', count_tokens=count, num=1)
  with pytest.raises(ValueError, match='fill_min'):
    ScenarioConfig(fill_min=0.9, fill_max=0.5)
  with pytest.raises(ValueError, match='num_train'):
    ScenarioConfig(num_train=-1)
  cfg = ScenarioConfig.from_config({'num_train': 5, 'not_a_field': 'A',
                                    'rollout_limit': 6})
  assert cfg.num_train == 5 and cfg.rollout_limit == 6


def test_rollout_limit_trims_distractors_first(pools):
  construction, _ = pools
  cfg = ScenarioConfig(rollout_limit=4)
  for ex in construction[:40]:
    spec = build_episode(ex, 'A', 'add', count_tokens=count, config=cfg)
    assert len(spec.observations) + 1 <= 4
    assert spec.max_decisions == len(spec.observations) + 1
    sup = set(hotpotqa.supporting_unit_ids(ex))
    kept = [o for o in spec.observations[:-1]]
    n_facts = sum(bool(set(o.source_refs) & sup) for o in kept)
    assert n_facts == len(kept) or n_facts >= 2  # distractors go before facts


def test_example_without_resolvable_facts_is_skipped(pools):
  construction, _ = pools
  bad = dataclasses.replace(construction[0], id='no-resolvable-facts',
                            supporting_facts=(('Missing title', 0),))
  assert build_view(bad, count).facts == ()
  for phase in PHASES:
    for fam in FAMILIES[phase]:
      assert build_episode(bad, phase, fam, count_tokens=count) is None
  specs = build_episodes([bad] + construction[:5], 'B', count_tokens=count, num=6)
  assert len(specs) == 6 and all(s.example.id != bad.id for s in specs)


_ENTRY = re.compile(r'^\["(\S+:m\d+)" v\d+\] (".*")$', re.M)
_OBS = re.compile(r'^\["(\S+:c\d+)" observation\] (".*")$', re.M)


def _about(a, b):
  """Same 'Title: ' prefix and half of a's words among b's."""
  ta, _, ra = a.partition(': ')
  tb, _, rb = b.partition(': ')
  wa, wb = ra.split(), set(rb.split())
  return ta == tb and bool(wa) and 2 * sum(w in wb for w in wa) >= len(wa)


class CorrectPhaseAPolicy:
  """Scripted correct Phase A policy. Private knowledge (from the specs): the stale
  texts and the supporting-fact texts. Per decision: a stale entry whose correct
  version is already held is deleted; one whose source sentence is in C is updated
  from it (how='update') or deleted (how='delete'); otherwise the first supporting
  sentence in C that M lacks is added; else ∅."""

  def __init__(self, specs, how='update'):
    self.how = how
    self.info = {}
    for s in specs:
      facts = {f.text for f in build_view(s.example, count).facts}
      self.info[json.dumps(s.initial_state.q, ensure_ascii=False)] = (
          set(s.stale_texts), facts)

  def __call__(self, xs):
    return [self.decide(x) for x in xs]

  def decide(self, x):
    (q,) = [q for q in self.info if q in x]
    stale, facts = self.info[q]
    entries = [(i, json.loads(t)) for i, t in _ENTRY.findall(x)]
    obs = [(i, json.loads(t)) for i, t in _OBS.findall(x)]
    held = [t for _, t in entries if t not in stale]
    for i, t in entries:
      if t not in stale:
        continue
      if any(_about(t, g) for g in held):
        return f'Delete(memory_id="{i}", reason="obsolete version")'
      src = [(c, o) for c, o in obs if o in facts and _about(t, o)]
      if src and self.how == 'update':
        return cmds.format_command(cmds.Command(cmds.UPDATE, {
            'memory_id': i, 'new_content': src[0][1], 'source_refs': [src[0][0]]}))
      if src:
        return f'Delete(memory_id="{i}", reason="outdated version")'
    for c, o in obs:
      if o in facts and not any(o == h for h in held):
        return cmds.format_command(cmds.Command(
            cmds.ADD, {'content': o, 'source_refs': [c]}))
    return '∅'


def add_only_policy(xs):
  """Stores each new observation and never repairs memory (no Update/Delete)."""
  out = []
  for x in xs:
    held = {json.loads(t) for _, t in _ENTRY.findall(x)}
    cur = _CURRENT.search(x)
    obs = dict((i, json.loads(t)) for i, t in _OBS.findall(x))
    cid = cur.group(1) if cur else None
    if cid in obs and obs[cid] not in held:
      out.append(cmds.format_command(cmds.Command(
          cmds.ADD, {'content': obs[cid], 'source_refs': [cid]})))
    else:
      out.append('∅')
  return out


def _r_task(res):
  ex = res.spec.example
  if res.final_answer is None:
    return 0.0
  return 0.5 * (answer_metrics.exact_match(res.final_answer, ex.answer)
                + answer_metrics.f1_score(res.final_answer, ex.answer))


def test_phase_a_stale_and_obsolete_entries_must_be_repaired(pools):
  """Phase A update/delete: the stale texts are a private label of the spec; ∅
  throughout and storing facts beside a stale entry get r^task 0, a policy that
  Updates (or Deletes) the stale entry gets r^task 1. In the null family ∅ is right."""
  construction, _ = pools
  specs = build_episodes(construction, 'A', count_tokens=count, config=CFG, num=60)
  fams = collections.Counter(s.family for s in specs)
  assert fams['update'] >= 8 and fams['delete'] >= 8, fams
  for s in specs:
    planted = {e.content for e in s.initial_state.active_entries()
               if not e.current.evidence}
    assert set(s.stale_texts) == planted  # exactly the unsourced M_0 entries
    if s.family == 'update':
      assert 1 <= len(s.stale_texts) <= 2
    elif s.family == 'delete':
      # A stale version, or (no number / too short) an exact duplicate: redundant,
      # not conflicting, so not labelled.
      dup = 'duplicate of' in s.reference_command
      assert len(s.stale_texts) == (0 if dup else 1)
    else:
      assert s.stale_texts == ()
  oracle = ts.OracleEvidenceReader.from_examples(construction)
  cfg = mconfig.ExecutorConfig(phase='A')

  def run(policy):
    return env.run_episodes(specs, policy, oracle, count_tokens=count,
                            executor_config=cfg)

  for how in ('update', 'delete'):
    for res in run(CorrectPhaseAPolicy(specs, how)):
      assert _r_task(res) == 1.0, (how, res.spec.episode_id)
      assert all(d.accepted for d in res.decisions), res.spec.episode_id
      ops = collections.Counter(d.op for d in res.decisions)
      if res.spec.family == 'update':
        assert ops['Update' if how == 'update' else 'Delete'] == len(
            res.spec.stale_texts)
      if res.spec.family == 'delete':
        assert ops['Delete'] == 1 and res.decisions[0].op == 'Delete'
  for res in run(lambda xs: ['∅'] * len(xs)):
    assert (_r_task(res) == 1.0) == (res.spec.family == 'null'), res.spec.episode_id
  for res in run(add_only_policy):
    if res.spec.stale_texts:
      assert res.final_answer is None, res.spec.episode_id
      assert oracle.judge(env.solver_input(res.spec, res.final_state)) == (
          ts.STALE_RECORD)
    else:  # add, null, delete-with-duplicate: nothing conflicting to repair
      assert _r_task(res) == 1.0, res.spec.episode_id


def test_phase_a_stale_entries_citing_their_unit_do_not_answer(pools):
  """The construction the flaw was found in: stale M_0 entries citing the supporting
  unit they misstate. ∅ throughout must not answer from them (it answered 22 of 26
  update episodes in 100 under the provenance-only oracle)."""
  construction, _ = pools
  specs = [s for s in build_episodes(construction, 'A', count_tokens=count,
                                     config=CFG, num=60) if s.family == 'update']
  cited = []
  for s in specs:
    view = build_view(s.example, count)
    entries = []
    for e in s.initial_state.M:
      (f,) = [f for f in view.facts if _same_sentence(e.content, f)][:1]
      v = dataclasses.replace(e.current, evidence=(f.unit_id,))
      entries.append(dataclasses.replace(e, versions=(v,)))
    cited.append(dataclasses.replace(
        s, initial_state=s.initial_state.evolve(M=tuple(entries))))
  sup_cited = [s for s in cited if set(hotpotqa.supporting_unit_ids(s.example)) <=
               set().union(*(e.current.evidence for e in s.initial_state.M))]
  assert len(sup_cited) >= 3  # provenance alone would answer these
  oracle = ts.OracleEvidenceReader.from_examples(construction)
  results = env.run_episodes(cited, lambda xs: ['∅'] * len(xs), oracle,
                             count_tokens=count,
                             executor_config=mconfig.ExecutorConfig(phase='A'))
  assert all(r.final_answer is None for r in results)
  results = env.run_episodes(cited, CorrectPhaseAPolicy(specs), oracle,
                             count_tokens=count,
                             executor_config=mconfig.ExecutorConfig(phase='A'))
  assert all(_r_task(r) == 1.0 for r in results)


def test_phase_c_update_filter_labels_its_stale_entry(pools):
  construction, _ = pools
  specs = [s for s in build_episodes(construction, 'C', count_tokens=count,
                                     config=CFG, num=24)]
  for s in specs:
    if s.family == 'update_filter':
      (stale,) = s.stale_texts
      ref = cmds.parse_command(s.reference_command)
      assert s.initial_state.entry(dict(ref.args)['memory_id']).content == stale
    else:
      assert s.stale_texts == ()
  assert any(s.family == 'update_filter' for s in specs)
