"""Local and global verifiers (paper Appendix F.1-F.3, SPEC §5).

All backends share `Verifier.score_local(list[LocalVerifierInput]) ->
list[LocalScores | None]` and `Verifier.score_global(list[GlobalVerifierInput]) ->
list[GlobalScores | None]`, plus `Verifier.counters` (retries, malformed outputs,
fallbacks) for metrics.

Modules (import them directly; this package re-exports nothing):
  base               VerifierConfig, the input/score types, Verifier, BACKENDS.
  backends           make_verifier(config): the backend named by `config.backend`.
  heuristic          HeuristicVerifier: deterministic rules (the CPU default).
  llm                LLMVerifier: prompts, strict parsing, retries, fallback.
  local_model        LocalModelVerifier: a Flax Qwen checkpoint in-process.
  openai_compatible  OpenAICompatibleVerifier: an HTTP chat-completions server.
  prompts, parsing   the rubric prompts and the strict reply parsers.
  adapters           verifier inputs from memory transitions and trajectories.
"""
