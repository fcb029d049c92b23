"""The op handlers of T_m (`executor.execute`; paper Appendix A.2-A.4): for each non-null
tool, the argument, id, precondition, source-support, leakage and budget checks and the
transition they guard. executor.py's module docstring states every transition and the
violation of each failed check.

A handler takes (state, cmd, config, count_tokens, found) with a schema-valid, qualified
`cmd` and the executor's violation collector `found`, records each failed check with
`found.add(kind, message)` and returns a commit thunk () -> (s~_t, outcome) or None.
"""

from vermem_jax.memory import bm25_index
from vermem_jax.memory import checks
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import state as st

# Unsupported fact tokens named in one violation message (decision: messages stay short).
_MAX_LISTED = 10


def _dedupe(refs):
  return tuple(dict.fromkeys(refs))


def _resolve(state, ref, letters, found):
  """Record named by `ref` if it has one of `letters` ('m', 'c', 'h'); else None."""
  p = st.parse_id(ref)
  if p is None:
    found.add('missing_id', f'{cmds.shorten(ref)} is not a record id')
    return None
  if p[0] != state.ns:
    found.add('foreign_ref', f'{ref} belongs to another task')
    return None
  if p[1] not in letters:
    found.add('missing_id', f'{ref} is not a valid reference here')
    return None
  rec = {'m': state.entry, 'c': state.item, 'h': state.event}[p[1]](ref)
  if rec is None:
    where = {'m': 'long-term memory', 'c': 'the active context',
             'h': 'the history'}[p[1]]
    found.add('missing_id', f'{ref} is not in {where}')
  return rec


def _source_text(rec):
  return rec.content if isinstance(rec, st.LTMEntry) else rec.text


def _source_evidence(rec):
  return rec.current.evidence if isinstance(rec, st.LTMEntry) else rec.evidence


def _deleted_entry(state, ref):
  p = st.parse_id(ref)
  if p is None or p[1] != 'm':
    return False
  entry = state.entry(ref)
  return entry is not None and not entry.active


def _sources(state, refs, found, exclude=None):
  """Validates write sources; returns the list of records (may be partial).

  A C item is followed to the records its text comes from (`ContextItem.derived_from`:
  the entry a retrieved item copies, the records a summary condenses): it supports the
  write only through those that are neither deleted entries nor `exclude` (the entry
  an Update rewrites). A source left with no such record is skipped when it traces
  only to `exclude` (like citing the entry itself) and rejected when deleted entries
  are all it traces to.
  """
  recs = []
  for ref in refs:
    rec = _resolve(state, ref, 'mch', found)
    if rec is None:
      continue
    if isinstance(rec, st.LTMEntry) and not rec.active:
      found.add('unsupported_write', f'source {ref} is a deleted entry')
    elif isinstance(rec, st.HistoryEvent) and rec.kind in st.POLICY_AUTHORED_EVENTS:
      found.add('unsupported_write',
                f'source {ref} is a memory decision, not evidence')
    elif exclude is not None and ref == exclude:
      continue
    elif isinstance(rec, st.ContextItem):
      roots = rec.derived_from()
      deleted = [r for r in roots if r != exclude and _deleted_entry(state, r)]
      if any(r != exclude and r not in deleted for r in roots):
        recs.append(rec)
      elif deleted:
        also = f' and {exclude} itself' if exclude in roots else ''
        found.add('unsupported_write', f'source {ref} traces back only to deleted '
                  f'entr{"ies" if len(deleted) > 1 else "y"} {", ".join(deleted)}{also}')
      # else: a copy of `exclude` only -- no source other than the entry itself
    else:
      recs.append(rec)
  return recs


def _check_markup(found, name, text, grounding=()):
  tag = checks.control_markup(text, grounding)
  if tag is not None:
    found.add('bad_argument', f'{name} holds the chat-control tag {tag!r}, which its '
              'sources do not contain')


def _check_written(state, config, found, text, grounding, check_numbers):
  if check_numbers:
    bad = checks.unsupported_facts(text, grounding)
    if bad:
      more = f' and {len(bad) - _MAX_LISTED} more' if len(bad) > _MAX_LISTED else ''
      found.add('unsupported_write', 'not supported by the sources: '
                f'{", ".join(bad[:_MAX_LISTED])}{more}')
  leaks = checks.leaked([text], list(grounding) + [state.q], state.forbidden)
  if leaks:
    found.add('leakage', f'writes {len(leaks)} forbidden string(s) not present in '
              'its sources')


def _replace_entry(state, entry):
  n = st.parse_id(entry.id)[2]
  m = state.M[:n - 1] + (entry,) + state.M[n:]
  return state.evolve(M=m)


# --- handlers: return (found violations, commit thunk or None) ---------------------


