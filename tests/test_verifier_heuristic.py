"""Heuristic verifier: discriminative, deterministic scores on hand-built transitions."""
import dataclasses

import pytest

from vermem_jax.verifiers import base, heuristic
from vermem_jax.verifiers.base import ItemUpdate, ItemView, TransitionDelta

Q = "Which country is the director of Titanic from?"
INSTR = ItemView("c0", "Answer the question using the context.", (), "instruction")
TITANIC = ItemView("Titanic#0", "Titanic is a 1997 American epic romance film directed "
                   "by James Cameron.", (), "observation")
CAMERON = ItemView("James Cameron#0", "James Cameron is a Canadian filmmaker born on "
                   "August 16, 1954.", (), "observation")
EIFFEL = ItemView("Eiffel Tower#0", "The Eiffel Tower is located in Paris and opened "
                  "in 1889.", (), "observation")
AVATAR = ItemView("c9", "Bread is baked from flour, water and yeast in an oven.", (),
                  "observation")
EVIDENCE = (TITANIC, CAMERON, EIFFEL)


def verifier():
  return heuristic.HeuristicVerifier()


def local(op, transition=TransitionDelta(), **kw):
  kw.setdefault("context_before", (INSTR, TITANIC))
  kw.setdefault("visible_evidence", EVIDENCE)
  return base.LocalVerifierInput(question=Q, policy_input="x_t", command=f"{op}(...)",
                                 op=op, transition=transition, **kw)


def score(inp):
  (s,) = verifier().score_local([inp])
  return s


def add(content, refs):
  return local("Add", TransitionDelta(ltm_added=(ItemView("m9", content, refs, "ltm"),)))


def test_text_features():
  assert heuristic.content_terms("The director directed films") == {"direct", "film"}
  facts = heuristic.key_facts("Titanic is a 1997 film by James Cameron, out on March 3.")
  assert facts == {"1997", "james", "cameron", "march", "3"}


def test_add_relevant_grounded_beats_irrelevant():
  good = score(add("James Cameron is a Canadian filmmaker.", ("James Cameron#0",)))
  bad = score(add("The Eiffel Tower opened in 1889.", ("Eiffel Tower#0",)))
  assert good.relevance > bad.relevance == 0
  assert good.local_progress > bad.local_progress
  assert good.r_local > bad.r_local
  assert good.grounding == bad.grounding == 4  # both are faithful to their sources


def test_add_fabricated_facts_lose_grounding_and_fidelity():
  faithful = score(add("James Cameron is a Canadian filmmaker born in 1954.",
                       ("James Cameron#0",)))
  invented = score(add("James Cameron is a Mexican stuntman born in 1961.",
                       ("James Cameron#0",)))
  assert faithful.information_fidelity == 4
  assert invented.information_fidelity < faithful.information_fidelity
  assert invented.grounding < faithful.grounding


def test_add_duplicate_of_memory_makes_no_progress():
  mem = (ItemView("m1", "James Cameron is a Canadian filmmaker.", ("James Cameron#0",)),)
  fresh = score(add("James Cameron is a Canadian filmmaker.", ("James Cameron#0",)))
  dup = score(dataclasses.replace(
      add("James Cameron is a Canadian filmmaker.", ("James Cameron#0",)),
      memory_before=mem))
  assert dup.local_progress == 0 < fresh.local_progress


def test_add_uncited_source_caps_grounding():
  s = score(add("James Cameron is a Canadian filmmaker.", ("Nowhere#3",)))
  assert s.grounding <= heuristic.HeuristicRules().uncited_grounding_cap


def summarize(summary):
  src = ItemView("c3", "Titanic is a 1997 American film directed by James Cameron. "
                 "It was released on December 19, 1997 and grossed 2.2 billion dollars.",
                 ("Titanic#0", "Titanic#1"), "observation")
  t = TransitionDelta(context_removed=(src,),
                      context_added=(ItemView("c4", summary, ("c3",), "summary"),))
  return local("Summarize", t, context_before=(INSTR, src))


