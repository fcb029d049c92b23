"""Memory-decision state s_t = (q, M_t, C_t, H_t) (paper Eq. 1, Appendix A.1; SPEC §1).

Everything here is immutable (frozen dataclasses holding tuples); a new state shares
every unchanged entry, item and event with the old one, so keeping s_t, s~_t and s_{t+1}
for every decision of a rollout costs a few tuple copies of pointers, never a deep copy.

Ids. Every record id is namespaced by its task: `"{ns}:m{n}"` (LTM entry),
`"{ns}:c{n}"` (context item), `"{ns}:h{n}"` (history event), where `ns =
task_namespace(task_id)` is 6 hex digits of SHA-1(task_id). An id that has the id
shape but another namespace is a *foreign* reference (it can never resolve: a state
holds only its own task's records). LTM entry `m{n}` is `M[n-1]`, history event
`h{n}` is `H[n-1]`; context ids count up from 1 and are never reused.

Provenance. `source_refs` are the direct sources of a record: for an observation the
evidence-unit ids given by the environment (HotpotQA: `"{title}#{sent_id}"`), for a
retrieved item `(entry_id,)`, for a restored item `(event_id,)`, for a summary the
replaced item ids, for an LTM version the record ids its command cited (validated).
A summary item also keeps `roots`: the record ids its text derives from, traced through
the items it replaced (`ContextItem.derived_from`: an item's origin, or the item itself
when it copies no record; a replaced summary contributes its own roots). The executor
uses them to decide whether a write is supported by something other than the entry it
rewrites, and whether a source still traces to an active record.
`evidence` is the transitive set of environment evidence-unit ids behind a record,
computed by the executor from its own records (sorted tuple). `protected` is set only by
trusted environment code (the builders below / `interact`), never by a command.

Token counts. `tokens` fields cache `count_tokens(text)` of the counter the state was
built with; use one counter per state (the executor and T_e take it as an argument).

JSON (`to_json` / `from_json`; `to_dict` / `from_dict` for the dict form), schema:

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

Namespace collisions. `ns` has 24 bits, so among ~5,000 task ids two share one (e.g.
'task-3968' and 'task-5372' both map to '9c7d46'). Isolation never depends on it: a
state holds only its own records and every lookup is in that state, so another task's
id resolves at most to *this* task's record with the same id, never to the other
task's text. The namespace only lets the executor classify an id of another
namespace as 'foreign_ref' (cost 1.0) rather than 'missing_id' (0.5); under a
collision a foreign id is classified like an own id. Decision: keep 6 hex digits. Each
rendered and cited id costs ~8 Qwen tokens with 6 digits (digits are single tokens),
~14 with 12, and g(s) shows tens of ids per decision; the misclassification needs a
policy to emit the one other task's id that collides, which it never sees.

Local ids. The executor also accepts an id without its namespace (`c2`) as this task's
record (`qualify_id`), and g(s) can show ids that way (`ExecutorConfig.local_ids`,
decision: on at the CPU scale, where a small model from scratch does not learn to copy
the 6 hex digits; off at paper scale). A qualified id of another task stays a foreign
reference either way.
"""

import dataclasses
import functools
import hashlib
import json
import re
from typing import Optional

from vermem_jax.memory import checks

SCHEMA = 'vermem.memory_state/1'

ACTIVE = 'active'
DELETED = 'deleted'

# Context item kinds (SPEC §1).
INSTRUCTION = 'instruction'
OBSERVATION = 'observation'
RETRIEVED = 'retrieved'
RESTORED = 'restored'
SUMMARY = 'summary'
CONTEXT_KINDS = (INSTRUCTION, OBSERVATION, RETRIEVED, RESTORED, SUMMARY)

