"""Verifier backend over an OpenAI-compatible chat-completions HTTP endpoint.

POSTs `{'model', 'messages', 'temperature', 'max_tokens'}` to
`{base_url}/chat/completions` with the standard library (urllib), one request per
input, at most `max_concurrency` in flight (thread pool). Reads
`choices[0].message.content`. Timeouts, connection errors, HTTP 408/429/5xx and
unreadable response bodies are retryable transport failures; other HTTP errors
(400, 401, 403, 404, ...) are not. Retries, backoff and fallback follow `llm.LLMVerifier`.

The API key is read from the environment variable named by `config.api_key_env` when
the verifier is built, kept only in the request header, and never logged, stored in
the config or put into an error message.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import urllib.error
import urllib.request

from vermem_jax.verifiers import base
from vermem_jax.verifiers import llm

# HTTP statuses worth retrying: request timeout, rate limit, server-side failures.
_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})


class OpenAICompatibleVerifier(llm.LLMVerifier):
  """LLM verifier served over HTTP (e.g. vLLM, SGLang or a hosted API).

  Raises:
    ValueError: at construction when `api_key_env` names an unset variable.
  """

  def __init__(self, config: base.VerifierConfig):
    super().__init__(config)
    self._url = config.base_url.rstrip("/") + "/chat/completions"
    self._headers = {"Content-Type": "application/json"}
    if config.api_key_env:
      key = os.environ.get(config.api_key_env)
      if not key:
        raise ValueError(
            f"verifier.api_key_env names {config.api_key_env!r}, which is unset or "
            "empty; set it or use api_key_env='' for a server without auth")
      self._headers["Authorization"] = "Bearer " + key
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=config.max_concurrency, thread_name_prefix="verifier-http")

  def __repr__(self):  # the default repr would not leak the key, but be explicit
    return (f"OpenAICompatibleVerifier(url={self._url!r}, "
            f"model={self.config.model!r})")

  def _complete(self, conversations):
    return list(self._pool.map(self._request, conversations))

  def _request(self, messages: list[dict]) -> str | llm.BackendError:
    body = json.dumps({
        "model": self.config.model,
        "messages": messages,
        "temperature": self.config.temperature,
        "max_tokens": self.config.max_new_tokens,
    }).encode("utf-8")
    req = urllib.request.Request(self._url, data=body, headers=self._headers,
                                 method="POST")
    try:
      with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
        raw = resp.read()
    except urllib.error.HTTPError as e:
      retryable = e.code >= 500 or e.code in _RETRYABLE_STATUS
      e.close()
      return llm.BackendError(f"HTTP {e.code} from {self._url}", retryable=retryable)
    except (TimeoutError, socket.timeout):
      return llm.BackendError(
          f"timed out after {self.config.timeout_s}s waiting for {self._url}")
    except urllib.error.URLError as e:
      reason = e.reason
      if isinstance(reason, (TimeoutError, socket.timeout)):
        return llm.BackendError(
            f"timed out after {self.config.timeout_s}s waiting for {self._url}")
      return llm.BackendError(
          f"connection to {self._url} failed: {type(reason).__name__}")
    except (ConnectionError, OSError) as e:
      return llm.BackendError(f"connection to {self._url} failed: {type(e).__name__}")
    try:
      content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
      return llm.BackendError(f"unreadable chat-completions response from {self._url}")
    if not isinstance(content, str):
      return llm.BackendError(f"non-text message content from {self._url}")
    return content

  def preflight(self) -> None:
    """Sends one tiny chat request; raises if the endpoint cannot answer it.

    Scoring never raises on transport failures (they become the configured fallback
    scores), so a mistyped `base_url` or a server that is not up would otherwise turn a
    whole RL phase into fallback scores. Run once before training starts. The reply's
    content is not checked (any text is fine), only that a chat completion came back.

    Raises:
      ValueError: naming the URL, the model and the transport error (HTTP status,
        timeout, refused connection, unreadable body).
    """
    reply = self._request([{"role": "user", "content": "Reply with OK."}])
    if isinstance(reply, llm.BackendError):
      raise ValueError(
          f"verifier endpoint check failed: {reply} (verifier.base_url="
          f"{self.config.base_url!r}, verifier.model={self.config.model!r}); start the "
          "server or fix the URL, or use --config.verifier.backend=heuristic")

  def close(self):
    self._pool.shutdown(wait=True)
