"""Phase A/B/C scenario generators: initial states s_0 and observation schedules.

SPEC §4, paper Appendix D.4 (phase-specific episode construction) and F.8 (decision
patterns). Each generator turns one HotpotQA example into an `ScenarioSpec` (an
`environment.EpisodeSpec` with construction metadata): the initial memory state
s_0 = (q, M_0, C_0, H_0), the observation schedule z_1, z_2, ... revealed after each
decision, the allowed operation subspace, the rollout limit and the delayed query.

Phases and scenario families (one family per episode, drawn uniformly by the seeded
episode RNG; `FAMILIES`):

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

What "needs" means here (checked by `needs_of`, recomputed from the state and schedule,
never read from metadata): an LTM need is a revealed supporting sentence that M does
not hold (Add), an active entry that a revealed sentence contradicts or completes
(Update), or an obsolete/duplicate active entry (Delete); an STM need is evidence held
in M but not in C (Retrieve), distractor items in C (Filter), evidence present only in
H (SelectEpisode), or a C item with non-evidence sentences around evidence
(Summarize).

Labels: the reference answer and supporting facts choose which sentences appear where
(training-instance construction, paper D.1) but are never written into any state text;
`MemoryState.forbidden` carries the answer for the executor's leakage check and is
never rendered. The construction pool feeds train episodes and the internal-dev pool
dev episodes (`build_episodes(..., split=...)` takes the pool the caller chose).

Everything is deterministic under `ScenarioConfig.seed`: episode i of (phase, split)
uses `random.Random(f"{seed}:{phase}:{split}:{i}")` (string seeds hash with SHA-512,
independent of PYTHONHASHSEED).
"""

from __future__ import annotations

import dataclasses
import functools
import html
import random
import re
from typing import Optional

from vermem_jax import config_util
from vermem_jax.envs import environment
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import bm25_index
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import state as mstate
from vermem_jax.memory.config import ExecutorConfig

PHASES = ('A', 'B', 'C')

# Our wording of the task instruction placed (protected) at the head of C_0.
INSTRUCTION_TEXT = (
    'Task: answer the question below from the notes in this context. Documents and '
    'feedback arrive step by step; long-term memory and the episode history can '
    'bring earlier material back.')

# Fixed texts the constructed states may show besides the example's own text (task
# states, the solver's continue action, the query prefix). Tests check that a policy
# input holds nothing else.
TASK_STATES = {
    'phase_a': 'reading documents; the question will be asked after the last one',
    'phase_b': 'documents are being read',
    'phase_c': 'documents arrive one at a time',
    'query': 'the delayed query is posed: reply with the final answer',
    'progress': '{k} of {n} further documents revealed',
    'new_document': 'a new document arrived',
    'review': 'reviewing long-term memory',
    'needs_stored': 'the question needs earlier facts',
    'needs_history': 'the question needs an earlier document',
    'reading': 'reading documents',
}
CONTINUE_ACTION = 'Continue'
QUERY_PREFIX = 'Question (delayed): '

FAMILIES = {
    'A': ('add', 'update', 'delete', 'null'),
    'B': ('retrieve', 'filter', 'select_episode', 'summarize', 'null'),
    'C': ('add_retrieve', 'update_filter', 'delete_select', 'add_summarize'),
}

# Where the solver's final context comes from when the delayed query is posed.
CONTEXT_FROM_LTM = environment.SOLVER_READS_LTM  # Phase A (D.4 "delayed query")
CONTEXT_FROM_ACTIVE = environment.SOLVER_READS_CONTEXT  # Phase B/C: C_t


@dataclasses.dataclass(frozen=True)
class ScenarioConfig:
  """Sizes and construction knobs of the phase episodes (config section `episodes`).

  Attributes:
    seed: episode RNG seed.
    num_train, num_dev: episodes per phase and split. SPEC §4 (paper): A 8,000/800,
      B 8,000/800, C 12,000/1,200 (`paper_counts`); the default is the tiny scale.
    rollout_limit: cap on memory decisions per episode (config `episodes.rollout_limit`,
      decision 16); a spec's max_decisions is min(len(schedule) + 1, rollout_limit).
    token_budget: online-token budget per training rollout (decision; None =
      EnvConfig's).
    context_budget: C_t budget in tokens (SPEC §1 decision 2,048; must equal
      `memory.context_budget` of the run). C_0 is built inside it.
    fill_min, fill_max: Phase B C_0 occupies this fraction of the budget (decision;
      paper D.4 "part of the configured active-context budget").
    max_doc_sentences: sentences kept per document observation (decision): supporting
      sentences always, then the earliest others.
    max_doc_tokens: token cap of one document observation (decision), further bounded
      by context_budget // 4 so several documents fit C.
    phase_a_distractors: distractor sentences interleaved in a Phase A schedule
      (decision).
  """
  seed: int = 0
  num_train: int = 16
  num_dev: int = 4
  rollout_limit: int = 16
  token_budget: Optional[int] = None
  context_budget: int = ExecutorConfig.context_budget  # SPEC §1 (memory config's)
  fill_min: float = 0.5
  fill_max: float = 0.8
  max_doc_sentences: int = 5
  max_doc_tokens: int = 320
  phase_a_distractors: int = 2

  def __post_init__(self):
    for name in ('num_train', 'num_dev', 'phase_a_distractors'):
      if int(getattr(self, name)) < 0:
        raise ValueError(f'ScenarioConfig.{name} must be >= 0, got '
                         f'{getattr(self, name)!r}')
    for name in ('rollout_limit', 'context_budget', 'max_doc_sentences',
                 'max_doc_tokens'):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f'ScenarioConfig.{name} must be positive, got '
                         f'{getattr(self, name)!r}')
    if not 0.0 < self.fill_min <= self.fill_max <= 1.0:
      raise ValueError('ScenarioConfig needs 0 < fill_min <= fill_max <= 1, got '
                       f'{self.fill_min}, {self.fill_max}')

  @classmethod
  def from_config(cls, section, **overrides):
    """Builds from a config section (dict-like), ignoring keys this class lacks."""
    return config_util.dataclass_from_mapping(cls, section, overrides=overrides)


