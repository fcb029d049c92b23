"""What the BabyAI agent has seen, in words, and shortest paths over it.

BabyAI (minigrid 3.2.0) observes a 7x7 egocentric symbolic grid plus a mission string;
it has no text interface. This module holds the pieces of ours (our own design; the
idea of describing objects by steps ahead/left/right and of macro actions expanded by
path search follows AgentBoard's BabyAI environment):

  * `Memory` — the cells the agent has seen so far this episode (the only cells path
    search may cross) and stable object names: the first red ball seen is 'red ball 1'
    for the rest of the episode, whatever it is near, so names written into memory stay
    valid.
  * `describe` — the observation: heading, what is held, each visible object with its
    offset in steps (ahead/behind, left/right), and how far the way ahead is free.
  * `plan_path` — breadth-first search over (cell, heading) with turn-left, turn-right
    and move-forward, through seen free cells, to a state satisfying a goal test.

Headings follow minigrid: 0 = east (+x), 1 = south (+y), 2 = west, 3 = north.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Optional

import numpy as np

HEADINGS = ("east", "south", "west", "north")
DIR_TO_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))
# minigrid primitive action indices
LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE, DONE = range(7)
# Object kinds that are named and listed (walls and floor are not objects).
OBJECT_TYPES = ("ball", "box", "key", "door", "goal", "lava")


def front_of(pos, heading: int) -> tuple[int, int]:
  dx, dy = DIR_TO_VEC[heading]
  return int(pos[0]) + dx, int(pos[1]) + dy


def offset_words(agent_pos, heading: int, target) -> tuple[int, int]:
  """(ahead, right) steps from the agent to `target` in its own frame (negative =
  behind / to the left)."""
  dx, dy = DIR_TO_VEC[heading]
  rx, ry = -dy, dx
  vx, vy = int(target[0]) - int(agent_pos[0]), int(target[1]) - int(agent_pos[1])
  return vx * dx + vy * dy, vx * rx + vy * ry


def _steps(n: int, word: str) -> str:
  return f"{n} step{'s' if n != 1 else ''} {word}"


def offset_text(ahead: int, right: int) -> str:
  """'2 steps ahead, 1 step to the left' (our wording)."""
  parts = []
  if ahead > 0:
    parts.append(_steps(ahead, "ahead"))
  elif ahead < 0:
    parts.append(_steps(-ahead, "behind"))
  if right > 0:
    parts.append(_steps(right, "to the right"))
  elif right < 0:
    parts.append(_steps(-right, "to the left"))
  return ", ".join(parts) or "here"


class Memory:
  """Seen cells and stable object names of one episode (reset with the env)."""

  def __init__(self, width: int, height: int):
    self.seen = np.zeros((width, height), dtype=bool)
    self._names: dict[int, str] = {}      # id(obj) -> name
    self._objects: dict[str, object] = {}  # name -> obj
    self._counts: collections.Counter = collections.Counter()

  def name_of(self, obj) -> str:
    """The object's stable name, assigning the next free number on first sight."""
    key = id(obj)
    if key not in self._names:
      base = f"{obj.color} {obj.type}" if obj.type in ("ball", "box", "key", "door") \
          else obj.type
      self._counts[base] += 1
      name = f"{base} {self._counts[base]}"
      self._names[key] = name
      self._objects[name] = obj
    return self._names[key]

  def lookup(self, name: str):
    """The object named `name` (case and spacing insensitive), or None."""
    key = " ".join(name.lower().split())
    return self._objects.get(key)

  def known_names(self) -> list[str]:
    return sorted(self._objects)


def visible_cells(env) -> list[tuple[int, int]]:
  """Absolute (x, y) of the cells the agent sees now (minigrid's visibility mask)."""
  _, vis_mask = env.gen_obs_grid()
  top_x, top_y, bot_x, bot_y = env.get_view_exts()
  cells = []
  for x in range(max(top_x, 0), min(bot_x, env.width)):
    for y in range(max(top_y, 0), min(bot_y, env.height)):
      rel = env.relative_coords(x, y)
      if rel is not None and vis_mask[rel[0], rel[1]]:
        cells.append((x, y))
  return cells


