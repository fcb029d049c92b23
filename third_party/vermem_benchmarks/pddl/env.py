"""PDDL planning problems as a text environment (pddlgym 0.0.7), with progress rate.

The paper reports PDDL's progress rate (App. C.5; AgentBoard, Ma et al. 2024): the best
fraction of goal literals satisfied so far, on a 0–100 scale in tables. Following
AgentBoard's environment, the value is taken over the states reached by executed
actions (the initial state counts only with `count_initial_state=True`), invalid
actions leave it unchanged, and success is every goal literal holding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import os
import warnings
from typing import Any, Mapping, Optional, Sequence

from vermem_jax import config_util
from vermem_jax.envs import interactive

from vermem_benchmarks.pddl import text as ptext

OBSERVATION_MODES = ("full", "changes")


@dataclasses.dataclass(frozen=True)
class PDDLConfig:
  """PDDL benchmark settings (config section `benchmark` of eval_pddl.py).

  Attributes:
    domains: domain names; each needs `<pddl_dir>/<domain>.pddl` and a problem folder.
    problems: instance ids '<domain>/<problem file stem>' to run, in order; () = every
      problem of every domain, sorted by file name.
    pddl_dir: folder of domain files and problem folders; '' = the copy bundled with
      pddlgym (its `blocks` and `gripper` domains). Point it at AgentBoard's PDDL files
      to run barman / tyreworld.
    problem_dir: problem folder name pattern; pddlgym keeps each domain's held-out
      problems in '<domain>_test' (its test split).
    max_steps: actions per episode (decision: 50, AgentBoard's PDDL limit is of this
      order; help commands are free).
    count_initial_state: progress also counts the initial state's satisfied goals.
    observation: 'full' (every observation lists the whole state, AgentBoard's choice
      for blocks and gripper) or 'changes' (what became true / false).
  """
  domains: tuple[str, ...] = ("blocks", "gripper")
  problems: tuple[str, ...] = ()
  pddl_dir: str = ""
  problem_dir: str = "{domain}_test"
  max_steps: int = 50
  count_initial_state: bool = False
  observation: str = "full"

  def __post_init__(self):
    object.__setattr__(self, "domains", tuple(self.domains))
    object.__setattr__(self, "problems", tuple(self.problems))
    if self.observation not in OBSERVATION_MODES:
      raise ValueError(f"pddl observation must be one of {OBSERVATION_MODES}, got "
                       f"{self.observation!r}")
    if self.max_steps < 1:
      raise ValueError(f"pddl max_steps must be >= 1, got {self.max_steps}")

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "PDDLConfig":
    return config_util.dataclass_from_mapping(cls, section, strict=True,
                                              what="benchmark (pddl)")


@dataclasses.dataclass(frozen=True)
class PDDLInstance:
  """One problem: `instance_id` = 'pddl/<domain>/<problem stem>'."""
  domain: str
  problem: str
  domain_file: str
  problem_file: str
  benchmark: str = "pddl"

  @property
  def instance_id(self) -> str:
    return f"pddl/{self.domain}/{self.problem}"


def _import_pddlgym():
  try:
    # gym 0.26 prints a notice about NumPy 2 on import; the adapter is tested on it.
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
      warnings.simplefilter("ignore")
      import pddlgym  # pylint: disable=import-outside-toplevel
      import pddlgym.core  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise interactive.BenchmarkUnavailable(
        f"the PDDL benchmark needs pddlgym: pip install -e '.[pddl]' ({e})") from e
  return pddlgym


def bundled_pddl_dir() -> str:
  """pddlgym's own folder of domains and problems."""
  return os.path.join(os.path.dirname(_import_pddlgym().__file__), "pddl")


def instances(config: PDDLConfig) -> list[PDDLInstance]:
  """The problems of `config`, in config order (or domain, then file name).

  Raises:
    FileNotFoundError: a domain file or problem folder is missing.
    ValueError: a requested problem id does not exist.
  """
  root = config.pddl_dir or bundled_pddl_dir()
  out = []
  for domain in config.domains:
    domain_file = os.path.join(root, f"{domain}.pddl")
    pdir = os.path.join(root, config.problem_dir.format(domain=domain))
    if not os.path.isfile(domain_file):
      raise FileNotFoundError(f"PDDL domain file not found: {domain_file}")
    if not os.path.isdir(pdir):
      raise FileNotFoundError(f"PDDL problem folder not found: {pdir}")
    for path in sorted(glob.glob(os.path.join(pdir, "*.pddl"))):
      stem = os.path.splitext(os.path.basename(path))[0]
      out.append(PDDLInstance(domain, stem, domain_file, path))
  if config.problems:
    by_id = {f"{i.domain}/{i.problem}": i for i in out}
    missing = [p for p in config.problems if p not in by_id]
    if missing:
      raise ValueError(f"unknown PDDL problems {missing}; available: {sorted(by_id)}")
    out = [by_id[p] for p in config.problems]
  return out


def goal_literals(goal) -> list:
  """The goal as a flat list of literals (pddlgym goals are a literal or a
  conjunction of literals in the domains we run)."""
  if hasattr(goal, "literals"):
    out = []
    for part in goal.literals:
      out.extend(goal_literals(part))
    return out
  return [goal]


