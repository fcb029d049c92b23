"""MemoryState <-> JSON (`MemoryState.to_json` / `from_json`; SPEC §1 records).

JSON schema (`to_json` / `from_json`; `to_dict` / `from_dict` for the dict form):

    {"schema": "vermem.memory_state/1",
     "task_id": str, "q": str, "task_state": str, "step": int, "tool_calls": int,
     "next_c": int, "env_item_id": str | null, "forbidden": [str, ...],
     "M": [{"id": str, "status": "active" | "deleted", "deletion_reason": str | null,
            "deleted_step": int | null,
            "versions": [{"version": int, "content": str, "source_refs": [str],
                          "evidence": [str], "step": int, "tokens": int}, ...]}, ...],
     "C": [{"id": str, "kind": str, "text": str, "source_refs": [str],
            "evidence": [str], "protected": bool, "origin": str | null,
            "tokens": int, "roots": [str]}, ...],    ("roots" optional on read: [])
     "H": [{"id": str, "step": int, "kind": str, "text": str, "source_refs": [str],
            "evidence": [str], "tokens": int}, ...]}

`forbidden` holds strings the policy must not write in a no-reference setting (answer,
supporting-fact labels; see executor leakage check). It is never rendered by g(s).

Trust. A JSON state is a trusted artifact written by this code (rollout records, test
fixtures, bug reports), never policy input: `protected`, `source_refs`, `evidence`,
`origin` and `forbidden` are taken as recorded (provenance cannot be re-derived from a
file). `from_json` checks the schema and the invariants the executor relies on and
raises ValueError naming the field otherwise: exact key sets (unknown fields are
errors), types, non-negative ints, no unpaired surrogates, task_id non-empty, `M[i].id`
= `{ns}:m{i+1}` and `H[i].id` = `{ns}:h{i+1}`, C ids of this task, unique and below
`next_c`, C origins and roots ids of this task, `env_item_id` an item of C, versions numbered
0..k, active entries without deletion data. Malformed JSON (including nesting too deep
for the decoder) is a ValueError as well.
"""

from vermem_jax.memory import checks
from vermem_jax.memory.state import (ACTIVE, CONTEXT_KINDS, DELETED, HISTORY_KINDS,
                                     SCHEMA, ContextItem, HistoryEvent, LTMEntry,
                                     LTMVersion, MemoryState, make_id, parse_id)


def state_to_dict(s):
  """The JSON-ready dict of MemoryState `s` (schema above)."""
  return {
      'schema': SCHEMA,
      'task_id': s.task_id, 'q': s.q, 'task_state': s.task_state, 'step': s.step,
      'tool_calls': s.tool_calls, 'next_c': s.next_c, 'env_item_id': s.env_item_id,
      'forbidden': list(s.forbidden),
      'M': [{'id': e.id, 'status': e.status, 'deletion_reason': e.deletion_reason,
             'deleted_step': e.deleted_step,
             'versions': [{'version': v.version, 'content': v.content,
                           'source_refs': list(v.source_refs),
                           'evidence': list(v.evidence), 'step': v.step,
                           'tokens': v.tokens} for v in e.versions]}
            for e in s.M],
      'C': [{'id': c.id, 'kind': c.kind, 'text': c.text,
             'source_refs': list(c.source_refs), 'evidence': list(c.evidence),
             'protected': c.protected, 'origin': c.origin, 'tokens': c.tokens,
             'roots': list(c.roots)}
            for c in s.C],
      'H': [{'id': h.id, 'step': h.step, 'kind': h.kind, 'text': h.text,
             'source_refs': list(h.source_refs), 'evidence': list(h.evidence),
             'tokens': h.tokens} for h in s.H],
  }


def _bad(where, message):
  return ValueError(f'MemoryState.from_json: field {where} {message}')


