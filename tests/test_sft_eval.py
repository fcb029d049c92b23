"""Tests of the SFT dev metrics (vermem_jax/train/sft_eval.py) on hand-made
predictions for real SFT dev records."""

import dataclasses
import json

import pytest

from test_sft_examples import records  # pylint: disable=g-bad-import-order,unused-import
from test_sft_examples import tok  # pylint: disable=unused-import
from vermem_jax.memory import commands as cmds
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.train import sft_eval


def test_dev_metrics_on_hand_made_predictions(records, tok):
  dev = records[1]
  by_op = {r.op: r for r in dev}
  add, delete, null = by_op['Add'], by_op['Delete'], by_op['Null']
  # The Update state offered in the LTM phase subspace (A): Retrieve is not allowed.
  phase_a = dataclasses.replace(by_op['Update'], phase='A')
  recs = [add, add, add, delete, null, phase_a]
  preds = [add.target,                                  # exact, executable
           'Add(content="never closed',                 # unparseable: invalid, op wrong
           cmds.NULL_SYMBOL,                            # wrong op, but executable
           'Delete(memory_id="no-such-id", reason="x")',  # right op, rejected
           'Null()',                                    # exact (same command as ∅)
           'Retrieve(query="anything")']                # op not allowed in phase A
  m = sft_eval.dev_metrics(recs, preds, executor_config=ExecutorConfig(
      context_budget=256, policy_input_limit=512), count_tokens=tok.count_tokens)
  assert m['tool_accuracy'] == pytest.approx(3 / 6)     # add, delete, null
  assert m['invalid_rate'] == pytest.approx(3 / 6)      # unparseable, missing id, phase
  assert m['executable_rate'] == pytest.approx(3 / 6)
  assert m['exact_match'] == pytest.approx(2 / 6)
  assert m['unparseable_rate'] == pytest.approx(1 / 6)
  assert m['tool_accuracy/Add'] == pytest.approx(1 / 3)
  # What each class was predicted as: Add -> Add, unparseable, ∅ (a third each).
  assert {k: v for k, v in m.items() if k.startswith('predicted/Add/')} == {
      'predicted/Add/Add': pytest.approx(1 / 3), 'predicted/Add/Unparseable': pytest.approx(1 / 3),
      'predicted/Add/Null': pytest.approx(1 / 3)}
  assert m['predicted/Update/Retrieve'] == 1.0
  assert m['num_dev'] == 6
  with pytest.raises(ValueError, match='predictions'):
    sft_eval.dev_metrics(recs, preds[:2], executor_config=ExecutorConfig(),
                         count_tokens=tok.count_tokens)


def test_exact_match_compares_ids_qualified(records, tok):
  """A local id (`c2`) and the qualified one name the same record: both exact; a
  wrong local id is not."""
  add = next(r for r in records[1] if r.op == 'Add')
  ns = add.state.ns
  assert f'"{ns}:' in add.target
  local = add.target.replace(f'{ns}:', '')
  wrong = local.replace('"c2"', '"c1"') if '"c2"' in local else local.replace(
      'source_refs=["', 'source_refs=["c9", "')
  m = sft_eval.dev_metrics([add] * 3, [add.target, local, wrong],
                           executor_config=ExecutorConfig(context_budget=256,
                                                          policy_input_limit=512),
                           count_tokens=tok.count_tokens)
  assert m['exact_match'] == pytest.approx(2 / 3)


def test_write_predictions_one_line_per_record(records, tok, tmp_path):
  dev = records[1][:3]
  preds = [dev[0].target, 'Add(content="never closed', cmds.NULL_SYMBOL]
  outcomes = sft_eval.prediction_outcomes(
      dev, preds, executor_config=ExecutorConfig(context_budget=256,
                                                 policy_input_limit=512),
      count_tokens=tok.count_tokens)
  path = tmp_path / sft_eval.PREDICTIONS_FILE
  sft_eval.write_predictions(str(path), dev, preds, outcomes, step=7)
  rows = [json.loads(l) for l in path.read_text().splitlines()]
  assert [r['prediction'] for r in rows] == preds
  assert [r['template'] for r in rows] == [r.template for r in dev]
  assert rows[0]['exact'] and rows[0]['predicted_op'] == dev[0].op
  assert rows[1]['predicted_op'] == 'Unparseable' and not rows[1]['accepted']
  assert {r['step'] for r in rows} == {7}