def observe(env, memory: Memory) -> list[tuple[str, object, tuple[int, int]]]:
  """Marks the visible cells seen; returns (name, obj, pos) of the visible objects,
  nearest first (walking distance, then name)."""
  objs = []
  for x, y in visible_cells(env):
    memory.seen[x, y] = True
    cell = env.grid.get(x, y)
    if cell is not None and cell.type in OBJECT_TYPES:
      objs.append((memory.name_of(cell), cell, (x, y)))
  ax, ay = env.agent_pos
  objs.sort(key=lambda t: (abs(t[2][0] - ax) + abs(t[2][1] - ay), t[0]))
  return objs


def door_state(door) -> str:
  if getattr(door, "is_locked", False):
    return "locked"
  return "open" if getattr(door, "is_open", False) else "closed"


def passable(cell) -> bool:
  """A cell the agent can stand on: empty floor, an open door, a goal square."""
  if cell is None:
    return True
  if cell.type == "door":
    return bool(cell.is_open)
  return cell.type == "goal"


def way_ahead(env, memory: Memory) -> str:
  """How far the agent can walk straight ahead, and what stops it."""
  pos, heading, n = env.agent_pos, env.agent_dir, 0
  while True:
    nxt = front_of(pos, heading)
    cell = env.grid.get(*nxt)
    if cell is not None and (not passable(cell) or cell.type == "goal"):
      if cell.type == "wall":
        thing = "a wall"
      else:
        thing = memory.name_of(cell)
        if cell.type == "door":
          thing += f" ({door_state(cell)})"
      return (f"{thing} is right in front of you" if n == 0 else
              f"{_steps(n, 'of free floor')}, then {thing}")
    pos, n = nxt, n + 1


def describe(env, memory: Memory, visible) -> str:
  """The text observation of the current state (our wording)."""
  heading = HEADINGS[env.agent_dir]
  held = env.carrying
  held_txt = f"hold {memory.name_of(held)}" if held is not None else "hold nothing"
  lines = [f"You face {heading} and {held_txt}."]
  if visible:
    items = []
    for name, obj, pos in visible:
      ahead, right = offset_words(env.agent_pos, env.agent_dir, pos)
      state = f", {door_state(obj)}" if obj.type == "door" else ""
      items.append(f"{name}{state} ({offset_text(ahead, right)})")
    lines.append("You see: " + "; ".join(items) + ".")
  else:
    lines.append("You see no objects.")
  lines.append(f"Ahead: {way_ahead(env, memory)}.")
  return " ".join(lines)


def plan_path(env, memory: Memory, goal: Callable[[tuple[int, int], int], bool],
              max_states: int = 20000) -> Optional[list[int]]:
  """Shortest list of primitive actions (LEFT/RIGHT/FORWARD) from the agent's state to
  a (cell, heading) with `goal(cell, heading)` true, moving only through seen cells
  that are passable. [] if the agent is already there; None if no path is known."""
  start = (tuple(int(v) for v in env.agent_pos), int(env.agent_dir))
  if goal(*start):
    return []
  parent = {start: None}
  queue = collections.deque([start])
  while queue and len(parent) < max_states:
    state = queue.popleft()
    pos, heading = state
    moves = [(LEFT, (pos, (heading - 1) % 4)), (RIGHT, (pos, (heading + 1) % 4))]
    nxt = front_of(pos, heading)
    if (0 <= nxt[0] < env.width and 0 <= nxt[1] < env.height and memory.seen[nxt]
        and passable(env.grid.get(*nxt))):
      moves.insert(0, (FORWARD, (nxt, heading)))
    for action, new in moves:
      if new in parent:
        continue
      parent[new] = (state, action)
      if goal(*new):
        path = []
        while parent[new] is not None:
          new, act = parent[new]
          path.append(act)
        return path[::-1]
      queue.append(new)
  return None


def adjacent4(a, b) -> bool:
  return abs(int(a[0]) - int(b[0])) + abs(int(a[1]) - int(b[1])) == 1


def free_floor(env, memory: Memory, cell) -> bool:
  """A seen cell inside the grid with nothing on it (where an object can be dropped)."""
  x, y = cell
  return (0 <= x < env.width and 0 <= y < env.height and memory.seen[x, y]
          and env.grid.get(x, y) is None)


def names_in(text: str, names: Iterable[str]) -> list[str]:
  """Known names occurring in `text` (longest first, case-insensitive)."""
  low = " ".join(text.lower().split())
  return [n for n in sorted(names, key=len, reverse=True) if n in low]
