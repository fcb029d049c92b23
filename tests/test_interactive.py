"""Tests for vermem_jax.envs.interactive (the benchmark interface and its registry)."""
import pytest

from vermem_jax.envs import interactive as I


class _Counter(I.InteractiveEnv):
  """Toy benchmark: reach `goal` by saying 'add N'; progress = value / goal."""
  benchmark = "toy"

  def __init__(self, goal=5, **kw):
    super().__init__("toy/0", **kw)
    self.goal = goal
    self.value = 0
    self.seen = []

  def _reset(self):
    self.value = 0
    return f"Make the counter reach {self.goal}.", "The counter shows 0.", {"goal": self.goal}

  def _step(self, action):
    self.seen.append(action)
    parts = action.split()
    if len(parts) != 2 or parts[0] != "add" or not parts[1].lstrip("-").isdigit():
      return "Nothing happens: say 'add N'.", False, False, 0.0, {"valid": False}
    self.value += int(parts[1])
    done = self.value >= self.goal
    return (f"The counter shows {self.value}.", done, done, max(self.value, 0) / self.goal,
            {})

  def _valid_actions(self):
    return ["add 1", "add 2"]


def test_reset_and_step_contract():
  env = _Counter()
  with pytest.raises(I.EnvStateError, match="reset"):
    env.step("add 1")
  r = env.reset()
  assert (r.task, r.observation) == ("Make the counter reach 5.", "The counter shows 0.")
  assert r.info == {"goal": 5, "instance_id": "toy/0"}
  s = env.step("  `add 3`.\nignored second line")
  assert env.seen == ["add 3"]  # first line, quotes/backticks/period stripped
  assert s == I.Step("The counter shows 3.", False, False, 0.6,
                     {"valid": True, "steps": 1, "truncated": False})
  s = env.step("add -2")  # progress is a running best, not the current value
  assert s.progress == 0.6 and env.value == 1
  s = env.step("fly")
  assert not s.info["valid"] and s.progress == 0.6 and s.info["steps"] == 3
  s = env.step("add 4")
  assert s.done and s.success and s.progress == 1.0
  with pytest.raises(I.EnvStateError, match="over"):
    env.step("add 1")
  env.reset()  # a new episode starts from scratch
  assert env.steps == 0 and env.progress == 0.0 and not env.done


def test_help_command_lists_valid_actions_without_a_step():
  env = _Counter()
  env.reset()
  for text in ("check valid actions", "Check valid actions.", "list the valid actions"):
    s = env.step(text)
    assert s.observation == "Valid actions: add 1; add 2."
    assert s.info["help"] and s.info["steps"] == 0 and not s.done
  assert env.seen == [] and env.valid_actions() == ("add 1", "add 2")


def test_step_limit_ends_unsuccessfully_and_empty_action_counts():
  env = _Counter(goal=100, max_steps=3)
  env.reset()
  assert not env.step("").info["valid"]  # an empty reply is a (wasted) step
  env.step("add 1")
  s = env.step("add 1")
  assert s.done and not s.success and s.info["truncated"]
  assert "step limit of 3" in s.observation
  with pytest.raises(ValueError):
    _Counter(max_steps=0)


def test_success_only_when_done():
  class Lying(_Counter):
    def _step(self, action):
      return "ok", False, True, 0.5, {}
  env = Lying()
  env.reset()
  s = env.step("add 1")
  assert not s.success and s.progress == 0.5


@pytest.mark.parametrize("text,want", [
    ("go to red ball 1", "go to red ball 1"), ("'open door'.", "open door"),
    ("\n\n  take   apple 1  \nmore", "take apple 1"), ("", ""), ("wait..", "wait.."),
])
def test_normalize_action(text, want):
  assert I.normalize_action(text) == want


def test_play_with_script_and_actor():
  r = I.play(_Counter(goal=3), ["add 1", "add 2", "add 9"])
  assert r.actions == ("add 1", "add 2") and r.success and r.progress == 1.0
  r = I.play(_Counter(goal=3), lambda first, steps: "add 1" if len(steps) < 2 else None)
  assert r.actions == ("add 1", "add 1") and not r.done and r.progress == pytest.approx(2 / 3)


class _ToyBenchmark:
  name, extra, config_class, action_prompt = "toy", "", dict, "Say 'add N'."

  def instances(self, config):
    return []

  def make_env(self, instance, config):
    return _Counter()

  def gold_plan(self, instance, config):
    return ["add 5"]


def test_registry(monkeypatch):
  monkeypatch.setattr(I, "_REGISTRY", dict(I._REGISTRY))
  monkeypatch.setattr(I, "_OBJECTS", {})
  assert set(I.PAPER_BENCHMARKS) <= set(I.benchmark_names())
  with pytest.raises(KeyError, match="unknown benchmark 'nope'.*alfworld"):
    I.load_benchmark("nope")
  I.register_benchmark("toy", _ToyBenchmark())
  assert I.load_benchmark("toy").gold_plan(None, None) == ["add 5"]
  I.register_benchmark("ghost", "no_such_module_for_vermem", extra="ghost")
  with pytest.raises(I.BenchmarkUnavailable, match=r"pip install -e '\.\[ghost\]'"):
    I.load_benchmark("ghost")
  assert I.benchmark_available("ghost")[0] is False
  assert I.benchmark_available("toy") == (True, "")
  with pytest.raises(ValueError):
    I.register_benchmark("Bad Name", "x")
