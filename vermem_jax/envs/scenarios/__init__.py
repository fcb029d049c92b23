"""Phase A/B/C scenario generators: initial states s_0 and observation schedules.

SPEC §4, paper Appendix D.4 (phase-specific episode construction) and F.8 (decision
patterns). Each generator turns one HotpotQA example into an `ScenarioSpec` (an
`environment.EpisodeSpec` with construction metadata): the initial memory state
s_0 = (q, M_0, C_0, H_0), the observation schedule z_1, z_2, ... revealed after each
decision, the allowed operation subspace, the rollout limit and the delayed query.

Phases and scenario families (one family per episode, drawn uniformly by the seeded
episode RNG; `spec.FAMILIES`):

- A (LTM ⊂ {Add, Update, Delete, ∅}): supporting facts arrive one sentence at a time,
  interleaved with distractor sentences and a repeated (duplicate) fact; M_0 carries
  the family's persistent state: nothing (`add`), stale versions of facts that later
  observations correct (`update`), an obsolete or duplicated entry beside the
  supported one (`delete`), or every fact already stored (`null`). C_0 holds the
  instruction and the current observation; H_0 begins with that observation. The
  episode ends with a delayed query answered from what LTM holds
  (`DelayedQuery.context_source == 'ltm'`). The texts of stale / obsolete M_0 entries
  are a private label of the spec (`stale_texts`): the oracle reader does not answer
  while one is still active, so leaving it (even beside an added correct fact) fails
  the query; an exact duplicate is redundant, not conflicting, and is not labelled.
- B (STM ⊂ {Retrieve, Filter, SelectEpisode, Summarize, ∅}): prepared M_0, a
  distractor-rich C_0 that fills part of the context budget, same-task H_0. Families:
  evidence stored only in M (`retrieve`), distractors beside the evidence in C
  (`filter`), evidence only in earlier history with related distractors more recent
  (`select_episode`, the recovery case, `is_recovery=True`), long evidence documents
  (`summarize`), evidence already compact in C (`null`).
- C (all ops): every episode pairs one LTM need with one STM need (`add_retrieve`,
  `update_filter`, `delete_select`, `add_summarize`); documents arrive sequentially.

The needs a family creates are checked by `needs.needs_of`, recomputed from the state
and schedule, never read from metadata (its docstring defines each op's need).

Labels: the reference answer and supporting facts choose which sentences appear where
(training-instance construction, paper D.1) but are never written into any state text;
`MemoryState.forbidden` carries the answer for the executor's leakage check and is
never rendered. The construction pool feeds train episodes and the internal-dev pool
dev episodes (`build.build_episodes(..., split=...)` takes the pool the caller chose).

Everything is deterministic under `ScenarioConfig.seed`: episode i of (phase, split)
uses `random.Random(f"{seed}:{phase}:{split}:{i}")` (string seeds hash with SHA-512,
independent of PYTHONHASHSEED).

Modules (`envs.episodes` builds the pools and phase episodes over this package):
  spec             PHASES, FAMILIES, ScenarioConfig, paper_counts, DelayedQuery,
                   ScenarioSpec.
  views            Doc, Fact, ExampleView, build_view (documents and facts of an
                   example, capped for the context budget).
  perturbations    perturb_number, truncate_partial, stale_version (stale entries).
  initial_state    the fixed texts a state may show, StateBuilder (trusted s_0
                   construction), validate_initial_state.
  needs            needs_of (the memory needs recomputed from s_0 and the schedule).
  generator_parts  what the phase generators share (Skip, document caps, observation
                   constructors, interleaving, distractor filling).
  phase_a, phase_b, phase_c   one generator per phase.
  build            build_episode, build_episodes (family draw, schedule trimming,
                   reference-command check).
"""
