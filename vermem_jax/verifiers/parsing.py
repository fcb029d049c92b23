"""Strict parsing of verifier replies.

A valid reply is exactly one line per dimension, in the prompt's order, each
`<dimension>: <d>` with `d` a single digit 0..4 (Appendix F.1 scale). Blank lines and
spaces around the line, the key and the colon are tolerated; anything else (prose,
markdown, a missing, repeated or reordered dimension, '3.5', '10', '3/4') makes the
whole reply malformed, which the caller retries and eventually replaces by the
configured fallback. Lenient salvage is deliberately absent: a half-parsed reply is
not a verifier judgement.
"""

from __future__ import annotations

import re
from typing import Sequence

from vermem_jax.verifiers import base

_LINE = re.compile(r"^\s*([a-z_]+)\s*:\s*([0-9]+)\s*$")


class VerifierOutputError(ValueError):
  """The reply does not match the required score lines; the message says why."""


def parse_scores(text: str, dimensions: Sequence[str]) -> dict[str, int]:
  """Parses `text` into {dimension: score} with scores in [0, 4].

  Args:
    text: the verifier's reply.
    dimensions: the expected keys in order, e.g. `base.LOCAL_DIMENSIONS`.

  Returns:
    dict mapping every dimension to an int in [SCORE_MIN, SCORE_MAX].

  Raises:
    VerifierOutputError: when the reply is anything but the exact lines.
  """
  if not isinstance(text, str):
    raise VerifierOutputError(f"reply is {type(text).__name__}, not text")
  lines = [line for line in text.splitlines() if line.strip()]
  if len(lines) != len(dimensions):
    raise VerifierOutputError(
        f"expected {len(dimensions)} score lines ({', '.join(dimensions)}), "
        f"got {len(lines)} non-empty lines")
  scores = {}
  for n, (line, dim) in enumerate(zip(lines, dimensions), start=1):
    m = _LINE.match(line)
    if m is None:
      raise VerifierOutputError(
          f"line {n} is not '<dimension>: <0-4>': {line.strip()[:80]!r}")
    key, value = m.group(1), m.group(2)
    if key != dim:
      raise VerifierOutputError(f"line {n} has key {key!r}, expected {dim!r}")
    if len(value) != 1 or not base.SCORE_MIN <= int(value) <= base.SCORE_MAX:
      raise VerifierOutputError(
          f"line {n} score {value!r} is not an integer in "
          f"[{base.SCORE_MIN}, {base.SCORE_MAX}]")
    scores[dim] = int(value)
  return scores


def parse_local(text: str) -> base.LocalScores:
  """Parses a local verifier reply into `LocalScores` (raises VerifierOutputError)."""
  return base.LocalScores(**parse_scores(text, base.LOCAL_DIMENSIONS))


def parse_global(text: str) -> base.GlobalScores:
  """Parses a global verifier reply into `GlobalScores` (raises VerifierOutputError)."""
  return base.GlobalScores(**parse_scores(text, base.GLOBAL_DIMENSIONS))


def format_scores(scores: dict[str, int], dimensions: Sequence[str]) -> str:
  """The canonical reply for `scores` (inverse of `parse_scores`)."""
  return "\n".join(f"{d}: {scores[d]}" for d in dimensions)
