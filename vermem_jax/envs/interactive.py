"""Interactive text benchmarks behind one small interface (paper Section 4, App. C.1–C.2).

The paper evaluates on ALFWorld, ScienceWorld, PDDL and BabyAI besides HotpotQA. Each of
them is an environment the task solver acts in with text: the episode starts with the
task text q and a first observation z_0 (C_0 = instruction + z_0, App. C.2); after each
memory decision the solver proposes an action b_t, `step(b_t)` returns z_{t+1}, and the
episode ends when the environment says so, the step limit is hit, or the token budget
runs out (the episode loop's business, not the environment's).

This module is the core's side of the contract; the adapters live in
`third_party/vermem_benchmarks/<name>/` behind optional extras, and the core reaches
them only by module path through the registry below (never a static import):

  * `InteractiveEnv` — one task instance. Subclasses implement `_reset` and `_step`;
    the base class owns what every benchmark shares: action-text normalisation, the
    'check valid actions' help command, the step limit, progress as a running best,
    and errors for use before reset or after the end.
  * `Reset(task, observation, info)` and `Step(observation, done, success, progress,
    info)` — what reset/step return (NamedTuples: unpack or use the names).
  * `Benchmark` — a named instance list plus an env factory:
    `instances(config) -> [instance]`, `make_env(instance, config) -> InteractiveEnv`,
    `gold_plan(instance, config) -> actions | None`, and the action-format prompt
    text for LLM solvers (`action_prompt`).
  * `load_benchmark(name)` — imports the adapter registered under `name` and raises
    `BenchmarkUnavailable` naming the extra to install when its package is missing.

Metrics (SPEC §7, App. C.5): success is the benchmark's own signal (ALFWorld `won`,
ScienceWorld score 100 / completed, PDDL goal satisfied, BabyAI mission verified);
progress is in [0, 1] — PDDL's progress rate, for the others 1.0 on success else the
benchmark's own partial score when it has one (ScienceWorld score/100) or 0.0.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import re
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Protocol, Sequence

# The help command every environment with a list of valid actions understands (our
# wording; AgentBoard offers the same affordance).
CHECK_VALID_ACTIONS = "check valid actions"
_CHECK_RE = re.compile(r"^\s*(?:check|list|show)\s+(?:the\s+)?valid\s+actions?\s*\.?\s*$",
                       re.IGNORECASE)


class Reset(NamedTuple):
  """What `InteractiveEnv.reset` returns.

  Attributes:
    task: the task text q (the benchmark's instruction, stable for the episode).
    observation: the first observation z_0 (C_0 = instruction + z_0, App. C.2).
    info: benchmark extras (instance id, ...); never shown to the policy.
  """
  task: str
  observation: str
  info: Mapping[str, Any]


class Step(NamedTuple):
  """What `InteractiveEnv.step` returns.

  Attributes:
    observation: z_{t+1}, the environment's text reply (for an action that was not
      understood or not possible: the reason, phrased for the solver).
    done: the episode is over (success, failure, or the step limit).
    success: the benchmark's own success signal (never True unless done).
    progress: running best progress in [0, 1] (PDDL progress rate; 1.0 on success).
    info: extras: 'valid' (the action was understood and executed), 'steps'
      (actions taken, help commands excluded), 'truncated' (ended by the step
      limit), benchmark keys (score, ...). Never shown to the policy.
  """
  observation: str
  done: bool
  success: bool
  progress: float
  info: Mapping[str, Any]


class EnvStateError(RuntimeError):
  """`step` before `reset`, or after the episode ended."""


class BenchmarkUnavailable(ImportError):
  """A benchmark's optional package (or runtime, data) is missing; the message names
  the extra to install or the variable to set."""


def normalize_action(text: str) -> str:
  """The action a reply carries: its first non-empty line, surrounding quotes,
  backticks and a trailing period removed, inner whitespace collapsed. '' if none."""
  for line in str(text).splitlines():
    prev = None
    while line != prev:  # "'open door'." -> open door
      prev = line
      line = line.strip().strip("`'\"").strip()
      if line.endswith(".") and not line.endswith(".."):
        line = line[:-1]
    if line:
      return " ".join(line.split())
  return ""


def is_check_valid_actions(action: str) -> bool:
  """True for the help command ('check valid actions' and close variants)."""
  return bool(_CHECK_RE.match(action))


class InteractiveEnv(abc.ABC):
  """One task instance of an interactive benchmark (template: subclasses implement
  `_reset`, `_step` and optionally `_valid_actions`).

  Args:
    max_steps: action limit of an episode (help commands do not count); reaching it
      ends the episode as unsuccessful (`info['truncated']`). None = only the
      benchmark's own limit.

  Attributes:
    benchmark: registry name ('pddl', ...).
    instance_id: stable id of the instance (e.g. 'pddl/blocks/problem2').
  """

  benchmark: str = ""

  def __init__(self, instance_id: str, *, max_steps: Optional[int] = None):
    if max_steps is not None and max_steps < 1:
      raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
    self.instance_id = instance_id
    self.max_steps = max_steps
    self._steps = 0
    self._done = True
    self._started = False
    self._progress = 0.0

  # --- to implement -----------------------------------------------------------------

  @abc.abstractmethod
  def _reset(self) -> tuple[str, str, Mapping[str, Any]]:
    """Starts the instance: (task text, first observation, info)."""

  @abc.abstractmethod
  def _step(self, action: str) -> tuple[str, bool, bool, float, Mapping[str, Any]]:
    """Plays one normalised action: (observation, done, success, progress, info).

    `progress` is this step's value in [0, 1] (the base class keeps the running
    best); info should hold 'valid' (bool): whether the action was understood and
    possible (an invalid action leaves the world unchanged and its observation says
    why).
    """

  def _valid_actions(self) -> Optional[Sequence[str]]:
    """Currently valid actions, or None when the benchmark has no list."""
    return None

  def close(self) -> None:
    """Releases external resources (a JVM, a game process)."""

  # --- the interface ----------------------------------------------------------------

  @property
  def steps(self) -> int:
    return self._steps

  @property
  def done(self) -> bool:
    return self._done

  @property
  def progress(self) -> float:
    return self._progress

  def reset(self) -> Reset:
    """Starts (or restarts) the episode. Returns Reset(task, observation, info)."""
    task, observation, info = self._reset()
    self._steps = 0
    self._done = False
    self._started = True
    self._progress = 0.0
    return Reset(task, observation, dict(info, instance_id=self.instance_id))

  def valid_actions(self) -> Optional[tuple[str, ...]]:
    """The actions possible now, or None when the benchmark has no such list."""
    acts = self._valid_actions()
    return None if acts is None else tuple(acts)

  def step(self, action: str) -> Step:
    """Plays `action` (free text; its first line is used).

    The help command ('check valid actions') returns the list of valid actions as the
    observation and costs no step. Anything else counts as a step, understood or not.

    Raises:
      EnvStateError: before `reset`, or after the episode ended.
    """
    if not self._started:
      raise EnvStateError(f"{self.instance_id}: call reset() before step()")
    if self._done:
      raise EnvStateError(f"{self.instance_id}: the episode is over; call reset()")
    act = normalize_action(action)
    if is_check_valid_actions(act):
      acts = self.valid_actions()
      text = ("This environment has no list of valid actions." if acts is None else
              "Valid actions: " + "; ".join(acts) + ".")
      return Step(text, False, False, self._progress,
                  {"valid": acts is not None, "help": True, "steps": self._steps,
                   "truncated": False})
    if not act:
      obs, done, success, progress, info = (
          "No action was given. Reply with one action.", False, False, 0.0,
          {"valid": False})
    else:
      obs, done, success, progress, info = self._step(act)
    self._steps += 1
    success = bool(success) and bool(done)
    self._progress = 1.0 if success else max(self._progress, float(progress))
    truncated = False
    if not done and self.max_steps is not None and self._steps >= self.max_steps:
      done, truncated = True, True
      obs = f"{obs}\nThe step limit of {self.max_steps} actions is reached."
    self._done = bool(done)
    info = dict(info, steps=self._steps, truncated=truncated)
    info.setdefault("valid", True)
    return Step(obs, self._done, success, self._progress, info)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False


@dataclasses.dataclass(frozen=True)
class PlayResult:
  """A finished `play` run.

  Attributes:
    reset: the Reset of the episode.
    steps: one Step per action played (help commands included).
    actions: the actions played, in order.
  """
  reset: Reset
  steps: tuple[Step, ...]
  actions: tuple[str, ...]

  @property
  def success(self) -> bool:
    return bool(self.steps) and self.steps[-1].success

  @property
  def progress(self) -> float:
    return self.steps[-1].progress if self.steps else 0.0

  @property
  def done(self) -> bool:
    return bool(self.steps) and self.steps[-1].done


def play(env: InteractiveEnv,
         actor: Iterable[str] | Callable[[Reset, Sequence[Step]], Optional[str]],
         *, max_actions: int = 1000) -> PlayResult:
  """Runs one episode without a memory policy: resets `env`, then plays a fixed action
  list, or asks `actor(reset, steps_so_far)` for each next action (None stops), until
  the episode is done or `max_actions` actions were played.

  For scripted solvers and tests; the memory episode loop drives envs through
  reset/step itself.
  """
  first = env.reset()
  steps: list[Step] = []
  played: list[str] = []
  script = None if callable(actor) else iter(actor)
  while len(played) < max_actions and not (steps and steps[-1].done):
    if script is not None:
      action = next(script, None)
    else:
      action = actor(first, tuple(steps))
    if action is None:
      break
    played.append(action)
    steps.append(env.step(action))
  return PlayResult(first, tuple(steps), tuple(played))


class Instance(Protocol):
  """A benchmark task instance: hashable, with a stable id."""
  benchmark: str
  instance_id: str


class Benchmark(Protocol):
  """What an adapter module exposes as `BENCHMARK`.

  Attributes:
    name: registry name.
    extra: the setup.py extra that installs its packages.
    config_class: a frozen dataclass of the benchmark's settings (instance list,
      limits); `config_class.from_config(section)` builds it from a config section.
    action_prompt: the benchmark's action-format instructions for LLM solvers (our
      wording), used by `vermem_jax.envs.action_solvers.action_messages`.
  """
  name: str
  extra: str
  config_class: type
  action_prompt: str

  def instances(self, config: Any) -> Sequence[Instance]: ...
  def make_env(self, instance: Instance, config: Any) -> InteractiveEnv: ...
  def gold_plan(self, instance: Instance, config: Any) -> Optional[Sequence[str]]: ...


# name -> (module path, extra). Module paths are imported lazily by load_benchmark.
_REGISTRY: dict[str, tuple[str, str]] = {
    "scienceworld": ("vermem_benchmarks.scienceworld", "scienceworld"),
    "babyai": ("vermem_benchmarks.babyai", "babyai"),
    "pddl": ("vermem_benchmarks.pddl", "pddl"),
    "alfworld": ("vermem_benchmarks.alfworld", "alfworld"),
}
# Benchmarks registered as objects (a user's own adapter, test doubles).
_OBJECTS: dict[str, Benchmark] = {}

# The paper's interactive benchmarks, in Table 2's column order.
PAPER_BENCHMARKS = ("alfworld", "scienceworld", "pddl", "babyai")


def register_benchmark(name: str, target: str | Benchmark, *, extra: str = "") -> None:
  """Registers a benchmark under `name`: a module path exposing `BENCHMARK`, or a
  Benchmark object. Re-registering a name replaces it."""
  if not name or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
    raise ValueError(f"benchmark names are lowercase identifiers, got {name!r}")
  if isinstance(target, str):
    _OBJECTS.pop(name, None)
    _REGISTRY[name] = (target, extra or name)
  else:
    _OBJECTS[name] = target


def benchmark_names() -> tuple[str, ...]:
  """Registered benchmark names (installed or not)."""
  return tuple(sorted(set(_REGISTRY) | set(_OBJECTS)))


def load_benchmark(name: str) -> Benchmark:
  """The Benchmark registered under `name`.

  Raises:
    KeyError: unknown name (the message lists the known ones).
    BenchmarkUnavailable: its adapter or the adapter's package cannot be imported;
      the message names `pip install -e '.[<extra>]'` and the import error.
  """
  if name in _OBJECTS:
    return _OBJECTS[name]
  if name not in _REGISTRY:
    raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(benchmark_names())}")
  module_path, extra = _REGISTRY[name]
  try:
    module = importlib.import_module(module_path)
  except ImportError as e:
    if isinstance(e, BenchmarkUnavailable):
      raise
    raise BenchmarkUnavailable(
        f"benchmark {name!r} is not installed: pip install -e '.[{extra}]' "
        f"(importing {module_path} failed: {e})") from e
  bench = getattr(module, "BENCHMARK", None)
  if bench is None:
    raise BenchmarkUnavailable(f"{module_path} defines no BENCHMARK object")
  return bench


def benchmark_available(name: str) -> tuple[bool, str]:
  """(True, '') when `load_benchmark(name)` works, else (False, why)."""
  try:
    load_benchmark(name)
  except (BenchmarkUnavailable, KeyError) as e:
    return False, str(e)
  return True, ""