# History event kinds (SPEC §1).
EV_OBSERVATION = 'observation'
EV_TASK_ACTION = 'task_action'
EV_TOOL_OUTPUT = 'tool_output'
EV_CONCLUSION = 'conclusion'
EV_MEMORY_DECISION = 'memory_decision'
EV_REJECTED = 'rejected_command'
HISTORY_KINDS = (EV_OBSERVATION, EV_TASK_ACTION, EV_TOOL_OUTPUT, EV_CONCLUSION,
                 EV_MEMORY_DECISION, EV_REJECTED)
# Events whose text the policy wrote itself: they are never a source and never restored,
# so a command cannot launder its own words into M or C through H.
POLICY_AUTHORED_EVENTS = (EV_MEMORY_DECISION, EV_REJECTED)

_ID_RE = re.compile(r'([0-9a-f]{6}):([mch])([1-9][0-9]{0,8})\Z')
_LOCAL_ID_RE = re.compile(r'[mch][1-9][0-9]{0,8}\Z')


@functools.lru_cache(maxsize=4096)
def task_namespace(task_id):
  """6-hex-digit namespace of a task's record ids (SHA-1 of `task_id`)."""
  return hashlib.sha1(task_id.encode('utf-8', 'surrogatepass')).hexdigest()[:6]


def parse_id(ref):
  """Splits a record id into (namespace, letter 'm'|'c'|'h', number) or returns None."""
  if not isinstance(ref, str):
    return None
  m = _ID_RE.match(ref)
  if m is None:
    return None
  return m.group(1), m.group(2), int(m.group(3))


def qualify_id(ref, ns):
  """`ref` with namespace `ns` when it is a local id (`m3`, `c2`, `h1`), else `ref`.

  A local id names a record of the state it is used in (the policy view without
  namespaces, `ExecutorConfig.local_ids`); anything else (a qualified id, an evidence
  ref `Title#k`, a malformed string) is returned unchanged.
  """
  if isinstance(ref, str) and _LOCAL_ID_RE.match(ref):
    return f'{ns}:{ref}'
  return ref


class _Record:
  """Base of immutable records: g(s) caches rendered lines in the instance __dict__
  under names starting with '_g'; those are dropped when pickling or copying."""

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if not k.startswith('_g')}

  def __setstate__(self, d):
    self.__dict__.update(d)


@dataclasses.dataclass(frozen=True)
class LTMVersion:
  """One version of an LTM entry; Update appends a new one (never overwrites)."""
  version: int
  content: str
  source_refs: tuple = ()
  evidence: tuple = ()
  step: int = 0
  tokens: int = 0


@dataclasses.dataclass(frozen=True)
class LTMEntry(_Record):
  """A persistent LTM entry with its full version history (M_t)."""
  id: str
  versions: tuple
  status: str = ACTIVE
  deletion_reason: Optional[str] = None
  deleted_step: Optional[int] = None

  @property
  def current(self):
    return self.versions[-1]

  @property
  def content(self):
    return self.versions[-1].content

  @property
  def active(self):
    return self.status == ACTIVE


@dataclasses.dataclass(frozen=True)
class ContextItem(_Record):
  """An item of the active context C_t (visible to the task solver)."""
  id: str
  kind: str
  text: str
  source_refs: tuple = ()
  evidence: tuple = ()
  protected: bool = False
  origin: Optional[str] = None  # H event or M entry id this item copies
  tokens: int = 0
  # Summary items only: the records the summary's text derives from (see `roots`).
  roots: tuple = ()

  def derived_from(self):
    """Ids of the records this item's text comes from (the executor's source
    tracing): a summary's `roots`; else its `origin` (the entry a retrieved item
    copies, the event a restored or observation item copies); else (also a summary
    read from JSON without roots) the item itself."""
    if self.kind == SUMMARY and self.roots:
      return self.roots
    return (self.origin,) if self.origin is not None else (self.id,)


@dataclasses.dataclass(frozen=True)
class HistoryEvent(_Record):
  """An append-only event of the episodic history H_t."""
  id: str
  step: int
  kind: str
  text: str
  source_refs: tuple = ()
  evidence: tuple = ()
  tokens: int = 0


