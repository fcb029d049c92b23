"""BabyAI levels (minigrid 3.2.0) behind a text interface with macro actions.

Task text: the level's mission ('go to the red ball', 'pick up the box on your left').
Observations (`world.describe`): heading, what is held, the visible objects by stable
name with their offset in steps, and how far the way ahead is free.

Actions (our syntax; case and articles ignored):
  turn left | turn right | move forward            one primitive step
  pick up | drop | toggle                          act on the cell in front
  go to <object>                                   walk until facing it
  pick up <object>                                 walk there, then pick it up
  open <object> | toggle <object>                  walk there, then toggle it (doors, boxes)
  drop next to <object>                            walk to a free cell beside it, drop
<object> is a name from an observation ('red ball 1'; 'red ball' when only one red ball
has been seen). Macros walk only through cells seen so far (shortest path, breadth-first
search over cell and heading). An action that cannot run — an unknown name, no known
path, hands full, nothing in front — changes nothing and the observation gives the
reason.

Success is BabyAI's own signal: the mission verified (reward > 0 on termination). A
wrong pick-up that makes the mission impossible ends the episode unsuccessfully, and
so does the level's own primitive-step limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from typing import Any, Mapping, Optional

from vermem_jax import config_util
from vermem_jax.envs import interactive

from vermem_benchmarks.babyai import world

# Default levels of the instance list (decision: single- and two-room levels covering
# go-to, pick-up, open, put-next and unlock missions, all within the macro set).
DEFAULT_LEVELS = (
    "BabyAI-GoToRedBallGrey-v0",
    "BabyAI-GoToRedBall-v0",
    "BabyAI-GoToObj-v0",
    "BabyAI-GoToLocal-v0",
    "BabyAI-PickupLoc-v0",
    "BabyAI-OpenDoor-v0",
    "BabyAI-PutNextLocal-v0",
    "BabyAI-UnlockLocal-v0",
)
# BabyAI's own code evaluates on seeds from 10**9 on, above the training seeds.
TEST_SEED_START = 1_000_000_000

PRIMITIVE_TEXT = {world.LEFT: "turn left", world.RIGHT: "turn right",
                  world.FORWARD: "move forward", world.PICKUP: "pick up",
                  world.DROP: "drop", world.TOGGLE: "toggle"}
_PRIMITIVE_WORDS = {
    "turn left": world.LEFT, "left": world.LEFT, "turn right": world.RIGHT,
    "right": world.RIGHT, "move forward": world.FORWARD, "go forward": world.FORWARD,
    "forward": world.FORWARD, "move ahead": world.FORWARD, "pick up": world.PICKUP,
    "pickup": world.PICKUP, "drop": world.DROP, "put down": world.DROP,
    "toggle": world.TOGGLE, "open": world.TOGGLE,
}
_MACROS = (
    ("drop_next", re.compile(r"^(?:drop|put|place)\b.*?\b(?:next to|beside|near) (.+)$")),
    ("goto", re.compile(r"^(?:go|walk|move) to (.+)$")),
    ("pickup", re.compile(r"^(?:pick up|pickup|take|grab) (.+)$")),
    ("toggle", re.compile(r"^(?:open|toggle|unlock|close) (.+)$")),
)
_ARTICLES = re.compile(r"\b(?:the|a|an)\b")
ACTION_LIST = ("turn left, turn right, move forward, pick up, drop, toggle, "
               "go to <object>, pick up <object>, open <object>, drop next to <object>")


@dataclasses.dataclass(frozen=True)
class BabyAIConfig:
  """BabyAI benchmark settings (config section `benchmark` of eval_babyai.py).

  Attributes:
    levels: gymnasium ids of the BabyAI levels, in instance order.
    episodes_per_level: instances per level (seeds seed_start, seed_start + 1, ...).
    seed_start: first seed (BabyAI's held-out test seeds start at 10**9).
    max_steps: text actions per episode (decision: 50; a macro counts as one, the
      level's own limit on primitive steps applies as well).
  """
  levels: tuple[str, ...] = DEFAULT_LEVELS
  episodes_per_level: int = 14
  seed_start: int = TEST_SEED_START
  max_steps: int = 50

  def __post_init__(self):
    object.__setattr__(self, "levels", tuple(self.levels))
    if self.episodes_per_level < 1 or self.max_steps < 1:
      raise ValueError("babyai episodes_per_level and max_steps must be >= 1")

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "BabyAIConfig":
    return config_util.dataclass_from_mapping(cls, section, strict=True,
                                              what="benchmark (babyai)")


@dataclasses.dataclass(frozen=True)
class BabyAIInstance:
  """One (level, seed) episode: `instance_id` = 'babyai/<level>/<seed>'."""
  level: str
  seed: int
  benchmark: str = "babyai"

  @property
  def instance_id(self) -> str:
    return f"babyai/{self.level}/{self.seed}"


def instances(config: BabyAIConfig) -> list[BabyAIInstance]:
  """Levels in config order, seeds seed_start .. seed_start + episodes_per_level - 1."""
  return [BabyAIInstance(level, config.seed_start + i) for level in config.levels
          for i in range(config.episodes_per_level)]


def _make_level(level: str):
  try:
    import gymnasium  # pylint: disable=import-outside-toplevel
    import minigrid  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise interactive.BenchmarkUnavailable(
        f"the BabyAI benchmark needs minigrid: pip install -e '.[babyai]' ({e})") from e
  del minigrid  # importing it registers the BabyAI levels with gymnasium
  try:
    return gymnasium.make(level, disable_env_checker=True).unwrapped
  except gymnasium.error.Error as e:
    raise ValueError(f"unknown BabyAI level {level!r} ({e})") from e


def _strip(text: str) -> str:
  return " ".join(_ARTICLES.sub(" ", text.lower()).split())


class BabyAIEnv(interactive.InteractiveEnv):
  """One BabyAI (level, seed) behind the text interface (module docstring)."""

  benchmark = "babyai"

  def __init__(self, instance: BabyAIInstance, config: BabyAIConfig = BabyAIConfig()):
    super().__init__(instance.instance_id, max_steps=config.max_steps)
    self.instance = instance
    self.env = _make_level(instance.level)
    self.memory: Optional[world.Memory] = None
    self._visible: list = []
    self._over = False

  # --- helpers -----------------------------------------------------------------------

  def _observe(self) -> str:
    self._visible = world.observe(self.env, self.memory)
    return world.describe(self.env, self.memory, self._visible)

  def _resolve(self, text: str):
    """(obj, name) for an object name, or (None, reason)."""
    name = _strip(text)
    obj = self.memory.lookup(name)
    if obj is not None:
      return obj, name
    known = self.memory.known_names()
    matches = [n for n in known if n.rsplit(" ", 1)[0] == name]
    if len(matches) == 1:
      return self.memory.lookup(matches[0]), matches[0]
    if matches:
      return None, f"'{text}' could be {', '.join(matches)}; name one of them"
    seen = ", ".join(known) if known else "nothing yet"
    return None, f"you have not seen '{text}' (objects seen so far: {seen})"

  def _front(self):
    return self.env.grid.get(*self.env.front_pos)

  def _run(self, actions) -> tuple[bool, float, bool]:
    """Plays primitive actions until the list ends or the level ends.
    Returns (terminated, reward, truncated)."""
    for a in actions:
      _, reward, terminated, truncated, _ = self.env.step(a)
      world.observe(self.env, self.memory)
      if terminated or truncated:
        return bool(terminated), float(reward), bool(truncated)
    return False, 0.0, False

  def _primitive_check(self, action: int) -> str:
    """'' when the primitive can act now, else why not."""
    front, held = self._front(), self.env.carrying
    if action == world.FORWARD and not world.passable(front):
      what = "a wall" if front.type == "wall" else self.memory.name_of(front)
      return f"you cannot move forward: {what} is in the way"
    if action == world.PICKUP:
      if held is not None:
        return f"you already hold {self.memory.name_of(held)}; drop it first"
      if front is None or not front.can_pickup():
        return "there is nothing you can pick up right in front of you"
    if action == world.DROP:
      if held is None:
        return "you hold nothing to drop"
      if front is not None:
        return "the cell in front of you is not free"
    if action == world.TOGGLE and (front is None or front.type not in ("door", "box")):
      return "there is nothing to open or toggle right in front of you"
    if action == world.TOGGLE and front.type == "door" and front.is_locked:
      if held is None or held.type != "key" or held.color != front.color:
        return (f"{self.memory.name_of(front)} is locked; you need to hold the "
                f"{front.color} key")
    return ""

  def _macro_plan(self, kind: str, target_text: str) -> tuple[Optional[list], str]:
    """(primitive actions, '') for a macro, or (None, reason)."""
    obj, why = self._resolve(target_text)
    if obj is None:
      return None, why
    name = why
    if kind == "pickup":
      if self.env.carrying is not None:
        return None, f"you already hold {self.memory.name_of(self.env.carrying)}; drop it first"
      if not obj.can_pickup():
        return None, f"{name} cannot be picked up"
    if kind == "drop_next" and self.env.carrying is None:
      return None, "you hold nothing to drop"
    if obj is self.env.carrying:
      return None, f"you are holding {name}"
    if kind == "toggle" and obj.type not in ("door", "box"):
      return None, f"{name} cannot be opened or toggled"
    if kind == "toggle" and obj.type == "door" and obj.is_locked:
      held = self.env.carrying
      if held is None or held.type != "key" or held.color != obj.color:
        return None, f"{name} is locked; you need to hold the {obj.color} key"
    target = tuple(int(v) for v in obj.cur_pos)
    if kind == "drop_next":
      def goal(pos, heading):
        f = world.front_of(pos, heading)
        return (f != tuple(pos) and world.adjacent4(f, target)
                and world.free_floor(self.env, self.memory, f))
    else:
      def goal(pos, heading):
        return world.front_of(pos, heading) == target
    path = world.plan_path(self.env, self.memory, goal)
    if path is None:
      return None, (f"you know no free path to {name} yet; look around or move to "
                    "see more of the room")
    # Already facing the target of 'go to': minigrid's no-op 'done' lets the level
    # check the mission without moving.
    last = {"goto": [] if path else [world.DONE], "pickup": [world.PICKUP],
            "toggle": [world.TOGGLE], "drop_next": [world.DROP]}[kind]
    return path + last, ""

  # --- InteractiveEnv ----------------------------------------------------------------

  def _reset(self):
    with contextlib.redirect_stdout(io.StringIO()):  # level generation prints retries
      self.env.reset(seed=self.instance.seed)
    self.memory = world.Memory(self.env.width, self.env.height)
    self._over = False
    obs = self._observe()
    return (f"Your mission: {self.env.mission}.", obs,
            {"level": self.instance.level, "seed": self.instance.seed})

  def _step(self, action: str):
    text = _strip(action)
    plan, reason, label = None, "", text
    if text in _PRIMITIVE_WORDS:
      prim = _PRIMITIVE_WORDS[text]
      reason = self._primitive_check(prim)
      plan = None if reason else [prim]
      label = PRIMITIVE_TEXT[prim]
    else:
      for kind, pattern in _MACROS:
        m = pattern.match(text)
        if m:
          plan, reason = self._macro_plan(kind, m.group(1))
          break
      else:
        reason = (f"'{action}' is not an action here; actions are: {ACTION_LIST}")
    if plan is None:
      return (f"Nothing happens: {reason}. {self._observe()}", False, False, 0.0,
              {"valid": False})
    terminated, reward, truncated = self._run(plan)
    success = terminated and reward > 0
    obs = f"You {label}" + (f" ({len(plan)} moves)" if len(plan) > 1 else "") + ". "
    obs += self._observe()
    if success:
      obs += " Mission complete."
    elif terminated:
      obs += " The mission has failed."
    elif truncated:
      obs += " Time is up: the level's step limit is reached."
    done = terminated or truncated
    return obs, done, success, 1.0 if success else 0.0, {
        "valid": True, "primitive_steps": len(plan), "reward": reward,
        "level_truncated": truncated}

  def _valid_actions(self):
    acts = []
    for prim in (world.LEFT, world.RIGHT, world.FORWARD, world.PICKUP, world.DROP,
                 world.TOGGLE):
      if not self._primitive_check(prim):
        acts.append(PRIMITIVE_TEXT[prim])
    for name in self.memory.known_names():
      for kind, verb in (("goto", "go to"), ("pickup", "pick up"), ("toggle", "open"),
                         ("drop_next", "drop next to")):
        plan, _ = self._macro_plan(kind, name)
        if plan:
          acts.append(f"{verb} {name}")
    return acts

  def close(self) -> None:
    self.env.close()


def bot_plan(instance: BabyAIInstance, max_actions: int = 500) -> list[str]:
  """The level solved by minigrid's BabyAI bot, as our primitive action texts (a gold
  plan for the scripted solver; the bot sees the full grid, the text agent does not)."""
  from minigrid.utils.baby_ai_bot import BabyAIBot  # pylint: disable=import-outside-toplevel
  env = _make_level(instance.level)
  with contextlib.redirect_stdout(io.StringIO()):
    env.reset(seed=instance.seed)
  bot = BabyAIBot(env)
  plan = []
  for _ in range(max_actions):
    action = int(bot.replan())
    if action == world.DONE:
      break
    plan.append(PRIMITIVE_TEXT[action])
    _, _, terminated, truncated, _ = env.step(action)
    if terminated or truncated:
      break
  env.close()
  return plan


ACTION_PROMPT = (
    "The environment is a BabyAI grid world seen from the agent's position. Objects "
    "are named as in the observations (e.g. 'red ball 1') and located in steps ahead "
    "or behind and to the left or right of you. Actions: " + ACTION_LIST + ". Macro "
    "actions such as 'go to red ball 1' walk the whole way through the part of the "
    "world you have seen; turn or move to see more.")


class BabyAIBenchmark:
  """`BENCHMARK` of this adapter (see envs.interactive.Benchmark)."""
  name = "babyai"
  extra = "babyai"
  config_class = BabyAIConfig
  action_prompt = ACTION_PROMPT

  def instances(self, config: BabyAIConfig) -> list[BabyAIInstance]:
    return instances(config)

  def make_env(self, instance: BabyAIInstance, config: BabyAIConfig) -> BabyAIEnv:
    return BabyAIEnv(instance, config)

  def gold_plan(self, instance: BabyAIInstance, config: BabyAIConfig) -> list[str]:
    del config
    return bot_plan(instance)
