"""ALFWorld (alfworld 0.4.2, TextWorld engine; Shridhar et al. 2021) behind the text
interface.

ALFWorld's games are not in the package: `alfworld-download` fetches them (json_2.1.1
trajectories with one `game.tw-pddl` per trial) into `$ALFWORLD_DATA`. This adapter
reads games from there exactly as ALFWorld's own TextWorld environment does — the
`traj_data.json` + `game.tw-pddl` folders of a split, skipping unsolvable games and the
movable-receptacle / sliced tasks ALFWorld skips — and plays each through `textworld`
with ALFWorld's name demangler ('apple 1', 'fridge 1').

Task text: the game's 'Your task is to: ...' line. First observation: the room
description before it. Success is ALFWorld's `won`. Valid actions are the game's
admissible commands; ALFWorld answers an impossible command with 'Nothing happens.'.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Optional

from vermem_jax import config_util
from vermem_jax.envs import interactive

# ALFWorld's task types (alfworld.agents.environment.alfred_tw_env.TASK_TYPES).
TASK_TYPES = {1: "pick_and_place_simple", 2: "look_at_obj_in_light",
              3: "pick_clean_then_place_in_recep", 4: "pick_heat_then_place_in_recep",
              5: "pick_cool_then_place_in_recep", 6: "pick_two_obj_and_place"}
# valid_unseen is ALFWorld's out-of-distribution evaluation split (134 games), the one
# LLM-agent papers report as the test set; valid_seen (140) is the in-distribution one.
SPLITS = ("valid_unseen", "valid_seen", "train")
DATA_ENV = "ALFWORLD_DATA"
DOWNLOAD_HINT = (f"set {DATA_ENV} to the folder that `alfworld-download` filled (run it "
                 "once on a machine with internet access and copy the folder), or set "
                 "the benchmark's data_dir")


@dataclasses.dataclass(frozen=True)
class ALFWorldConfig:
  """ALFWorld benchmark settings (config section `benchmark` of eval_alfworld.py).

  Attributes:
    data_dir: the ALFWorld data root ('' = $ALFWORLD_DATA, else ALFWorld's own default
      ~/.cache/alfworld); games are read from <data_dir>/json_2.1.1/<split>.
    split: 'valid_unseen' (the test split of SPEC §7), 'valid_seen' or 'train'.
    task_types: ALFWorld task type ids to keep (1..6, all by default).
    max_games: keep only the first N games (sorted by path); None = all.
    max_steps: actions per episode (decision: 50, the limit ALFWorld LLM agents use).
  """
  data_dir: str = ""
  split: str = "valid_unseen"
  task_types: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
  max_games: Optional[int] = None
  max_steps: int = 50

  def __post_init__(self):
    object.__setattr__(self, "task_types", tuple(int(t) for t in self.task_types))
    if self.split not in SPLITS:
      raise ValueError(f"alfworld split must be one of {SPLITS}, got {self.split!r}")
    bad = [t for t in self.task_types if t not in TASK_TYPES]
    if bad:
      raise ValueError(f"alfworld task_types must be in {sorted(TASK_TYPES)}, got {bad}")
    if self.max_games is not None and self.max_games < 1:
      raise ValueError("alfworld max_games must be >= 1 or None")
    if self.max_steps < 1:
      raise ValueError("alfworld max_steps must be >= 1")

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "ALFWorldConfig":
    return config_util.dataclass_from_mapping(cls, section, strict=True,
                                              what="benchmark (alfworld)")


@dataclasses.dataclass(frozen=True)
class ALFWorldInstance:
  """One game: `instance_id` = 'alfworld/<split>/<task folder>/<trial>'."""
  split: str
  game_file: str
  task_type: str
  benchmark: str = "alfworld"

  @property
  def instance_id(self) -> str:
    trial_dir = os.path.dirname(self.game_file)
    return (f"alfworld/{self.split}/{os.path.basename(os.path.dirname(trial_dir))}/"
            f"{os.path.basename(trial_dir)}")


def data_root(config: ALFWorldConfig) -> str:
  """The data root the config points at (no folder is created, unlike alfworld.info)."""
  return os.path.expanduser(config.data_dir or os.environ.get(DATA_ENV)
                            or "~/.cache/alfworld")


def instances(config: ALFWorldConfig) -> list[ALFWorldInstance]:
  """The split's playable games, sorted by path.

  Raises:
    BenchmarkUnavailable: the split folder or its games are missing (the message
      names ALFWORLD_DATA and alfworld-download).
    ValueError: games exist but none is kept by the task-type filter.
  """
  split_dir = os.path.join(data_root(config), "json_2.1.1", config.split)
  if not os.path.isdir(split_dir):
    raise interactive.BenchmarkUnavailable(
        f"ALFWorld games not found: {split_dir} does not exist; {DOWNLOAD_HINT}")
  wanted = {TASK_TYPES[t] for t in config.task_types}
  out, found = [], 0
  for root, _, files in sorted(os.walk(split_dir)):
    if "traj_data.json" not in files or "game.tw-pddl" not in files:
      continue
    found += 1
    if "movable" in root or "Sliced" in root:  # ALFWorld skips these as well
      continue
    with open(os.path.join(root, "traj_data.json")) as f:
      task_type = json.load(f).get("task_type")
    if task_type not in wanted:
      continue
    game_file = os.path.join(root, "game.tw-pddl")
    with open(game_file) as f:
      if not json.load(f).get("solvable", False):
        continue
    out.append(ALFWorldInstance(config.split, game_file, task_type))
  if not found:
    raise interactive.BenchmarkUnavailable(
        f"no ALFWorld games (traj_data.json + game.tw-pddl) under {split_dir}; "
        f"{DOWNLOAD_HINT}")
  if not out:
    raise ValueError(f"none of the {found} ALFWorld games under {split_dir} is a "
                     f"solvable game of task types {config.task_types}")
  if config.max_games is not None:
    out = out[:config.max_games]
  return out


def _textworld():
  try:
    import textworld  # pylint: disable=import-outside-toplevel
    # Importing alfworld creates $ALFWORLD_DATA (or ~/.cache/alfworld) if missing.
    from alfworld.agents.environment import alfred_tw_env  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise interactive.BenchmarkUnavailable(
        f"ALFWorld needs alfworld and textworld: pip install -e '.[alfworld]' ({e})"
    ) from e
  return textworld, alfred_tw_env


def _split_intro(feedback: str) -> tuple[str, str]:
  """(task line, room description) of the game's opening text."""
  text = feedback.replace("-= Welcome to TextWorld, ALFRED! =-", "").strip()
  marker = "Your task is to:"
  if marker in text:
    room, task = text.split(marker, 1)
    return f"{marker} {task.strip()}", room.strip()
  return text, text


