"""The checked memory transition s~_t = T_m(s_t, u_t) (paper Eq. 2, Appendix A.2–A.4).

Every command is untrusted text sampled from a language model. `execute` runs all
checks before any change (tool name, phase subspace, tool budget, arguments, ids,
ownership, preconditions, source support, leakage, context budget) and then either
commits exactly the specified transition or rejects:

- rejected: M and C unchanged; the failed command (truncated to
  `history_command_max_chars`) and its reasons are appended to H as a
  `rejected_command` event; one `Violation` per violated kind with its cost from
  `ExecutorConfig` (SPEC §3); `cost` = min(cost_cap, sum).
- accepted non-null: the transition below; a `memory_decision` event (command and
  outcome) is appended to H.
- accepted ∅: the identity, `state_after is state` (no H event; the decision lives in the
  rollout record). A `Null(...)` with arguments is rejected ('bad_argument').

Ids in the ref arguments (REF_ARGS) may be local (`c2`): they name this task's record
and are qualified before the checks (`qualify_command`; the Transition carries the
qualified command, H the text as written).

Transitions and the violation of each failed check:

- Add(content, source_refs): new active entry `m{n}`, version 0, content stripped.
  Empty content (no visible character, checks.is_blank) or a chat-control tag in it
  (checks.control_markup: the solver reads M and C as prompt text) -> bad_argument.
  No sources -> unsupported_write. Each source must be
  an id of this task (other namespace -> foreign_ref; unknown / wrong kind ->
  missing_id) naming an active entry, a C item, or an H event not written by the policy
  (memory decisions and rejected commands are not sources) -> else unsupported_write.
  A C item is followed to the records its text comes from (origin of a retrieved
  item; the roots of a summary, state.ContextItem.derived_from): one that traces back
  only to deleted entries -> unsupported_write.
  Duplicate (checks.same_text) of an active entry -> unsupported_write. A number, date
  or time absent from the sources (checks.unsupported_facts, when
  check_numbers_on_write) -> unsupported_write. Leakage -> leakage.
- Update(memory_id, new_content, source_refs): appends version k+1 to an *active*
  entry (deleted / unknown -> missing_id); earlier versions stay. Same checks as Add,
  plus: needs a source other than the entry itself -- a retrieved copy of the entry,
  or a summary of only such copies, is the entry itself -- and a changed text
  (-> unsupported_write); a duplicate of another active entry -> unsupported_write.
- Delete(memory_id, reason): soft delete of an active entry (status 'deleted', reason
  and step recorded; versions kept). Empty reason -> unjustified_delete.
- Retrieve(query): BM25 over active entries (bm25_index), skipping entries whose
  current text is already in C as a retrieved item, top `retrieve_top_k` with a
  positive score; each becomes a 'retrieved' C item (text = entry content, origin =
  entry id). Empty query -> bad_argument. C over budget -> context_overflow (nothing
  inserted). No match is an accepted no-op with outcome 'no results'.
- Filter(drop_refs): removes the C items. Unknown / not in C -> missing_id. The
  instruction, the current environment item (`state.env_item_id`) and protected items
  cannot go -> protected_removal. Empty list -> bad_argument.
- SelectEpisode(selected_refs): copies the text of the referenced H events of this task
  into C as 'restored' items in history order (origin = event id). Only observation,
  task_action, tool_output and conclusion events; policy-written events or events
  already in C -> bad_argument. Over budget -> context_overflow.
- Summarize(source_refs, summary): replaces the C items by one 'summary' item at the
  first one's position; originals stay in H. Protected items -> protected_removal; an
  empty summary or one with a chat-control tag -> bad_argument; not
  shorter in tokens than the items it replaces -> bad_argument; an unsupported number,
  date or time -> unsupported_write; over budget -> context_overflow. The summary item
  records `roots`: the records the replaced items derive from.

Provenance: sources, evidence, origin and `protected` of new records come from the
executor's records of the cited ids, never from the command; ids of another task never
resolve; state text is never parsed as a command; strings with unpaired surrogates
never parse and texts stored in H are scrubbed of them, so every state text encodes
as UTF-8 and tokenizes. Leakage (checks.leaked): a written
text (content, new_content, summary, reason) containing a `state.forbidden` string that
its grounding (cited source texts, the entry's own text for Update/Delete, and q) does
not contain.
"""

import dataclasses
from typing import Optional

from vermem_jax.memory import checks
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import op_handlers
from vermem_jax.memory import state as st


@dataclasses.dataclass(frozen=True)
class Violation:
  """One hard violation of the constraint channel (SPEC §3).

  Attributes:
    kind: one of config.VIOLATION_KINDS.
    cost: cost of this violation (from ExecutorConfig).
    message: what was wrong (names the ids / arguments).
  """
  kind: str
  cost: float
  message: str


@dataclasses.dataclass(frozen=True)
class Transition:
  """Result of T_m.

  Attributes:
    state_after: s~_t.
    accepted: whether the command was committed (∅ included).
    violations: tuple of Violation (empty when accepted).
    cost: constraint cost c_{t,k} = min(cost_cap, sum of violation costs).
    is_tool_call: a known non-null tool was called (accepted or not; counts toward TC).
    op: op name, or 'Invalid' (commands.INVALID_OP) for text naming no known tool.
    command: the parsed Command, or None when the text did not parse.
    message: outcome of an accepted command or the joined rejection reasons.
  """
  state_after: st.MemoryState
  accepted: bool
  violations: tuple
  cost: float
  is_tool_call: bool
  op: str
  command: Optional[cmds.Command] = None
  message: str = ''


