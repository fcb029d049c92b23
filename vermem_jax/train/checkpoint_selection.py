"""Checkpoint selection keys: how a phase ranks its checkpoints (SPEC §4 for SFT,
SPEC §7 / paper C.8 for RL)."""

from __future__ import annotations

from typing import Mapping


def sft_selection_key(metrics: Mapping[str, float]) -> tuple[float, float]:
  """SFT checkpoint ranking (SPEC §4): higher dev tool accuracy, then lower invalid rate.

  Args:
    metrics: with keys 'tool_accuracy' and 'invalid_rate' (fractions in [0, 1]).
  Returns:
    A key where larger is better.
  Raises:
    KeyError: naming a missing metric.
  """
  for name in ('tool_accuracy', 'invalid_rate'):
    if name not in metrics:
      raise KeyError(f'selection metrics need {name!r}; got {sorted(metrics)}')
  return (float(metrics['tool_accuracy']), -float(metrics['invalid_rate']))


# Selection metrics of an RL phase (SPEC §7, paper C.8): the internal-dev score, the
# share of rejected dev decisions and the checkpoint's step.
RL_SELECTION_SCORE = 'dev_score'
RL_SELECTION_INVALID = 'dev_invalid_rate'
RL_SELECTION_STEP = 'step'


def rl_selection_key(metrics: Mapping[str, float]) -> tuple[float, float, int]:
  """RL checkpoint ranking (paper C.8): higher internal-dev score, then lower invalid
  rate, then the later step. The invalid-rate tie-break is our decision, SPEC §4's SFT
  rule carried over: the paper names no tie-break for RL, and at the CPU scale the
  score ties over whole phases (4 dev episodes, r^task in steps of 1/8) while the
  rejected share moves (make run, Phase A update 3: 11 of 12 dev decisions rejected at
  the same r^task 0).

  Args:
    metrics: {'dev_score': float, 'step': int, optionally 'dev_invalid_rate' (rejected
      dev decisions / decisions, in [0, 1]; absent in checkpoints saved before it was
      recorded, read as 0, so those rank by score and step as they did)}.
  Returns:
    A key where larger is better.
  Raises:
    KeyError: naming a missing metric.
  """
  for name in (RL_SELECTION_SCORE, RL_SELECTION_STEP):
    if name not in metrics:
      raise KeyError(f'RL selection metrics need {name!r}; got {sorted(metrics)}')
  return (float(metrics[RL_SELECTION_SCORE]),
          -float(metrics.get(RL_SELECTION_INVALID, 0.0)),
          int(metrics[RL_SELECTION_STEP]))


def selection_key(metrics: Mapping[str, float]) -> tuple[float, ...]:
  """The ranking of a phase's `selection_metrics`: `rl_selection_key` for RL phases
  (they record 'dev_score'), `sft_selection_key` otherwise. Larger is better."""
  if RL_SELECTION_SCORE in metrics:
    return rl_selection_key(metrics)
  return sft_selection_key(metrics)
