"""The SFT state templates: one registry of standard and boundary templates per target.

SPEC §4 and paper Appendix D.2. Boundary templates build states around the
confusable pairs, where a superficially plausible operation is wrong and the target
is another *legal* one (never an invalid command, D.3):

    Add vs Update       add_same_topic (new fact beside a stored fact of the same page
                        -> Add), update_partial (a truncated entry of the observed
                        sentence -> Update, not a second Add)
    Retrieve vs         retrieve_not_history (earlier observations left C but are
    SelectEpisode       distractors; the evidence is in M -> Retrieve),
                        select_not_ltm (M holds related distractors; the evidence
                        is only in H -> SelectEpisode)
    Filter vs Summarize filter_verbose_distractors (long but irrelevant -> Filter),
                        summarize_all_relevant (every item is evidence, only verbose
                        -> Summarize)
    op vs ∅             null_duplicate (the observed fact is already in M -> ∅, not
                        Add), null_already_retrieved (M's evidence already sits in C ->
                        ∅, not Retrieve), delete_duplicate (two identical entries ->
                        Delete)

Phase subspaces: LTM templates show the Phase A or C subspace, STM templates B or C,
∅ templates the phases where ∅ is the unique right choice (null_duplicate: A only).
In Phase C, LTM templates store no unrelated facts in M (they would make Retrieve an
equally valid target); Retrieve templates are kept only when BM25 over M actually
returns a stored fact for the question.

Standard templates cover the plain case of each op (add_new_fact, update_correction,
delete_obsolete, retrieve_from_ltm, select_from_history, filter_distractors,
summarize_long_evidence, null_settled). A `boundary_fraction` share of every class
(default half; SPEC requires at least `min_negative_fraction` = 25%) comes from
boundary templates; the count is exact per class and split (`build`).

The template functions live in `ltm_templates`, `stm_templates` and `null_templates`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from vermem_jax.envs.sft_data import ltm_templates as ltm
from vermem_jax.envs.sft_data import null_templates as null
from vermem_jax.envs.sft_data import stm_templates as stm
from vermem_jax.memory import commands as cmds


@dataclasses.dataclass(frozen=True)
class Template:
  """A boundary or standard state template for one target op.

  Attributes:
    name: template name (records, the count table).
    op: target op (one of memory.commands.ALL_OPS).
    is_boundary: builds boundary/negative states (a confusable op is wrong there).
    phases: op subspaces ('A' | 'B' | 'C') the state may be shown under.
    build: (view: scenarios.views.ExampleView, rng: random.Random, count_tokens,
      context_budget: int tokens, phase) -> (MemoryState, Command) or None when the
      example does not support the template.
  """
  name: str
  op: str
  is_boundary: bool
  phases: tuple
  build: Callable


_LTM = ('A', 'C')
_STM = ('B', 'C')
TEMPLATES = (
    Template('add_new_fact', cmds.ADD, False, _LTM, ltm.t_add_new_fact),
    Template('add_same_topic', cmds.ADD, True, _LTM, ltm.t_add_same_topic),
    Template('update_correction', cmds.UPDATE, False, _LTM, ltm.t_update_correction),
    Template('update_partial', cmds.UPDATE, True, _LTM, ltm.t_update_partial),
    Template('delete_obsolete', cmds.DELETE, False, _LTM, ltm.t_delete_obsolete),
    Template('delete_duplicate', cmds.DELETE, True, _LTM, ltm.t_delete_duplicate),
    Template('retrieve_from_ltm', cmds.RETRIEVE, False, _STM, stm.t_retrieve_from_ltm),
    Template('retrieve_not_history', cmds.RETRIEVE, True, _STM,
             stm.t_retrieve_not_history),
    Template('select_from_history', cmds.SELECT_EPISODE, False, _STM,
             stm.t_select_from_history),
    Template('select_not_ltm', cmds.SELECT_EPISODE, True, _STM, stm.t_select_not_ltm),
    Template('filter_distractors', cmds.FILTER, False, _STM, stm.t_filter_distractors),
    Template('filter_verbose_distractors', cmds.FILTER, True, _STM,
             stm.t_filter_verbose_distractors),
    Template('summarize_long_evidence', cmds.SUMMARIZE, False, _STM,
             stm.t_summarize_long_evidence),
    Template('summarize_all_relevant', cmds.SUMMARIZE, True, _STM,
             stm.t_summarize_all_relevant),
    Template('null_settled', cmds.NULL, False, ('A', 'B', 'C'), null.t_null_settled),
    # Phase A only: in B/C, facts stored but absent from C would call for Retrieve.
    Template('null_duplicate', cmds.NULL, True, ('A',), null.t_null_duplicate),
    Template('null_already_retrieved', cmds.NULL, True, _STM,
             null.t_null_already_retrieved),
)
TEMPLATES_BY_NAME = {t.name: t for t in TEMPLATES}


def templates_for(op, is_boundary):
  """The templates of target `op` that are (or are not) boundary templates."""
  return tuple(t for t in TEMPLATES if t.op == op and t.is_boundary == is_boundary)
