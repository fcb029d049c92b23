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
`evidence` is the transitive set of environment evidence-unit ids behind a record,
computed by the executor from its own records (sorted tuple). `protected` is set only by
trusted environment code (the builders below / `interact`), never by a command.

Token counts. `tokens` fields cache `count_tokens(text)` of the counter the state was
built with; use one counter per state (the executor and T_e take it as an argument).

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
            "tokens": int}, ...],
     "H": [{"id": str, "step": int, "kind": str, "text": str, "source_refs": [str],
            "evidence": [str], "tokens": int}, ...]}

`forbidden` holds strings the policy must not write in a no-reference setting (answer,
supporting-fact labels; see executor leakage check). It is never rendered by g(s).
"""

import dataclasses
import functools
import hashlib
import json
import re
from typing import Optional

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
    return _state_to_dict(self)

  def to_json(self):
    """JSON text of the state (schema in the module docstring)."""
    return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True)

  @classmethod
  def from_dict(cls, d):
    return _state_from_dict(d)

  @classmethod
  def from_json(cls, text):
    """Inverse of `to_json`; raises ValueError naming the bad field."""
    try:
      d = json.loads(text)
    except (TypeError, ValueError) as e:
      raise ValueError(f'MemoryState.from_json: not valid JSON: {e}') from None
    return _state_from_dict(d)


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

  Raises:
    ValueError: empty or non-string task_id / q.
  """
  if not isinstance(task_id, str) or not task_id:
    raise ValueError(f'task_id must be a non-empty string, got {task_id!r}')
  if not isinstance(q, str):
    raise ValueError(f'q must be a string, got {type(q).__name__}')
  state = MemoryState(task_id=task_id, q=q, task_state=str(task_state),
                      forbidden=tuple(str(f) for f in forbidden))
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
  refs = tuple(source_refs)
  ev = refs if evidence is None else tuple(evidence)
  item_id = make_id(state.ns, 'c', state.next_c)
  item = ContextItem(id=item_id, kind=kind, text=str(text), source_refs=refs,
                     evidence=tuple(sorted(set(ev))), protected=bool(protected),
                     origin=origin, tokens=count_tokens(str(text)))
  c = list(state.C)
  c.insert(len(c) if position is None else position, item)
  return state.evolve(C=tuple(c), next_c=state.next_c + 1), item_id


def add_history(state, kind, text, count_tokens, *, source_refs=(), evidence=None,
                step=None):
  """Trusted: appends an H event; returns (state, event_id)."""
  if kind not in HISTORY_KINDS:
    raise ValueError(f'unknown history kind {kind!r}; kinds are {HISTORY_KINDS}')
  refs = tuple(source_refs)
  ev = refs if evidence is None else tuple(evidence)
  event_id = make_id(state.ns, 'h', len(state.H) + 1)
  event = HistoryEvent(id=event_id, step=state.step if step is None else step,
                       kind=kind, text=str(text), source_refs=refs,
                       evidence=tuple(sorted(set(ev))),
                       tokens=count_tokens(str(text)))
  return state.evolve(H=state.H + (event,)), event_id


def add_entry(state, content, count_tokens, *, source_refs=(), evidence=None):
  """Trusted: appends an active LTM entry (prepared M_0); returns (state, entry_id)."""
  refs = tuple(source_refs)
  ev = refs if evidence is None else tuple(evidence)
  entry_id = make_id(state.ns, 'm', len(state.M) + 1)
  version = LTMVersion(version=0, content=str(content), source_refs=refs,
                       evidence=tuple(sorted(set(ev))), step=state.step,
                       tokens=count_tokens(str(content)))
  entry = LTMEntry(id=entry_id, versions=(version,))
  return state.evolve(M=state.M + (entry,)), entry_id


def set_task_state(state, task_state):
  """Trusted: replaces the current environment state text."""
  return state.evolve(task_state=str(task_state))


# ---------------------------------------------------------------------------
# JSON.


def _state_to_dict(s):
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
             'protected': c.protected, 'origin': c.origin, 'tokens': c.tokens}
            for c in s.C],
      'H': [{'id': h.id, 'step': h.step, 'kind': h.kind, 'text': h.text,
             'source_refs': list(h.source_refs), 'evidence': list(h.evidence),
             'tokens': h.tokens} for h in s.H],
  }