def _write_args(state, cmd, found, field, *, entry=None, no_source='no valid source'):
  """Checks the text an Add/Update writes (`field`) and its source_refs.

  `entry` is the entry an Update rewrites: it is no source of itself, and its current
  content counts as grounding (the new text may restate it).
  Returns (text, refs, source records, grounding texts); violations go to `found`.
  """
  text = cmd.get(field).strip()
  refs = _dedupe(cmd.get('source_refs'))
  if checks.is_blank(text):
    found.add('bad_argument', f'{field} is empty')
  if not refs:
    found.add('unsupported_write', 'no source_refs given')
  recs = _sources(state, refs, found,
                  exclude=entry.id if entry is not None else None)
  grounding = ([_source_text(r) for r in recs]
               + ([entry.content] if entry is not None else []))
  _check_markup(found, field, text, grounding)
  if refs and not recs and not found:
    found.add('unsupported_write', no_source)
  return text, refs, recs, grounding


def _new_version(state, k, content, refs, recs, count_tokens):
  return st.LTMVersion(
      version=k, content=content, source_refs=refs,
      evidence=st.union_refs(*(_source_evidence(r) for r in recs)),
      step=state.step, tokens=count_tokens(content))


def _check_new_text(state, config, found, content, grounding, dup_hint=''):
  """An Add/Update text must not repeat an active entry, then must be grounded."""
  dup = _duplicate_of(state, content)
  if dup is not None:
    found.add('unsupported_write', f'duplicates active entry {dup}{dup_hint}')
    return
  _check_written(state, config, found, content, grounding,
                 config.check_numbers_on_write)


def _op_add(state, cmd, config, count_tokens, found):
  content, refs, recs, grounding = _write_args(state, cmd, found, 'content')
  if found:
    return None
  _check_new_text(state, config, found, content, grounding,
                  dup_hint=' (use Update or ∅)')
  if found:
    return None

  def commit():
    entry_id = st.make_id(state.ns, 'm', len(state.M) + 1)
    version = _new_version(state, 0, content, refs, recs, count_tokens)
    s = state.evolve(M=state.M + (st.LTMEntry(entry_id, (version,)),))
    return s, f'created {entry_id}'
  return commit


def _duplicate_of(state, content):
  """Id of an active entry whose text equals `content` (checks.same_text), or None."""
  norm = checks.normalize_entry(content)
  for e in state.M:
    if (e.status == st.ACTIVE and
        checks.normalize_entry(e.versions[-1].content) == norm):
      return e.id
  return None


def _active_entry(state, ref, found):
  entry = _resolve(state, ref, 'm', found)
  if entry is not None and not entry.active:
    found.add('missing_id', f'{ref} is deleted (no active entry)')
    return None
  return entry


def _op_update(state, cmd, config, count_tokens, found):
  entry = _active_entry(state, cmd.get('memory_id'), found)
  content, refs, recs, grounding = _write_args(
      state, cmd, found, 'new_content', entry=entry,
      no_source='no valid source other than the entry itself')
  if found:
    return None
  if checks.same_text(entry.content, content):
    found.add('unsupported_write', 'new_content does not change the entry (use ∅)')
    return None
  _check_new_text(state, config, found, content, grounding)
  if found:
    return None

  def commit():
    k = len(entry.versions)
    version = _new_version(state, k, content, refs, recs, count_tokens)
    new = st.LTMEntry(entry.id, entry.versions + (version,), entry.status,
                      entry.deletion_reason, entry.deleted_step)
    return _replace_entry(state, new), f'{entry.id} now at version {k}'
  return commit


def _op_delete(state, cmd, config, count_tokens, found):
  del count_tokens
  entry = _active_entry(state, cmd.get('memory_id'), found)
  reason = cmd.get('reason').strip()
  if checks.is_blank(reason):
    found.add('unjustified_delete', 'reason is empty')
  if found:
    return None
  _check_written(state, config, found, reason, [entry.content], False)
  if found:
    return None

  def commit():
    new = st.LTMEntry(entry.id, entry.versions, st.DELETED, reason, state.step)
    return _replace_entry(state, new), f'{entry.id} deleted'
  return commit


def _check_budget(state, config, found, added, removed=0):
  total = state.context_tokens() - removed + added
  if total > config.context_budget:
    found.add('context_overflow', f'context would hold {total} tokens; the budget is '
              f'{config.context_budget}')


def _new_items(state, specs, count_tokens):
  """Builds C items from (kind, text, refs, evidence, origin, tokens) specs."""
  items = []
  n = state.next_c
  for kind, text, refs, evidence, origin, tokens in specs:
    items.append(st.ContextItem(
        id=st.make_id(state.ns, 'c', n), kind=kind, text=text, source_refs=refs,
        evidence=evidence, protected=False, origin=origin,
        tokens=count_tokens(text) if tokens is None else tokens))
    n += 1
  return items, n