def test_summarize_dropping_a_number_loses_fidelity():
  keep = score(summarize("Titanic (1997, directed by James Cameron) came out December "
                         "19, 1997 and grossed 2.2 billion dollars."))
  drop = score(summarize("Titanic (1997, directed by James Cameron) came out December "
                         "19, 1997 and grossed billions."))
  assert keep.information_fidelity == 4
  assert drop.information_fidelity < keep.information_fidelity


def test_summarize_that_does_not_shrink_makes_no_progress():
  long_summary = ("Titanic is a 1997 American film directed by James Cameron. It was "
                  "released on December 19, 1997 and grossed 2.2 billion dollars. "
                  "Titanic is a 1997 American film directed by James Cameron.")
  assert score(summarize(long_summary)).local_progress == 0
  short = score(summarize("Titanic (1997, James Cameron) out December 19, 1997; "
                          "grossed 2.2 billion dollars."))
  assert short.local_progress >= 2


MEMORY = (ItemView("m1", "Titanic is a 1997 film directed by James Cameron.",
                   ("Titanic#0",), "ltm"),
          ItemView("m2", "James Cameron is a Canadian filmmaker.", ("James Cameron#0",),
                   "ltm"))


def test_null_with_missing_evidence_scores_below_useful_retrieve():
  ctx = (INSTR, AVATAR)
  retrieve = local("Retrieve", TransitionDelta(context_added=(
      ItemView("c5", MEMORY[0].text, MEMORY[0].source_refs, "retrieved"),)),
                   context_before=ctx, memory_before=MEMORY, visible_evidence=(),
                   arguments={"query": "director of Titanic"},
                   allowed_ops=base.STM_OPS + ("Null",))
  null = local("Null", context_before=ctx, memory_before=MEMORY, visible_evidence=(),
               allowed_ops=base.STM_OPS + ("Null",))
  r, n = score(retrieve), score(null)
  assert r.local_progress >= 3
  assert n.local_progress < r.local_progress
  assert n.relevance < r.relevance
  assert n.information_fidelity == 4  # identity transition keeps everything


def test_null_when_nothing_is_pending_scores_full():
  ctx = (INSTR, ItemView("c1", MEMORY[0].text, (), "retrieved"),
         ItemView("c2", MEMORY[1].text, (), "retrieved"))
  s = score(local("Null", context_before=ctx, memory_before=MEMORY, visible_evidence=(),
                  allowed_ops=base.STM_OPS + ("Null",)))
  assert s.as_dict() == dict.fromkeys(base.LOCAL_DIMENSIONS, 4)


def test_null_in_phase_a_with_unstored_relevant_fact_is_penalised():
  ctx = (INSTR, ItemView("o1", "Titanic (1997) is a film directed by James Cameron, "
                         "a director from Canada.", ("Titanic#0",), "observation"))
  phase_a = base.LTM_OPS + ("Null",)
  pending = score(local("Null", context_before=ctx, memory_before=(), allowed_ops=phase_a,
                        visible_evidence=()))
  stored = score(local("Null", context_before=ctx, allowed_ops=phase_a,
                       visible_evidence=(), memory_before=(
                           ItemView("m1", ctx[1].text, ("Titanic#0",), "ltm"),)))
  assert pending.local_progress < stored.local_progress


def test_retrieve_of_already_present_or_irrelevant_scores_low():
  ctx = (INSTR, ItemView("c1", MEMORY[0].text, (), "retrieved"))
  redundant = local("Retrieve", TransitionDelta(context_added=(
      ItemView("c5", MEMORY[0].text, (), "retrieved"),)), context_before=ctx,
                    memory_before=MEMORY, arguments={"query": "Titanic director"})
  s = score(redundant)
  assert s.local_progress == 0 and s.relevance <= 1


