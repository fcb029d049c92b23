"""OpenAI-compatible HTTP backend against a loopback server started by the test."""
import logging

import chat_server
import pytest

from vermem_jax import http_chat
from vermem_jax.verifiers import backends
from vermem_jax.verifiers import base
from vermem_jax.verifiers import heuristic

SECRET = "sk-test-5ecret-never-log-me"
KEY_ENV = "VERMEM_TEST_VERIFIER_KEY"
RETRY_MARK = "could not be read"


def _ok_reply(messages):
  """Well-formed scores that depend on the question, to check result order."""
  user = messages[1]["content"]
  k = int(user.split("question number ", 1)[1].split(".", 1)[0])
  if "evidence_coherence" in messages[0]["content"]:
    return f"evidence_coherence: {k % 5}\nterminal_memory_consistency: {(k + 1) % 5}"
  return (f"relevance: {k % 5}\ngrounding: {(k + 1) % 5}\nlocal_progress: "
          f"{(k + 2) % 5}\ninformation_fidelity: {(k + 3) % 5}")


class _Server(chat_server.LoopbackChatServer):
  """Loopback server whose behaviour is set by `mode`."""

  def __init__(self):
    self.mode = "ok"
    self.fail_first = 0
    super().__init__(self._respond)

  def _respond(self, n, body):
    msgs = body["messages"]
    mode = self.mode
    if mode == "flaky":
      mode = "500" if n <= self.fail_first else "ok"
    if mode == "fix_on_retry":
      mode = "ok" if RETRY_MARK in msgs[-1]["content"] else "malformed"
    if mode in ("500", "401"):
      return int(mode)
    if mode == "garbage":
      return b"<html>not json</html>"
    return _ok_reply(msgs) if mode == "ok" else "I would rate this highly."


@pytest.fixture
def server():
  s = _Server()
  yield s
  s.close()


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
  monkeypatch.setenv(KEY_ENV, SECRET)


def make(server, **kw):
  cfg = dict(backend="openai_compatible", base_url=server.url, model="judge-1",
             api_key_env=KEY_ENV, timeout_s=2.0, max_concurrency=4, max_retries=2,
             backoff_s=0.001, fallback="midpoint")
  cfg.update(kw)
  v = backends.make_verifier(cfg)
  v.sleeps = []
  v._sleep = v.sleeps.append  # record backoff instead of sleeping  # pylint: disable=protected-access
  return v


def local_inputs(n):
  return [base.LocalVerifierInput(
      question=f"This is question number {k}.", policy_input="x_t",
      command="Null()", op="Null") for k in range(n)]


def global_inputs(n):
  return [base.GlobalVerifierInput(question=f"This is question number {k}.",
                                   final_answer="x") for k in range(n)]


def test_happy_path_order_auth_and_payload(server):
  v = make(server)
  out = v.score_local(local_inputs(7))
  for k, s in enumerate(out):
    assert s.as_dict() == {"relevance": k % 5, "grounding": (k + 1) % 5,
                           "local_progress": (k + 2) % 5,
                           "information_fidelity": (k + 3) % 5}
    assert s.fallback is None
  g = v.score_global(global_inputs(3))
  assert [x.evidence_coherence for x in g] == [0, 1, 2]
  assert [x.terminal_memory_consistency for x in g] == [1, 2, 3]
  req = server.requests[0]
  assert req["path"] == "/v1/chat/completions"
  assert req["auth"] == f"Bearer {SECRET}"
  assert req["body"]["model"] == "judge-1" and req["body"]["temperature"] == 0.0
  snap = v.counters.snapshot()
  assert snap["attempts"] == 10 and snap["retries"] == 0 and snap["malformed"] == 0
  assert snap["local_requests"] == 7 and snap["global_requests"] == 3
  assert v.sleeps == []
  v.close()


def test_bounded_concurrency(server):
  server.delay_s = 0.05
  v = make(server, max_concurrency=2)
  v.score_local(local_inputs(8))
  assert server.max_in_flight == 2
  v.close()


def test_timeout_retries_then_falls_back(server, caplog):
  server.delay_s = 0.5
  v = make(server, timeout_s=0.1, max_retries=1, fallback="zero")
  with caplog.at_level(logging.DEBUG):
    out = v.score_local(local_inputs(2))
  assert all(s.as_dict() == dict.fromkeys(base.LOCAL_DIMENSIONS, 0) for s in out)
  assert all(s.fallback == "zero" for s in out)
  snap = v.counters.snapshot()
  assert snap["attempts"] == 4 and snap["transport_errors"] == 4
  assert snap["retries"] == 2 and snap["fallback_zero"] == 2
  assert v.sleeps == [0.001]  # one retry round after a transport failure
  assert "timed out" in caplog.text and SECRET not in caplog.text
  v.close()


def test_malformed_scores_retry_then_fall_back(server, caplog):
  server.mode = "malformed"
  v = make(server, max_retries=2, fallback="midpoint")
  with caplog.at_level(logging.DEBUG):
    out = v.score_local(local_inputs(3))
  assert all(s.as_dict() == dict.fromkeys(base.LOCAL_DIMENSIONS, 2) for s in out)
  snap = v.counters.snapshot()
  assert snap["attempts"] == 9 and snap["malformed"] == 9 and snap["retries"] == 6
  assert snap["fallback_midpoint"] == 3 and snap["transport_errors"] == 0
  assert v.sleeps == []  # malformed replies are re-asked without backoff
  # Retries carry the bad reply and the reason back to the model.
  last = server.requests[-1]["body"]["messages"]
  assert last[-2] == {"role": "assistant", "content": "I would rate this highly."}
  assert RETRY_MARK in last[-1]["content"]
  assert SECRET not in caplog.text
  v.close()


