"""Verifier prompts (our own wording of Appendix F.1-F.3 and Table 22's intent).

Two separate prompts: the local one judges one executed memory decision on four
dimensions with an operation-specific condition for the top score (one per tool and
one for ∅); the global one judges a finished trajectory on evidence coherence and
terminal-memory consistency only. Each returns chat messages
`[{'role': 'system'|'user'|'assistant', 'content': str}, ...]` for a chat template or
an OpenAI-compatible endpoint. Replies are parsed by `parsing.parse_local/global`.
"""

from __future__ import annotations

from typing import Sequence

from vermem_jax.verifiers import base

_SCALE = """\
Scale used for every dimension (integers only):
0 = wrong, harmful, contradicted by the evidence, or without any justification
1 = barely supported; major mistakes
2 = partly justified; clear gaps or omissions
3 = sound; only small flaws
4 = fully justified given what was visible"""

LOCAL_SYSTEM = f"""\
You grade one memory-management decision taken by an agent that answers a question.
The agent keeps a long-term memory (persistent entries with sources), an active
context (the budgeted text the answering model reads) and an episodic history. At
each step it issues one command: Add, Update or Delete on long-term memory; Retrieve,
Filter, SelectEpisode or Summarize on the active context; or the null command (do
nothing). The command you see already passed every format, reference, precondition
and budget check, so do not grade syntax or validity.

Judge only from the material given: the question, the agent's view before the
decision, the command, the change it caused, and the evidence visible at that moment.
Nothing that happened later is available to you and nothing outside the given material
counts as support.

Dimensions:
- relevance: does the command serve a real memory need of the current state?
- grounding: is what the command writes, selects or removes backed by the visible
  evidence?
- local_progress: does the change leave the task or memory in a better state?
- information_fidelity: are the facts, numbers, dates, names, relations and source
  attributions that the change carries kept intact?

{_SCALE}

Reply with exactly these four lines and nothing else:
relevance: <0-4>
grounding: <0-4>
local_progress: <0-4>
information_fidelity: <0-4>"""

# What a top-scoring decision of each operation looks like (our reading of Table 22).
OPERATION_RUBRICS = {
    "Add": (
        "Add earns 4 when it stores a fact the question will need later, states it "
        "as the cited source sentences do (no invented or altered numbers, dates or "
        "names), cites the sentences it came from, and does not repeat something "
        "already stored."),
    "Update": (
        "Update earns 4 when the visible evidence shows the stored entry is outdated, "
        "incomplete or wrong, the new version fixes exactly that with the source's "
        "wording of the facts, keeps the still-valid parts, and cites the correcting "
        "source."),
    "Delete": (
        "Delete earns 4 when the entry is demonstrably obsolete, contradicted by newer "
        "evidence, duplicated, or irrelevant to the question, the stated reason says "
        "so, and no fact the question needs disappears with it."),
    "Retrieve": (
        "Retrieve earns 4 when the active context lacks information that memory "
        "holds, the query targets it precisely, and the returned entries bring "
        "question-relevant facts into the context without crowding it with noise."),
    "Filter": (
        "Filter earns 4 when every dropped item is noise or no longer useful for the "
        "question, no evidence the answer depends on is dropped, and the context "
        "becomes smaller and more focused."),
    "SelectEpisode": (
        "SelectEpisode earns 4 when evidence the question needs has left the active "
        "context but remains in this task's history, and the restored fragments are "
        "exactly that evidence rather than related distractors."),
    "Summarize": (
        "Summarize earns 4 when the summary is clearly shorter than the items it "
        "replaces yet keeps every fact the question may need, with every number, "
        "date, name and relation exactly as in the sources and nothing added."),
    "Null": (
        "The null command earns 4 when no enabled operation would have improved the "
        "state: nothing useful is waiting to be stored, corrected, removed, retrieved "
        "or restored. It scores low when such work was visibly pending. Grounding "
        "asks whether the visible state supports that judgement; fidelity is high "
        "because nothing changed."),
}

GLOBAL_SYSTEM = f"""\
You grade a finished episode of an agent that manages its own memory while answering a
question. Answer correctness, supporting-fact recall, cost, command syntax and
validity are measured elsewhere; do not grade them.

Dimensions:
- evidence_coherence: does the final answer follow from a complete, relevant and
  non-contradictory chain of the evidence the agent observed and kept? No answer, or
  an answer the evidence does not support, scores low.
- terminal_memory_consistency: at the end, do the long-term memory and the active
  context agree with the observed evidence, keep the facts the question needs
  reachable, and leave no stale, duplicated or conflicting entry active? Deleted or
  superseded entries whose status is explicit are fine.

{_SCALE}

Reply with exactly these two lines and nothing else:
evidence_coherence: <0-4>
terminal_memory_consistency: <0-4>"""

# Shown before the training labels (Appendix F.1/F.3: the global verifier reads the
# reference answer and the annotated supporting facts).
LABELS_NOTE = (
    "Training labels follow: the reference answer and the annotated supporting facts. "
    "Use them only to judge whether the evidence the agent kept forms the chain the "
    "question needs and whether the final memory keeps those facts reachable; answer "
    "correctness and supporting-fact recall are scored elsewhere.")

RETRY_INSTRUCTION = (
    "Your reply could not be read ({error}). Reply again with only the required "
    "lines, each '<dimension>: <integer 0-4>', in this order: {keys}.")


