"""Strict parsing of verifier replies, scores, config validation and prompt scope."""
import dataclasses

import ml_collections
import pytest

from vermem_jax import http_chat
from vermem_jax.verifiers import backends
from vermem_jax.verifiers import base, parsing, prompts
from vermem_jax.verifiers import heuristic

GOOD_LOCAL = "relevance: 3\ngrounding: 4\nlocal_progress: 0\ninformation_fidelity: 2"


def test_parse_local_exact_lines():
  s = parsing.parse_local(GOOD_LOCAL)
  assert s.as_dict() == {"relevance": 3, "grounding": 4, "local_progress": 0,
                         "information_fidelity": 2}
  # r_local = mean(score / 4) over the 4 dimensions (App. F.2), by hand: 9 / 16.
  assert s.r_local == pytest.approx((3 + 4 + 0 + 2) / 16)
  assert s.fallback is None


def test_parse_tolerates_only_whitespace():
  text = "\n  relevance :3  \n\ngrounding:  4\n\tlocal_progress: 0\ninformation_fidelity: 2\n\n"
  assert parsing.parse_local(text).as_dict() == parsing.parse_local(GOOD_LOCAL).as_dict()


@pytest.mark.parametrize("text,fragment", [
    ("relevance: 3\ngrounding: 4\nlocal_progress: 0", "expected 4 score lines"),
    (GOOD_LOCAL + "\nThat is my judgement.", "expected 4 score lines"),
    ("Relevance: 3\ngrounding: 4\nlocal_progress: 0\ninformation_fidelity: 2", "line 1"),
    ("grounding: 4\nrelevance: 3\nlocal_progress: 0\ninformation_fidelity: 2",
     "expected 'relevance'"),
    ("relevance: 5\ngrounding: 4\nlocal_progress: 0\ninformation_fidelity: 2", "'5'"),
    ("relevance: 03\ngrounding: 4\nlocal_progress: 0\ninformation_fidelity: 2", "'03'"),
    ("relevance: 3.5\ngrounding: 4\nlocal_progress: 0\ninformation_fidelity: 2", "line 1"),
    ("relevance: -1\ngrounding: 4\nlocal_progress: 0\ninformation_fidelity: 2", "line 1"),
    ("relevance: 3/4\ngrounding: 4\nlocal_progress: 0\ninformation_fidelity: 2", "line 1"),
    ("**relevance**: 3\ngrounding: 4\nlocal_progress: 0\ninformation_fidelity: 2",
     "line 1"),
    ("relevance: 3\nrelevance: 3\nlocal_progress: 0\ninformation_fidelity: 2",
     "expected 'grounding'"),
    ("", "got 0 non-empty lines"),
])
def test_parse_rejects_malformed(text, fragment):
  with pytest.raises(parsing.VerifierOutputError, match=None) as e:
    parsing.parse_local(text)
  assert fragment in str(e.value)


def test_parse_global_and_roundtrip():
  g = parsing.parse_global("evidence_coherence: 1\nterminal_memory_consistency: 4")
  assert (g.v_coh, g.v_state) == (0.25, 1.0)
  with pytest.raises(parsing.VerifierOutputError):
    parsing.parse_global(GOOD_LOCAL)  # local lines are not global lines
  for scores in ({"relevance": 0, "grounding": 1, "local_progress": 2,
                  "information_fidelity": 4},):
    text = parsing.format_scores(scores, base.LOCAL_DIMENSIONS)
    assert parsing.parse_scores(text, base.LOCAL_DIMENSIONS) == scores


def test_scores_validate_range():
  with pytest.raises(ValueError, match="relevance"):
    base.LocalScores(5, 0, 0, 0)
  with pytest.raises(TypeError, match="grounding"):
    base.LocalScores(1, 2.0, 0, 0)
  with pytest.raises(ValueError, match="terminal_memory_consistency"):
    base.GlobalScores(0, -1)


@pytest.mark.parametrize("field,value", [
    ("backend", "gpt"), ("fallback", "random"), ("timeout_s", 0),
    ("max_concurrency", 0), ("max_retries", -1), ("backoff_s", -0.1),
    ("max_new_tokens", 0), ("batch_size", 0), ("temperature", -1.0),
])
def test_config_rejects_bad_values(field, value):
  with pytest.raises(ValueError, match=field):
    base.VerifierConfig.from_config({field: value})


