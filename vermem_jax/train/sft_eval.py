"""SFT dev evaluation: greedy commands and the checkpoint-selection metrics (SPEC §4).

Evaluation on the dev set: greedy decoding (`sampling.eval_temperature`, SPEC §4) of each
dev prompt with the RL sampler policy (`rl.policy.SamplerPolicy(greedy=True)`,
`predict_commands`), parsed with `memory.parse_command` and executed with
`memory.execute` on the record's own state s_i under the record's phase subspace
(`dev_metrics`): tool accuracy (predicted op == target op), invalid-operation rate
(unparseable, op outside the phase, or rejected by the executor), executable rate
(1 − invalid), exact command match. SPEC §4 selects the SFT checkpoint by dev tool
accuracy, ties broken by the lower invalid rate. With a mesh, greedy decoding runs under
`sharding.use_sharding` (`setup.generate_fn_for`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

import jax
import numpy as np

from vermem_jax.envs import episode_types
from vermem_jax.envs.sft_data import records as sft_records
from vermem_jax.models import qwen_config
from vermem_jax import tokenization
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.rl import policy
from vermem_jax.train import setup as setup_lib

# The last dev evaluation's greedy predictions, one JSON line per dev record, in the
# SFT phase directory (`write_predictions`).
PREDICTIONS_FILE = 'dev_predictions.jsonl'


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One dev prediction scored: target op, predicted op (`episode_types.UNPARSEABLE`
  for text that does not parse into a command, as in every operation mix),
  accepted by the executor on the record's state, equal to the target."""
  op: str
  pred_op: str
  accepted: bool
  exact: bool


def prediction_outcomes(records: Sequence[sft_records.SFTRecord],
                        predictions: Sequence[str], *, executor_config: ExecutorConfig,
                        count_tokens: Callable[[str], int]) -> list[Outcome]:
  """Scores each prediction on its record (see `dev_metrics` for the rules).

  Raises:
    ValueError: different numbers of records and predictions, or no records.
  """
  if len(records) != len(predictions):
    raise ValueError(f'{len(records)} dev records but {len(predictions)} predictions')
  if not records:
    raise ValueError('dev metrics need at least one record')
  out = []
  for rec, text in zip(records, predictions):
    parsed = cmds.parse_command(text, executor_config.max_command_chars)
    ok_parse = isinstance(parsed, cmds.Command)
    cfg = dataclasses.replace(executor_config, phase=rec.phase, allowed_ops=None)
    target = cmds.parse_command(rec.target, executor_config.max_command_chars)
    # Compared with ids qualified: `c2` and `<ns>:c2` name the same record.
    exact = (ok_parse and isinstance(target, cmds.Command)
             and mexec.qualify_command(parsed, rec.state.ns)
             == mexec.qualify_command(target, rec.state.ns))
    pred_op = parsed.op if ok_parse else episode_types.UNPARSEABLE
    out.append(Outcome(op=rec.op, pred_op=pred_op,
                       accepted=mexec.execute(rec.state, text, cfg, count_tokens).accepted,
                       exact=bool(exact)))
  return out


def dev_metrics(records: Sequence[sft_records.SFTRecord], predictions: Sequence[str], *,
                executor_config: ExecutorConfig,
                count_tokens: Callable[[str], int]) -> dict[str, float]:
  """Dev metrics of predicted command texts (SPEC §4 checkpoint selection).

  Each prediction is parsed (`parse_command`) and executed (`memory.execute`) on its
  record's state s_i with the record's phase subspace (the record's phase replaces
  `executor_config.phase`).

  Args:
    records: dev records (op, target, phase, state).
    predictions: generated command text per record (end-of-turn token removed).
    executor_config: budgets/costs of the executor.
    count_tokens: backbone token counter (tokens).
  Returns:
    {'tool_accuracy': share with predicted op == target op (unparseable text has op
     'Unparseable'), 'invalid_rate': share unparseable, outside the phase subspace, or
     rejected by the executor, 'executable_rate': 1 - invalid_rate, 'exact_match':
     share whose parsed command equals the parsed target (canonical arguments),
     'executable_rate_non_null': executable share among the predictions whose op is
     not ∅ (NaN if there are none), 'unparseable_rate', 'num_dev',
     'tool_accuracy/<op>', 'exact_match/<op>' per target op, and
     'predicted/<op>/<pred op>': the share of <op>'s records predicted as <pred op>
     (only pairs that occur; <pred op> 'Unparseable' for unparseable text)}.
  Raises:
    ValueError: different numbers of records and predictions, or no records.
  """
  return metrics_from_outcomes(prediction_outcomes(
      records, predictions, executor_config=executor_config, count_tokens=count_tokens))


