"""How well a HotpotQA episode was answered: exact match and token F1 of the final
answer with the official normalization, and supporting-fact recall of what the solver
read.

Behaviour follows the official HotpotQA evaluation script (``hotpot_evaluate_v1.py``,
Yang et al., 2018): answers are lower-cased, punctuation is removed, the articles
"a", "an", "the" are removed and whitespace is collapsed. Token F1 is zero whenever
either normalized side is one of the special answers ``yes``, ``no``, ``noanswer``
and the two sides differ (a yes/no question is all or nothing). Used by r^task
(paper Eq. 13, Appendix F.3), by the internal-dev selection of a phase's checkpoint
and by held-out evaluation (SPEC §7); it sits in `envs`, below `rl`, `train` and
`eval`, so each of them imports it without importing the others.

Pure Python, no JAX.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Iterable

from vermem_jax.envs import environment
from vermem_jax.envs import episode_types
from vermem_jax.envs import hotpotqa

# Normalized answers that the official script scores all-or-nothing in F1.
SPECIAL_ANSWERS = ("yes", "no", "noanswer")

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _check_str(value, name: str) -> str:
  if not isinstance(value, str):
    raise TypeError(f"{name} must be a str, got {type(value).__name__}")
  return value


def normalize_answer(text: str) -> str:
  """Official HotpotQA/SQuAD answer normalization.

  Steps, in the official order: lower-case, drop ASCII punctuation, replace the
  articles a/an/the by a space, collapse runs of whitespace to one space and strip.

  Args:
    text: an answer string.

  Returns:
    The normalized string (possibly empty).

  Raises:
    TypeError: if ``text`` is not a str.
  """
  text = _check_str(text, "text").lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def exact_match(prediction: str, ground_truth: str) -> float:
  """1.0 when the normalized prediction equals the normalized gold answer, else 0.0.

  Raises:
    TypeError: if either argument is not a str.
  """
  return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_precision_recall(prediction: str,
                        ground_truth: str) -> tuple[float, float, float]:
  """Token-level (F1, precision, recall) as in the official HotpotQA script.

  Tokens are whitespace tokens of the normalized strings, matched as multisets.
  If either normalized side is in ``SPECIAL_ANSWERS`` and the sides differ, the
  result is (0, 0, 0). No token overlap (including an empty side) gives (0, 0, 0).

  Raises:
    TypeError: if either argument is not a str.
  """
  pred = normalize_answer(prediction)
  gold = normalize_answer(ground_truth)
  zero = (0.0, 0.0, 0.0)
  if (pred in SPECIAL_ANSWERS or gold in SPECIAL_ANSWERS) and pred != gold:
    return zero
  pred_tokens = pred.split()
  gold_tokens = gold.split()
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return zero
  precision = num_same / len(pred_tokens)
  recall = num_same / len(gold_tokens)
  return 2.0 * precision * recall / (precision + recall), precision, recall


def f1_score(prediction: str, ground_truth: str) -> float:
  """Token F1 in [0, 1] (official HotpotQA definition; see f1_precision_recall)."""
  return f1_precision_recall(prediction, ground_truth)[0]


def solver_seen_evidence(result: episode_types.EpisodeResult) -> frozenset[str]:
  """Evidence-unit ids behind the context C̃_t the solver read at its last call.

  Empty when the solver was never called in the episode.
  """
  for d in reversed(result.decisions):
    if d.solver_called:
      return environment.context_evidence(d.state_after_memory,
                                          result.spec.answer_context)
  return frozenset()


def supporting_fact_recall(seen: Iterable[str], example: hotpotqa.Example) -> float:
  """|gold ∩ seen| / |gold| over evidence-unit ids; 0.0 without gold units.

  Args:
    seen: evidence-unit ids (e.g. `solver_seen_evidence`).
    example: the HotpotQA example whose supporting facts are the gold units.
  """
  gold = set(hotpotqa.supporting_unit_ids(example))
  return len(gold & set(seen)) / len(gold) if gold else 0.0