def test_config_http_needs_url_and_model():
  with pytest.raises(ValueError, match="base_url"):
    base.VerifierConfig.from_config({"backend": "openai_compatible", "model": "m"})


def test_make_verifier_from_configdict_and_unknown_keys():
  default = base.VerifierConfig()
  flat = {k: v for k, v in dataclasses.asdict(default).items() if k != "chat"}
  flat.update({k: getattr(default.chat, k) for k in http_chat.ENDPOINT_FIELDS})
  cd = ml_collections.ConfigDict(flat)
  v = backends.make_verifier(cd)
  assert isinstance(v, heuristic.HeuristicVerifier)
  with pytest.raises(ValueError, match="unknown verifier config keys"):
    backends.make_verifier({"backend": "heuristic", "temprature": 0.0})


def test_counters_snapshot_and_reset():
  c = base.VerifierCounters()
  c.add("malformed", 3)
  c.add("fallback_zero")
  snap = c.snapshot()
  assert snap["malformed"] == 3 and snap["fallback_zero"] == 1 and snap["attempts"] == 0
  c.reset()
  assert all(v == 0 for v in c.snapshot().values())
  with pytest.raises(KeyError, match="unknown verifier counter"):
    c.add("nope")


def _local_input(op="Add"):
  return base.LocalVerifierInput(
      question="Which country is the director of Titanic from?",
      policy_input="x_t view",
      command='Add(content="James Cameron is Canadian.", source_refs=["James Cameron#0"])',
      op=op,
      transition=base.TransitionDelta(ltm_added=(base.ItemView(
          "m1", "James Cameron is Canadian.", ("James Cameron#0",), "ltm"),)),
      visible_evidence=(base.ItemView("James Cameron#0", "James Cameron is a Canadian "
                                      "filmmaker.", (), "observation"),))


def test_local_prompt_scope_and_rubric():
  inp = _local_input()
  msgs = prompts.local_messages(inp, max_section_chars=4000)
  assert [m["role"] for m in msgs] == ["system", "user"]
  user = msgs[1]["content"]
  for needle in (inp.question, inp.command, "James Cameron#0",
                 prompts.OPERATION_RUBRICS["Add"]):
    assert needle in user
  for dim in base.LOCAL_DIMENSIONS:
    assert f"{dim}: <0-4>" in msgs[0]["content"]
  assert set(prompts.OPERATION_RUBRICS) == set(base.ALL_OPS)
  assert len(set(prompts.OPERATION_RUBRICS.values())) == len(base.ALL_OPS)
  # The input type has no field for later states, final or reference answers.
  fields = {f.name for f in dataclasses.fields(base.LocalVerifierInput)}
  assert not fields & {"final_answer", "reference_answer", "answer", "state_next",
                       "supporting_facts"}


def test_prompt_sections_are_clipped():
  inp = dataclasses.replace(_local_input(), policy_input="z" * 50_000)
  user = prompts.local_messages(inp, max_section_chars=1000)[1]["content"]
  assert "characters omitted" in user
  assert len(user) < 5000


def test_global_prompt_scope():
  inp = base.GlobalVerifierInput(question="q?", final_answer=None,
                                 memory_commands=("Add(...) -> accepted",))
  msgs = prompts.global_messages(inp, max_section_chars=4000)
  assert "(no final answer)" in msgs[1]["content"]
  assert "1. Add(...) -> accepted" in msgs[1]["content"]
  fields = {f.name for f in dataclasses.fields(base.GlobalVerifierInput)}
  assert "reference_answer" not in fields and "supporting_facts" not in fields


def test_retry_messages_append_feedback():
  msgs = prompts.local_messages(_local_input(), 4000)
  out = prompts.retry_messages(msgs, "I think 3", "line 1 bad", base.LOCAL_DIMENSIONS)
  assert out[:2] == msgs and out[2] == {"role": "assistant", "content": "I think 3"}
  assert "line 1 bad" in out[3]["content"] and "relevance" in out[3]["content"]


def test_bad_op_rejected():
  with pytest.raises(ValueError, match="op="):
    _local_input(op="Remember")