def _get(d, key, typ, where, optional=False):
  if not isinstance(d, dict):
    raise ValueError(f'MemoryState.from_json: {where} must be an object, got '
                     f'{type(d).__name__}')
  if key not in d:
    raise ValueError(f'MemoryState.from_json: missing field {where}.{key}')
  v = d[key]
  if optional and v is None:
    return None
  if typ is int and isinstance(v, bool) or not isinstance(v, typ):
    raise _bad(f'{where}.{key}', f'must be {typ.__name__}, got {type(v).__name__}')
  if typ is int and v < 0:
    raise _bad(f'{where}.{key}', f'must be >= 0, got {v}')
  if typ is str and checks.has_surrogates(v):
    raise _bad(f'{where}.{key}', 'holds an unpaired surrogate (not Unicode text)')
  return v


def _get_choice(d, key, allowed, where):
  v = _get(d, key, str, where)
  if v not in allowed:
    raise _bad(f'{where}.{key}', f'is {v!r}')
  return v


def _strs(d, key, where):
  v = _get(d, key, list, where)
  if not all(isinstance(x, str) and not checks.has_surrogates(x) for x in v):
    raise _bad(f'{where}.{key}', 'must be a list of strings (Unicode text)')
  return tuple(v)


_KEYS = {
    'state': ('schema', 'task_id', 'q', 'task_state', 'step', 'tool_calls', 'next_c',
              'env_item_id', 'forbidden', 'M', 'C', 'H'),
    'M': ('id', 'status', 'deletion_reason', 'deleted_step', 'versions'),
    'versions': ('version', 'content', 'source_refs', 'evidence', 'step', 'tokens'),
    'C': ('id', 'kind', 'text', 'source_refs', 'evidence', 'protected', 'origin',
          'tokens', 'roots'),
    'H': ('id', 'step', 'kind', 'text', 'source_refs', 'evidence', 'tokens'),
}


def _no_unknown(d, kind, where):
  if isinstance(d, dict) and (set(d) - set(_KEYS[kind])):
    extra = sorted(set(d) - set(_KEYS[kind]))
    raise ValueError(f'MemoryState.from_json: unknown field(s) {extra} in {where}')


def _check_ids(state):
  """Id invariants the executor relies on (module docstring: Ids)."""
  ns = state.ns
  for i, e in enumerate(state.M):
    if e.id != make_id(ns, 'm', i + 1):
      raise _bad(f'M[{i}].id', f'is {e.id!r}; expected {make_id(ns, "m", i + 1)!r} '
                 '(entry n of this task is M[n-1])')
    if [v.version for v in e.versions] != list(range(len(e.versions))):
      raise _bad(f'M[{i}].versions', 'must be numbered 0, 1, ... in order')
    if e.status == ACTIVE and (e.deletion_reason is not None or
                               e.deleted_step is not None):
      raise _bad(f'M[{i}].deletion_reason', 'must be null for an active entry')
  for i, ev in enumerate(state.H):
    if ev.id != make_id(ns, 'h', i + 1):
      raise _bad(f'H[{i}].id', f'is {ev.id!r}; expected {make_id(ns, "h", i + 1)!r} '
                 '(event n of this task is H[n-1])')
  seen = set()
  for i, it in enumerate(state.C):
    p = parse_id(it.id)
    if p is None or p[0] != ns or p[1] != 'c' or p[2] >= state.next_c:
      raise _bad(f'C[{i}].id', f'is {it.id!r}; expected {ns}:c<n> with n < next_c '
                 f'= {state.next_c}')
    if it.id in seen:
      raise _bad(f'C[{i}].id', f'{it.id!r} occurs twice')
    seen.add(it.id)
    if it.origin is not None and (parse_id(it.origin) or ('',))[0] != ns:
      raise _bad(f'C[{i}].origin', f'{it.origin!r} is not a record id of this task')
    for r in it.roots:
      if (parse_id(r) or ('',))[0] != ns:
        raise _bad(f'C[{i}].roots', f'{r!r} is not a record id of this task')
  if state.env_item_id is not None and state.env_item_id not in seen:
    raise _bad('state.env_item_id', f'{state.env_item_id!r} is not an item of C')
  if state.next_c < 1:
    raise _bad('state.next_c', 'must be >= 1')