def _op_retrieve(state, cmd, config, count_tokens, found):
  query = cmd.get('query').strip()
  if checks.is_blank(query):
    found.add('bad_argument', 'query is empty')
    return None
  present = {(it.origin, it.text) for it in state.C if it.kind == st.RETRIEVED}
  candidates = tuple(e for e in state.M if e.status == st.ACTIVE and
                     (e.id, e.versions[-1].content) not in present)
  ranked = bm25_index.rank(candidates, query, config.retrieve_top_k,
                           config.bm25_k1, config.bm25_b)
  entries = [e for e, _ in ranked]
  _check_budget(state, config, found, sum(e.current.tokens for e in entries))
  if found:
    return None

  def commit():
    if not entries:
      return state, 'no results'
    items, n = _new_items(state, [
        (st.RETRIEVED, e.content, (e.id,), e.current.evidence, e.id,
         e.current.tokens) for e in entries], count_tokens)
    s = state.evolve(C=state.C + tuple(items), next_c=n)
    return s, 'added ' + ', '.join(f'{it.id} (from {it.origin})' for it in items)
  return commit


def _undroppable(state, item):
  return item.protected or item.kind == st.INSTRUCTION or item.id == state.env_item_id


def _context_refs(state, refs, name, found):
  if not refs:
    found.add('bad_argument', f'{name} is empty')
  items = []
  for ref in refs:
    it = _resolve(state, ref, 'c', found)
    if it is None:
      continue
    if _undroppable(state, it):
      found.add('protected_removal', f'{ref} is protected ({it.kind})')
    items.append(it)
  return items


def _op_filter(state, cmd, config, count_tokens, found):
  del config, count_tokens
  refs = _dedupe(cmd.get('drop_refs'))
  _context_refs(state, refs, 'drop_refs', found)
  if found:
    return None

  def commit():
    drop = set(refs)
    c = tuple(it for it in state.C if it.id not in drop)
    return state.evolve(C=c), 'dropped ' + ', '.join(refs)
  return commit


_RESTORABLE = (st.EV_OBSERVATION, st.EV_TASK_ACTION, st.EV_TOOL_OUTPUT,
               st.EV_CONCLUSION)


def _op_select_episode(state, cmd, config, count_tokens, found):
  refs = _dedupe(cmd.get('selected_refs'))
  if not refs:
    found.add('bad_argument', 'selected_refs is empty')
  in_c = {it.origin for it in state.C}
  events = []
  for ref in refs:
    ev = _resolve(state, ref, 'h', found)
    if ev is None:
      continue
    if ev.kind not in _RESTORABLE:
      found.add('bad_argument', f'{ref} is a {ev.kind} event, which is not restorable')
    elif ev.id in in_c:
      found.add('bad_argument', f'{ref} is already in the active context')
    else:
      events.append(ev)
  if found:
    return None
  events.sort(key=lambda e: st.parse_id(e.id)[2])
  _check_budget(state, config, found, sum(e.tokens for e in events))
  if found:
    return None

  def commit():
    items, n = _new_items(state, [
        (st.RESTORED, e.text, (e.id,), e.evidence, e.id, e.tokens) for e in events],
                          count_tokens)
    s = state.evolve(C=state.C + tuple(items), next_c=n)
    return s, 'restored ' + ', '.join(f'{it.id} (from {it.origin})' for it in items)
  return commit


def _op_summarize(state, cmd, config, count_tokens, found):
  refs = _dedupe(cmd.get('source_refs'))
  summary = cmd.get('summary').strip()
  items = _context_refs(state, refs, 'source_refs', found)
  if checks.is_blank(summary):
    found.add('bad_argument', 'summary is empty')
  _check_markup(found, 'summary', summary, [it.text for it in items])
  if found:
    return None
  before = sum(it.tokens for it in items)
  tokens = count_tokens(summary)
  if tokens >= before:
    found.add('bad_argument', f'summary has {tokens} tokens, not fewer than the '
              f'{before} it replaces')
  texts = [it.text for it in items]
  _check_written(state, config, found, summary, texts, True)
  _check_budget(state, config, found, tokens, removed=before)
  if found:
    return None

  def commit():
    ids = set(refs)
    ordered = tuple(it.id for it in state.C if it.id in ids)
    by_id = {it.id: it for it in items}
    roots = tuple(dict.fromkeys(r for i in ordered for r in by_id[i].derived_from()))
    item = st.ContextItem(
        id=st.make_id(state.ns, 'c', state.next_c), kind=st.SUMMARY, text=summary,
        source_refs=ordered, evidence=st.union_refs(*(it.evidence for it in items)),
        protected=False, origin=None, tokens=tokens, roots=roots)
    c = []
    for it in state.C:
      if it.id in ids:
        if it.id == ordered[0]:
          c.append(item)
      else:
        c.append(it)
    s = state.evolve(C=tuple(c), next_c=state.next_c + 1)
    return s, f'{item.id} replaces ' + ', '.join(ordered)
  return commit


HANDLERS = {
    cmds.ADD: _op_add, cmds.UPDATE: _op_update, cmds.DELETE: _op_delete,
    cmds.RETRIEVE: _op_retrieve, cmds.FILTER: _op_filter,
    cmds.SELECT_EPISODE: _op_select_episode, cmds.SUMMARIZE: _op_summarize,
}