def paper_counts(phase):
  """(num_train, num_dev) of SPEC §4 for `phase`."""
  return {'A': (8000, 800), 'B': (8000, 800), 'C': (12000, 1200)}[phase]


@dataclasses.dataclass(frozen=True)
class DelayedQuery:
  """The query posed once the observation schedule is exhausted (paper D.4).

  Attributes:
    text: the query text (HotpotQA: the question q itself).
    context_source: 'ltm' — the solver should answer from the active LTM entries
      (Phase A: "answered from what LTM holds"); 'context' — from C_t as it stands.
    observation_index: index in `observations` of the observation that poses it
      (always the last one).
  """
  text: str
  context_source: str
  observation_index: int


@dataclasses.dataclass(frozen=True)
class ScenarioSpec(environment.EpisodeSpec):
  """An EpisodeSpec plus construction metadata (never shown to the policy).

  Attributes (beyond EpisodeSpec):
    split: 'train' (construction pool) or 'dev' (internal-dev pool).
    delayed_query: the DelayedQuery (its text is also the last observation).
    reference_command: a correct legal first command on s_0 (checked with the
      executor at construction); scripted policies and tests use it.
    is_recovery: the needed evidence is only in H_0, with related distractors more
      recent (Phase B `select_episode`, Phase C `delete_select`).
    context_budget: the C_t budget s_0 was built for (tokens).

  EpisodeSpec fields set here: max_decisions = len(observations) + 1 (the delayed
  query is always reached; schedules are trimmed, distractors first, to fit
  `rollout_limit`); answer_from = len(observations) and answer_context 'ltm' in
  Phase A (the solver is first asked after the query and reads the active LTM);
  answer_from = 0 and answer_context 'context' in Phases B and C; stale_texts = the
  texts of the stale / obsolete entries planted in M_0 (Phase A `update`, `delete`
  with a stale version, Phase C `update_filter`; private label for the oracle reader,
  which refuses to answer while one is among what it reads — a stale entry is not
  fixed by adding the correct fact beside it. Phase C's solver reads C_t, so there
  the stale entry only matters once retrieved into C).
  """
  split: str = ''
  delayed_query: Optional[DelayedQuery] = None
  reference_command: str = ''
  is_recovery: bool = False
  context_budget: int = 0


# ---------------------------------------------------------------------------
# Example views: documents and facts as the generators use them.


@dataclasses.dataclass(frozen=True)
class Doc:
  """A (possibly shortened) context paragraph as an observation.

  `unit_ids[i]` is the evidence unit of `sentences[i]`; `gold_mask[i]` marks supporting
  sentences (label; only used to choose content).
  """
  title: str
  display_title: str
  unit_ids: tuple
  sentences: tuple
  gold_mask: tuple

  @property
  def gold(self):
    return any(self.gold_mask)

  @functools.cached_property
  def text(self):
    return f'{self.display_title}: ' + ' '.join(self.sentences)

  def fact_text(self, i):
    """A single sentence with its title: the text of a fact observation / entry."""
    return f'{self.display_title}: {self.sentences[i]}'

  def compact(self):
    """The document reduced to its supporting sentences (a gold doc only)."""
    keep = [i for i, g in enumerate(self.gold_mask) if g]
    return dataclasses.replace(
        self, unit_ids=tuple(self.unit_ids[i] for i in keep),
        sentences=tuple(self.sentences[i] for i in keep),
        gold_mask=tuple(True for _ in keep))


@dataclasses.dataclass(frozen=True)
class Fact:
  """One supporting sentence: its unit id, the doc it belongs to, its index there."""
  unit_id: str
  doc: Doc
  index: int

  @property
  def text(self):
    return self.doc.fact_text(self.index)

  @property
  def sentence(self):
    return self.doc.sentences[self.index]


@dataclasses.dataclass(frozen=True)
class ExampleView:
  """Documents and facts of one example, bounded for the context budget."""
  example: hotpotqa.Example
  gold_docs: tuple
  distractor_docs: tuple
  facts: tuple

  @functools.cached_property
  def _related(self):
    q = set(bm25_index.tokenize(self.example.question))
    scored = [(-len(q & set(bm25_index.tokenize(d.text))), i, d)
              for i, d in enumerate(self.distractor_docs)]
    return tuple(d for _, _, d in sorted(scored, key=lambda x: (x[0], x[1])))

  def related_distractors(self):
    """Distractor docs, most word overlap with the question first."""
    return self._related

  @functools.cached_property
  def _token_cache(self):
    return {}

  def tokens(self, text, count_tokens):
    """count_tokens(text), memoized per view and counter."""
    key = (count_tokens, text)
    n = self._token_cache.get(key)
    if n is None:
      n = self._token_cache[key] = count_tokens(text)
    return n


