"""ALFWorld adapter (extra `alfworld`: alfworld 0.4.2 with textworld; game files from
`alfworld-download` via ALFWORLD_DATA). See README.md."""

import importlib.util

from vermem_jax.envs import interactive

if importlib.util.find_spec("alfworld") is None or importlib.util.find_spec(
    "textworld") is None:
  raise interactive.BenchmarkUnavailable(
      "the ALFWorld benchmark needs alfworld and textworld: pip install -e '.[alfworld]'")

from vermem_benchmarks.alfworld.env import (  # noqa: E402
    ACTION_PROMPT, DATA_ENV, DOWNLOAD_HINT, SPLITS, TASK_TYPES, ALFWorldBenchmark,
    ALFWorldConfig, ALFWorldEnv, ALFWorldInstance, data_root, instances)

BENCHMARK = ALFWorldBenchmark()

__all__ = ["ACTION_PROMPT", "BENCHMARK", "DATA_ENV", "DOWNLOAD_HINT", "SPLITS",
           "TASK_TYPES", "ALFWorldBenchmark", "ALFWorldConfig", "ALFWorldEnv",
           "ALFWorldInstance", "data_root", "instances"]