def test_delete_superseded_beats_delete_of_needed_fact():
  old = ItemView("m3", "James Cameron was born in 1955.", ("James Cameron#0",), "ltm")
  mem = MEMORY + (old,)
  good = score(local("Delete", TransitionDelta(ltm_deleted=(old,)), memory_before=mem,
                     arguments={"reason": "contradicted by the newer source"}))
  bad = score(local("Delete", TransitionDelta(ltm_deleted=(MEMORY[0],)),
                    memory_before=mem, arguments={"reason": "not needed"},
                    context_before=(INSTR,), visible_evidence=(CAMERON,)))
  assert good.as_dict() == dict.fromkeys(base.LOCAL_DIMENSIONS, 4)
  assert bad.local_progress == 0 and bad.information_fidelity == 0
  assert bad.r_local < good.r_local


def test_delete_irrelevant_entry_is_reasonable():
  junk = ItemView("m4", "Bread is baked from flour.", (), "ltm")
  s = score(local("Delete", TransitionDelta(ltm_deleted=(junk,)),
                  memory_before=MEMORY + (junk,), arguments={"reason": "irrelevant"}))
  assert s.local_progress == 3 and s.information_fidelity == 4


def test_update_correction_beats_cosmetic_rewrite():
  before = ItemView("m3", "James Cameron was born in 1955.", ("James Cameron#0",), "ltm")
  fix = ItemView("m3", "James Cameron was born on August 16, 1954.",
                 ("James Cameron#0",), "ltm")
  cosmetic = ItemView("m3", "Born in 1955: James Cameron.", ("James Cameron#0",), "ltm")
  good = score(local("Update", TransitionDelta(ltm_updated=(ItemUpdate(before, fix),)),
                     memory_before=(before,)))
  meh = score(local("Update", TransitionDelta(ltm_updated=(ItemUpdate(before, cosmetic),)),
                    memory_before=(before,)))
  assert good.local_progress > meh.local_progress
  assert good.information_fidelity == 4


def test_filter_noise_beats_filter_of_needed_evidence():
  ctx = (INSTR, TITANIC, AVATAR)
  noise = score(local("Filter", TransitionDelta(context_removed=(AVATAR,)),
                      context_before=ctx))
  needed = score(local("Filter", TransitionDelta(context_removed=(TITANIC,)),
                       context_before=ctx))
  assert noise.relevance == noise.local_progress == 4
  assert needed.local_progress <= 1 and needed.information_fidelity < 4
  assert needed.r_local < noise.r_local


def test_select_episode_needed_history_beats_distractor():
  hist = (ItemView("h3", TITANIC.text, ("Titanic#0",), "history"),
          ItemView("h4", EIFFEL.text, ("Eiffel Tower#0",), "history"))
  useful = score(local("SelectEpisode", TransitionDelta(context_added=(hist[0],)),
                       context_before=(INSTR, AVATAR), visible_evidence=hist))
  distractor = score(local("SelectEpisode", TransitionDelta(context_added=(hist[1],)),
                           context_before=(INSTR, AVATAR), visible_evidence=hist))
  assert useful.local_progress > distractor.local_progress
  assert useful.relevance > distractor.relevance
  assert useful.grounding == 4  # restored verbatim from visible history


def test_rejected_commands_are_not_scored_and_counted():
  v = verifier()
  ok = add("James Cameron is a Canadian filmmaker.", ("James Cameron#0",))
  out = v.score_local([dataclasses.replace(ok, accepted=False), ok])
  assert out[0] is None and isinstance(out[1], base.LocalScores)
  snap = v.counters.snapshot()
  assert snap["rejected_skipped"] == 1 and snap["local_requests"] == 2


def test_deterministic():
  inp = add("James Cameron is a Canadian filmmaker.", ("James Cameron#0",))
  assert score(inp) == score(inp)


