"""Local and global verifiers (paper Appendix F.1-F.3, SPEC §5).

`make_verifier(config)` builds the backend named by `config.backend`:
  * 'heuristic' — deterministic rules, the CPU default and a stand-in for the paper's
    frozen LLM verifiers;
  * 'local_model' — a Flax Qwen checkpoint through `vermem_jax.models.sampling`;
  * 'openai_compatible' — an HTTP chat-completions server.
All share `Verifier.score_local(list[LocalVerifierInput]) -> list[LocalScores | None]`
and `Verifier.score_global(list[GlobalVerifierInput]) -> list[GlobalScores | None]`,
plus `Verifier.counters` (retries, malformed outputs, fallbacks) for metrics.
"""

from typing import Any, Mapping

from vermem_jax.config_util import dataclass_from_mapping

from vermem_jax.verifiers.base import (
    ALL_OPS, BACKENDS, FALLBACKS, GLOBAL_DIMENSIONS, LOCAL_DIMENSIONS, GlobalScores,
    GlobalVerifierInput, ItemUpdate, ItemView, LocalScores, LocalVerifierInput,
    TransitionDelta, Verifier, VerifierConfig, VerifierCounters)
from vermem_jax.verifiers.heuristic import HeuristicRules, HeuristicVerifier
from vermem_jax.verifiers.parsing import VerifierOutputError, parse_global, parse_local


def make_verifier(config: VerifierConfig | Mapping[str, Any], **backend_kwargs) -> Verifier:
  """Builds the verifier backend named by `config.backend`.

  Args:
    config: a `VerifierConfig` or a mapping with its field names (e.g.
      `config.verifier` of the experiment ConfigDict).
    **backend_kwargs: passed to the backend (local_model: model_config, params,
      tokenizer to share already loaded weights).

  Raises:
    ValueError: unknown backend/fallback or invalid values (via VerifierConfig);
      unknown keys in a mapping config.
  """
  if not isinstance(config, VerifierConfig):
    config = dataclass_from_mapping(VerifierConfig, config, strict=True,
                                    what="verifier")
  if config.backend == "heuristic":
    return HeuristicVerifier(config, **backend_kwargs)
  if config.backend == "local_model":
    from vermem_jax.verifiers.local_model import LocalModelVerifier  # pylint: disable=g-import-not-at-top
    return LocalModelVerifier(config, **backend_kwargs)
  from vermem_jax.verifiers.openai_compatible import OpenAICompatibleVerifier  # pylint: disable=g-import-not-at-top
  return OpenAICompatibleVerifier(config, **backend_kwargs)


__all__ = [
    "ALL_OPS", "BACKENDS", "FALLBACKS", "GLOBAL_DIMENSIONS", "LOCAL_DIMENSIONS",
    "GlobalScores", "GlobalVerifierInput", "HeuristicRules", "HeuristicVerifier",
    "ItemUpdate", "ItemView", "LocalScores", "LocalVerifierInput", "TransitionDelta",
    "Verifier", "VerifierConfig", "VerifierCounters", "VerifierOutputError",
    "make_verifier", "parse_global", "parse_local",
]
