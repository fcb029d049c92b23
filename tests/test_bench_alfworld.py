"""ALFWorld adapter (third_party/vermem_benchmarks/alfworld): the message without data,
and reset/step on a tiny game written offline (vermem_benchmarks.alfworld.tiny_game)."""
import pytest

from bench_support import require_benchmark
from vermem_jax.envs import interactive as I


@pytest.fixture(scope="module")
def bench():
  return require_benchmark("alfworld")


def test_without_data_the_message_names_the_fix(bench, tmp_path, monkeypatch):
  monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "empty"))
  with pytest.raises(I.BenchmarkUnavailable) as e:
    bench.instances(bench.config_class())
  assert "ALFWORLD_DATA" in str(e.value) and "alfworld-download" in str(e.value)
  assert str(tmp_path / "empty" / "json_2.1.1" / "valid_unseen") in str(e.value)
  (tmp_path / "empty" / "json_2.1.1" / "valid_unseen").mkdir(parents=True)
  with pytest.raises(I.BenchmarkUnavailable, match="no ALFWorld games"):
    bench.instances(bench.config_class())


def test_tiny_game_reset_step_and_planner(bench, tmp_path, monkeypatch):
  monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))  # importing alfworld mkdirs it
  from vermem_benchmarks.alfworld import tiny_game
  tiny_game.build(str(tmp_path))
  cfg = bench.config_class(data_dir=str(tmp_path))
  (inst,) = bench.instances(cfg)
  assert inst.instance_id == ("alfworld/valid_unseen/pick_and_place_simple-Apple-None-"
                              "Fridge-0/trial_T00000000_000000")
  with pytest.raises(ValueError, match="none of the 1 ALFWorld games"):
    bench.instances(bench.config_class(data_dir=str(tmp_path), task_types=(2,)))
  # TextWorld's planner agrees with the plan written with the game.
  assert bench.gold_plan(inst, cfg) == list(tiny_game.GOLD_PLAN)
  with bench.make_env(inst, cfg) as env:
    r = I.play(env, ["jump", "check valid actions"] + list(tiny_game.GOLD_PLAN))
  assert r.reset.task == "Your task is to: put an apple in fridge."
  assert r.reset.observation.endswith("you see a countertop 1, and a fridge 1.")
  assert r.steps[0].observation == "Nothing happens." and not r.steps[0].info["valid"]
  assert r.steps[1].observation == ("Valid actions: go to countertop 1; go to fridge 1; "
                                    "inventory; look.")
  assert "you see a apple 1" in r.steps[2].observation
  assert [s.success for s in r.steps] == [False] * 6 + [True]
  assert r.done and r.progress == 1.0 and r.steps[-1].info["steps"] == 6


def test_step_limit_and_open_before_put(bench, tmp_path, monkeypatch):
  monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
  from vermem_benchmarks.alfworld import tiny_game
  tiny_game.build(str(tmp_path))
  cfg = bench.config_class(data_dir=str(tmp_path), max_steps=4)
  (inst,) = bench.instances(cfg)
  with bench.make_env(inst, cfg) as env:
    r = I.play(env, ["go to countertop 1", "take apple 1 from countertop 1",
                     "go to fridge 1", "move apple 1 to fridge 1"])
  assert r.steps[-1].observation.startswith("Nothing happens.")  # the fridge is closed
  assert r.done and not r.success and r.steps[-1].info["truncated"]
