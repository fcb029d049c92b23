"""PDDL adapter (third_party/vermem_benchmarks/pddl): gold plans, progress rate, reasons."""
import pytest

from bench_support import require_benchmark
from vermem_jax.envs import interactive as I

# blocks_test/problem2: d on c on a, b on the table; goal b on a, a on c, c on d.
BLOCKS_PLAN = ["unstack d from c", "put down d", "unstack c", "stack c on d", "pick up a",
               "stack a on c", "pick up b", "stack b on a"]


def _gripper_plan():
  """gripper_test/prob02: six balls from rooma to roomb, two per trip."""
  plan = []
  for trip, (x, y) in enumerate([(1, 2), (3, 4), (5, 6)]):
    if trip:
      plan.append("move from roomb to rooma")
    plan += [f"pick ball{x} in rooma with left", f"pick ball{y} in rooma with right",
             "move from rooma to roomb", f"drop ball{x} in roomb with left",
             f"drop ball{y} in roomb with right"]
  return plan


@pytest.fixture(scope="module")
def bench():
  return require_benchmark("pddl")


def _env(bench, problem, **kw):
  cfg = bench.config_class(problems=(problem,), **kw)
  (inst,) = bench.instances(cfg)
  return bench.make_env(inst, cfg)


def test_default_instance_list(bench):
  ids = [i.instance_id for i in bench.instances(bench.config_class())]
  assert ids == ([f"pddl/blocks/problem{n}" for n in (10, 2, 4, 6, 8)]
                 + [f"pddl/gripper/prob{n:02d}" for n in range(2, 21, 2)])
  with pytest.raises(ValueError, match="unknown PDDL problems"):
    bench.instances(bench.config_class(problems=("blocks/nope",)))


def test_blocks_gold_plan_and_half_plan(bench):
  r = I.play(_env(bench, "blocks/problem2"), BLOCKS_PLAN)
  assert r.success and r.progress == 1.0 and r.steps[-1].done
  assert "The goal is reached." in r.steps[-1].observation
  # By hand: after 'stack c on d' one goal of three holds (c on d); then a on c.
  assert [s.progress for s in r.steps] == pytest.approx(
      [0, 0, 0, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 1])
  half = I.play(_env(bench, "blocks/problem2"), BLOCKS_PLAN[:4])
  assert not half.done and half.progress == pytest.approx(1 / 3)
  assert "problem2" in half.reset.info["instance_id"]
  assert "c is on top of d" in half.reset.task and "d is on top of c" in half.reset.observation


def test_gripper_gold_plan_half_plan_and_running_best(bench):
  plan = _gripper_plan()
  assert len(plan) == 17
  r = I.play(_env(bench, "gripper/prob02"), plan)
  assert r.success and r.progress == 1.0 and len(r.steps) == 17
  half = I.play(_env(bench, "gripper/prob02"), plan[:10])  # 3 of 6 balls in roomb
  assert half.progress == pytest.approx(0.5) and not half.done
  # Taking a delivered ball back lowers the current fraction, not the progress rate.
  back = I.play(_env(bench, "gripper/prob02"),
                plan[:5] + ["pick ball1 in roomb with left"])
  assert back.steps[-1].info["goal_fraction"] == pytest.approx(1 / 6)
  assert back.progress == pytest.approx(2 / 6)


def test_invalid_actions_give_reasons_and_change_nothing(bench):
  env = _env(bench, "gripper/prob02")
  env.reset()
  s = env.step("stack a on b")
  assert not s.info["valid"] and "names no action" in s.observation
  s = env.step("pick ball1 rooma")
  assert not s.info["valid"] and "needs 3" in s.observation
  s = env.step("drop ball1 in roomb with left")  # nothing held, robot not in roomb
  assert not s.info["valid"] and "not possible in the current state" in s.observation
  assert s.progress == 0.0 and env.steps == 3
  valid = env.valid_actions()
  assert "move from rooma to roomb" in valid and "pick ball1 in rooma with left" in valid
  assert not any(a.startswith("drop") for a in valid)
  s = env.step("check valid actions")
  assert s.observation.startswith("Valid actions: ") and env.steps == 3


def test_count_initial_state_and_changes_mode(bench):
  # The initial fraction counts only when asked (problem2 starts with none).
  env = _env(bench, "blocks/problem2", count_initial_state=True, observation="changes")
  env.reset()
  s = env.step("unstack d")
  assert s.progress == 0.0  # no goal holds initially in problem2
  assert "Now true:" in s.observation and "No longer true:" in s.observation
  assert "the robot hand holds d" in s.observation


TOY_DOMAIN = """(define (domain lamps)
  (:requirements :strips :typing)
  (:types lamp)
  (:predicates (lit ?l - lamp) (dark ?l - lamp))
  (:action switch-on
    :parameters (?l - lamp)
    :precondition (and (dark ?l))
    :effect (and (lit ?l) (not (dark ?l)))))
"""
TOY_PROBLEM = """(define (problem two-lamps) (:domain lamps)
  (:objects l1 l2 l3 - lamp)
  (:init (dark l1) (dark l2) (dark l3))
  (:goal (and (lit l1) (lit l3))))
"""


def test_user_pddl_dir_with_generic_text(bench, tmp_path):
  (tmp_path / "lamps.pddl").write_text(TOY_DOMAIN)
  (tmp_path / "lamps_test").mkdir()
  (tmp_path / "lamps_test" / "p1.pddl").write_text(TOY_PROBLEM)
  cfg = bench.config_class(domains=("lamps",), pddl_dir=str(tmp_path))
  (inst,) = bench.instances(cfg)
  env = bench.make_env(inst, cfg)
  r = env.reset()
  assert "switch-on <lamp>" in r.task and "lit l1; lit l3" in r.task
  assert "dark l2" in r.observation
  assert env.step("switch on l1").progress == 0.5  # spaces for the dash are accepted
  assert not env.step("switch-on l1").info["valid"]  # already lit: precondition fails
  s = env.step("Switch-On(l3)")
  assert s.success and s.done