def test_malformed_then_fixed_on_retry(server):
  server.mode = "fix_on_retry"
  v = make(server, max_retries=1)
  out = v.score_local(local_inputs(2))
  assert [s.relevance for s in out] == [0, 1] and all(s.fallback is None for s in out)
  snap = v.counters.snapshot()
  assert snap["malformed"] == 2 and snap["retries"] == 2 and snap["attempts"] == 4
  assert snap["fallback_midpoint"] == 0
  v.close()


def test_http_500_backoff_then_recovers(server):
  server.mode, server.fail_first = "flaky", 2
  v = make(server, max_concurrency=1, max_retries=3, backoff_s=0.01)
  out = v.score_local(local_inputs(2))
  assert [s.relevance for s in out] == [0, 1]
  snap = v.counters.snapshot()
  assert snap["transport_errors"] == 2 and snap["attempts"] == 4
  assert v.sleeps == [0.01]
  v.close()


def test_http_500_exhausts_retries_with_exponential_backoff(server, caplog):
  server.mode = "500"
  v = make(server, max_retries=3, backoff_s=0.01, fallback="skip")
  with caplog.at_level(logging.DEBUG):
    out = v.score_global(global_inputs(2))
  assert out == [None, None]
  assert v.sleeps == [0.01, 0.02, 0.04]
  snap = v.counters.snapshot()
  assert snap["attempts"] == 8 and snap["transport_errors"] == 8
  assert snap["fallback_skip"] == 2
  assert "HTTP 500" in caplog.text and SECRET not in caplog.text
  v.close()


def test_non_retryable_status_and_garbage_body(server):
  server.mode = "401"
  v = make(server, max_retries=3, fallback="heuristic")
  out = v.score_local(local_inputs(1))
  assert out[0].fallback == "heuristic"
  # the heuristic fallback gives exactly the heuristic backend's scores
  (h,) = heuristic.HeuristicVerifier().score_local(local_inputs(1))
  assert out[0].as_dict() == h.as_dict()
  assert v.counters["attempts"] == 1 and v.counters["fallback_heuristic"] == 1
  server.mode = "garbage"
  v.counters.reset()
  out = v.score_global(global_inputs(1))
  assert out[0].fallback == "heuristic" and v.counters["attempts"] == 4
  v.close()


def test_connection_refused_is_a_transport_error():
  v = backends.make_verifier(dict(
      backend="openai_compatible", base_url="http://127.0.0.1:9/v1", model="m",
      api_key_env="", timeout_s=1.0, max_retries=1, backoff_s=0.0, fallback="zero"))
  out = v.score_local(local_inputs(1))
  assert out[0].fallback == "zero" and v.counters["transport_errors"] == 2
  v.close()


def test_missing_key_env_names_the_variable_only(monkeypatch):
  monkeypatch.delenv(KEY_ENV)
  with pytest.raises(ValueError, match=KEY_ENV):
    backends.make_verifier(dict(backend="openai_compatible", base_url="http://x",
                                 model="m", api_key_env=KEY_ENV))


def test_key_not_in_repr_or_config(server):
  v = make(server)
  assert SECRET not in repr(v) and SECRET not in repr(v.config)
  assert SECRET not in str(vars(v.config))
  v.close()


def test_rejected_never_sent(server):
  v = make(server)
  inputs = local_inputs(3)
  import dataclasses
  inputs[1] = dataclasses.replace(inputs[1], accepted=False)
  out = v.score_local(inputs)
  assert out[1] is None and out[0] is not None and out[2] is not None
  assert len(server.requests) == 2 and v.counters["rejected_skipped"] == 1
  v.close()


def test_backend_error_is_exception_with_flag():
  e = http_chat.ChatError("HTTP 503", retryable=True)
  assert isinstance(e, Exception) and e.retryable


def test_preflight_names_unreachable_endpoint(server):
  """An endpoint that is down / wrong would silently turn every score into the
  fallback; preflight (run.py calls it before training) fails fast and says why."""
  v = make(server)
  server.mode = "prose"  # any chat completion passes; its text is not checked
  v.preflight()
  assert len(server.requests) == 1 and server.requests[0]["body"]["model"] == "judge-1"
  server.mode = "401"
  with pytest.raises(ValueError, match=r"verifier endpoint check failed: HTTP 401 from "
                     r"http://127\.0\.0\.1:\d+/v1/chat/completions .*verifier.model="
                     r"'judge-1'"):
    v.preflight()
  server.mode = "garbage"
  with pytest.raises(ValueError, match="unreadable chat-completions response"):
    v.preflight()
  v.close()
  down = backends.make_verifier(dict(
      backend="openai_compatible", base_url="http://127.0.0.1:9/v1", model="m",
      api_key_env="", timeout_s=1.0))
  with pytest.raises(ValueError, match=r"connection to http://127\.0\.0\.1:9/v1/chat/"
                     r"completions failed"):
    down.preflight()
  down.close()