def _clip(text: str, limit: int) -> str:
  """Keeps the head and tail of `text` within `limit` characters."""
  if len(text) <= limit:
    return text
  marker = f"\n[... {len(text) - limit} characters omitted ...]\n"
  keep = max(0, limit - len(marker))
  return text[: keep // 2] + marker + text[len(text) - (keep - keep // 2):]


def _items(items: Sequence[base.ItemView]) -> str:
  if not items:
    return "(none)"
  lines = []
  for it in items:
    src = f" [sources: {', '.join(it.source_refs)}]" if it.source_refs else ""
    kind = f" ({it.kind})" if it.kind else ""
    lines.append(f"- {it.ref}{kind}: {it.text}{src}")
  return "\n".join(lines)


def describe_transition(delta: base.TransitionDelta) -> str:
  """Human-readable list of what the command changed in M and C."""
  if delta.is_identity:
    return "No change: long-term memory and active context are identical."
  parts = []
  if delta.ltm_added:
    parts.append("Long-term memory, added:\n" + _items(delta.ltm_added))
  for up in delta.ltm_updated:
    parts.append("Long-term memory, updated:\n"
                 f"  before: {_items((up.before,))[2:]}\n"
                 f"  after:  {_items((up.after,))[2:]}")
  if delta.ltm_deleted:
    parts.append("Long-term memory, soft-deleted:\n" + _items(delta.ltm_deleted))
  if delta.context_added:
    parts.append("Active context, inserted:\n" + _items(delta.context_added))
  if delta.context_removed:
    parts.append("Active context, removed:\n" + _items(delta.context_removed))
  if delta.context_tokens_before is not None and delta.context_tokens_after is not None:
    parts.append(f"Active context size: {delta.context_tokens_before} -> "
                 f"{delta.context_tokens_after} tokens")
  return "\n".join(parts)


def local_messages(inp: base.LocalVerifierInput, max_section_chars: int) -> list[dict]:
  """Chat messages asking the local verifier to score `inp` (Appendix F.2)."""
  op_name = "null command (∅)" if inp.op == base.NULL_OP else inp.op
  user = "\n\n".join([
      f"Question:\n{inp.question}",
      "Agent's view before the decision (x_t):\n"
      + _clip(inp.policy_input, max_section_chars),
      f"Command ({op_name}):\n{inp.command}",
      "Realized change:\n" + _clip(describe_transition(inp.transition),
                                   max_section_chars),
      "Evidence visible at this decision:\n"
      + _clip(_items(inp.visible_evidence), max_section_chars),
      f"Enabled operations in this phase: {', '.join(inp.allowed_ops)}",
      f"Condition for a 4 on this operation:\n{OPERATION_RUBRICS[inp.op]}",
      "Now give the four score lines.",
  ])
  return [{"role": "system", "content": LOCAL_SYSTEM},
          {"role": "user", "content": user}]


def global_messages(inp: base.GlobalVerifierInput, max_section_chars: int) -> list[dict]:
  """Chat messages asking the global verifier to score `inp` (Appendix F.3)."""
  answer = inp.final_answer if inp.final_answer else "(no final answer)"
  commands = "\n".join(f"{i + 1}. {c}" for i, c in enumerate(inp.memory_commands))
  reference, facts = base.global_labels(inp)
  labels = []
  if reference is not None or facts:
    labels.append(LABELS_NOTE)
  if reference is not None:
    labels.append(f"Reference answer:\n{reference}")
  if facts:
    labels.append("Annotated supporting facts:\n"
                  + _clip(_items(facts), max_section_chars))
  # Observed evidence already shown in the history section is not repeated.
  in_history = {ev.ref for ev in inp.terminal_history}
  observed = [it for it in inp.observed_evidence if it.ref not in in_history]
  history = []
  if inp.terminal_history or inp.history_omitted:
    left_out = (f"; the {inp.history_omitted} oldest events are left out"
                if inp.history_omitted else "")
    # Already bounded in tokens (oldest dropped first): no character clip here.
    history.append(f"Episodic history at the end, oldest first{left_out}:\n"
                   + _items(inp.terminal_history))
  user = "\n\n".join([
      f"Question:\n{inp.question}",
      *labels,
      f"Final answer given by the agent:\n{answer}",
      "Evidence observed during the episode"
      + (" (beyond the history below)" if history else "") + ":\n"
      + _clip(_items(observed), max_section_chars),
      "Memory decisions in order, with outcomes:\n"
      + _clip(commands or "(none)", max_section_chars),
      *history,
      "Final long-term memory (active entries):\n"
      + _clip(_items(inp.terminal_ltm), max_section_chars),
      "Final long-term memory (deleted entries):\n"
      + _clip(_items(inp.deleted_ltm), max_section_chars),
      "Final active context:\n" + _clip(_items(inp.terminal_context),
                                         max_section_chars),
      "Now give the two score lines.",
  ])
  return [{"role": "system", "content": GLOBAL_SYSTEM},
          {"role": "user", "content": user}]


def retry_messages(messages: list[dict], bad_reply: str, error: str,
                   dimensions: Sequence[str]) -> list[dict]:
  """`messages` plus the malformed reply and a request to answer in the format."""
  return list(messages) + [
      {"role": "assistant", "content": bad_reply[:2000]},
      {"role": "user", "content": RETRY_INSTRUCTION.format(
          error=error, keys=", ".join(dimensions))},
  ]
