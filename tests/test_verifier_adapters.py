"""Verifier inputs built from real memory states and transitions."""
import dataclasses

from vermem_jax.memory import executor as mexec
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import interaction
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import state as mstate
from vermem_jax.memory import token_count
from vermem_jax.verifiers import adapters, base, heuristic

COUNT = token_count.count_whitespace_tokens
Q = "Which country is the director of Titanic from?"


def _state():
  s = mstate.new_state("task-1", Q, COUNT, instruction="Answer the question.")
  cfg = mconfig.ExecutorConfig()
  s, _ = interaction.interact(s, "search Titanic", "Titanic is a 1997 American film directed "
                         "by James Cameron.", COUNT, cfg, observation_refs=("Titanic#0",))
  s, _ = interaction.interact(s, "search Bread", "Bread is baked from flour and yeast.",
                         COUNT, cfg, observation_refs=("Bread#0",))
  s, _ = interaction.interact(s, "search Cameron", "James Cameron is a Canadian filmmaker "
                         "born on August 16, 1954.", COUNT, cfg,
                         observation_refs=("James Cameron#0",))
  return s, cfg


def test_op_names_match_memory():
  assert base.ALL_OPS == cmds.ALL_OPS
  assert base.LTM_OPS == cmds.LTM_OPS and base.STM_OPS == cmds.STM_OPS


def test_add_transition_becomes_local_input():
  s, cfg = _state()
  obs = [it for it in s.C if it.kind == mstate.OBSERVATION]
  text = (f'Add(content="James Cameron is a Canadian filmmaker.", '
          f'source_refs=["{obs[2].id}"])')
  tr = mexec.execute(s, text, cfg, COUNT)
  assert tr.accepted, tr.message
  inp = adapters.local_input(s, tr, policy_input="x_t", command_text=text,
                             allowed_ops=cmds.PHASE_OPS["A"])
  assert inp.op == "Add" and inp.accepted and inp.question == Q
  (added,) = inp.transition.ltm_added
  assert added.text == "James Cameron is a Canadian filmmaker."
  assert added.source_refs == (obs[2].id,)
  assert not inp.transition.context_added and not inp.transition.ltm_deleted
  assert [it.ref for it in inp.context_before] == [it.id for it in s.C]
  assert inp.memory_before == ()
  assert [e.kind for e in inp.visible_evidence] == ["observation"] * 3
  assert inp.arguments["content"] == added.text
  s_local = heuristic.HeuristicVerifier().score_local([inp])[0]
  assert s_local.grounding == 4 and s_local.relevance >= 2


def test_filter_delete_update_and_rejection_deltas():
  s, cfg = _state()
  obs = [it for it in s.C if it.kind == mstate.OBSERVATION]
  bread = obs[1]
  text = f'Filter(drop_refs=["{bread.id}"])'
  tr = mexec.execute(s, text, cfg, COUNT)
  assert tr.accepted, tr.message
  inp = adapters.local_input(s, tr, policy_input="x", command_text=text)
  assert [it.ref for it in inp.transition.context_removed] == [bread.id]
  assert inp.transition.context_tokens_after < inp.transition.context_tokens_before
  sc = heuristic.HeuristicVerifier().score_local([inp])[0]
  assert sc.local_progress == 4  # dropped the irrelevant bread sentence

  s2, mid = mstate.add_entry(s, "James Cameron was born in 1955.", COUNT,
                             source_refs=("James Cameron#0",))
  up = (f'Update(memory_id="{mid}", new_content="James Cameron was born in 1954.", '
        f'source_refs=["{obs[2].id}"])')
  tr = mexec.execute(s2, up, cfg, COUNT)
  assert tr.accepted, tr.message
  inp = adapters.local_input(s2, tr, policy_input="x", command_text=up)
  (u,) = inp.transition.ltm_updated
  assert u.before.text.endswith("1955.") and u.after.text.endswith("1954.")

  de = f'Delete(memory_id="{mid}", reason="superseded")'
  tr = mexec.execute(s2, de, cfg, COUNT)
  inp = adapters.local_input(s2, tr, policy_input="x", command_text=de)
  assert [e.ref for e in inp.transition.ltm_deleted] == [mid]

  bad = 'Frobnicate(x="1")'
  tr = mexec.execute(s, bad, cfg, COUNT)
  inp = adapters.local_input(s, tr, policy_input="x", command_text=bad)
  assert not inp.accepted and inp.transition.is_identity
  assert heuristic.HeuristicVerifier().score_local([inp]) == [None]