@dataclasses.dataclass(frozen=True)
class MemoryState:
  """s_t = (q, M_t, C_t, H_t) plus bookkeeping (paper Eq. 1).

  Attributes:
    task_id: task instance id (ids are namespaced by it).
    q: fixed task specification (HotpotQA: the question).
    M: LTM entries in creation order (`m{n}` is `M[n-1]`).
    C: active context items in order.
    H: history events in order (`h{n}` is `H[n-1]`).
    task_state: current environment state text (always shown by g(s)).
    step: decision step t (incremented by T_e).
    tool_calls: non-null tool commands issued so far (accepted or rejected).
    next_c: number of the next context item id.
    env_item_id: C item holding the current environment observation (undroppable),
      or None.
    forbidden: leakage strings (never rendered).
  """
  task_id: str
  q: str
  M: tuple = ()
  C: tuple = ()
  H: tuple = ()
  task_state: str = ''
  step: int = 0
  tool_calls: int = 0
  next_c: int = 1
  env_item_id: Optional[str] = None
  forbidden: tuple = ()

  @property
  def ns(self):
    return task_namespace(self.task_id)

  def evolve(self, **changes):
    """A copy with `changes` applied (a fast `dataclasses.replace` for hot paths).

    Raises:
      TypeError: a name that is not a MemoryState field.
    """
    unknown = set(changes) - _STATE_FIELDS
    if unknown:
      raise TypeError(f'MemoryState has no fields {sorted(unknown)}')
    new = object.__new__(MemoryState)
    d = new.__dict__
    d.update(self.__dict__)
    d.update(changes)
    return new

  def entry(self, ref):
    """The LTM entry with id `ref` of this task, or None."""
    p = parse_id(ref)
    if p is None or p[0] != self.ns or p[1] != 'm' or p[2] > len(self.M):
      return None
    return self.M[p[2] - 1]

  def event(self, ref):
    """The history event with id `ref` of this task, or None."""
    p = parse_id(ref)
    if p is None or p[0] != self.ns or p[1] != 'h' or p[2] > len(self.H):
      return None
    return self.H[p[2] - 1]

  def item(self, ref):
    """The context item with id `ref` currently in C, or None."""
    for it in self.C:
      if it.id == ref:
        return it
    return None

  def active_entries(self):
    return tuple(e for e in self.M if e.status == ACTIVE)

  def context_tokens(self):
    """Tokens of C_t (sum of cached item counts)."""
    return sum(it.tokens for it in self.C)

  def to_dict(self):
    return state_to_dict(self)

  def to_json(self):
    """JSON text of the state (schema: module docstring)."""
    return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True)

  @classmethod
  def from_dict(cls, d):
    return state_from_dict(d)

  @classmethod
  def from_json(cls, text):
    """Inverse of `to_json`; raises ValueError naming the bad field."""
    try:
      d = json.loads(text)
    except (TypeError, ValueError, RecursionError) as e:
      raise ValueError(f'MemoryState.from_json: not valid JSON: '
                       f'{type(e).__name__}: {str(e)[:200]}') from None
    return state_from_dict(d)


_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(MemoryState))


def make_id(ns, letter, n):
  return f'{ns}:{letter}{n}'


def union_refs(*groups):
  """Sorted tuple of the distinct refs of `groups` (evidence sets of records)."""
  return tuple(sorted(set().union(*groups)))


# ---------------------------------------------------------------------------
# Trusted builders: environment / episode code constructs states with these. Commands
# never reach them; only they set `protected` and environment source refs.


