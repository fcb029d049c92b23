"""Tests of vermem_jax.rl.running_stats_init: executable internal-dev transitions and the
phase-start RunningStats they initialize (SPEC §6, App. F.4).

The fixtures (Qwen2.5 tokenizer, HotpotQA pools, oracle reader, the scripted update)
are those of tests/test_rollout.py.
"""
import dataclasses

import numpy as np
import pytest

from test_rollout import Scripted  # pylint: disable=g-bad-import-order
from test_rollout import oracle  # pylint: disable=unused-import
from test_rollout import scripted  # pylint: disable=unused-import
from test_rollout import tok  # pylint: disable=unused-import
from vermem_jax.envs import episode_types
from vermem_jax.envs.sft_data import records as sft_records
from vermem_jax.envs.scenarios import build as scenario_build
from vermem_jax.envs.scenarios import spec as scenario_spec
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.rl import running_stats_init
from vermem_jax.verifiers.backends import make_verifier


def test_init_running_stats_from_dev(pools, tok):
  dev = pools[1]
  cfg = scenario_spec.ScenarioConfig(context_budget=1024, rollout_limit=4, num_dev=10)
  specs = scenario_build.build_episodes(dev, "B", count_tokens=tok.count_tokens,
                                   config=cfg, split="dev")
  base_cfg = ExecutorConfig(context_budget=1024, policy_input_limit=2048)
  inputs = running_stats_init.dev_inputs_from_episodes(
      specs, count_tokens=tok.count_tokens, executor_config=base_cfg)
  assert inputs and all(i.accepted for i in inputs)
  verifier = make_verifier({"backend": "heuristic"})
  stats, counts = running_stats_init.init_running_stats_from_dev(
      verifier, inputs, ops=("Retrieve", "Filter", "SelectEpisode", "Summarize",
                             "Null"), count=2)
  for op, n in counts.items():
    chosen = [i for i in inputs if i.op == op][:2]
    assert n == len(chosen)
    if not n:
      assert not stats.is_initialized(op)
      continue
    scores = np.array([verifier.score_local_one(i).r_local for i in chosen])
    assert stats.get(op) == pytest.approx((scores.mean(), scores.std()))
  assert sum(counts.values()) >= 2
  with pytest.raises(ValueError, match="unknown op"):
    running_stats_init.init_running_stats_from_dev(verifier, inputs, ops=("Jump",),
                                                   count=2)


def test_dev_inputs_from_results(scripted):
  res = scripted["result"]
  inputs = running_stats_init.dev_inputs_from_results(
      [t.result for t in res.trajectories],
      executor_config=ExecutorConfig(context_budget=1024, policy_input_limit=2048))
  assert len(inputs) == sum(d.accepted for d in res.decisions)
  ref = [d for d in res.decisions if d.accepted and d.op != "Null"]
  got = [i for i in inputs if i.op != "Null"]
  assert [i.command for i in got] == [d.command for d in ref]
  assert [i.arguments for i in got] == [
      dict(d.record.transition.command.args) for d in ref]
  assert all(i.arguments for i in got)
  # A hand-built record without the executor's Transition is refused clearly.
  d = res.decisions[0].record
  bare = episode_types.EpisodeResult(**{
      **{f.name: getattr(res.trajectories[0].result, f.name)
         for f in dataclasses.fields(episode_types.EpisodeResult)},
      "decisions": (dataclasses.replace(d, transition=None),)})
  with pytest.raises(ValueError, match="no executor Transition"):
    running_stats_init.dev_inputs_from_results([bare],
                                               executor_config=ExecutorConfig())


def test_dev_inputs_from_sft_records(scripted, tok):
  cfg = ExecutorConfig(context_budget=1024, policy_input_limit=2048)
  records = []
  for spec in scripted["specs"]:
    for target in (spec.reference_command, "∅", Scripted.BAD):
      records.append(sft_records.SFTRecord(
          policy_input="x", target=target, op="?", template="t", is_boundary=False,
          example_id=spec.example.id, split="dev", phase="B", source="template",
          state=spec.initial_state))
  inputs = running_stats_init.dev_inputs_from_sft_records(
      records, count_tokens=tok.count_tokens, executor_config=cfg)
  # The unknown tool is rejected by the executor and left out.
  assert [i.op for i in inputs] == ["SelectEpisode", "Null", "Retrieve", "Null"]
  assert inputs[0].transition.context_added and inputs[1].transition.is_identity
  stats, counts = running_stats_init.init_running_stats_from_dev(
      make_verifier({"backend": "heuristic"}), inputs, ops=("Null", "Retrieve"),
      count=1)
  assert counts == {"Null": 1, "Retrieve": 1} and not stats.is_initialized(
      "SelectEpisode")
  assert stats.count("Null") == 1 and stats.get("Null")[1] == 0.0
