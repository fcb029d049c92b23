"""PDDL facts and actions as English text, and action text back to ground literals.

Our own phrasing. Domains we know (pddlgym's `blocks` and `gripper`, and the
AgentBoard-style `blockworld` spelling of the same predicates) get sentence templates;
any other domain falls back to 'name arg1 arg2' with the predicate's own name, so a
user's PDDL files (AgentBoard's barman, tyreworld) still play.

Works on pddlgym structures (`Literal`, `Predicate`, `TypedEntity` with `.name`) but
imports nothing from pddlgym: the functions only read attributes.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

# predicate name -> sentence template over its arguments ({0}, {1}, ...).
FACT_TEMPLATES: Mapping[str, str] = {
    # blocks (pddlgym) / blockworld
    "on": "{0} is on top of {1}",
    "ontable": "{0} is on the table",
    "on-table": "{0} is on the table",
    "clear": "nothing is on top of {0}",
    "handempty": "the robot hand is empty",
    "arm-empty": "the robot hand is empty",
    "handfull": "the robot hand is full",
    "holding": "the robot hand holds {0}",
    # gripper
    "at-robby": "the robot is in {0}",
    "at": "{0} is in {1}",
    "free": "gripper {0} is empty",
    "carry": "{0} is held by gripper {1}",
    "room": "{0} is a room",
    "ball": "{0} is a ball",
    "gripper": "{0} is a gripper",
}

# action predicate name -> how we write the action (also accepted when parsing).
ACTION_TEMPLATES: Mapping[str, str] = {
    "pickup": "pick up {0}",
    "pick-up": "pick up {0}",
    "putdown": "put down {0}",
    "put-down": "put down {0}",
    "stack": "stack {0} on {1}",
    "unstack": "unstack {0}",
    "move": "move from {0} to {1}",
    "pick": "pick {0} in {1} with {2}",
    "drop": "drop {0} in {1} with {2}",
}

# Predicates that only restate an object's kind: shown once, in the first observation.
STATIC_KIND_PREDICATES = frozenset({"room", "ball", "gripper"})

# Our description of the domains we know (task text).
DOMAIN_DESCRIPTIONS: Mapping[str, str] = {
    "blocks": (
        "Blocks sit on a table or on top of each other, and a robot hand moves them one "
        "at a time. Actions: 'pick up X' (X on the table, nothing on it, hand empty), "
        "'put down X' (put the held block X on the table), 'stack X on Y' (put the held "
        "block X on Y, which must have nothing on it), 'unstack X' (lift X, which has "
        "nothing on it, off the block it sits on; hand empty)."),
    "gripper": (
        "A robot with two grippers carries balls between rooms. Actions: 'move from A to "
        "B' (the robot goes from room A to room B), 'pick X in R with G' (gripper G, "
        "empty, picks ball X in room R, where the robot is), 'drop X in R with G' "
        "(gripper G puts ball X down in room R, where the robot is)."),
}

_SEP = re.compile(r"[(),:;]+")


def predicate_key(name: str) -> str:
  return str(name).lower()


def literal_args(literal) -> list[str]:
  """Object names of a ground literal (TypedEntity.name, or str before ':')."""
  return [getattr(v, "name", str(v).split(":")[0]) for v in literal.variables]


def fact_text(literal) -> str:
  """One state fact in English (falls back to 'name a b')."""
  name = predicate_key(literal.predicate.name)
  args = literal_args(literal)
  tmpl = FACT_TEMPLATES.get(name)
  if tmpl is not None and tmpl.count("{") <= len(args):  # may omit e.g. the robot
    text = tmpl.format(*args)
  else:
    text = " ".join([name] + args)
  if getattr(literal, "is_anti", False) or getattr(literal, "is_negative", False):
    text = f"not ({text})"
  return text


def action_text(literal) -> str:
  """A ground action in our action syntax (falls back to 'name a b')."""
  name = predicate_key(literal.predicate.name)
  args = literal_args(literal)
  tmpl = ACTION_TEMPLATES.get(name)
  if tmpl is not None and tmpl.count("{") == len(args):
    return tmpl.format(*args)
  return " ".join([name] + args)


def state_text(literals: Iterable, *, include_static: bool = True) -> str:
  """Facts of a state, one sentence each, sorted (deterministic)."""
  facts = sorted(fact_text(l) for l in literals
                 if include_static
                 or predicate_key(l.predicate.name) not in STATIC_KIND_PREDICATES)
  return ". ".join(facts) + "." if facts else "(no facts)"


def goal_text(goal_literals: Sequence) -> str:
  return "; ".join(sorted(fact_text(l) for l in goal_literals))


def _action_aliases(name: str) -> set[str]:
  """Ways to write an action's name: 'pick-up' -> {'pick-up', 'pick up', 'pickup'};
  the verb part of our template ('pick up' for pickup, 'put down' for putdown)."""
  key = predicate_key(name)
  aliases = {key, key.replace("-", " "), key.replace("-", "").replace("_", ""),
             key.replace("_", " ")}
  tmpl = ACTION_TEMPLATES.get(key)
  if tmpl:
    verb = tmpl.split("{", 1)[0].strip()
    if verb:
      aliases.add(verb)
  return {a for a in aliases if a}


class ParseError(ValueError):
  """Action text that names no action of the domain, or too few objects."""


def parse_action(text: str, action_predicates: Sequence, objects: Sequence
                 ) -> tuple[object, list]:
  """(predicate, [objects]) named by `text`.

  The action name is matched at the start (any alias of `_action_aliases`, longest
  first, case-insensitive); then the object names are taken in order of appearance,
  other words ('on', 'from', 'with', ...) ignored. Extra objects beyond the action's
  arity are dropped ('unstack a from b' -> unstack(a)).

  Args:
    text: the action (normalised, one line).
    action_predicates: pddlgym Predicates of the domain's actions.
    objects: the problem's objects (TypedEntity).

  Raises:
    ParseError: unknown action, or fewer objects than its arity (message says which).
  """
  norm = " ".join(_SEP.sub(" ", text.lower()).split())
  best = None
  for pred in action_predicates:
    for alias in _action_aliases(pred.name):
      if (norm == alias or norm.startswith(alias + " ")) and (
          best is None or len(alias) > len(best[1])):
        best = (pred, alias)
  if best is None:
    names = sorted({ACTION_TEMPLATES.get(predicate_key(p.name), predicate_key(p.name))
                    .split("{", 1)[0].strip() for p in action_predicates})
    raise ParseError(f"'{text}' names no action of this domain; actions start with "
                     f"one of: {', '.join(names)}")
  pred, alias = best
  by_name = {getattr(o, "name", str(o)).lower(): o for o in objects}
  args = [by_name[tok] for tok in norm[len(alias):].split() if tok in by_name]
  if len(args) < pred.arity:
    tmpl = ACTION_TEMPLATES.get(predicate_key(pred.name))
    form = tmpl.format(*"XYZUVW"[:pred.arity]) if tmpl and tmpl.count("{") == pred.arity \
        else f"{predicate_key(pred.name)} " + " ".join("XYZUVW"[:pred.arity])
    raise ParseError(f"'{text}' names {len(args)} known object(s) but the action needs "
                     f"{pred.arity}: write '{form}' with object names from the task")
  return pred, args[:pred.arity]


def domain_description(domain_names: Sequence[str], action_predicates: Sequence) -> str:
  """Our text for the first known name in `domain_names` (the config's domain name,
  then the PDDL file's), else a generic list of the action forms."""
  for name in domain_names:
    known = DOMAIN_DESCRIPTIONS.get(predicate_key(name))
    if known:
      return known
  forms = []
  for p in action_predicates:
    types = [str(t) for t in (getattr(p, "var_types", None) or [])]
    slots = [f"<{t}>" if t and t != "default" else f"<{'XYZUVW'[i % 6]}>"
             for i, t in enumerate(types)] or ["<X>"] * p.arity
    forms.append(" ".join([predicate_key(p.name)] + slots))
  return ("Actions (write the name, then the objects in order): " + "; ".join(sorted(forms))
          + ".")

