"""BabyAI adapter (extra `babyai`: minigrid 3.2.0). See README.md."""

import importlib.util

from vermem_jax.envs import interactive

if importlib.util.find_spec("minigrid") is None:
  raise interactive.BenchmarkUnavailable(
      "the BabyAI benchmark needs minigrid: pip install -e '.[babyai]'")

from vermem_benchmarks.babyai.env import (ACTION_PROMPT, DEFAULT_LEVELS,  # noqa: E402
                                          TEST_SEED_START, BabyAIBenchmark, BabyAIConfig,
                                          BabyAIEnv, BabyAIInstance, bot_plan, instances)

BENCHMARK = BabyAIBenchmark()

__all__ = ["ACTION_PROMPT", "BENCHMARK", "DEFAULT_LEVELS", "TEST_SEED_START",
           "BabyAIBenchmark", "BabyAIConfig", "BabyAIEnv", "BabyAIInstance", "bot_plan",
           "instances"]
