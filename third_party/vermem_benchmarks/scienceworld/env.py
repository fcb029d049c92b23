"""ScienceWorld (scienceworld 1.2.3; Wang et al. 2022) behind the text interface.

ScienceWorld is already a text game: the task text is the variation's task description,
the first observation is what `reset` shows (the starting room), and actions are the
simulator's own commands ('open door to kitchen', 'focus on ...'). Its score (0–100) is
the benchmark's partial progress; success is the task completed (score 100). A
negative score means the task failed (e.g. focusing on the wrong object) and ends the
episode.

The simulator runs on a Java 17 JVM started by py4j. Starting one takes seconds, so
closed environments hand their JVM to a small pool that later episodes reuse; the pool
is shut down at interpreter exit.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import re
import shutil
import subprocess
import threading
from typing import Any, Mapping, Optional

from vermem_jax import config_util
from vermem_jax.envs import interactive

SPLITS = ("train", "dev", "test")
JAVA_HINT = ("ScienceWorld needs a Java 17 (or newer) runtime on PATH: on Debian/Ubuntu "
             "apt-get install openjdk-17-jre-headless")


@dataclasses.dataclass(frozen=True)
class ScienceWorldConfig:
  """ScienceWorld benchmark settings (config section `benchmark` of
  eval_scienceworld.py).

  Attributes:
    tasks: task names to run, in order; () = all 30 tasks of the simulator.
    split: 'test' (the official held-out variations, SPEC §7), 'dev' or 'train'.
    variations_per_task: run only the first N variations of each task's split;
      None = all of them.
    simplification: the simulator's simplification string; decision: 'easy'
      (teleporting, open doors, self-watering pots, no electrical actions), the
      setting LLM-agent evaluations of ScienceWorld commonly use.
    max_steps: actions per episode (decision: 100; help commands are free).
    pool_size: idle JVMs kept for reuse after an env is closed.
  """
  tasks: tuple[str, ...] = ()
  split: str = "test"
  variations_per_task: Optional[int] = None
  simplification: str = "easy"
  max_steps: int = 100
  pool_size: int = 2

  def __post_init__(self):
    object.__setattr__(self, "tasks", tuple(self.tasks))
    if self.split not in SPLITS:
      raise ValueError(f"scienceworld split must be one of {SPLITS}, got {self.split!r}")
    if self.variations_per_task is not None and self.variations_per_task < 1:
      raise ValueError("scienceworld variations_per_task must be >= 1 or None")
    if self.max_steps < 1 or self.pool_size < 0:
      raise ValueError("scienceworld max_steps must be >= 1 and pool_size >= 0")

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "ScienceWorldConfig":
    return config_util.dataclass_from_mapping(cls, section, strict=True,
                                              what="benchmark (scienceworld)")


@dataclasses.dataclass(frozen=True)
class ScienceWorldInstance:
  """One task variation: `instance_id` = 'scienceworld/<task>/<variation>'."""
  task: str
  variation: int
  simplification: str = "easy"
  benchmark: str = "scienceworld"

  @property
  def instance_id(self) -> str:
    return f"scienceworld/{self.task}/{self.variation}"


@functools.lru_cache(maxsize=1)
def java_version() -> Optional[int]:
  """Major version of `java` on PATH, or None when there is none."""
  java = shutil.which("java")
  if java is None:
    return None
  try:
    out = subprocess.run([java, "-version"], capture_output=True, text=True,
                         timeout=60, check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
  if not m:
    return None
  major = int(m.group(1))
  return int(m.group(2)) if major == 1 and m.group(2) else major  # "1.8" -> 8


def check_runtime() -> None:
  """Raises BenchmarkUnavailable when the package or a Java >= 17 is missing."""
  try:
    import scienceworld  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    raise interactive.BenchmarkUnavailable(
        "ScienceWorld needs the scienceworld package: pip install -e "
        f"'.[scienceworld]' ({e})") from e
  version = java_version()
  if version is None or version < 17:
    found = "no java" if version is None else f"java {version}"
    raise interactive.BenchmarkUnavailable(f"{JAVA_HINT} (found {found})")


class _Pool:
  """Idle ScienceWorld simulators (one JVM each) for reuse."""

  def __init__(self):
    self._idle: list = []
    self._lock = threading.Lock()

  def acquire(self):
    with self._lock:
      if self._idle:
        return self._idle.pop()
    check_runtime()
    from scienceworld import ScienceWorldEnv  # pylint: disable=import-outside-toplevel
    # Our step limit is enforced by InteractiveEnv; the simulator's own is set far away.
    return ScienceWorldEnv("", envStepLimit=1_000_000)

  def release(self, server, keep: int) -> None:
    with self._lock:
      if len(self._idle) < keep:
        self._idle.append(server)
        return
    server.close()

  def close_all(self) -> None:
    with self._lock:
      idle, self._idle = self._idle, []
    for server in idle:
      try:
        server.close()
      except Exception:  # pylint: disable=broad-except
        pass


POOL = _Pool()
atexit.register(POOL.close_all)


def instances(config: ScienceWorldConfig) -> list[ScienceWorldInstance]:
  """Task variations of the split, tasks in config order (or the simulator's),
  variations ascending. Starts (and returns to the pool) one JVM.

  Raises:
    BenchmarkUnavailable: package or Java missing.
    ValueError: an unknown task name.
  """
  server = POOL.acquire()
  try:
    names = list(server.get_task_names())
    tasks = list(config.tasks) or names
    unknown = [t for t in tasks if t not in names]
    if unknown:
      raise ValueError(f"unknown ScienceWorld tasks {unknown}; known: {names}")
    out = []
    for task in tasks:
      server.load(task, 0, config.simplification)
      variations = {"train": server.get_variations_train, "dev": server.get_variations_dev,
                    "test": server.get_variations_test}[config.split]()
      variations = sorted(int(v) for v in variations)
      if config.variations_per_task is not None:
        variations = variations[:config.variations_per_task]
      out.extend(ScienceWorldInstance(task, v, config.simplification) for v in variations)
    return out
  finally:
    POOL.release(server, config.pool_size)


def gold_plan(instance: ScienceWorldInstance) -> list[str]:
  """The simulator's gold action sequence of the variation."""
  server = POOL.acquire()
  try:
    server.load(instance.task, instance.variation, instance.simplification,
                generateGoldPath=True)
    return list(server.get_gold_action_sequence())
  finally:
    POOL.release(server, 1)


class ScienceWorldEnv(interactive.InteractiveEnv):
  """One ScienceWorld task variation (module docstring)."""

  benchmark = "scienceworld"

  def __init__(self, instance: ScienceWorldInstance,
               config: ScienceWorldConfig = ScienceWorldConfig()):
    super().__init__(instance.instance_id, max_steps=config.max_steps)
    check_runtime()
    self.instance = instance
    self.config = config
    self._server = None
    self._valid: list[str] = []

  def _reset(self):
    if self._server is None:
      self._server = POOL.acquire()
    s = self._server
    s.load(self.instance.task, self.instance.variation, self.instance.simplification)
    obs, info = s.reset()
    self._valid = list(info.get("valid", []))
    return (s.get_task_description(), obs.strip(),
            {"task": self.instance.task, "variation": self.instance.variation})

  def _step(self, action: str):
    obs, _, completed, info = self._server.step(action)
    self._valid = list(info.get("valid", []))
    score = int(info.get("score", 0))
    success = score >= 100
    failed = score < 0
    done = bool(completed) or success or failed
    text = obs.strip()
    if success:
      text += "\nThe task is complete."
    elif failed:
      text += "\nThe task has failed."
    # ScienceWorld answers an unknown command with a fixed message.
    valid = not text.lower().startswith("no known action matches")
    return text, done, success, max(score, 0) / 100.0, {"valid": valid, "score": score}

  def _valid_actions(self):
    return sorted(self._valid)

  def close(self) -> None:
    if self._server is not None:
      POOL.release(self._server, self.config.pool_size)
      self._server = None


ACTION_PROMPT = (
    "The environment is ScienceWorld, a text simulation of rooms, objects and simple "
    "science. Use its own command words, for example: look around, open door to "
    "kitchen, go to kitchen, pick up <object>, move <object> to <container>, focus on "
    "<object>, activate <device>, wait. Use 'focus on' only on the object the task "
    "asks about: focusing on a wrong object fails the task.")


class ScienceWorldBenchmark:
  """`BENCHMARK` of this adapter (see envs.interactive.Benchmark)."""
  name = "scienceworld"
  extra = "scienceworld"
  config_class = ScienceWorldConfig
  action_prompt = ACTION_PROMPT

  def instances(self, config: ScienceWorldConfig) -> list[ScienceWorldInstance]:
    return instances(config)

  def make_env(self, instance: ScienceWorldInstance,
               config: ScienceWorldConfig) -> ScienceWorldEnv:
    return ScienceWorldEnv(instance, config)

  def gold_plan(self, instance: ScienceWorldInstance,
                config: ScienceWorldConfig) -> list[str]:
    del config
    return gold_plan(instance)