def state_from_dict(d):
  """The MemoryState of dict `d` after every check above.

  Raises:
    ValueError: naming the first bad field.
  """
  if not isinstance(d, dict):
    raise ValueError('MemoryState.from_json: top level must be an object')
  if d.get('schema') != SCHEMA:
    raise ValueError(f'MemoryState.from_json: field schema must be {SCHEMA!r}, got '
                     f'{d.get("schema")!r}')
  _no_unknown(d, 'state', 'the top level')
  task_id = _get(d, 'task_id', str, 'state')
  if not task_id:
    raise _bad('state.task_id', 'must be a non-empty string')
  m = []
  for i, e in enumerate(_get(d, 'M', list, 'state')):
    w = f'M[{i}]'
    versions = []
    for j, v in enumerate(_get(e, 'versions', list, w)):
      wv = f'{w}.versions[{j}]'
      _no_unknown(v, 'versions', wv)
      versions.append(LTMVersion(
          version=_get(v, 'version', int, wv), content=_get(v, 'content', str, wv),
          source_refs=_strs(v, 'source_refs', wv), evidence=_strs(v, 'evidence', wv),
          step=_get(v, 'step', int, wv), tokens=_get(v, 'tokens', int, wv)))
    if not versions:
      raise ValueError(f'MemoryState.from_json: field {w}.versions is empty')
    _no_unknown(e, 'M', w)
    status = _get_choice(e, 'status', (ACTIVE, DELETED), w)
    m.append(LTMEntry(id=_get(e, 'id', str, w), versions=tuple(versions),
                      status=status,
                      deletion_reason=_get(e, 'deletion_reason', str, w, True),
                      deleted_step=_get(e, 'deleted_step', int, w, True)))
  c = []
  for i, it in enumerate(_get(d, 'C', list, 'state')):
    w = f'C[{i}]'
    _no_unknown(it, 'C', w)
    kind = _get_choice(it, 'kind', CONTEXT_KINDS, w)
    c.append(ContextItem(
        id=_get(it, 'id', str, w), kind=kind, text=_get(it, 'text', str, w),
        source_refs=_strs(it, 'source_refs', w), evidence=_strs(it, 'evidence', w),
        protected=_get(it, 'protected', bool, w),
        origin=_get(it, 'origin', str, w, True), tokens=_get(it, 'tokens', int, w),
        roots=_strs(it, 'roots', w) if 'roots' in it else ()))
  h = []
  for i, ev in enumerate(_get(d, 'H', list, 'state')):
    w = f'H[{i}]'
    _no_unknown(ev, 'H', w)
    kind = _get_choice(ev, 'kind', HISTORY_KINDS, w)
    h.append(HistoryEvent(
        id=_get(ev, 'id', str, w), step=_get(ev, 'step', int, w), kind=kind,
        text=_get(ev, 'text', str, w), source_refs=_strs(ev, 'source_refs', w),
        evidence=_strs(ev, 'evidence', w), tokens=_get(ev, 'tokens', int, w)))
  state = MemoryState(
      task_id=task_id, q=_get(d, 'q', str, 'state'),
      M=tuple(m), C=tuple(c), H=tuple(h),
      task_state=_get(d, 'task_state', str, 'state'),
      step=_get(d, 'step', int, 'state'),
      tool_calls=_get(d, 'tool_calls', int, 'state'),
      next_c=_get(d, 'next_c', int, 'state'),
      env_item_id=_get(d, 'env_item_id', str, 'state', True),
      forbidden=_strs(d, 'forbidden', 'state'))
  _check_ids(state)
  return state