def metrics_from_outcomes(outcomes: Sequence[Outcome]) -> dict[str, float]:
  """`dev_metrics`'s figures from scored predictions (`prediction_outcomes`)."""
  tool = [o.pred_op == o.op for o in outcomes]
  invalid = [not o.accepted for o in outcomes]
  exact = [o.exact for o in outcomes]
  unparseable = [o.pred_op == episode_types.UNPARSEABLE for o in outcomes]
  invalid_non_null = [not o.accepted for o in outcomes if o.pred_op != cmds.NULL]
  per_op: dict[str, list[Outcome]] = {}
  for o in outcomes:
    per_op.setdefault(o.op, []).append(o)
  out = {'tool_accuracy': float(np.mean(tool)), 'invalid_rate': float(np.mean(invalid)),
         'executable_rate': 1.0 - float(np.mean(invalid)),
         # A policy that answers ∅ everywhere is fully "executable"; this share counts
         # only the predictions that are not ∅ (NaN when every prediction is ∅).
         'executable_rate_non_null': (1.0 - float(np.mean(invalid_non_null))
                                      if invalid_non_null else float('nan')),
         'exact_match': float(np.mean(exact)),
         'unparseable_rate': float(np.mean(unparseable)), 'num_dev': float(len(outcomes))}
  for op in sorted(per_op):
    group = per_op[op]
    out[f'tool_accuracy/{op}'] = float(np.mean([o.pred_op == op for o in group]))
    out[f'exact_match/{op}'] = float(np.mean([o.exact for o in group]))
    for pred_op in sorted({o.pred_op for o in group}):
      out[f'predicted/{op}/{pred_op}'] = float(np.mean([o.pred_op == pred_op
                                                        for o in group]))
  return out


def write_predictions(path: str, records: Sequence[sft_records.SFTRecord],
                      predictions: Sequence[str], outcomes: Sequence[Outcome],
                      step: int) -> None:
  """Writes one JSON line per dev record (step, template, target, prediction and its
  outcome) to `path`, replacing the file: the last evaluation's predictions."""
  with open(path, 'w') as f:
    for rec, text, o in zip(records, predictions, outcomes):
      f.write(json.dumps({'step': step, 'template': rec.template, 'op': rec.op,
                          'target': rec.target, 'prediction': text,
                          'predicted_op': o.pred_op, 'accepted': o.accepted,
                          'exact': o.exact}, ensure_ascii=False) + '\n')


def predict_commands(params: Any, model_config: qwen_config.QwenConfig,
                     records: Sequence[sft_records.SFTRecord],
                     tokenizer: tokenization.Tokenizer, *, batch_size: int,
                     sampling_config: policy.PolicySamplingConfig,
                     rng: Any = 0, mesh: jax.sharding.Mesh | None = None) -> list[str]:
  """Greedy command text for each record's x_i through the RL sampler policy.

  Uses `rl.policy.SamplerPolicy(greedy=True)` (eval_temperature, SPEC §4: 0), i.e. the
  same prompt, stop tokens and decoding as rollout evaluation. Inputs are sorted by
  length and sent in batches of exactly `batch_size` rows, so generation compiles once
  per prompt bucket. With `mesh` (params placed on it) the sampler runs under its
  sharding rules (`setup.generate_fn_for`).

  Returns:
    list[str] in record order (stop token removed, whitespace stripped).
  """
  if not records:
    return []
  sampler = policy.SamplerPolicy(model_config, params, tokenizer,
                                 sampling_config=sampling_config, greedy=True,
                                 batch_buckets=(batch_size,),
                                 generate_fn=setup_lib.generate_fn_for(mesh))
  order = sorted(range(len(records)), key=lambda i: len(records[i].policy_input))
  texts = [''] * len(records)
  key = jax.random.PRNGKey(rng) if isinstance(rng, (int, np.integer)) else rng
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    key, sub = jax.random.split(key)
    outs = sampler([records[i].policy_input for i in idx], sub)
    for i, out in zip(idx, outs):
      texts[i] = out.text
  return texts
