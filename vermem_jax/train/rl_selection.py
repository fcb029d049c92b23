"""RL checkpoint selection on the internal-dev set (paper C.8; SPEC §7).

Every `rl.eval_every` updates (and after the last one) an RL phase runs its internal-dev
episodes (the phase's dev scenarios, built from the 10% internal-dev pool of the train
split, SPEC §4) with the current parameters: greedy decoding (temperature 0, top-p 1),
no verifier, the phase's own task solver. The score is the mean over those episodes of
the metric `rl.selection_metric`:

  r_task    mean of EM and token F1 of the final answer (0 without one; SPEC §5)
  em, f1    each alone
  sf_recall supporting-fact recall of what the solver read at its last call
  m_ans     clip(r_task − P_aux, 0, 1): the task score less the mean constraint cost
            of the episode's decisions (SPEC §5 monitor)

The checkpoint of that update is saved with selection metrics {'dev_score', 'step'};
the phase's selected checkpoint — what the next phase starts from and what evaluation
loads — is the best score, ties to the lower share of rejected dev decisions, then to
the later step (`checkpoint_selection.rl_selection_key`).
Held-out data and the evaluation judges never take part.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vermem_jax.envs import environment
from vermem_jax.train import checkpoint_selection
from vermem_jax.train import internal_dev

SELECTION_METRICS = ('r_task', 'em', 'f1', 'sf_recall', 'm_ans')
DEFAULT_METRIC = 'r_task'


def check_metric(metric: str) -> str:
  if metric not in SELECTION_METRICS:
    raise ValueError(f'config.rl.selection_metric={metric!r}; expected one of '
                     f'{SELECTION_METRICS}')
  return metric


def selection_figures(records: Sequence[Mapping[str, Any]],
                      metric: str) -> dict[str, float]:
  """Checkpoint selection's reading of internal-dev records
  (`internal_dev.run_dev_episodes`).

  Returns:
    {'dev/score': mean of `metric`, 'dev/<metric>' for every metric,
     'dev/tool_calls', 'dev/invalid_rate' (rejected decisions / decisions, unparseable
     text included), 'dev/episodes', 'dev/op_share/<op>' for every op that occurred
     (share of all decisions, `internal_dev.op_shares`)}.
  Raises:
    ValueError: an unknown metric.
  """
  check_metric(metric)
  out = {f'dev/{k}': float(np.mean([r[k] for r in records])) for k in SELECTION_METRICS}
  decisions = sum(r['decisions'] for r in records)
  out['dev/score'] = out[f'dev/{metric}']
  out['dev/tool_calls'] = float(np.mean([r['tool_calls'] for r in records]))
  out['dev/invalid_rate'] = sum(r['rejected'] for r in records) / max(decisions, 1)
  out['dev/episodes'] = float(len(records))
  ops = sum((r['ops'] for r in records), collections.Counter())
  out.update({f'dev/{k}': v for k, v in internal_dev.op_shares(ops).items()})
  return out


def dev_evaluation(specs: Sequence[environment.EpisodeSpec], policy: Any, solver: Any, *,
                   count_tokens: Callable[[str], int], executor_config: Any,
                   env_config: environment.EnvConfig, seed: int, metric: str,
                   group: Any = None) -> dict[str, float]:
  """`selection_figures` of the internal-dev evaluation of `policy` (a greedy
  `rl.policy.SamplerPolicy` holding the parameters to score) on `specs`, the sampler
  keyed by `seed`; other arguments as `internal_dev.run_dev_episodes`.

  Raises:
    ValueError: an unknown metric or no dev episodes.
  """
  check_metric(metric)
  return selection_figures(internal_dev.run_dev_episodes(
      specs, policy, solver, count_tokens=count_tokens, executor_config=executor_config,
      env_config=env_config, rng=seed, group=group), metric)


def selection_metrics(dev: dict[str, float], step: int) -> dict[str, float]:
  """The checkpoint's selection metrics (`checkpoint_selection.rl_selection_key`)
  from `selection_figures`."""
  return {checkpoint_selection.RL_SELECTION_SCORE: float(dev['dev/score']),
          checkpoint_selection.RL_SELECTION_INVALID: float(dev['dev/invalid_rate']),
          checkpoint_selection.RL_SELECTION_STEP: int(step)}
