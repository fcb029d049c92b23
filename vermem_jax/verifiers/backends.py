"""The verifier backends by name, and `make_verifier` (paper Appendix F.1-F.3, SPEC §5).

`BACKEND_CLASSES` maps each name of `base.BACKENDS` (the values `VerifierConfig.backend`
accepts) to its class:
  * 'heuristic' — deterministic rules, the CPU default and a stand-in for the paper's
    frozen LLM verifiers;
  * 'local_model' — a Flax Qwen checkpoint through `vermem_jax.models.sampling`;
  * 'openai_compatible' — an HTTP chat-completions server.
A new backend is a `base.Verifier` subclass whose constructor takes
`(config, **backend_kwargs)`, its name added to `base.BACKENDS` and here.
"""

from typing import Any, Mapping

from vermem_jax.verifiers import base
from vermem_jax.verifiers import heuristic
from vermem_jax.verifiers import local_model
from vermem_jax.verifiers import openai_compatible

BACKEND_CLASSES = {
    "heuristic": heuristic.HeuristicVerifier,
    "local_model": local_model.LocalModelVerifier,
    "openai_compatible": openai_compatible.OpenAICompatibleVerifier,
}


def make_verifier(config: base.VerifierConfig | Mapping[str, Any],
                  **backend_kwargs) -> base.Verifier:
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
  if not isinstance(config, base.VerifierConfig):
    config = base.VerifierConfig.from_config(config, strict=True)
  return BACKEND_CLASSES[config.backend](config, **backend_kwargs)