def test_global_input_scope():
  s, cfg = _state()
  obs = [it for it in s.C if it.kind == mstate.OBSERVATION]
  text = (f'Add(content="James Cameron is a Canadian filmmaker.", '
          f'source_refs=["{obs[2].id}"])')
  s = mexec.execute(s, text, cfg, COUNT).state_after
  s = mexec.execute(s, 'Delete(memory_id="nope", reason="x")', cfg, COUNT).state_after
  g = adapters.global_input(s, "Canada")
  assert g.final_answer == "Canada" and g.question == Q
  assert len(g.observed_evidence) == 3
  assert len(g.memory_commands) == 2 and "rejected" in g.memory_commands[1]
  assert [e.text for e in g.terminal_ltm] == ["James Cameron is a Canadian filmmaker."]
  assert not any(f.name in ("reference_answer", "supporting_facts")
                 for f in dataclasses.fields(g))
  (gs,) = heuristic.HeuristicVerifier().score_global([g])
  assert isinstance(gs, base.GlobalScores)


def test_global_input_carries_null_decisions_and_the_budgeted_history():
  from vermem_jax.verifiers import prompts
  s, cfg = _state()
  obs = [it for it in s.C if it.kind == mstate.OBSERVATION]
  records = []
  for text in (f'Add(content="James Cameron is a Canadian filmmaker.", '
               f'source_refs=["{obs[2].id}"])', "∅", 'Delete(memory_id="nope", '
               'reason="x")'):
    tr = mexec.execute(s, text, cfg, COUNT)
    records.append(dataclasses.make_dataclass(
        "Rec", ["command", "accepted", "transition_message"])(
            text, tr.accepted, tr.message))
    s = tr.state_after
  g = adapters.global_input(s, "Canada", decisions=records)
  assert g.memory_commands == (
      f'{records[0].command} -> created {s.M[0].id}', "∅ -> no change",
      f'{records[2].command} -> rejected: {records[2].transition_message}')
  # Without a budget the whole H (task actions too), policy records excluded.
  assert {e.kind for e in g.terminal_history} == {"observation", "task_action"}
  hist = [e for e in s.H if e.kind not in (mstate.EV_MEMORY_DECISION,
                                           mstate.EV_REJECTED)]
  assert [e.ref for e in g.terminal_history] == [e.id for e in hist]
  assert g.history_omitted == 0
  # A budget keeps the newest events that fit, drops the oldest and counts them.
  budget = hist[-1].tokens + hist[-2].tokens
  g2 = adapters.global_input(s, "Canada", decisions=records,
                             history_token_budget=budget)
  assert [e.ref for e in g2.terminal_history] == [e.id for e in hist[-2:]]
  assert g2.history_omitted == len(hist) - 2
  g3 = adapters.global_input(s, "Canada", history_token_budget=budget - 1)
  assert [e.ref for e in g3.terminal_history] == [hist[-1].id]
  assert len(g3.memory_commands) == 2  # from H: no ∅ record
  text = prompts.global_messages(g2, 4000)[1]["content"]
  assert f"the {len(hist) - 2} oldest events are left out" in text
  assert "∅ -> no change" in text and hist[-1].text in text
  # Evidence shown in the history section is not listed again among observed evidence.
  evidence = text.split("Evidence observed")[1].split("Memory decisions")[0]
  assert hist[-1].text not in evidence
  assert all(e.text in evidence for e in hist[:-2] if e.kind == "observation")
