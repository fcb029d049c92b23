"""Shared retry-and-fallback loop for verifiers that generate text (LLM backends).

Each input gets at most `1 + max_retries` attempts. An attempt fails when the reply
does not parse (`parsing.VerifierOutputError`; the retry re-asks with the bad reply and
the reason appended) or when the backend reports a retryable transport failure
(`http_chat.ChatError(retryable=True)`; the retry re-sends the same request after a backoff of
`backoff_s * 2**r` seconds for retry round r). Non-retryable failures (e.g. HTTP 401)
go straight to the fallback. Inputs still unscored at the end get the configured
fallback (Appendix F.1 leaves it to the protocol), counted in `counters`.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import time
from typing import Callable, Sequence

from vermem_jax import http_chat
from vermem_jax.verifiers import base
from vermem_jax.verifiers import heuristic
from vermem_jax.verifiers import parsing
from vermem_jax.verifiers import prompts

_LOG = logging.getLogger(__name__)

# Score given to every dimension by the 'midpoint' fallback: the middle of 0..4.
MIDPOINT_SCORE = (base.SCORE_MIN + base.SCORE_MAX) // 2




class LLMVerifier(base.Verifier):
  """Verifier that asks a text generator and parses its replies strictly."""

  def __init__(self, config: base.VerifierConfig):
    super().__init__(config)
    self._heuristic = None
    self._sleep = time.sleep  # replaced in tests

  @abc.abstractmethod
  def _complete(self, conversations: list[list[dict]]) -> list[str | http_chat.ChatError]:
    """One generation per conversation, in order; failures returned, not raised."""

  def _score_local(self, inputs):
    convs = [prompts.local_messages(x, self.config.max_section_chars) for x in inputs]
    return self._run(inputs, convs, parsing.parse_local, base.LOCAL_DIMENSIONS,
                     self._local_fallback)

  def _score_global(self, inputs):
    convs = [prompts.global_messages(x, self.config.max_section_chars) for x in inputs]
    return self._run(inputs, convs, parsing.parse_global, base.GLOBAL_DIMENSIONS,
                     self._global_fallback)

  def _run(self, inputs: Sequence, convs: list[list[dict]], parse: Callable,
           dimensions: Sequence[str], fallback: Callable) -> list:
    results: list = [None] * len(inputs)
    current = list(convs)
    pending = list(range(len(inputs)))
    failed: list[int] = []
    transport_failed_last_round = False
    for attempt in range(self.config.chat.max_retries + 1):
      if not pending:
        break
      if attempt > 0:
        self.counters.add("retries", len(pending))
        if transport_failed_last_round and self.config.chat.backoff_s > 0:
          self._sleep(self.config.chat.backoff_s * 2 ** (attempt - 1))
      replies = self._complete([current[i] for i in pending])
      if len(replies) != len(pending):
        raise RuntimeError(
            f"backend returned {len(replies)} replies for {len(pending)} requests")
      self.counters.add("attempts", len(pending))
      next_pending = []
      transport_failed_last_round = False
      for i, reply in zip(pending, replies):
        if isinstance(reply, http_chat.ChatError):
          self.counters.add("transport_errors")
          _LOG.warning("verifier request failed (attempt %d): %s", attempt + 1, reply)
          if reply.retryable:
            next_pending.append(i)
            transport_failed_last_round = True
          else:
            failed.append(i)
          continue
        try:
          results[i] = parse(reply)
        except parsing.VerifierOutputError as e:
          self.counters.add("malformed")
          current[i] = prompts.retry_messages(convs[i], reply, str(e), dimensions)
          next_pending.append(i)
      pending = next_pending
    failed.extend(pending)
    if failed:
      failed.sort()
      _LOG.warning("verifier: %d of %d inputs unscored after %d attempts; "
                   "fallback=%s", len(failed), len(inputs),
                   self.config.chat.max_retries + 1, self.config.fallback)
      self.counters.add(f"fallback_{self.config.fallback}", len(failed))
      for i, s in zip(failed, fallback([inputs[i] for i in failed])):
        results[i] = s
    return results

  def _heuristic_verifier(self):
    if self._heuristic is None:
      self._heuristic = heuristic.HeuristicVerifier(self.config)
    return self._heuristic

  def _local_fallback(self, inputs):
    return self._fallback(inputs, base.LocalScores, "_score_local")

  def _global_fallback(self, inputs):
    return self._fallback(inputs, base.GlobalScores, "_score_global")

  def _fallback(self, inputs, scores_cls, heuristic_method):
    """Scores of `config.fallback` for unscored inputs (None each for 'skip');
    'heuristic' calls the heuristic backend's `heuristic_method` on them."""
    kind = self.config.fallback
    if kind == "skip":
      return [None] * len(inputs)
    if kind == "heuristic":
      scores = getattr(self._heuristic_verifier(), heuristic_method)(list(inputs))
      return [dataclasses.replace(s, fallback=kind) for s in scores]
    v = base.SCORE_MIN if kind == "zero" else MIDPOINT_SCORE
    constant = dict.fromkeys(scores_cls.DIMENSIONS, v)
    return [scores_cls(**constant, fallback=kind) for _ in inputs]
