"""A tiny ALFWorld game written from scratch, for offline smoke tests.

ALFWorld's real games come from `alfworld-download`, which needs internet access. This
builds one game in the same on-disk layout (json_2.1.1/<split>/<task folder>/<trial>/
with traj_data.json and game.tw-pddl), using only what the alfworld package ships: its
PDDL domain (alfred.pddl) and text grammar (alfred.twl2). The scene is ours: a room
with a countertop holding an apple and a closed fridge; the task is to put the apple in
the fridge (task type pick_and_place_simple). Object ids follow ALFRED's
'Type|x|y|z' naming (mangled), so ALFWorld's demangler calls them 'apple 1',
'countertop 1', 'fridge 1'.
"""

from __future__ import annotations

import importlib.util
import json
import os

_APPLE = "Apple_bar__plus_00_dot_50_bar__plus_00_dot_95_bar__plus_01_dot_00"
_COUNTER = "CounterTop_bar__plus_00_dot_50_bar__plus_00_dot_90_bar__plus_01_dot_00"
_FRIDGE = "Fridge_bar__minus_01_dot_50_bar__plus_00_dot_00_bar__plus_02_dot_00"
_START, _AT_COUNTER, _AT_FRIDGE = ("loc_bar_0_bar_0_bar_0_bar_30",
                                   "loc_bar_2_bar_4_bar_1_bar_45",
                                   "loc_bar__minus_5_bar_8_bar_3_bar_60")
TASK_DESC = "put an apple in fridge"
GOLD_PLAN = ("go to countertop 1", "take apple 1 from countertop 1", "go to fridge 1",
             "open fridge 1", "move apple 1 to fridge 1")

PROBLEM = f"""(define (problem plan_tiny_apple_fridge)
(:domain alfred)
(:objects
        agent1 - agent
        AppleType - otype
        CounterTopType - rtype
        FridgeType - rtype
        {_APPLE} - object
        {_COUNTER} - receptacle
        {_FRIDGE} - receptacle
        {_START} - location
        {_AT_COUNTER} - location
        {_AT_FRIDGE} - location
        )
(:init
        (atLocation agent1 {_START})
        (receptacleType {_COUNTER} CounterTopType)
        (receptacleType {_FRIDGE} FridgeType)
        (objectType {_APPLE} AppleType)
        (canContain CounterTopType AppleType)
        (canContain FridgeType AppleType)
        (pickupable {_APPLE})
        (coolable {_APPLE})
        (heatable {_APPLE})
        (cleanable {_APPLE})
        (openable {_FRIDGE})
        (receptacleAtLocation {_COUNTER} {_AT_COUNTER})
        (receptacleAtLocation {_FRIDGE} {_AT_FRIDGE})
        (inReceptacle {_APPLE} {_COUNTER})
        (objectAtLocation {_APPLE} {_AT_COUNTER})
        )
(:goal
    (and
        (exists (?r - receptacle)
            (exists (?o - object)
                (and
                    (objectType ?o AppleType)
                    (receptacleType ?r FridgeType)
                    (inReceptacle ?o ?r)
                )
            )
        )
    )
)
)
"""


def build(data_root: str, split: str = "valid_unseen") -> str:
  """Writes the game under `data_root` (an ALFWORLD_DATA-style folder); returns the
  path of its game.tw-pddl. Needs the alfworld package (for its domain and grammar),
  which it locates without importing it (importing alfworld creates data folders)."""
  spec = importlib.util.find_spec("alfworld")
  if spec is None or not spec.submodule_search_locations:
    raise ImportError("the tiny ALFWorld game needs alfworld: pip install -e '.[alfworld]'")
  logic = os.path.join(list(spec.submodule_search_locations)[0], "data")
  trial = os.path.join(data_root, "json_2.1.1", split,
                       "pick_and_place_simple-Apple-None-Fridge-0", "trial_T00000000_000000")
  os.makedirs(trial, exist_ok=True)
  with open(os.path.join(logic, "alfred.pddl")) as f:
    domain = f.read()
  with open(os.path.join(logic, "alfred.twl2")) as f:
    grammar = f.read().replace("UNKNOWN GOAL", TASK_DESC)
  traj = {"task_id": "trial_T00000000_000000", "task_type": "pick_and_place_simple",
          "pddl_params": {"object_target": "Apple", "parent_target": "Fridge",
                          "mrecep_target": "", "toggle_target": "",
                          "object_sliced": False}}
  with open(os.path.join(trial, "traj_data.json"), "w") as f:
    json.dump(traj, f)
  with open(os.path.join(trial, "initial_state.pddl"), "w") as f:
    f.write(PROBLEM)
  game_file = os.path.join(trial, "game.tw-pddl")
  with open(game_file, "w") as f:
    json.dump({"pddl_domain": domain, "grammar": grammar, "pddl_problem": PROBLEM,
               "solvable": True, "walkthrough": list(GOLD_PLAN)}, f)
  return game_file