def new_state(task_id, q, count_tokens, *, instruction=None, task_state='',
              forbidden=()):
  """A fresh state with empty M and H and (optionally) a protected instruction in C.

  Args:
    task_id: task instance id (non-empty str).
    q: task specification.
    count_tokens: `str -> int` token counter (tokens of the backbone tokenizer).
    instruction: optional instruction text put in C as a protected item.
    task_state: current environment state text.
    forbidden: leakage strings for no-reference settings (answer, labels).

  Texts (q, task_state, instruction, forbidden; also in the other builders) have
  unpaired surrogates replaced by U+FFFD.

  Raises:
    ValueError: empty or non-string task_id / q, or a task_id with an unpaired
      surrogate.
  """
  if not isinstance(task_id, str) or not task_id or checks.has_surrogates(task_id):
    raise ValueError(f'task_id must be a non-empty string of Unicode text, got '
                     f'{task_id!r}')
  if not isinstance(q, str):
    raise ValueError(f'q must be a string, got {type(q).__name__}')
  state = MemoryState(task_id=task_id, q=_text(q), task_state=_text(task_state),
                      forbidden=tuple(_text(f) for f in forbidden))
  if instruction is not None:
    state, _ = add_context(state, INSTRUCTION, instruction, count_tokens,
                           protected=True)
  return state


def add_context(state, kind, text, count_tokens, *, source_refs=(), evidence=None,
                protected=False, origin=None, position=None):
  """Trusted: appends (or inserts at `position`) a C item; returns (state, item_id).

  `evidence` defaults to `source_refs` (environment evidence-unit ids). Does not check
  the context budget (episode builders own their initial states).
  """
  if kind not in CONTEXT_KINDS:
    raise ValueError(f'unknown context kind {kind!r}; kinds are {CONTEXT_KINDS}')
  refs, ev = _refs(source_refs, evidence)
  item_id = make_id(state.ns, 'c', state.next_c)
  text = _text(text)
  item = ContextItem(id=item_id, kind=kind, text=text, source_refs=refs,
                     evidence=tuple(sorted(set(ev))), protected=bool(protected),
                     origin=origin, tokens=count_tokens(text))
  c = list(state.C)
  c.insert(len(c) if position is None else position, item)
  return state.evolve(C=tuple(c), next_c=state.next_c + 1), item_id


def add_history(state, kind, text, count_tokens, *, source_refs=(), evidence=None,
                step=None):
  """Trusted: appends an H event; returns (state, event_id)."""
  if kind not in HISTORY_KINDS:
    raise ValueError(f'unknown history kind {kind!r}; kinds are {HISTORY_KINDS}')
  refs, ev = _refs(source_refs, evidence)
  event_id = make_id(state.ns, 'h', len(state.H) + 1)
  text = _text(text)
  event = HistoryEvent(id=event_id, step=state.step if step is None else step,
                       kind=kind, text=text, source_refs=refs,
                       evidence=tuple(sorted(set(ev))), tokens=count_tokens(text))
  return state.evolve(H=state.H + (event,)), event_id


def add_entry(state, content, count_tokens, *, source_refs=(), evidence=None):
  """Trusted: appends an active LTM entry (prepared M_0); returns (state, entry_id)."""
  refs, ev = _refs(source_refs, evidence)
  entry_id = make_id(state.ns, 'm', len(state.M) + 1)
  content = _text(content)
  version = LTMVersion(version=0, content=content, source_refs=refs,
                       evidence=tuple(sorted(set(ev))), step=state.step,
                       tokens=count_tokens(content))
  entry = LTMEntry(id=entry_id, versions=(version,))
  return state.evolve(M=state.M + (entry,)), entry_id


def set_task_state(state, task_state):
  """Trusted: replaces the current environment state text."""
  return state.evolve(task_state=_text(task_state))


def _refs(source_refs, evidence):
  refs = tuple(_text(r) for r in source_refs)
  return refs, refs if evidence is None else tuple(_text(r) for r in evidence)


def _text(value):
  """str(value) with unpaired surrogates replaced by U+FFFD: environment text may
  come from JSON "\\ud800" escapes, and no tokenizer or UTF-8 file accepts them."""
  return checks.scrub_surrogates(str(value))


# ---------------------------------------------------------------------------
# The JSON form (schema, trust and checks: module docstring).


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