def build_view(example, count_tokens, *, max_doc_sentences=5, max_doc_tokens=320):
  """ExampleView of `example`: gold/distractor docs (sentence- and token-capped).

  Supporting sentences are always kept; other sentences are kept in order while the
  doc stays within `max_doc_sentences` and `max_doc_tokens`. Empty sentences and
  paragraphs are dropped. An example none of whose supporting facts resolves to a
  context sentence (a quirk of the full train file) gets no facts; the generators and
  the SFT builder skip it.
  """
  sup = set(hotpotqa.supporting_unit_ids(example))
  by_title = {}
  for u in hotpotqa.evidence_units(example):
    if u.text.strip():
      by_title.setdefault(u.title, []).append(u)
  gold, distractors = [], []
  for title, units in by_title.items():
    display = html.unescape(title).strip() or title
    keep = [u for u in units if u.id in sup]
    budget_left = max_doc_tokens - count_tokens(
        f'{display}: ' + ' '.join(u.text.strip() for u in keep))
    for u in units:
      if u in keep:
        continue
      if len(keep) >= max_doc_sentences:
        break
      cost = count_tokens(u.text.strip())
      if cost > budget_left:
        continue
      keep.append(u)
      budget_left -= cost
    if not keep:  # a distractor whose first sentence alone exceeds the cap
      continue
    keep.sort(key=lambda u: u.sent_id)
    doc = Doc(title=title, display_title=display,
              unit_ids=tuple(u.id for u in keep),
              sentences=tuple(u.text.strip() for u in keep),
              gold_mask=tuple(u.id in sup for u in keep))
    (gold if doc.gold else distractors).append(doc)
  facts = []
  for d in gold:
    for i, g in enumerate(d.gold_mask):
      if g:
        facts.append(Fact(d.unit_ids[i], d, i))
  return ExampleView(example, tuple(gold), tuple(distractors), tuple(facts))


# ---------------------------------------------------------------------------
# Text corruptions for stale / obsolete entries (paper D.1: partial, conflicting,
# duplicated and obsolete states).

# Whole-word numbers only (not '82nd', not '3.5'): a perturbed value stays a number.
_YEAR = re.compile(r'(?<![\w.,])(1[5-9]\d\d|20\d\d)(?![\w.,]\w|\w)')
_INT = re.compile(r'(?<![\w.,])(\d{1,6})(?![\w.,]\w|\w)')


def perturb_number(text, rng):
  """`text` with its first year (else integer) changed to a value absent from it.

  Returns None when `text` has no such number.
  """
  m = _YEAR.search(text) or _INT.search(text)
  if m is None:
    return None
  value = int(m.group(1))
  present = set(re.findall(r'\d+', text))
  deltas = [1, 2, 3, -1, -2] if m.re is _YEAR else [1, 2, 3]
  rng.shuffle(deltas)
  for d in deltas:
    new = value + d
    if new >= 0 and str(new) not in present:
      return text[:m.start(1)] + str(new) + text[m.end(1):]
  return None


