"""ScienceWorld adapter (third_party/vermem_benchmarks/scienceworld): a gold sequence of
one test variation reaches success through our interface (needs Java 17)."""
import pytest

from bench_support import require_benchmark, unavailable
from vermem_jax.envs import interactive as I

TASK = "find-living-thing"


@pytest.fixture(scope="module")
def bench():
  b = require_benchmark("scienceworld")
  from vermem_benchmarks import scienceworld as sw
  try:
    sw.check_runtime()
  except I.BenchmarkUnavailable as e:
    unavailable(str(e))
  yield b
  sw.POOL.close_all()


@pytest.fixture(scope="module")
def setup(bench):
  cfg = bench.config_class(tasks=(TASK,), variations_per_task=1)
  (inst,) = bench.instances(cfg)
  return cfg, inst


def test_instance_is_the_first_test_variation(bench, setup):
  cfg, inst = setup
  assert inst.instance_id == f"scienceworld/{TASK}/225"  # test split starts at 225
  assert inst.simplification == "easy"


def test_gold_sequence_reaches_success(bench, setup):
  cfg, inst = setup
  plan = bench.gold_plan(inst, cfg)
  assert plan and plan[-1].startswith("move ")
  with bench.make_env(inst, cfg) as env:
    r = I.play(env, ["xyzzy", "check valid actions"] + plan)
  assert r.reset.task.startswith("Your task is to find a(n) living thing")
  assert "This room is called" in r.reset.observation
  bad, help_ = r.steps[0], r.steps[1]
  assert not bad.info["valid"] and "No known action matches" in bad.observation
  assert help_.info["help"] and "go to hallway" in help_.observation
  assert r.success and r.done and r.progress == 1.0 and r.steps[-1].info["score"] == 100
  assert "The task is complete." in r.steps[-1].observation
  scores = [s.info["score"] for s in r.steps if "score" in s.info]
  assert scores == sorted(scores)  # the gold path only ever gains points
  # Half of the gold path: ScienceWorld's partial score, not a success.
  with bench.make_env(inst, cfg) as env:
    half = I.play(env, plan[:len(plan) // 2])
  assert not half.done and 0.0 < half.progress < 1.0


def test_config_validation(bench):
  with pytest.raises(ValueError, match="split"):
    bench.config_class(split="validation")
  with pytest.raises(ValueError, match="unknown"):
    bench.config_class.from_config({"max_steps": 10, "typo": 1})
