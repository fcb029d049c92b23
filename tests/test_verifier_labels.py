"""Training labels in the global verifier input (paper Appendix F.1/F.3).

The global verifier reads the reference answer and the annotated supporting facts;
the local verifier never does. Label-free inputs behave exactly as before.
"""
import dataclasses

import pytest

from vermem_jax.memory import state as mstate
from vermem_jax.memory import token_count
from vermem_jax.verifiers import adapters
from vermem_jax.verifiers import base
from vermem_jax.verifiers import heuristic
from vermem_jax.verifiers import prompts
from vermem_jax.verifiers.base import ItemView

Q = "Which country is the director of Titanic from?"
FACTS = (ItemView("Titanic (1997 film)#0",
                  "Titanic is a 1997 film directed by James Cameron."),
         ItemView("James Cameron#0", "James Cameron is a film director from Canada."))
NOISE = ItemView("c9", "The Nile is the longest river in Africa.", ("Nile#0",))
EVIDENCE = tuple(ItemView(f.ref.replace("#", "_h"), f.text, (f.ref,), "observation")
                 for f in FACTS) + (NOISE,)


def g_input(context, answer="Canada", **labels):
  cls = base.LabeledGlobalVerifierInput if labels else base.GlobalVerifierInput
  return cls(question=Q, final_answer=answer, observed_evidence=EVIDENCE,
             memory_commands=("Retrieve(query=\"Titanic\") -> accepted",),
             terminal_context=context, **labels)


def score(inp):
  return heuristic.HeuristicVerifier().score_global_one(inp)


def test_adapter_builds_labeled_input_only_when_given():
  s = mstate.new_state("t1", Q, count_tokens=token_count.count_whitespace_tokens)
  plain = adapters.global_input(s, "Canada")
  assert type(plain) is base.GlobalVerifierInput
  assert base.global_labels(plain) == (None, ())
  labeled = adapters.global_input(s, "Canada", reference_answer="Canada",
                                  supporting_facts=["James Cameron#0", FACTS[0]])
  assert isinstance(labeled, base.LabeledGlobalVerifierInput)
  assert labeled.reference_answer == "Canada"
  assert labeled.supporting_facts == (ItemView("James Cameron#0", ""), FACTS[0])
  with pytest.raises(TypeError, match="supporting_facts"):
    adapters.global_input(s, "Canada", supporting_facts=[("James Cameron", 0)])


def test_coverage_of_supporting_units_raises_coherence_and_state():
  kept_all = tuple(ItemView(f"c{i}", f.text, (e.ref,), "restored")
                   for i, (f, e) in enumerate(zip(FACTS, EVIDENCE)))
  kept_half = kept_all[1:] + (NOISE,)  # the Titanic -> Cameron hop is lost
  labels = dict(reference_answer="Canada", supporting_facts=FACTS)
  full, half = score(g_input(kept_all, **labels)), score(g_input(kept_half, **labels))
  assert full.evidence_coherence > half.evidence_coherence
  assert full.terminal_memory_consistency >= half.terminal_memory_consistency
  # A context with the answer and every question word but without the Titanic ->
  # Cameron sentence looks complete to the label-free rules; the labels expose it.
  lookalike = (ItemView("c1", "Canada is the home country of a director.",
                        ("James Cameron_h0",), "summary"),
               ItemView("c5", "Notes on Titanic.", ()))
  assert score(g_input(lookalike)).evidence_coherence == 4
  assert score(g_input(lookalike, **labels)).evidence_coherence == 2  # 1 of 2 units
  assert score(g_input(kept_all, **labels)) == score(g_input(kept_all))


def test_units_count_by_provenance_or_wording():
  labels = dict(supporting_facts=FACTS)
  # Summaries that cite the observations (provenance) but reword the sentences.
  cited = (ItemView("c1", "Cameron made it.", ("Titanic (1997 film)_h0",), "summary"),
           ItemView("c2", "He is from Canada.", ("James Cameron_h0",), "summary"))
  worded = (ItemView("c3", FACTS[0].text + " " + FACTS[1].text, (), "summary"),)
  none = (NOISE,)
  s_cited, s_worded, s_none = (score(g_input(c, answer="yes", **labels))
                               for c in (cited, worded, none))
  # A yes/no answer: coherence is the chain coverage itself.
  assert s_cited.evidence_coherence == s_worded.evidence_coherence == 4
  assert s_none.evidence_coherence == 0
  assert s_none.terminal_memory_consistency <= 1


def test_global_prompt_shows_labels_only_when_present():
  ctx = (NOISE,)
  plain = prompts.global_messages(g_input(ctx), 4000)[1]["content"]
  assert "Reference answer" not in plain and "supporting facts" not in plain
  labeled = prompts.global_messages(
      g_input(ctx, reference_answer="Canada", supporting_facts=FACTS), 4000)
  user = labeled[1]["content"]
  assert "Reference answer:\nCanada" in user
  assert "James Cameron#0" in user and FACTS[0].text in user
  assert prompts.LABELS_NOTE in user


def test_local_scope_has_no_labels():
  fields = {f.name for f in dataclasses.fields(base.LocalVerifierInput)}
  assert not fields & {"reference_answer", "supporting_facts", "final_answer"}
  with pytest.raises(TypeError, match="ItemView"):
    base.LabeledGlobalVerifierInput(question=Q, final_answer=None,
                                    supporting_facts=("James Cameron#0",))