class ALFWorldEnv(interactive.InteractiveEnv):
  """One ALFWorld game (module docstring)."""

  benchmark = "alfworld"

  def __init__(self, instance: ALFWorldInstance, config: ALFWorldConfig = ALFWorldConfig(),
               *, policy_commands: bool = False):
    super().__init__(instance.instance_id, max_steps=config.max_steps)
    textworld, alfred = _textworld()
    self.instance = instance
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"],
                               policy_commands=policy_commands)
    self._env = textworld.start(instance.game_file, infos,
                                wrappers=[alfred.AlfredDemangler, alfred.AlfredInfos])
    self._state = None

  def _reset(self):
    self._state = self._env.reset()
    task, room = _split_intro(self._state["feedback"])
    return task, room, {"task_type": self.instance.task_type}

  def _step(self, action: str):
    self._state, _, done = self._env.step(action)
    obs = self._state["feedback"].strip()
    won = bool(self._state["won"])
    if won:
      obs += "\nThe task is complete."
    return obs, bool(done) or won, won, 1.0 if won else 0.0, {
        "valid": obs != "Nothing happens."}

  def _valid_actions(self):
    return [a for a in self._state["admissible_commands"] if a != "help"]

  def policy_commands(self) -> list[str]:
    """The planner's remaining plan from the current state (needs policy_commands=True)."""
    return list(self._state["policy_commands"] or [])

  def close(self) -> None:
    self._env.close()


ACTION_PROMPT = (
    "The environment is ALFWorld, a text household. Actions: go to <receptacle>, "
    "open <receptacle>, close <receptacle>, take <object> from <receptacle>, move "
    "<object> to <receptacle>, examine <something>, use <lamp>, heat <object> with "
    "<microwave>, cool <object> with <fridge>, clean <object> with <sinkbasin>, "
    "inventory, look. Name objects and receptacles exactly as the observations do, "
    "numbers included (e.g. 'apple 1', 'countertop 2').")


class ALFWorldBenchmark:
  """`BENCHMARK` of this adapter (see envs.interactive.Benchmark)."""
  name = "alfworld"
  extra = "alfworld"
  config_class = ALFWorldConfig
  action_prompt = ACTION_PROMPT

  def instances(self, config: ALFWorldConfig) -> list[ALFWorldInstance]:
    return instances(config)

  def make_env(self, instance: ALFWorldInstance, config: ALFWorldConfig) -> ALFWorldEnv:
    return ALFWorldEnv(instance, config)

  def gold_plan(self, instance: ALFWorldInstance, config: ALFWorldConfig) -> list[str]:
    """The game's plan from TextWorld's planner (fast-downward) at the start."""
    env = ALFWorldEnv(instance, config, policy_commands=True)
    try:
      env.reset()
      return env.policy_commands()
    finally:
      env.close()
