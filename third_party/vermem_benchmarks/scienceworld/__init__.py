"""ScienceWorld adapter (extra `scienceworld`: scienceworld 1.2.3; needs Java 17). See
README.md."""

import importlib.util

from vermem_jax.envs import interactive

if importlib.util.find_spec("scienceworld") is None:
  raise interactive.BenchmarkUnavailable(
      "the ScienceWorld benchmark needs scienceworld: pip install -e '.[scienceworld]'")

from vermem_benchmarks.scienceworld.env import (  # noqa: E402
    ACTION_PROMPT, JAVA_HINT, POOL, ScienceWorldBenchmark, ScienceWorldConfig,
    ScienceWorldEnv, ScienceWorldInstance, check_runtime, gold_plan, instances,
    java_version)

BENCHMARK = ScienceWorldBenchmark()

__all__ = ["ACTION_PROMPT", "BENCHMARK", "JAVA_HINT", "POOL", "ScienceWorldBenchmark",
           "ScienceWorldConfig", "ScienceWorldEnv", "ScienceWorldInstance",
           "check_runtime", "gold_plan", "instances", "java_version"]
