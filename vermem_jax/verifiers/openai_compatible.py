"""Verifier backend over an OpenAI-compatible chat-completions HTTP endpoint.

Transport is `vermem_jax.http_chat.ChatClient` (stdlib urllib, one request per input,
at most `max_concurrency` in flight; its module docstring lists which failures are
retryable). The client itself does not retry (`max_retries=0`): retries, backoff and
fallback follow `llm.LLMVerifier`, which also re-asks on unparsable replies.

The API key is read from the environment variable named by `config.chat.api_key_env` when
the verifier is built, kept only in the request header, and never logged, stored in
the config or put into an error message.
"""

from __future__ import annotations

from vermem_jax import http_chat
from vermem_jax.verifiers import base
from vermem_jax.verifiers import llm


class OpenAICompatibleVerifier(llm.LLMVerifier):
  """LLM verifier served over HTTP (e.g. vLLM, SGLang or a hosted API).

  Raises:
    ValueError: at construction when `api_key_env` names an unset variable.
  """

  def __init__(self, config: base.VerifierConfig):
    super().__init__(config)
    # The verifier's own rounds retry (also unparsable replies); the client does not.
    self._client = config.chat.client(require_api_key=True, retry_in_client=False)

  def __repr__(self):  # the default repr would not leak the key, but be explicit
    return (f"OpenAICompatibleVerifier(url={self._client.url!r}, "
            f"model={self.config.chat.model!r})")

  def _complete(self, conversations):
    return self._client.complete_many(conversations,
                                      max_tokens=self.config.max_new_tokens,
                                      temperature=self.config.temperature)

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
    reply = self._client.request_once(
        [{"role": "user", "content": "Reply with OK."}],
        max_tokens=self.config.max_new_tokens, temperature=self.config.temperature)
    if isinstance(reply, http_chat.ChatError):
      raise ValueError(
          f"verifier endpoint check failed: {reply} (verifier.base_url="
          f"{self.config.chat.base_url!r}, verifier.model={self.config.chat.model!r}); "
          "start the "
          "server or fix the URL, or use --config.verifier.backend=heuristic")

  def close(self):
    self._client.close()
