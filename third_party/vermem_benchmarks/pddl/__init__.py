"""PDDL adapter (extra `pddl`: pddlgym 0.0.7, gym 0.26.2). See README.md."""

import importlib.util

from vermem_jax.envs import interactive

if importlib.util.find_spec("pddlgym") is None:
  raise interactive.BenchmarkUnavailable(
      "the PDDL benchmark needs pddlgym: pip install -e '.[pddl]'")

from vermem_benchmarks.pddl.env import (ACTION_PROMPT, PDDLBenchmark, PDDLConfig, PDDLEnv,
                                        PDDLInstance, goal_fraction, goal_literals,
                                        instances)

BENCHMARK = PDDLBenchmark()

__all__ = ["ACTION_PROMPT", "BENCHMARK", "PDDLBenchmark", "PDDLConfig", "PDDLEnv",
           "PDDLInstance", "goal_fraction", "goal_literals", "instances"]