def g_input(answer, ltm, question="Who directed Titanic?"):
  return base.GlobalVerifierInput(
      question=question, final_answer=answer, observed_evidence=EVIDENCE,
      memory_commands=("Add(...) -> accepted",), terminal_ltm=ltm,
      terminal_context=(INSTR, TITANIC))


def test_global_coherence_requires_a_supported_answer():
  v = verifier()
  ltm = (MEMORY[0],)
  good, wrong, none = v.score_global([g_input("James Cameron", ltm),
                                      g_input("Steven Spielberg", ltm),
                                      g_input(None, ltm)])
  assert good.evidence_coherence >= 3
  assert wrong.evidence_coherence == 0 and none.evidence_coherence == 0


def test_global_state_penalises_conflicts_and_ungrounded_entries():
  v = verifier()
  clean = (MEMORY[0], ItemView("m2", "James Cameron was born on August 16, 1954.",
                               ("James Cameron#0",)))
  conflicting = clean + (ItemView("m3", "James Cameron was born on August 16, 1955.",
                                  ("James Cameron#0",)),)
  made_up = (ItemView("m4", "Titanic was filmed entirely on the Moon by robots.", ()),)
  a, b, c = v.score_global([g_input("James Cameron", clean),
                            g_input("James Cameron", conflicting),
                            g_input("James Cameron", made_up)])
  assert a.terminal_memory_consistency > b.terminal_memory_consistency
  assert a.terminal_memory_consistency > c.terminal_memory_consistency


def test_hotpotqa_supporting_facts_score_higher(raw_rows):
  """On real questions: storing a supporting sentence beats storing a distractor, and
  filtering a distractor beats filtering a supporting sentence (labels used only here
  to build the cases; the verifier never sees them)."""
  import random
  rows = raw_rows("validation")[:60]
  rng = random.Random(0)
  v = verifier()
  add_pairs, filter_pairs = [], []
  for ex in rows:
    labels = {(t, i) for t, i in ex["supporting_facts"]}
    ev = [ItemView(f"{t}#{i}", s.strip(), (), "observation")
          for t, sents in ex["context"] for i, s in enumerate(sents)]
    sup = [e for e in ev if (e.ref.rsplit("#", 1)[0], int(e.ref.rsplit("#", 1)[1]))
           in labels]
    dis = [e for e in ev if e not in sup]
    def add_of(e, q=ex["question"], ev=tuple(ev)):
      return base.LocalVerifierInput(
          question=q, policy_input="", command="", op="Add", visible_evidence=ev,
          transition=TransitionDelta(ltm_added=(ItemView("m1", e.text, (e.ref,)),)))
    def filter_of(e, ctx, q=ex["question"]):
      return base.LocalVerifierInput(
          question=q, policy_input="", command="", op="Filter", context_before=ctx,
          transition=TransitionDelta(context_removed=(e,)))
    a, b = v.score_local([add_of(rng.choice(sup)), add_of(rng.choice(dis))])
    add_pairs.append((a.r_local, b.r_local))
    ctx = tuple(sup) + tuple(rng.sample(dis, 3))
    a, b = v.score_local([filter_of(ctx[-1], ctx), filter_of(ctx[0], ctx)])
    filter_pairs.append((a.r_local, b.r_local))
  for pairs in (add_pairs, filter_pairs):
    good = sum(x for x, _ in pairs) / len(pairs)
    bad = sum(y for _, y in pairs) / len(pairs)
    wins = sum(x > y for x, y in pairs)
    losses = sum(x < y for x, y in pairs)
    assert good > bad + 0.05, (good, bad)
    assert wins > 2 * losses, (wins, losses)


@pytest.mark.parametrize("op", base.ALL_OPS)
def test_every_op_scores_within_range_even_on_an_empty_transition(op):
  s = score(local(op, memory_before=MEMORY))
  assert all(base.SCORE_MIN <= x <= base.SCORE_MAX for x in s.as_dict().values())
