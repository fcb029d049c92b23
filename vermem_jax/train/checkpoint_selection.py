"""Checkpoint selection keys: how a phase ranks its checkpoints (SPEC §4 for SFT,
SPEC §7 / paper C.8 for RL). Re-exported by `vermem_jax.train.checkpoints`."""

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


# Selection metrics of an RL phase (SPEC §7, paper C.8): the internal-dev score and the
# checkpoint's step (ties go to the later step).
RL_SELECTION_SCORE = 'dev_score'
RL_SELECTION_STEP = 'step'


def rl_selection_key(metrics: Mapping[str, float]) -> tuple[float, int]:
  """RL checkpoint ranking (paper C.8): higher internal-dev score, ties to the later
  step. `metrics`: {'dev_score': float, 'step': int}.

  Raises:
    KeyError: naming a missing metric.
  """
  for name in (RL_SELECTION_SCORE, RL_SELECTION_STEP):
    if name not in metrics:
      raise KeyError(f'RL selection metrics need {name!r}; got {sorted(metrics)}')
  return (float(metrics[RL_SELECTION_SCORE]), int(metrics[RL_SELECTION_STEP]))


def selection_key(metrics: Mapping[str, float]) -> tuple[float, float]:
  """The ranking of a phase's `selection_metrics`: `rl_selection_key` for RL phases
  (they record 'dev_score'), `sft_selection_key` otherwise. Larger is better."""
  if RL_SELECTION_SCORE in metrics:
    return rl_selection_key(metrics)
  return sft_selection_key(metrics)