def goal_fraction(literals, goal: Sequence) -> float:
  """Fraction of goal literals that hold in a state (anti-literals hold when their
  positive form is absent)."""
  if not goal:
    return 1.0
  held = 0
  for lit in goal:
    if getattr(lit, "is_anti", False) or getattr(lit, "is_negative", False):
      held += lit.positive not in literals if hasattr(lit, "positive") else 0
    else:
      held += lit in literals
  return held / len(goal)


class PDDLEnv(interactive.InteractiveEnv):
  """One PDDL problem behind the text interface.

  Observations: the task text states the domain rules (our words) and the goal; the
  first observation lists the initial state; each action's observation lists the
  state again ('full') or what changed ('changes'), plus 'The goal is reached.' at
  the end. Actions are written as in `text.ACTION_TEMPLATES` ('stack a on b', 'move
  from rooma to roomb', ...); an action that names no action, too few objects, or
  whose preconditions fail is answered with the reason and leaves the state as is.
  """

  benchmark = "pddl"

  def __init__(self, instance: PDDLInstance, config: PDDLConfig = PDDLConfig()):
    super().__init__(instance.instance_id, max_steps=config.max_steps)
    pddlgym = _import_pddlgym()
    self.instance = instance
    self.config = config
    with open(instance.domain_file) as f:
      ops_as_actions = "(:actions" not in f.read()
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      # pddlgym parses the whole problem folder; the instance's file is then fixed.
      self._env = pddlgym.core.PDDLEnv(
          instance.domain_file, os.path.dirname(instance.problem_file),
          operators_as_actions=ops_as_actions, dynamic_action_space=True)
    names = [os.path.abspath(p.problem_fname) for p in self._env.problems]
    self._env.fix_problem_index(names.index(os.path.abspath(instance.problem_file)))
    self._state = None
    self._goal: list = []

  def _action_predicates(self):
    return list(self._env.action_predicates)

  def _valid_literals(self):
    return self._env.action_space.all_ground_literals(self._state)

  def _observe(self, literals, *, first: bool) -> str:
    return ptext.state_text(literals, include_static=first)

  def _reset(self):
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      self._state, _ = self._env.reset()
    self._goal = goal_literals(self._state.goal)
    domain = self._env.domain.domain_name
    rules = ptext.domain_description([self.instance.domain, domain],
                                     self._action_predicates())
    task = f"{rules} Goal: reach a state where {ptext.goal_text(self._goal)}."
    obs = "Current state: " + self._observe(self._state.literals, first=True)
    self._initial_fraction = goal_fraction(self._state.literals, self._goal)
    return task, obs, {"domain": domain, "problem": self.instance.problem,
                       "goal_size": len(self._goal)}

  def _step(self, action: str):
    base = 0.0
    if self.config.count_initial_state:
      base = self._initial_fraction
    try:
      pred, args = ptext.parse_action(action, self._action_predicates(),
                                      sorted(self._state.objects))
    except ptext.ParseError as e:
      return (f"Nothing happens: {e}.", False, False, base, {"valid": False})
    literal = pred(*args)
    if literal not in self._valid_literals():
      return (f"Nothing happens: '{ptext.action_text(literal)}' is not possible in the "
              f"current state (a precondition does not hold). Say '"
              f"{interactive.CHECK_VALID_ACTIONS}' to list the possible actions.",
              False, False, base, {"valid": False})
    before = self._state.literals
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      self._state, _, done, _, _ = self._env.step(literal)
    after = self._state.literals
    fraction = goal_fraction(after, self._goal)
    success = fraction >= 1.0 or bool(done)
    if self.config.observation == "full":
      obs = "Current state: " + self._observe(after, first=False)
    else:
      gained = ptext.state_text(after - before) if after - before else "nothing"
      lost = ptext.state_text(before - after) if before - after else "nothing"
      obs = f"Now true: {gained} No longer true: {lost}"
    obs = f"You {ptext.action_text(literal)}. {obs}"
    if success:
      obs += " The goal is reached."
    return obs, success, success, max(fraction, base), {"valid": True,
                                                        "goal_fraction": fraction}

  def _valid_actions(self):
    return sorted(ptext.action_text(l) for l in self._valid_literals())


ACTION_PROMPT = (
    "The environment is a PDDL planning problem described in words. Write actions the "
    "way the task text writes them, with the object names it uses, for example "
    "'stack a on b' or 'move from rooma to roomb'. An action whose conditions do not "
    "hold changes nothing. The episode succeeds when every goal condition holds.")


class PDDLBenchmark:
  """`BENCHMARK` of this adapter (see envs.interactive.Benchmark)."""
  name = "pddl"
  extra = "pddl"
  config_class = PDDLConfig
  action_prompt = ACTION_PROMPT

  def instances(self, config: PDDLConfig) -> list[PDDLInstance]:
    return instances(config)

  def make_env(self, instance: PDDLInstance, config: PDDLConfig) -> PDDLEnv:
    return PDDLEnv(instance, config)

  def gold_plan(self, instance: PDDLInstance, config: PDDLConfig) -> Optional[list]:
    """pddlgym ships no plans; None (tests write theirs by hand)."""
    del instance, config
    return None