class _Checks:
  """Collects violations, one per kind, messages joined."""

  def __init__(self):
    self.by_kind = {}

  def add(self, kind, message):
    self.by_kind.setdefault(kind, []).append(message)

  def __bool__(self):
    return bool(self.by_kind)


def _reject(state, config, count_tokens, text, found, op, command, is_tool_call):
  violations = tuple(
      Violation(kind, config.cost(kind), '; '.join(msgs))
      for kind, msgs in found.by_kind.items())
  cost = min(config.cost_cap, sum(v.cost for v in violations))
  reason = '; '.join(f'{v.kind}: {v.message}' for v in violations)
  state, _ = st.add_history(
      state, st.EV_REJECTED,
      f'{_clip(text, config)} -> rejected: {_clip(reason, config)}', count_tokens)
  if is_tool_call:
    state = state.evolve(tool_calls=state.tool_calls + 1)
  return Transition(state, False, violations, cost, is_tool_call, op, command, reason)


def _clip(text, config):
  limit = config.history_command_max_chars
  if len(text) > limit:
    text = text[:limit] + f'... [{len(text) - limit} more characters]'
  # A caller's raw text may hold unpaired surrogates, which tokenizers reject.
  return checks.scrub_surrogates(text)


def _memory_decision(state, count_tokens, command_text, outcome):
  text = checks.scrub_surrogates(f'{command_text} -> {outcome}')
  event = st.HistoryEvent(id=st.make_id(state.ns, 'h', len(state.H) + 1),
                          step=state.step, kind=st.EV_MEMORY_DECISION, text=text,
                          tokens=count_tokens(text))
  return state.evolve(H=state.H + (event,), tool_calls=state.tool_calls + 1)


# Arguments whose values are record ids (a str or a tuple of str).
REF_ARGS = ('memory_id', 'source_refs', 'drop_refs', 'selected_refs')


def qualify_command(cmd, ns):
  """`cmd` with every local record id (`c2`) of its ref arguments qualified as `ns:c2`.

  Args:
    cmd: a schema-valid `Command` (ref values are str or tuples of str).
    ns: the task namespace of the state it runs on (`MemoryState.ns`).
  Returns:
    A `Command` (the same object when no ref changes). See `state.qualify_id`.
  """
  args, changed = [], False
  for name, value in cmd.args:
    if name in REF_ARGS:
      new = (st.qualify_id(value, ns) if isinstance(value, str)
             else tuple(st.qualify_id(v, ns) for v in value))
      changed = changed or new != value
      value = new
    args.append((name, value))
  return cmds.Command._trusted(cmd.op, tuple(args)) if changed else cmd  # pylint: disable=protected-access


def execute(state, command, config, count_tokens):
  """Applies memory command u_t to s_t under the checks of SPEC §2–3 (T_m, Eq. 2).

  Args:
    state: s_t (MemoryState).
    command: the generated text (parsed with `parse_command`) or a `Command`.
    config: ExecutorConfig (phase subspace, budgets, costs).
    count_tokens: `str -> int` token counter of the backbone tokenizer (tokens).

  Returns:
    Transition(state_after=s~_t, accepted, violations, cost, is_tool_call, op,
    command, message). Never raises on any command text.
  """
  found = _Checks()
  if isinstance(command, cmds.Command):
    cmd = command
    try:
      text = cmds.format_command(cmd)
    except (TypeError, AttributeError, ValueError):  # hand-built with odd values
      text = repr(cmd)
  else:
    text = command if isinstance(command, str) else repr(command)
    cmd = cmds.parse_command(command, config.max_command_chars)
    if isinstance(cmd, cmds.ParseError):
      found.add(cmd.kind, cmd.message)
      return _reject(state, config, count_tokens, text, found,
                     cmd.op or cmds.INVALID_OP, None, False)
  op = cmd.op
  if op not in cmds.SCHEMAS:
    found.add('unknown_tool', f'unknown tool {cmds.shorten(op)}')
    return _reject(state, config, count_tokens, text, found, cmds.INVALID_OP, cmd,
                   False)
  is_tool = op != cmds.NULL
  if op not in config.ops:
    found.add('op_not_allowed', f'{op} is not allowed in this phase (allowed: '
              f'{", ".join(config.ops)})')
    return _reject(state, config, count_tokens, text, found, op, cmd, is_tool)
  problems = cmds.schema_problems(cmd)
  if problems:
    for p in problems:
      found.add('bad_argument', p)
    return _reject(state, config, count_tokens, text, found, op, cmd, is_tool)
  if not is_tool:
    return Transition(state, True, (), 0.0, False, op, cmd, 'no change')
  cmd = qualify_command(cmd, state.ns)
  if config.max_tool_calls and state.tool_calls >= config.max_tool_calls:
    found.add('budget_exceeded', f'tool budget of {config.max_tool_calls} calls is '
              'spent')
    return _reject(state, config, count_tokens, text, found, op, cmd, is_tool)
  commit = op_handlers.HANDLERS[op](state, cmd, config, count_tokens, found)
  if commit is None:
    return _reject(state, config, count_tokens, text, found, op, cmd, is_tool)
  new_state, outcome = commit()
  new_state = _memory_decision(new_state, count_tokens, text, outcome)
  return Transition(new_state, True, (), 0.0, True, op, cmd, outcome)