def _get(d, key, typ, where, optional=False):
  if not isinstance(d, dict) or key not in d:
    raise ValueError(f'MemoryState.from_json: missing field {where}.{key}')
  v = d[key]
  if optional and v is None:
    return None
  if typ is int and isinstance(v, bool) or not isinstance(v, typ):
    raise ValueError(f'MemoryState.from_json: field {where}.{key} must be '
                     f'{typ.__name__}, got {type(v).__name__}')
  return v


def _strs(d, key, where):
  v = _get(d, key, list, where)
  if not all(isinstance(x, str) for x in v):
    raise ValueError(f'MemoryState.from_json: field {where}.{key} must be a list of '
                     'strings')
  return tuple(v)


def _state_from_dict(d):
  if not isinstance(d, dict):
    raise ValueError('MemoryState.from_json: top level must be an object')
  if d.get('schema') != SCHEMA:
    raise ValueError(f'MemoryState.from_json: field schema must be {SCHEMA!r}, got '
                     f'{d.get("schema")!r}')
  m = []
  for i, e in enumerate(_get(d, 'M', list, 'state')):
    w = f'M[{i}]'
    versions = []
    for j, v in enumerate(_get(e, 'versions', list, w)):
      wv = f'{w}.versions[{j}]'
      versions.append(LTMVersion(
          version=_get(v, 'version', int, wv), content=_get(v, 'content', str, wv),
          source_refs=_strs(v, 'source_refs', wv), evidence=_strs(v, 'evidence', wv),
          step=_get(v, 'step', int, wv), tokens=_get(v, 'tokens', int, wv)))
    if not versions:
      raise ValueError(f'MemoryState.from_json: field {w}.versions is empty')
    status = _get(e, 'status', str, w)
    if status not in (ACTIVE, DELETED):
      raise ValueError(f'MemoryState.from_json: field {w}.status is {status!r}')
    m.append(LTMEntry(id=_get(e, 'id', str, w), versions=tuple(versions),
                      status=status,
                      deletion_reason=_get(e, 'deletion_reason', str, w, True),
                      deleted_step=_get(e, 'deleted_step', int, w, True)))
  c = []
  for i, it in enumerate(_get(d, 'C', list, 'state')):
    w = f'C[{i}]'
    kind = _get(it, 'kind', str, w)
    if kind not in CONTEXT_KINDS:
      raise ValueError(f'MemoryState.from_json: field {w}.kind is {kind!r}')
    c.append(ContextItem(
        id=_get(it, 'id', str, w), kind=kind, text=_get(it, 'text', str, w),
        source_refs=_strs(it, 'source_refs', w), evidence=_strs(it, 'evidence', w),
        protected=_get(it, 'protected', bool, w),
        origin=_get(it, 'origin', str, w, True), tokens=_get(it, 'tokens', int, w)))
  h = []
  for i, ev in enumerate(_get(d, 'H', list, 'state')):
    w = f'H[{i}]'
    kind = _get(ev, 'kind', str, w)
    if kind not in HISTORY_KINDS:
      raise ValueError(f'MemoryState.from_json: field {w}.kind is {kind!r}')
    h.append(HistoryEvent(
        id=_get(ev, 'id', str, w), step=_get(ev, 'step', int, w), kind=kind,
        text=_get(ev, 'text', str, w), source_refs=_strs(ev, 'source_refs', w),
        evidence=_strs(ev, 'evidence', w), tokens=_get(ev, 'tokens', int, w)))
  return MemoryState(
      task_id=_get(d, 'task_id', str, 'state'), q=_get(d, 'q', str, 'state'),
      M=tuple(m), C=tuple(c), H=tuple(h),
      task_state=_get(d, 'task_state', str, 'state'),
      step=_get(d, 'step', int, 'state'),
      tool_calls=_get(d, 'tool_calls', int, 'state'),
      next_c=_get(d, 'next_c', int, 'state'),
      env_item_id=_get(d, 'env_item_id', str, 'state', True),
      forbidden=_strs(d, 'forbidden', 'state'))