def truncate_partial(text):
  """The first half of `text`'s words (an incomplete version); None if too short."""
  words = text.split()
  if len(words) < 6:
    return None
  return ' '.join(words[:len(words) // 2])


def stale_version(fact, rng, prefer_number=True):
  """(kind, text) of an outdated entry for `fact`: 'conflicting' or 'partial'."""
  if prefer_number:
    s = perturb_number(fact.sentence, rng)
    if s is not None:
      return 'conflicting', f'{fact.doc.display_title}: {s}'
  s = truncate_partial(fact.sentence)
  if s is not None:
    return 'partial', f'{fact.doc.display_title}: {s}'
  if not prefer_number:
    s = perturb_number(fact.sentence, rng)
    if s is not None:
      return 'conflicting', f'{fact.doc.display_title}: {s}'
  return None


# ---------------------------------------------------------------------------
# Trusted state construction.


def forbidden_strings(example):
  """Leakage strings of a no-reference setting: the answer (never rendered)."""
  return (example.answer,) if example.answer.strip() else ()


class StateBuilder:
  """Builds s_0 with the trusted builders of `memory.state` (ids assigned there)."""

  def __init__(self, example, count_tokens, *, task_state=''):
    self.count_tokens = count_tokens
    self.state = mstate.new_state(example.id, example.question, count_tokens,
                                  instruction=INSTRUCTION_TEXT, task_state=task_state,
                                  forbidden=forbidden_strings(example))
    self.step = 0
    self.stale_texts = []

  def entry(self, content, refs=(), *, stale=False):
    """Adds an active LTM entry (prepared M_0); returns its id.

    `stale` marks an outdated/obsolete version (a perturbed number or an incomplete
    sentence): its text becomes a private label of the episode
    (`EpisodeSpec.stale_texts`) so the oracle reader refuses to answer while it stays
    active.
    """
    self.state, eid = mstate.add_entry(self.state, content, self.count_tokens,
                                       source_refs=tuple(refs))
    if stale:
      self.stale_texts.append(content)
    return eid

  def observe(self, text, refs, *, in_context=True, current=False):
    """Records an observation in H (and C unless `in_context` is False).

    Returns (event_id, item_id or None). `current` makes the C item the current
    environment item (undroppable by Filter/Summarize).
    """
    self.state, hid = mstate.add_history(self.state, mstate.EV_OBSERVATION, text,
                                         self.count_tokens, source_refs=tuple(refs),
                                         step=self.step)
    self.step += 1
    cid = None
    if in_context:
      self.state, cid = mstate.add_context(self.state, mstate.OBSERVATION, text,
                                           self.count_tokens, source_refs=tuple(refs),
                                           origin=hid)
      if current:
        self.state = dataclasses.replace(self.state, env_item_id=cid)
    return hid, cid

  def task_action(self, text):
    self.state, hid = mstate.add_history(self.state, mstate.EV_TASK_ACTION, text,
                                         self.count_tokens, step=self.step)
    return hid

  def retrieved(self, entry_id):
    """Puts a copy of LTM entry `entry_id` in C as a retrieved item."""
    e = self.state.entry(entry_id)
    self.state, cid = mstate.add_context(
        self.state, mstate.RETRIEVED, e.content, self.count_tokens,
        source_refs=(e.id,), evidence=e.current.evidence, origin=e.id)
    return cid

  def finish(self, task_state=None):
    s = self.state
    if task_state is not None:
      s = mstate.set_task_state(s, task_state)
    return dataclasses.replace(s, step=max(self.step - 1, 0))

  def context_tokens(self):
    return self.state.context_tokens()


def fits(builder, text, budget):
  return builder.context_tokens() + builder.count_tokens(text) <= budget


def validate_initial_state(state, count_tokens, context_budget, *, example=None):
  """Structural checks of a constructed s_0 (what the executor relies on).

  Checks: C within `context_budget`; cached token counts equal `count_tokens`; every
  id has this task's namespace, M/H ids are consecutive, C ids unique and below
  `next_c`; `env_item_id` (if any) is in C; C items copying H events or M entries
  name existing records with the same text; exactly one instruction item, protected;
  with `example`, every evidence ref is an evidence unit of that example.

  Returns:
    list of problem strings (empty when valid).
  """
  problems = []
  ns = state.ns
  if state.context_tokens() > context_budget:
    problems.append(f'C holds {state.context_tokens()} tokens > budget '
                    f'{context_budget}')
  units = ({u.id for u in hotpotqa.evidence_units(example)}
           if example is not None else None)
  for n, e in enumerate(state.M, 1):
    if e.id != mstate.make_id(ns, 'm', n):
      problems.append(f'M[{n - 1}] has id {e.id}')
    for v in e.versions:
      if v.tokens != count_tokens(v.content):
        problems.append(f'{e.id} v{v.version} caches {v.tokens} tokens')
      if units is not None and not set(v.evidence) <= units:
        problems.append(f'{e.id} cites evidence outside the example')
  for n, h in enumerate(state.H, 1):
    if h.id != mstate.make_id(ns, 'h', n):
      problems.append(f'H[{n - 1}] has id {h.id}')
    if h.tokens != count_tokens(h.text):
      problems.append(f'{h.id} caches {h.tokens} tokens')
    if units is not None and not set(h.evidence) <= units:
      problems.append(f'{h.id} cites evidence outside the example')
  seen = set()
  instructions = 0
  for it in state.C:
    p = mstate.parse_id(it.id)
    if p is None or p[0] != ns or p[1] != 'c' or p[2] >= state.next_c:
      problems.append(f'bad context id {it.id}')
    if it.id in seen:
      problems.append(f'duplicate context id {it.id}')
    seen.add(it.id)
    if it.tokens != count_tokens(it.text):
      problems.append(f'{it.id} caches {it.tokens} tokens')
    if it.kind == mstate.INSTRUCTION:
      instructions += 1
      if not it.protected:
        problems.append(f'instruction {it.id} is not protected')
    if it.origin is not None:
      src = state.event(it.origin) or state.entry(it.origin)
      if src is None:
        problems.append(f'{it.id} copies missing record {it.origin}')
      elif it.text != (src.text if isinstance(src, mstate.HistoryEvent)
                       else src.content):
        problems.append(f'{it.id} text differs from its origin {it.origin}')
    if units is not None and not set(it.evidence) <= units:
      problems.append(f'{it.id} cites evidence outside the example')
  if instructions != 1:
    problems.append(f'C holds {instructions} instruction items')
  if state.env_item_id is not None and state.item(state.env_item_id) is None:
    problems.append(f'env_item_id {state.env_item_id} is not in C')
  return problems


# ---------------------------------------------------------------------------
# Needs (recomputed from a spec's state and schedule).


def _norm(text):
  return ' '.join(text.casefold().split())


def needs_of(spec, view):
  """The memory needs of a spec, recomputed from s_0 and the schedule.

  Returns:
    sorted tuple of op names whose need is present (see module docstring).
  """
  s = spec.initial_state
  fact_units = {f.unit_id for f in view.facts}
  fact_texts = {_norm(f.text): f for f in view.facts}
  active = s.active_entries()
  held = {_norm(e.content) for e in active}
  revealed_units = set()
  for it in s.C:
    revealed_units.update(it.evidence)
  for ob in spec.observations:
    revealed_units.update(ob.source_refs)
  needs = set()
  # LTM needs.
  if any(f.unit_id in revealed_units and _norm(f.text) not in held
         for f in view.facts):
    needs.add(cmds.ADD)
  for e in active:
    c = _norm(e.content)
    if c in fact_texts:
      continue
    for f in view.facts:
      if _same_sentence(e.content, f):
        if f.unit_id in revealed_units and _norm(f.text) not in held:
          needs.add(cmds.UPDATE)
        elif _norm(f.text) in held:
          needs.add(cmds.DELETE)
  counts = {}
  for e in active:
    counts[_norm(e.content)] = counts.get(_norm(e.content), 0) + 1
  if any(n > 1 for n in counts.values()):
    needs.add(cmds.DELETE)
  # STM needs.
  in_c = set()
  for it in s.C:
    in_c.update(it.evidence)
  in_m = set()
  for e in active:
    in_m.update(set(e.current.evidence) & fact_units)
  if in_m - in_c:
    needs.add(cmds.RETRIEVE)
  if any(it.kind != mstate.INSTRUCTION and it.evidence and
         not set(it.evidence) & fact_units for it in s.C):
    needs.add(cmds.FILTER)
  in_h = set()
  for h in s.H:
    in_h.update(set(h.evidence) & fact_units)
  if (in_h - in_c) - in_m:
    needs.add(cmds.SELECT_EPISODE)
  if any(set(it.evidence) & fact_units and set(it.evidence) - fact_units
         for it in s.C if it.id != s.env_item_id):
    needs.add(cmds.SUMMARIZE)
  return tuple(sorted(needs))


def _same_sentence(content, fact):
  """An entry written about `fact`'s sentence: same title prefix and at least half of
  the entry's words are words of the sentence (partial and conflicting versions)."""
  prefix = f'{fact.doc.display_title}: '
  if not content.startswith(prefix):
    return False
  words = content[len(prefix):].split()
  ref = set(fact.sentence.split())
  return bool(words) and sum(w in ref for w in words) * 2 >= len(words)


# ---------------------------------------------------------------------------
# Generators. Each returns (builder, schedule, reference Command, is_recovery,
# answer context) or raises _Skip.


class _Skip(Exception):
  """The family does not apply to this example (e.g. no number to correct)."""


def _budget_and_cap(cfg):
  """C's budget and the token cap of one document (a quarter of the budget at most,
  so the evidence and some distractors fit together)."""
  budget = cfg.context_budget
  return budget, max(1, min(cfg.max_doc_tokens, budget // 4))


def _docs(view, count_tokens, cap, which):
  docs = view.gold_docs if which == 'gold' else view.related_distractors()
  return [d for d in docs if view.tokens(d.text, count_tokens) <= cap]


def _fact_obs(fact):
  return environment.Observation(text=fact.text, source_refs=(fact.unit_id,))


def _doc_obs(doc):
  return environment.Observation(text=doc.text, source_refs=doc.unit_ids)


def _query_obs(example):
  return environment.Observation(
      text=QUERY_PREFIX + example.question, task_state=TASK_STATES['query'])


def _distractor_sentences(view, rng, k):
  pool = [(d, i) for d in view.distractor_docs for i in range(len(d.sentences))]
  rng.shuffle(pool)
  return [environment.Observation(text=d.fact_text(i), source_refs=(d.unit_ids[i],))
          for d, i in pool[:k]]


def _interleave(rng, main, extra):
  """`main` in order with `extra` inserted at random positions (never first)."""
  out = list(main)
  for ob in extra:
    out.insert(rng.randint(1, len(out)), ob)
  return out


# --- Phase A -----------------------------------------------------------------


def _phase_a(view, family, rng, count_tokens, cfg):
  ex = view.example
  facts = list(view.facts)
  if family == 'delete' and not facts:
    raise _Skip
  b = StateBuilder(ex, count_tokens, task_state=TASK_STATES['phase_a'])
  ref = None
  if family == 'add':
    order = facts[:]
    rng.shuffle(order)
    first, rest = order[0], order[1:]
    _, cid = b.observe(first.text, (first.unit_id,), current=True)
    ref = cmds.Command(cmds.ADD, {'content': first.text, 'source_refs': [cid]})
    dup = [_fact_obs(first)]  # the first fact comes again later (a duplicate)
    schedule = _interleave(rng, [_fact_obs(f) for f in rest],
                           _distractor_sentences(view, rng, cfg.phase_a_distractors)
                           + dup)
  elif family == 'update':
    order = facts[:]
    rng.shuffle(order)
    stale = []
    for f in order:
      v = stale_version(f, rng)
      if v is not None:
        stale.append((f, v[1]))
      if len(stale) == 2:
        break
    if not stale:
      raise _Skip
    # Stale entries cite no source: their provenance is what the update repairs.
    stale_ids = {f.unit_id: b.entry(text, stale=True) for f, text in stale}
    first = stale[0][0]
    _, cid = b.observe(first.text, (first.unit_id,), current=True)
    ref = cmds.Command(cmds.UPDATE, {'memory_id': stale_ids[first.unit_id],
                                     'new_content': first.text,
                                     'source_refs': [cid]})
    rest = [f for f in order if f is not first]
    schedule = _interleave(rng, [_fact_obs(f) for f in rest],
                           _distractor_sentences(view, rng, cfg.phase_a_distractors))
  elif family == 'delete':
    order = facts[:]
    rng.shuffle(order)
    target = order[0]
    v = stale_version(target, rng)
    good_first = rng.random() < 0.5
    if v is None:  # no stale version: an exact duplicate is the obsolete entry
      a = b.entry(target.text, (target.unit_id,))
      dup = b.entry(target.text, (target.unit_id,))
      obsolete, reason = dup, f'duplicate of {a}'
    elif good_first:
      good = b.entry(target.text, (target.unit_id,))
      obsolete = b.entry(v[1], stale=True)
      reason = f'obsolete: {good} holds the version the source supports'
    else:
      obsolete = b.entry(v[1], stale=True)
      good = b.entry(target.text, (target.unit_id,))
      reason = f'obsolete: {good} holds the version the source supports'
    b.observe(target.text, (target.unit_id,), current=True)
    ref = cmds.Command(cmds.DELETE, {'memory_id': obsolete, 'reason': reason})
    schedule = _interleave(rng, [_fact_obs(f) for f in order[1:]],
                           _distractor_sentences(view, rng, cfg.phase_a_distractors)
                           + [_fact_obs(target)])
  elif family == 'null':
    for f in facts:
      b.entry(f.text, (f.unit_id,))
    order = facts[:]
    rng.shuffle(order)
    b.observe(order[0].text, (order[0].unit_id,), current=True)
    ref = cmds.Command(cmds.NULL)
    schedule = _interleave(rng, [_fact_obs(f) for f in order[1:]],
                           _distractor_sentences(view, rng, cfg.phase_a_distractors))
  else:
    raise ValueError(f'unknown Phase A family {family!r}')
  return b, schedule, ref, False, CONTEXT_FROM_LTM


# --- Phase B -----------------------------------------------------------------


def _fill_distractors(b, docs, budget, target_tokens, *, current_last=True):
  """Adds distractor docs to C (and H) until C reaches `target_tokens`."""
  added = []
  for d in docs:
    if b.context_tokens() >= target_tokens:
      break
    if not fits(b, d.text, budget):
      continue
    added.append((d, b.observe(d.text, d.unit_ids)))
  if added and current_last:
    b.state = dataclasses.replace(b.state, env_item_id=added[-1][1][1])
  return added


def _phase_b(view, family, rng, count_tokens, cfg):
  ex = view.example
  budget, cap = _budget_and_cap(cfg)
  fill = int(budget * rng.uniform(cfg.fill_min, cfg.fill_max))
  gold = _docs(view, count_tokens, cap, 'gold')
  related = _docs(view, count_tokens, cap, 'distractor')
  b = StateBuilder(ex, count_tokens, task_state=TASK_STATES['phase_b'])
  ref = None
  recovery = False
  tail = []
  if family == 'retrieve':
    for f in view.facts:
      b.entry(f.text, (f.unit_id,))
    for d in related[-2:]:  # unrelated prepared entries
      b.entry(d.fact_text(0), (d.unit_ids[0],))
    added = _fill_distractors(b, related, budget, fill)
    if not added:
      raise _Skip
    ref = cmds.Command(cmds.RETRIEVE, {'query': ex.question})
    tail = [_doc_obs(d) for d in related if d not in [a for a, _ in added]][:1]
  elif family == 'filter':
    if not gold or len(related) < 2:
      raise _Skip
    order = gold[:]
    rng.shuffle(order)
    items = []
    for d in related:  # distractors first, so the current item is evidence
      if b.context_tokens() + sum(count_tokens(g.text) for g in order) >= fill:
        break
      if fits(b, d.text, budget - sum(count_tokens(g.text) for g in order)):
        items.append(('d', d, b.observe(d.text, d.unit_ids)[1]))
    if not items:
      raise _Skip
    for k, g in enumerate(order):
      if not fits(b, g.text, budget):
        raise _Skip
      items.append(('g', g, b.observe(g.text, g.unit_ids,
                                      current=k == len(order) - 1)[1]))
    drops = [cid for kind, _, cid in items if kind == 'd']
    ref = cmds.Command(cmds.FILTER, {'drop_refs': drops})
  elif family == 'select_episode':
    if not gold:
      raise _Skip
    gold_h = []
    for g in gold:
      gold_h.append(b.observe(g.text, g.unit_ids, in_context=False)[0])
    b.task_action(CONTINUE_ACTION)
    for d in related[:2]:  # related distractors stored earlier in LTM
      b.entry(d.fact_text(0), (d.unit_ids[0],))
    added = _fill_distractors(b, related, budget, fill)
    if not added:
      raise _Skip
    if sum(count_tokens(g.text) for g in gold) + b.context_tokens() > budget:
      raise _Skip
    ref = cmds.Command(cmds.SELECT_EPISODE, {'selected_refs': gold_h})
    recovery = True
  elif family == 'summarize':
    longs = [g for g in gold if not all(g.gold_mask)]
    if not longs:
      raise _Skip
    added = _fill_distractors(b, related, budget,
                              fill - sum(count_tokens(g.text) for g in gold),
                              current_last=False)
    long_ids = []
    for g in gold:
      if not fits(b, g.text, budget):
        raise _Skip
      cid = b.observe(g.text, g.unit_ids)[1]
      if g in longs:
        long_ids.append((g, cid))
    # The newest distractor (or none) is the current environment item.
    b.state = dataclasses.replace(
        b.state, env_item_id=added[-1][1][1] if added else None)
    g, cid = long_ids[0]
    ref = cmds.Command(cmds.SUMMARIZE, {'source_refs': [cid],
                                        'summary': g.compact().text})
  elif family == 'null':
    compact = [g.compact() for g in gold]
    for f in view.facts:
      b.entry(f.text, (f.unit_id,))
    for k, g in enumerate(compact):
      if not fits(b, g.text, budget):
        raise _Skip
      b.observe(g.text, g.unit_ids, current=k == len(compact) - 1)
    ref = cmds.Command(cmds.NULL)
  else:
    raise ValueError(f'unknown Phase B family {family!r}')
  return b, tail, ref, recovery, CONTEXT_FROM_ACTIVE


# --- Phase C -----------------------------------------------------------------


def _phase_c(view, family, rng, count_tokens, cfg):
  ex = view.example
  budget, cap = _budget_and_cap(cfg)
  gold = _docs(view, count_tokens, cap, 'gold')
  related = _docs(view, count_tokens, cap, 'distractor')
  b = StateBuilder(ex, count_tokens, task_state=TASK_STATES['phase_c'])
  recovery = False
  if not gold:
    raise _Skip
  order = gold[:]
  rng.shuffle(order)
  if family == 'add_retrieve':
    if len(order) < 2:
      raise _Skip
    stored, new = order[0], order[1:]
    for i, g in enumerate(stored.gold_mask):
      if g:
        b.entry(stored.fact_text(i), (stored.unit_ids[i],))
    d0 = related[0] if related else None
    if d0 is not None:
      b.observe(d0.text, d0.unit_ids, current=True)
    # Retrieve first (the stored doc is not in C); the new docs need Add later.
    ref = cmds.Command(cmds.RETRIEVE, {'query': ex.question})
    schedule = _interleave(rng, [_doc_obs(g) for g in new],
                           [_doc_obs(d) for d in related[1:3]])
  elif family == 'update_filter':
    stale = None
    for f in view.facts:
      v = stale_version(f, rng)
      if v is not None and f.doc in order:
        stale = (f, v[1])
        break
    if stale is None:
      raise _Skip
    f, text = stale
    eid = b.entry(text, stale=True)
    n_distractors = 0
    for d in related[:2]:
      if fits(b, d.text, budget - count_tokens(f.doc.text)):
        b.observe(d.text, d.unit_ids)
        n_distractors += 1
    if not n_distractors or not fits(b, f.doc.text, budget):
      raise _Skip
    _, cid = b.observe(f.doc.text, f.doc.unit_ids, current=True)
    ref = cmds.Command(cmds.UPDATE, {'memory_id': eid, 'new_content': f.text,
                                     'source_refs': [cid]})
    schedule = [_doc_obs(g) for g in order if g is not f.doc] + [
        _doc_obs(d) for d in related[2:3]]
  elif family == 'delete_select':
    if len(order) < len(view.gold_docs):
      raise _Skip  # every gold doc must be recoverable from H
    target = order[0]
    i = target.gold_mask.index(True)
    good = b.entry(target.fact_text(i), (target.unit_ids[i],))
    dup = b.entry(target.fact_text(i), (target.unit_ids[i],))
    for g in order:  # the evidence left C earlier: it is only in H
      b.observe(g.text, g.unit_ids, in_context=False)
    b.task_action(CONTINUE_ACTION)
    added = _fill_distractors(b, related, budget,
                              int(budget * cfg.fill_min) -
                              sum(count_tokens(g.text) for g in order))
    if not added:
      raise _Skip
    if sum(count_tokens(g.text) for g in order) + b.context_tokens() > budget:
      raise _Skip
    ref = cmds.Command(cmds.DELETE, {'memory_id': dup,
                                     'reason': f'duplicate of {good}'})
    recovery = True
    schedule = [_doc_obs(d) for d in related if d not in [a for a, _ in added]][:1]
  elif family == 'add_summarize':
    longs = [g for g in order if not all(g.gold_mask)]
    if not longs:
      raise _Skip
    g = longs[0]
    for k, d in enumerate(order):
      if not fits(b, d.text, budget):
        raise _Skip
      b.observe(d.text, d.unit_ids, current=k == len(order) - 1 and d is not g)
    cid = next(it.id for it in b.state.C if it.text == g.text)
    i = g.gold_mask.index(True)
    ref = cmds.Command(cmds.ADD, {'content': g.fact_text(i), 'source_refs': [cid]})
    schedule = [_doc_obs(d) for d in related[:2]]
  else:
    raise ValueError(f'unknown Phase C family {family!r}')
  return b, schedule, ref, recovery, CONTEXT_FROM_ACTIVE


_GENERATORS = {'A': _phase_a, 'B': _phase_b, 'C': _phase_c}


def _trim_schedule(schedule, view, max_len):
  """Drops observations (distractors first, from the end) to `max_len` entries, so
  the delayed query still arrives within the rollout limit."""
  fact_units = {f.unit_id for f in view.facts}
  while len(schedule) > max(max_len, 0):
    for k in range(len(schedule) - 1, -1, -1):
      if not set(schedule[k].source_refs) & fact_units:
        del schedule[k]
        break
    else:
      del schedule[-1]
  return schedule


def build_episode(example, phase, family, *, count_tokens, config=ScenarioConfig(),
                  rng=None, split='train', episode_id=None, view=None):
  """One ScenarioSpec of `phase` and `family` from `example`.

  Args:
    example: a HotpotQA train Example (construction pool for split 'train',
      internal-dev pool for 'dev').
    phase: 'A' | 'B' | 'C'.
    family: one of FAMILIES[phase].
    count_tokens: `str -> int` backbone token counter (tokens).
    config: ScenarioConfig.
    rng: random.Random (default: seeded from config.seed, phase, family, example id).
    split: 'train' | 'dev' (recorded on the spec).
    episode_id: default f'{phase}:{split}:{example.id}:{family}'.
    view: a prebuilt ExampleView (speed).

  Returns:
    ScenarioSpec, or None when the family does not apply to this example (no number to
    correct, too few documents, nothing fits the budget).

  Raises:
    ValueError: unknown phase/family; RuntimeError if a constructed reference command
      is rejected by the executor (a bug, never expected).
  """
  if phase not in PHASES:
    raise ValueError(f'unknown phase {phase!r}; expected one of {PHASES}')
  if family not in FAMILIES[phase]:
    raise ValueError(f'unknown Phase {phase} family {family!r}; expected one of '
                     f'{FAMILIES[phase]}')
  if rng is None:
    rng = random.Random(f'{config.seed}:{phase}:{family}:{example.id}')
  if view is None:
    view = build_view(example, count_tokens, max_doc_sentences=config.max_doc_sentences,
                      max_doc_tokens=config.max_doc_tokens)
  if not view.facts:
    return None
  try:
    b, schedule, ref, recovery, source = _GENERATORS[phase](
        view, family, rng, count_tokens, config)
  except _Skip:
    return None
  schedule = _trim_schedule(list(schedule), view, config.rollout_limit - 2)
  n_docs = len(schedule)
  observations = []
  for k, ob in enumerate(schedule):
    observations.append(dataclasses.replace(
        ob, task_state=TASK_STATES['progress'].format(k=k + 1, n=n_docs)))
  observations.append(_query_obs(example))
  state = b.finish()
  exec_config = ExecutorConfig(phase=phase, context_budget=config.context_budget)
  tr = mexec.execute(state, ref, exec_config, count_tokens)
  if not tr.accepted and all(v.kind == 'context_overflow' for v in tr.violations):
    return None  # the reference would not fit this budget: family does not apply
  if tr.accepted and ref.op == cmds.RETRIEVE:
    facts = {f.unit_id for f in view.facts}
    got = set().union(*(it.evidence for it in tr.state_after.C
                        if it.kind == mstate.RETRIEVED))
    if not got & facts:
      return None  # BM25 finds no stored fact for q: not a usable Retrieve case
  if not tr.accepted:
    raise RuntimeError(f'episode {phase}/{family} of {example.id}: reference command '
                       f'{cmds.format_command(ref)[:200]} rejected: {tr.message}')
  query = DelayedQuery(text=example.question, context_source=source,
                       observation_index=len(observations) - 1)
  # Phase A poses the query last and the solver reads LTM from then on; in B and C the
  # solver works on C_t from the first decision (the last observation re-poses q).
  answer_from = len(observations) if source == CONTEXT_FROM_LTM else 0
  return ScenarioSpec(
      episode_id=episode_id or f'{phase}:{split}:{example.id}:{family}',
      example=example, initial_state=state, observations=tuple(observations),
      phase=phase, allowed_ops=None,
      max_decisions=min(len(observations) + 1, config.rollout_limit),
      token_budget=config.token_budget, family=family, split=split,
      delayed_query=query, reference_command=cmds.format_command(ref),
      is_recovery=recovery, context_budget=config.context_budget,
      answer_from=answer_from, answer_context=source,
      stale_texts=tuple(b.stale_texts))


def build_episodes(examples, phase, *, count_tokens, config=ScenarioConfig(),
                   split='train', num=None):
  """`num` Phase-`phase` episodes from `examples` (deterministic under config.seed).

  Episode i draws its family uniformly from FAMILIES[phase] and its example from a
  seeded permutation of `examples` (cycled); when the family does not apply to that
  example, the next example of the permutation is tried with the same family (so
  families stay uniform).

  Args:
    examples: the pool (construction pool for 'train', internal-dev for 'dev').
    phase: 'A' | 'B' | 'C'.
    count_tokens: `str -> int` (tokens).
    config: ScenarioConfig (num_train / num_dev when `num` is None).
    split: 'train' | 'dev'.
    num: number of episodes (default config.num_train or config.num_dev).

  Returns:
    list of ScenarioSpec of length `num`.

  Raises:
    ValueError: empty pool, unknown phase/split, or no example of the pool supports a
      drawn family.
  """
  if split not in ('train', 'dev'):
    raise ValueError(f"split must be 'train' or 'dev', got {split!r}")
  if phase not in PHASES:
    raise ValueError(f'unknown phase {phase!r}; expected one of {PHASES}')
  if num is None:
    num = config.num_train if split == 'train' else config.num_dev
  if num and not examples:
    raise ValueError(f'Phase {phase} {split}: the example pool is empty')
  order = list(range(len(examples)))
  random.Random(f'{config.seed}:{phase}:{split}:order').shuffle(order)
  views = {}
  specs = []
  cursor = 0
  for i in range(num):
    rng = random.Random(f'{config.seed}:{phase}:{split}:{i}')
    family = rng.choice(FAMILIES[phase])
    spec = None
    for _ in range(len(order)):
      ex = examples[order[cursor % len(order)]]
      cursor += 1
      view = views.get(ex.id)
      if view is None:
        view = views[ex.id] = build_view(
            ex, count_tokens, max_doc_sentences=config.max_doc_sentences,
            max_doc_tokens=config.max_doc_tokens)
      spec = build_episode(ex, phase, family, count_tokens=count_tokens,
                           config=config, rng=rng, split=split, view=view,
                           episode_id=f'{phase}:{split}:{i}:{ex.id}:{family}')
      if spec is not None:
        break
    if spec is None:
      raise ValueError(f'Phase {phase} {split}: no example supports family {family!r}')
    specs.append(spec)
  return specs
