"""Shared by the benchmark-adapter tests: load an adapter or skip with the reason.

A missing optional piece (the extra's package, Java for ScienceWorld) skips the test
with a message naming it; CI sets VERMEM_REQUIRE_BENCHMARKS=1 (.ci/run), which turns
such a skip into a failure, so CI runs these tests instead of skipping them.
"""
import os

import pytest

from vermem_jax.envs import interactive

REQUIRE_ENV = "VERMEM_REQUIRE_BENCHMARKS"


def unavailable(reason: str):
  """Fails under VERMEM_REQUIRE_BENCHMARKS=1, else skips, with `reason`."""
  if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
    pytest.fail(f"{reason} ({REQUIRE_ENV} is set, so a missing benchmark fails)")
  pytest.skip(reason)


def require_benchmark(name: str):
  """The adapter's BENCHMARK, or skip/fail naming the extra to install."""
  try:
    return interactive.load_benchmark(name)
  except interactive.BenchmarkUnavailable as e:
    unavailable(str(e))
