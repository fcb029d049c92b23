"""BabyAI adapter (third_party/vermem_benchmarks/babyai): text interface and macros.

The scripted solver below reads only the text the interface returns (the task line and
observations): it turns in place to look around, maps each object it sees into the
agent's starting frame from the 'N steps ahead / to the left' offsets, picks the object
the mission describes (BabyAI's location words refer to the starting pose), and sends
one macro. It completes GoToObj and PickupLoc levels.
"""
import re

import pytest

from bench_support import require_benchmark
from vermem_jax.envs import interactive as I

COLORS = "red|green|blue|purple|yellow|grey"
MISSION = re.compile(rf"(go to|pick up) (?:the|a) (?:({COLORS}) )?(ball|box|key)"
                     r"(?: (in front of you|behind you|on your left|on your right))?")
SEEN = re.compile(r"([a-z]+ [a-z]+ \d+)(?:, [a-z]+)? \(([^)]*)\)")
SEEDS = 12


def _offset(text):
  ahead = right = 0
  for n, word in re.findall(r"(\d+) steps? (ahead|behind|to the left|to the right)", text):
    n = int(n)
    if word in ("ahead", "behind"):
      ahead = n if word == "ahead" else -n
    else:
      right = n if word == "to the right" else -n
  return ahead, right


def text_solver():
  """A fresh scripted solver (an `actor` for interactive.play)."""
  seen = {}

  def actor(reset, steps):
    verb, color, kind, loc = MISSION.search(reset.task).groups()
    obs = steps[-1].observation if steps else reset.observation
    if len(steps) <= 4:  # look around: four left turns in place
      for name, where in SEEN.findall(obs):
        ahead, right = _offset(where)
        for _ in range(len(steps) % 4):  # undo one left turn at a time
          ahead, right = right, -ahead
        seen.setdefault(name, (ahead, right))
      if len(steps) < 4:
        return "turn left"

    def fits(name):
      c, k, _ = name.split()
      ahead, right = seen[name]
      return k == kind and c == (color or c) and {
          None: True, "in front of you": ahead > 0, "behind you": ahead < 0,
          "on your left": right < 0, "on your right": right > 0}[loc]
    matches = sorted(n for n in seen if fits(n))
    return f"{verb} {matches[0]}" if matches else None
  return actor


@pytest.fixture(scope="module")
def bench():
  return require_benchmark("babyai")


@pytest.mark.parametrize("level", ["BabyAI-GoToObj-v0", "BabyAI-PickupLoc-v0"])
def test_text_solver_completes_level(bench, level):
  cfg = bench.config_class(levels=(level,), episodes_per_level=SEEDS)
  results = []
  for inst in bench.instances(cfg):
    with bench.make_env(inst, cfg) as env:
      r = I.play(env, text_solver(), max_actions=8)
    results.append(r)
    last = r.actions[-1]
    assert last.startswith("go to" if "GoTo" in level else "pick up"), r.actions
  assert all(r.success and r.progress == 1.0 for r in results), [
      (r.reset.info["instance_id"], r.actions) for r in results if not r.success]
  assert "Mission complete." in results[0].steps[-1].observation


def test_invalid_macros_return_reasons(bench):
  cfg = bench.config_class(levels=("BabyAI-GoToObj-v0",), episodes_per_level=1)
  (inst,) = bench.instances(cfg)
  env = bench.make_env(inst, cfg)
  first = env.reset()
  assert first.task == "Your mission: go to the grey ball."
  assert "grey ball 1" in first.observation and first.observation.startswith("You face")
  s = env.step("go to purple key 9")
  assert not s.info["valid"] and "you have not seen 'purple key 9'" in s.observation
  assert "grey ball 1" in s.observation  # the reason lists what was seen
  s = env.step("fly to the moon")
  assert not s.info["valid"] and "is not an action here" in s.observation
  s = env.step("drop")
  assert not s.info["valid"] and "hold nothing" in s.observation
  s = env.step("pick up")
  assert not s.info["valid"] and "nothing you can pick up" in s.observation
  assert env.steps == 4 and not s.done
  assert "go to grey ball 1" in env.valid_actions()
  s = env.step("go to the grey ball")  # an unnumbered name works when it is unique
  assert s.success and s.info["primitive_steps"] >= 1


def test_put_next_with_macros_and_hands_full(bench):
  cfg = bench.config_class(levels=("BabyAI-PutNextLocal-v0",), episodes_per_level=1)
  (inst,) = bench.instances(cfg)
  env = bench.make_env(inst, cfg)
  assert env.reset().task == "Your mission: put the red key next to the green key."
  for _ in range(3):  # facing east, the red key comes into view
    s = env.step("turn left")
  assert "red key 1 (4 steps ahead)" in s.observation
  s = env.step("pick up red key 1")
  assert s.info["valid"] and s.info["primitive_steps"] > 1
  assert "hold red key 1" in s.observation
  s = env.step("pick up grey ball 1")
  assert not s.info["valid"] and "you already hold red key 1; drop it first" in s.observation
  s = env.step("go to red key 1")
  assert not s.info["valid"] and "you are holding red key 1" in s.observation
  s = env.step("drop next to green key 1")  # the same name still means the same key
  assert s.success and s.done and "Mission complete." in s.observation


def test_go_to_when_already_facing_costs_one_no_op(bench):
  cfg = bench.config_class(levels=("BabyAI-GoToLocal-v0",), episodes_per_level=1)
  (inst,) = bench.instances(cfg)
  env = bench.make_env(inst, cfg)
  assert env.reset().task == "Your mission: go to the red key."
  s = env.step("go to yellow key 1")  # 3 steps ahead: walk 2, then face it
  assert s.info["primitive_steps"] == 2 and not s.done
  assert "yellow key 1 is right in front of you" in s.observation
  again = env.step("go to yellow key 1")
  assert again.info["valid"] and again.info["primitive_steps"] == 1 and not again.done
  assert "yellow key 1 is right in front of you" in again.observation


def test_bot_plan_is_a_gold_plan(bench):
  cfg = bench.config_class(levels=("BabyAI-OpenDoor-v0", "BabyAI-UnlockLocal-v0"),
                           episodes_per_level=2)
  for inst in bench.instances(cfg):
    plan = bench.gold_plan(inst, cfg)
    assert set(plan) <= {"turn left", "turn right", "move forward", "pick up", "drop",
                         "toggle"}
    assert I.play(bench.make_env(inst, cfg), plan).success, inst.instance_id


def test_default_instance_list(bench):
  insts = bench.instances(bench.config_class())
  assert len(insts) == 8 * 14
  assert insts[0].instance_id == "babyai/BabyAI-GoToRedBallGrey-v0/1000000000"
  assert insts[-1].instance_id == "babyai/BabyAI-UnlockLocal-v0/1000000013"
