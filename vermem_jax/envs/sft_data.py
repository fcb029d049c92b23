"""The SFT set: balanced memory-decision states with one correct target command each.

SPEC §4 and paper Appendix D.1–D.3. Eight targets (the seven tools and ∅) are exactly
balanced per split (paper: 4,000 train / 500 dev each; `SFTDataConfig` default is the
tiny scale). Each record pairs the policy input x_i = g(s_i) (`render_policy_input`)
with the target command text u*_i (`format_command`), and keeps its op, the template
that built the state, whether the state is a boundary/negative one, the example id,
the split and the source ('template' or 'teacher').

Boundary templates (D.2) build states around the confusable pairs, where a
superficially plausible operation is wrong and the target is another *legal* one
(never an invalid command, D.3):

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
boundary templates; the count is exact per class and split.

Every candidate passes the seven deterministic filters of D.3 (`check_candidate`),
each really run, with no repair:
  1 one_operation    the text parses as exactly one command (nothing after it);
  2 op_allowed       its op is in the state's phase subspace;
  3 required_args    the op's schema holds and string arguments are non-empty;
  4 refs_exist       every cited id resolves in the state (M entry / C item / H event);
  5 same_instance    every cited id has this task's namespace;
  6 transition_valid memory.execute accepts it on the state (all Appendix A checks);
  7 no_leakage       the executor saw no leakage, and every word written into
                     content / new_content / summary / query occurs in x_i, the
                     normalized reference answer occurs in a written text only if
                     x_i holds it, and no label marker (see `LABEL_MARKERS`) is
                     written unless x_i holds it.
Valid records are deduplicated by (state, op, arguments): the state's canonical JSON
hash, the op and the canonical argument tuple.

Optional teacher (D.2): an OpenAI-compatible chat-completions endpoint
(`vermem_jax.http_chat`; off by default). For a state built by a template it receives
x_i, the allowed operations and the visible record ids, never the answer or future
observations; its reply must pass the same seven filters and be of the class being
filled, else it is discarded (not repaired) and that state's template target is used.
The API key is read from the environment variable named by `teacher_api_key_env` and
never logged.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import random
import re
from typing import Callable, Optional

from vermem_jax import config_util
from vermem_jax import http_chat
from vermem_jax.envs import scenarios as sc
from vermem_jax.memory import checks
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.memory import state as mstate
from vermem_jax.memory.config import ExecutorConfig

TARGETS = cmds.ALL_OPS  # 7 tools + ∅ ('Null'), SPEC §4
FILTER_NAMES = ('one_operation', 'op_allowed', 'required_args', 'refs_exist',
                'same_instance', 'transition_valid', 'no_leakage')
# Label words that must never be written by a target unless the policy input has them.
LABEL_MARKERS = ('supporting fact', 'supporting_facts', 'sup_fact', 'gold evidence',
                 'reference answer', 'answer:', 'answer =', 'label:')
_WORD = re.compile(r'\w+')
_WRITTEN_ARGS = ('content', 'new_content', 'summary', 'query')


@dataclasses.dataclass(frozen=True)
class SFTDataConfig:
  """Sizes and options of the SFT set (config section `sft`; SPEC §4).

  Attributes:
    train_per_target, dev_per_target: records per target and split (paper 4,000 /
      500; tiny default 32 / 8).
    template_fraction: share of each class from templates when a teacher is set
      (SPEC §4: half); without a teacher templates fill every class.
    min_negative_fraction: SPEC §4 floor on boundary/negative states per class (25%).
    boundary_fraction: share of each class built on boundary/negative states
      (decision 0.5, at least min_negative_fraction).
    teacher_backend: None (off) or 'openai_compatible'.
    teacher_base_url, teacher_model: endpoint (…/v1) and model name.
    teacher_api_key_env: name of the environment variable holding the API key.
    teacher_timeout_s: HTTP timeout (seconds).
    teacher_max_tokens, teacher_temperature: decoding of the teacher reply.
    seed: RNG seed.
    context_budget: C_t budget (SPEC §1: 2,048 tokens; = memory.context_budget).
    policy_input_limit: limit of x_i (SPEC §1: 8,192 tokens).
    max_doc_sentences, max_doc_tokens: document caps (scenarios.ScenarioConfig).
    max_attempts_per_record: give up after this many candidate states per record.
  """
  train_per_target: int = 32
  dev_per_target: int = 8
  template_fraction: float = 0.5
  min_negative_fraction: float = 0.25
  boundary_fraction: float = 0.5
  teacher_backend: Optional[str] = None
  teacher_base_url: str = ''
  teacher_model: str = ''
  teacher_api_key_env: str = 'VERMEM_TEACHER_API_KEY'
  teacher_timeout_s: float = 30.0
  teacher_max_tokens: int = 256
  teacher_temperature: float = 0.7
  seed: int = 0
  # One source for the shared numbers: the memory and episode configs' defaults.
  context_budget: int = ExecutorConfig.context_budget
  policy_input_limit: int = ExecutorConfig.policy_input_limit
  max_doc_sentences: int = sc.ScenarioConfig.max_doc_sentences
  max_doc_tokens: int = sc.ScenarioConfig.max_doc_tokens
  max_attempts_per_record: int = 40

  def __post_init__(self):
    if self.train_per_target < 0 or self.dev_per_target < 0:
      raise ValueError('SFTDataConfig: per-target sizes must be >= 0')
    if not 0.0 <= self.min_negative_fraction <= 1.0:
      raise ValueError('SFTDataConfig.min_negative_fraction must be in [0, 1]')
    if not self.min_negative_fraction <= self.boundary_fraction <= 1.0:
      raise ValueError(f'SFTDataConfig.boundary_fraction ({self.boundary_fraction}) '
                       f'must be in [min_negative_fraction '
                       f'({self.min_negative_fraction}), 1]')
    if not 0.0 <= self.template_fraction <= 1.0:
      raise ValueError('SFTDataConfig.template_fraction must be in [0, 1]')
    if self.teacher_backend not in (None, 'openai_compatible'):
      raise ValueError(f'SFTDataConfig.teacher_backend must be None or '
                       f"'openai_compatible', got {self.teacher_backend!r}")
    if self.teacher_backend and not (self.teacher_base_url and self.teacher_model):
      raise ValueError('SFTDataConfig: the teacher needs teacher_base_url and '
                       'teacher_model')
    if self.max_attempts_per_record <= 0:
      raise ValueError('SFTDataConfig.max_attempts_per_record must be positive')

  @classmethod
  def from_config(cls, section, **overrides):
    """Builds from a config section (dict-like), ignoring keys this class lacks."""
    return config_util.dataclass_from_mapping(cls, section, overrides=overrides)

  @property
  def teacher_fraction(self):
    """Share of each class the teacher may fill (when a teacher is in use)."""
    return 1.0 - self.template_fraction


@dataclasses.dataclass(frozen=True)
class SFTRecord:
  """One supervised decision (x_i, u*_i).

  Attributes:
    policy_input: x_i = g(s_i) (the prompt; no loss on it).
    target: u*_i as canonical command text (the only tokens with loss).
    op: target op name (one of TARGETS).
    template: name of the template that built the state.
    is_boundary: s_i is a boundary/negative state (a confusable op is wrong here).
    example_id: HotpotQA question id.
    split: 'train' (construction pool) | 'dev' (internal-dev pool).
    phase: 'A' | 'B' | 'C' operation subspace shown in x_i.
    source: 'template' | 'teacher'.
    state: s_i (MemoryState; re-run the executor with it).
  """
  policy_input: str
  target: str
  op: str
  template: str
  is_boundary: bool
  example_id: str
  split: str
  phase: str
  source: str
  state: mstate.MemoryState

  def to_dict(self):
    """JSON-ready dict (state as its JSON text)."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d['state'] = self.state.to_json()
    return d


@dataclasses.dataclass
class SFTBuildReport:
  """Counts of a build: per (split, op, template, source) and teacher outcomes."""
  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  attempts: int = 0
  filter_failures: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)
  duplicates: int = 0
  teacher_requests: int = 0
  teacher_accepted: int = 0
  teacher_rejected: int = 0
  teacher_errors: int = 0

  def per_target(self, split):
    out = collections.Counter()
    for (s, op, _, _), n in self.counts.items():
      if s == split:
        out[op] += n
    return out

  def table(self):
    """Rows (split, op, template, source, count) sorted; the printed table's data."""
    return sorted((s, op, t, src, n) for (s, op, t, src), n in self.counts.items())

  def format_table(self):
    lines = [f'{"split":<6} {"target":<14} {"template":<28} {"source":<9} {"count":>6}']
    for s, op, t, src, n in self.table():
      lines.append(f'{s:<6} {op:<14} {t:<28} {src:<9} {n:>6}')
    for split in sorted({k[0] for k in self.counts}):
      per = self.per_target(split)
      lines.append(f'{split}: ' + ', '.join(f'{op}={per[op]}' for op in TARGETS))
    lines.append(f'attempts={self.attempts} duplicates={self.duplicates} '
                 f'filter_failures={dict(self.filter_failures)} '
                 f'teacher: requests={self.teacher_requests} '
                 f'accepted={self.teacher_accepted} rejected={self.teacher_rejected} '
                 f'errors={self.teacher_errors}')
    return '\n'.join(lines)


# ---------------------------------------------------------------------------
# Templates. Each: (view, rng, count_tokens, budget, phase) -> (state, Command) | None.


@dataclasses.dataclass(frozen=True)
class Template:
  """A boundary or standard state template for one target op.

  Attributes:
    name: template name (records, the count table).
    op: target op (one of TARGETS).
    is_boundary: builds boundary/negative states (a confusable op is wrong there).
    phases: op subspaces ('A' | 'B' | 'C') the state may be shown under.
    build: (view: scenarios.ExampleView, rng: random.Random, count_tokens,
      context_budget: int tokens, phase) -> (MemoryState, Command) or None when the
      example does not support the template.
  """
  name: str
  op: str
  is_boundary: bool
  phases: tuple
  build: Callable


def _pick(rng, seq):
  return seq[rng.randrange(len(seq))] if seq else None


def _gold(view, count_tokens, budget):
  cap = max(1, budget // 4)
  return [d for d in view.gold_docs if view.tokens(d.text, count_tokens) <= cap]


def _distractors(view, count_tokens, budget):
  cap = max(1, budget // 4)
  return [d for d in view.related_distractors()
          if view.tokens(d.text, count_tokens) <= cap]


def _builder(view, count_tokens, task_state=''):
  return sc.StateBuilder(view.example, count_tokens, task_state=task_state)


def _other_fact_entries(b, view, rng, exclude, k, phase):
  """Stores up to `k` other facts in M_0. Not in Phase C, where stored facts absent
  from C would make Retrieve an equally valid choice (the target must be unique)."""
  if phase == 'C':
    return
  others = [f for f in view.facts if f not in exclude]
  rng.shuffle(others)
  for f in others[:k]:
    b.entry(f.text, (f.unit_id,))


def t_add_new_fact(view, rng, count_tokens, budget, phase=None):
  facts = list(view.facts)
  f = _pick(rng, facts)
  b = _builder(view, count_tokens, sc.TASK_STATES['new_document'])
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 2), phase)
  for d in _distractors(view, count_tokens, budget)[:rng.randint(0, 1)]:
    b.observe(d.text, d.unit_ids, in_context=False)
  if rng.random() < 0.5:
    _, cid = b.observe(f.text, (f.unit_id,), current=True)
  else:
    _, cid = b.observe(f.doc.text, f.doc.unit_ids, current=True)
  return b.finish(), cmds.Command(cmds.ADD, {'content': f.text, 'source_refs': [cid]})


def t_add_same_topic(view, rng, count_tokens, budget, phase=None):
  cands = [(d, i, j) for d in view.gold_docs for i in range(len(d.sentences))
           for j in range(len(d.sentences)) if i != j and d.gold_mask[i]]
  if not cands:
    return None
  d, i, j = _pick(rng, cands)
  b = _builder(view, count_tokens, sc.TASK_STATES['new_document'])
  b.entry(d.fact_text(j), (d.unit_ids[j],))  # same page, another sentence
  _, cid = b.observe(d.text, d.unit_ids, current=True)
  return b.finish(), cmds.Command(cmds.ADD, {'content': d.fact_text(i),
                                             'source_refs': [cid]})


def _update_state(view, rng, count_tokens, kind, phase):
  cands = []
  for f in view.facts:
    if kind == 'conflicting':
      s = sc.perturb_number(f.sentence, rng)
    else:
      s = sc.truncate_partial(f.sentence)
    if s is not None:
      cands.append((f, f'{f.doc.display_title}: {s}'))
  if not cands:
    return None
  f, stale = _pick(rng, cands)
  b = _builder(view, count_tokens, sc.TASK_STATES['new_document'])
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 1), phase)
  eid = b.entry(stale)  # a stale entry cites no source
  if rng.random() < 0.5:
    _, cid = b.observe(f.text, (f.unit_id,), current=True)
  else:
    _, cid = b.observe(f.doc.text, f.doc.unit_ids, current=True)
  return b.finish(), cmds.Command(cmds.UPDATE, {'memory_id': eid,
                                                'new_content': f.text,
                                                'source_refs': [cid]})


def t_update_correction(view, rng, count_tokens, budget, phase=None):
  del budget
  return _update_state(view, rng, count_tokens, 'conflicting', phase)


def t_update_partial(view, rng, count_tokens, budget, phase=None):
  del budget
  return _update_state(view, rng, count_tokens, 'partial', phase)


def t_delete_obsolete(view, rng, count_tokens, budget, phase=None):
  del budget
  cands = [(f, v) for f in view.facts
           for v in [sc.stale_version(f, rng, prefer_number=rng.random() < 0.5)]
           if v is not None]
  if not cands:
    return None
  f, (_, stale) = _pick(rng, cands)
  b = _builder(view, count_tokens, sc.TASK_STATES['new_document'])
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 1), phase)
  if rng.random() < 0.5:
    good = b.entry(f.text, (f.unit_id,))
    bad = b.entry(stale)
  else:
    bad = b.entry(stale)
    good = b.entry(f.text, (f.unit_id,))
  b.observe(f.text, (f.unit_id,), current=True)
  reason = f'obsolete: {good} holds the version the source supports'
  return b.finish(), cmds.Command(cmds.DELETE, {'memory_id': bad, 'reason': reason})


def t_delete_duplicate(view, rng, count_tokens, budget, phase=None):
  f = _pick(rng, list(view.facts))
  b = _builder(view, count_tokens, sc.TASK_STATES['review'])
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 1), phase)
  first = b.entry(f.text, (f.unit_id,))
  _other_fact_entries(b, view, rng, (f,), rng.randint(0, 1), phase)
  second = b.entry(f.text, (f.unit_id,))
  d = _pick(rng, _distractors(view, count_tokens, budget))
  if d is not None:
    b.observe(d.text, d.unit_ids, current=True)
  return b.finish(), cmds.Command(cmds.DELETE, {'memory_id': second,
                                                'reason': f'duplicate of {first}'})


def _distractor_context(b, view, rng, count_tokens, budget, k):
  ds = _distractors(view, count_tokens, budget)[:k + 1]
  rng.shuffle(ds)
  out = []
  for d in ds[:k]:
    if sc.fits(b, d.text, budget // 2):
      out.append(b.observe(d.text, d.unit_ids)[1])
  if out:
    b.state = dataclasses.replace(b.state, env_item_id=out[-1])
  return out


def t_retrieve_from_ltm(view, rng, count_tokens, budget, phase=None):
  b = _builder(view, count_tokens, sc.TASK_STATES['needs_stored'])
  for f in view.facts:
    b.entry(f.text, (f.unit_id,))
  if not _distractor_context(b, view, rng, count_tokens, budget, rng.randint(1, 2)):
    return None
  return _retrieve_brings_evidence(view, b.finish(), count_tokens, budget)


def _retrieve_brings_evidence(view, state, count_tokens, budget):
  """(state, Retrieve(q)) when BM25 returns at least one stored fact, else None."""
  cmd = cmds.Command(cmds.RETRIEVE, {'query': view.example.question})
  tr = mexec.execute(state, cmd, ExecutorConfig(context_budget=budget), count_tokens)
  facts = {f.unit_id for f in view.facts}
  got = set()
  for it in tr.state_after.C:
    if it.kind == mstate.RETRIEVED:
      got.update(it.evidence)
  return (state, cmd) if tr.accepted and got & facts else None


def t_retrieve_not_history(view, rng, count_tokens, budget, phase=None):
  ds = _distractors(view, count_tokens, budget)
  if len(ds) < 2:
    return None
  b = _builder(view, count_tokens, sc.TASK_STATES['needs_stored'])
  for f in view.facts:
    b.entry(f.text, (f.unit_id,))
  for d in ds[:rng.randint(1, 2)]:  # related distractors that already left C
    b.observe(d.text, d.unit_ids, in_context=False)
  b.task_action(sc.CONTINUE_ACTION)
  last = ds[-1]
  b.observe(last.text, last.unit_ids, current=True)
  return _retrieve_brings_evidence(view, b.finish(), count_tokens, budget)


def _select_state(view, rng, count_tokens, budget, ltm_distractors):
  gold = _gold(view, count_tokens, budget)
  if not gold:
    return None
  gold = gold[:]
  rng.shuffle(gold)
  chosen = gold[:rng.randint(1, len(gold))]
  b = _builder(view, count_tokens, sc.TASK_STATES['needs_history'])
  hids = [b.observe(g.text, g.unit_ids, in_context=False)[0] for g in chosen]
  b.task_action(sc.CONTINUE_ACTION)
  ds = _distractors(view, count_tokens, budget)
  if ltm_distractors:
    if not ds:
      return None
    for d in ds[:2]:
      b.entry(d.fact_text(0), (d.unit_ids[0],))
  if not _distractor_context(b, view, rng, count_tokens, budget, rng.randint(1, 2)):
    return None
  if sum(count_tokens(g.text) for g in chosen) + b.context_tokens() > budget:
    return None
  return b.finish(), cmds.Command(cmds.SELECT_EPISODE, {'selected_refs': hids})


def t_select_from_history(view, rng, count_tokens, budget, phase=None):
  return _select_state(view, rng, count_tokens, budget, False)


def t_select_not_ltm(view, rng, count_tokens, budget, phase=None):
  return _select_state(view, rng, count_tokens, budget, True)


def _filter_state(view, rng, count_tokens, budget, verbose):
  gold = _gold(view, count_tokens, budget)
  ds = _distractors(view, count_tokens, budget)
  if not gold or not ds:
    return None
  if verbose:
    ds = sorted(ds, key=lambda d: -count_tokens(d.text))[:2]
    gold = [g.compact() for g in gold]
  else:
    ds = ds[:4]
    rng.shuffle(ds)
    ds = ds[:rng.randint(1, len(ds))]
  b = _builder(view, count_tokens, sc.TASK_STATES['reading'])
  gold_tokens = sum(count_tokens(g.text) for g in gold)
  drops = []
  for d in ds:
    if sc.fits(b, d.text, budget - gold_tokens):
      drops.append(b.observe(d.text, d.unit_ids)[1])
  if not drops:
    return None
  for k, g in enumerate(gold):
    b.observe(g.text, g.unit_ids, current=k == len(gold) - 1)
  if b.context_tokens() > budget:
    return None
  return b.finish(), cmds.Command(cmds.FILTER, {'drop_refs': drops})


def t_filter_distractors(view, rng, count_tokens, budget, phase=None):
  return _filter_state(view, rng, count_tokens, budget, False)


def t_filter_verbose_distractors(view, rng, count_tokens, budget, phase=None):
  return _filter_state(view, rng, count_tokens, budget, True)


def t_summarize_long_evidence(view, rng, count_tokens, budget, phase=None):
  gold = _gold(view, count_tokens, budget)
  longs = [g for g in gold if not all(g.gold_mask)]
  if not longs:
    return None
  g = _pick(rng, longs)
  others = [o.compact() for o in gold if o is not g]
  b = _builder(view, count_tokens, sc.TASK_STATES['reading'])
  cid = b.observe(g.text, g.unit_ids)[1]
  for k, o in enumerate(others):
    b.observe(o.text, o.unit_ids, current=k == len(others) - 1)
  if b.context_tokens() > budget:
    return None
  return b.finish(), cmds.Command(cmds.SUMMARIZE, {'source_refs': [cid],
                                                   'summary': g.compact().text})


def t_summarize_all_relevant(view, rng, count_tokens, budget, phase=None):
  gold = _gold(view, count_tokens, budget)
  if len(gold) < 2 or all(all(g.gold_mask) for g in gold):
    return None
  gold = gold[:]
  rng.shuffle(gold)
  b = _builder(view, count_tokens, sc.TASK_STATES['reading'])
  cids = [b.observe(g.text, g.unit_ids)[1] for g in gold]
  if b.context_tokens() > budget:
    return None
  summary = ' '.join(g.compact().text for g in gold)
  return b.finish(), cmds.Command(cmds.SUMMARIZE, {'source_refs': cids,
                                                   'summary': summary})


def t_null_settled(view, rng, count_tokens, budget, phase=None):
  gold = [g.compact() for g in view.gold_docs]
  b = _builder(view, count_tokens, sc.TASK_STATES['reading'])
  for f in view.facts:
    b.entry(f.text, (f.unit_id,))
  for k, g in enumerate(gold):
    b.observe(g.text, g.unit_ids, current=k == len(gold) - 1)
  if b.context_tokens() > budget:
    return None
  del rng
  return b.finish(), cmds.Command(cmds.NULL)


def t_null_duplicate(view, rng, count_tokens, budget, phase=None):
  del budget
  facts = list(view.facts)
  rng.shuffle(facts)
  k = rng.randint(1, len(facts))
  b = _builder(view, count_tokens, sc.TASK_STATES['new_document'])
  for f in facts[:k]:
    b.entry(f.text, (f.unit_id,))
  f = _pick(rng, facts[:k])
  b.observe(f.text, (f.unit_id,), current=True)
  return b.finish(), cmds.Command(cmds.NULL)


def t_null_already_retrieved(view, rng, count_tokens, budget, phase=None):
  b = _builder(view, count_tokens, sc.TASK_STATES['needs_stored'])
  eids = [b.entry(f.text, (f.unit_id,)) for f in view.facts]
  rng.shuffle(eids)
  for e in eids:
    b.retrieved(e)
  if b.context_tokens() > budget:
    return None
  return b.finish(), cmds.Command(cmds.NULL)


_LTM = ('A', 'C')
_STM = ('B', 'C')
TEMPLATES = (
    Template('add_new_fact', cmds.ADD, False, _LTM, t_add_new_fact),
    Template('add_same_topic', cmds.ADD, True, _LTM, t_add_same_topic),
    Template('update_correction', cmds.UPDATE, False, _LTM, t_update_correction),
    Template('update_partial', cmds.UPDATE, True, _LTM, t_update_partial),
    Template('delete_obsolete', cmds.DELETE, False, _LTM, t_delete_obsolete),
    Template('delete_duplicate', cmds.DELETE, True, _LTM, t_delete_duplicate),
    Template('retrieve_from_ltm', cmds.RETRIEVE, False, _STM, t_retrieve_from_ltm),
    Template('retrieve_not_history', cmds.RETRIEVE, True, _STM,
             t_retrieve_not_history),
    Template('select_from_history', cmds.SELECT_EPISODE, False, _STM,
             t_select_from_history),
    Template('select_not_ltm', cmds.SELECT_EPISODE, True, _STM, t_select_not_ltm),
    Template('filter_distractors', cmds.FILTER, False, _STM, t_filter_distractors),
    Template('filter_verbose_distractors', cmds.FILTER, True, _STM,
             t_filter_verbose_distractors),
    Template('summarize_long_evidence', cmds.SUMMARIZE, False, _STM,
             t_summarize_long_evidence),
    Template('summarize_all_relevant', cmds.SUMMARIZE, True, _STM,
             t_summarize_all_relevant),
    Template('null_settled', cmds.NULL, False, ('A', 'B', 'C'), t_null_settled),
    # Phase A only: in B/C, facts stored but absent from C would call for Retrieve.
    Template('null_duplicate', cmds.NULL, True, ('A',), t_null_duplicate),
    Template('null_already_retrieved', cmds.NULL, True, _STM,
             t_null_already_retrieved),
)
TEMPLATES_BY_NAME = {t.name: t for t in TEMPLATES}


def templates_for(op, is_boundary):
  """The templates of target `op` that are (or are not) boundary templates."""
  return tuple(t for t in TEMPLATES if t.op == op and t.is_boundary == is_boundary)


# ---------------------------------------------------------------------------
# The seven filters.


def _cited_refs(cmd):
  refs = []
  for name in ('memory_id',):
    v = cmd.get(name)
    if isinstance(v, str):
      refs.append(v)
  for name in ('source_refs', 'drop_refs', 'selected_refs'):
    v = cmd.get(name)
    if isinstance(v, tuple):
      refs.extend(v)
  return refs


def _words(text):
  return set(_WORD.findall(text.casefold()))


def check_candidate(state, command_text, *, phase, count_tokens, executor_config,
                    policy_input):
  """Runs the seven deterministic filters of paper D.3 on one candidate.

  Args:
    state: s_i (MemoryState).
    command_text: the candidate u_i as text.
    phase: 'A' | 'B' | 'C' (the allowed op subspace PHASE_OPS[phase]).
    count_tokens: `str -> int` (tokens).
    executor_config: ExecutorConfig for the transition check (its phase is replaced by
      `phase`).
    policy_input: x_i = g(s_i), what the policy (and teacher) saw.

  Returns:
    (Command or None, list of failed filter names with reasons). Empty list = pass.
  """
  failures = []
  cmd = cmds.parse_command(command_text, executor_config.max_command_chars)
  if isinstance(cmd, cmds.ParseError):
    return None, [f'one_operation: {cmd.message}']
  allowed = cmds.PHASE_OPS[phase]
  if cmd.op not in allowed:
    failures.append(f'op_allowed: {cmd.op} not in phase {phase}')
  problems = cmds.schema_problems(cmd)
  for name, kind in cmds.SCHEMAS.get(cmd.op, ()):
    v = cmd.get(name)
    if kind == 'str' and isinstance(v, str) and not v.strip():
      problems.append(f'{name} is empty')
    if kind == 'list' and isinstance(v, tuple) and not v:
      problems.append(f'{name} is empty')
  if problems:
    failures.append('required_args: ' + '; '.join(problems))
  for ref in _cited_refs(cmd):
    p = mstate.parse_id(ref)
    if p is None:
      failures.append(f'refs_exist: {ref!r} is not a record id')
    elif p[0] != state.ns:
      failures.append(f'same_instance: {ref!r} belongs to another task')
    elif (state.entry(ref) or state.item(ref) or state.event(ref)) is None:
      failures.append(f'refs_exist: {ref!r} does not exist')
  if failures:
    return cmd, failures
  config = dataclasses.replace(executor_config, phase=phase, allowed_ops=None)
  tr = mexec.execute(state, cmd, config, count_tokens)
  if not tr.accepted:
    kinds = {v.kind for v in tr.violations}
    if 'leakage' in kinds:
      failures.append(f'no_leakage: executor: {tr.message}')
    if kinds - {'leakage'}:
      failures.append(f'transition_valid: {tr.message}')
    return cmd, failures
  visible = _words(policy_input)
  visible_norm = ' ' + checks.normalize_answer_like(policy_input) + ' '
  lowered_input = policy_input.casefold()
  for name in _WRITTEN_ARGS + ('reason',):
    v = cmd.get(name)
    if not isinstance(v, str):
      continue
    if name != 'reason':
      unseen = _words(v) - visible
      if unseen:
        failures.append(f'no_leakage: {name} writes words not in x_i: '
                        f'{sorted(unseen)[:5]}')
    for f in state.forbidden:
      nf = checks.normalize_answer_like(f)
      if nf and f' {nf} ' in f' {checks.normalize_answer_like(v)} ' and (
          f' {nf} ' not in visible_norm):
        failures.append(f'no_leakage: {name} writes a forbidden string')
    low = v.casefold()
    for marker in LABEL_MARKERS:
      if marker in low and marker not in lowered_input:
        failures.append(f'no_leakage: {name} writes the label marker {marker!r}')
  return cmd, failures


def dedupe_key(state, cmd):
  """(state hash, op, canonical args): equal keys mean the same supervised decision."""
  digest = hashlib.sha1(state.to_json().encode('utf-8')).hexdigest()
  return digest, cmd.op, cmd.args


# ---------------------------------------------------------------------------
# Teacher backend (optional).

# Our own wording of the teacher instruction (paper D.2 describes its content).
TEACHER_SYSTEM_PROMPT = (
    'You label training data for a memory manager. Read the memory-decision state and '
    'reply with the single best memory command for it, or the null command when '
    'nothing should change. Rely only on what the state shows; never use outside '
    'knowledge or guess an answer. Guidance: Add stores a new durable fact that '
    'long-term memory lacks; Update revises an entry that new evidence corrects or '
    'completes; Delete retires an entry that is wrong, obsolete or duplicated; '
    'Retrieve brings stored facts into the context when they are missing there; '
    'Filter drops context items that do not help the question; SelectEpisode brings '
    'back earlier events of this task from the history; Summarize shortens relevant '
    'but long context items faithfully; the null command keeps everything as is. '
    'Output exactly one command in the syntax the state lists, with no explanation, '
    'no markdown and no second command.')


def teacher_messages(policy_input, state, phase):
  """Chat messages for the teacher: x_i, the allowed ops and the visible record ids."""
  allowed = ', '.join(op if op != cmds.NULL else cmds.NULL_SYMBOL
                      for op in cmds.PHASE_OPS[phase])
  ids = [e.id for e in state.active_entries()] + [it.id for it in state.C] + [
      h.id for h in state.H if h.kind not in mstate.POLICY_AUTHORED_EVENTS]
  user = (f'{policy_input}\n\nAllowed operations: {allowed}\n'
          f'Record ids you may cite: {", ".join(ids)}\n'
          'Reply with one command only.')
  return [{'role': 'system', 'content': TEACHER_SYSTEM_PROMPT},
          {'role': 'user', 'content': user}]


class TeacherError(RuntimeError):
  """The teacher endpoint failed or answered in an unexpected shape."""


class OpenAICompatibleTeacher:
  """Teacher over an OpenAI-compatible chat-completions endpoint (`http_chat`).

  The API key comes from the environment variable `api_key_env`, read when the
  teacher is built (optional for local endpoints), and is sent only in the
  Authorization header; it is never logged or put in an error message.

  Args:
    base_url, model: endpoint root (…/v1) and model name.
    api_key_env: name of the environment variable holding the key.
    timeout_s: HTTP timeout (seconds).
    max_tokens, temperature: decoding of the reply.
    max_retries, backoff_s: retries of retryable transport failures with
      exponential backoff (default none: a failed state falls back to its template).

  Raises:
    ValueError: empty base_url or model.
  """

  def __init__(self, base_url, model, *, api_key_env='VERMEM_TEACHER_API_KEY',
               timeout_s=30.0, max_tokens=256, temperature=0.7, max_retries=0,
               backoff_s=1.0):
    if not base_url or not model:
      raise ValueError('OpenAICompatibleTeacher needs base_url and model')
    self.model = model
    self.api_key_env = api_key_env
    self.max_tokens = max_tokens
    self.temperature = temperature
    self._client = http_chat.ChatClient(
        base_url, model, api_key_env=api_key_env, require_api_key=False,
        timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s)
    self.url = self._client.url

  @property
  def timeout_s(self):
    return self._client.timeout_s

  @classmethod
  def from_config(cls, config):
    return cls(config.teacher_base_url, config.teacher_model,
               api_key_env=config.teacher_api_key_env,
               timeout_s=config.teacher_timeout_s,
               max_tokens=config.teacher_max_tokens,
               temperature=config.teacher_temperature)

  def __call__(self, messages):
    """Returns the reply text of one chat completion (stripped). Raises TeacherError."""
    try:
      content = self._client.complete(messages, max_tokens=self.max_tokens,
                                      temperature=self.temperature)
    except http_chat.ChatError as e:
      raise TeacherError(f'teacher endpoint: {e}') from None
    return content.strip()


# ---------------------------------------------------------------------------
# Builder.


def _record(state, cmd, *, template, phase, split, source, policy_input):
  return SFTRecord(policy_input=policy_input, target=cmds.format_command(cmd),
                   op=cmd.op, template=template.name,
                   is_boundary=template.is_boundary, example_id=state.task_id,
                   split=split, phase=phase, source=source, state=state)


def _build_split(examples, split, n_per_target, config, count_tokens, teacher,
                 report, verbose_failures):
  records = []
  if n_per_target == 0:
    return records
  if not examples:
    raise ValueError(f'SFT {split}: the example pool is empty')
  views = {}
  exec_config = ExecutorConfig(context_budget=config.context_budget,
                               policy_input_limit=config.policy_input_limit)
  n_boundary = math.ceil(n_per_target * config.boundary_fraction)
  n_teacher = int(round(n_per_target * config.teacher_fraction)) if teacher else 0
  seen = set()
  for op in TARGETS:
    order = list(range(len(examples)))
    random.Random(f'{config.seed}:sft:{split}:{op}:order').shuffle(order)
    got = {True: 0, False: 0}
    teacher_got = 0
    quota = {True: n_boundary, False: n_per_target - n_boundary}
    max_attempts = config.max_attempts_per_record * n_per_target + len(examples)
    attempt = 0
    while got[True] + got[False] < n_per_target:
      if attempt >= max_attempts:
        raise ValueError(
            f'SFT {split}: only {got[True] + got[False]} of {n_per_target} valid '
            f'{op} states after {attempt} attempts from {len(examples)} examples; '
            'use more examples or fewer records per target')
      rng = random.Random(f'{config.seed}:sft:{split}:{op}:{attempt}')
      ex = examples[order[attempt % len(order)]]
      attempt += 1
      report.attempts += 1
      boundary = got[True] < quota[True]
      template = _pick(rng, templates_for(op, boundary))
      view = views.get(ex.id)
      if view is None:
        view = views[ex.id] = sc.build_view(
            ex, count_tokens, max_doc_sentences=config.max_doc_sentences,
            max_doc_tokens=config.max_doc_tokens)
      if not view.facts:
        continue  # no supporting fact resolves: nothing to build states around
      phase = _pick(rng, template.phases)
      built = template.build(view, rng, count_tokens, config.context_budget, phase)
      if built is None:
        continue
      state, cmd = built
      x = serialization.render_policy_input(
          state, count_tokens, allowed_ops=cmds.PHASE_OPS[phase],
          limit=config.policy_input_limit, context_budget=config.context_budget)
      source = 'template'
      if teacher is not None and teacher_got < n_teacher:
        report.teacher_requests += 1
        try:
          reply = teacher(teacher_messages(x, state, phase))
        except TeacherError:
          report.teacher_errors += 1
          reply = None
        if reply is not None:
          tcmd, fails = check_candidate(state, reply, phase=phase,
                                        count_tokens=count_tokens,
                                        executor_config=exec_config, policy_input=x)
          if not fails and tcmd.op == op and dedupe_key(state, tcmd) not in seen:
            cmd, source = tcmd, 'teacher'
            report.teacher_accepted += 1
          else:
            report.teacher_rejected += 1
      text = cmds.format_command(cmd)
      checked, fails = check_candidate(state, text, phase=phase,
                                       count_tokens=count_tokens,
                                       executor_config=exec_config, policy_input=x)
      if fails:
        for f in fails:
          report.filter_failures[f.split(':', 1)[0]] += 1
        if verbose_failures:
          print(f'SFT filter: {template.name} on {ex.id}: {fails}')
        continue
      key = dedupe_key(state, checked)
      if key in seen:
        report.duplicates += 1
        continue
      seen.add(key)
      got[boundary] += 1
      if source == 'teacher':
        teacher_got += 1
      report.counts[(split, op, template.name, source)] += 1
      records.append(_record(state, checked, template=template, phase=phase,
                             split=split, source=source, policy_input=x))
  return records


def build_sft_set(construction, dev, *, count_tokens, config=SFTDataConfig(),
                  teacher=None, verbose=True, verbose_failures=False):
  """Builds the balanced SFT train and dev records (SPEC §4, paper D.1–D.3).

  Args:
    construction: Examples of the construction pool (train records).
    dev: Examples of the internal-dev pool (dev records).
    count_tokens: `str -> int` backbone token counter (tokens).
    config: SFTDataConfig.
    teacher: optional callable messages -> reply text (default: an
      OpenAICompatibleTeacher when config.teacher_backend is set, else none).
    verbose: print the per-target / per-template table.
    verbose_failures: print each filtered-out template candidate (debugging).

  Returns:
    (train_records, dev_records, SFTBuildReport). Each split holds exactly
    `*_per_target` records of every target in TARGETS, in target order.

  Raises:
    ValueError: an empty pool, or a class cannot be filled from the pool.
  """
  if teacher is None and config.teacher_backend == 'openai_compatible':
    teacher = OpenAICompatibleTeacher.from_config(config)
  if teacher is not None and config.teacher_fraction <= 0.0:
    teacher = None  # template_fraction 1.0: no teacher share
  report = SFTBuildReport()
  train = _build_split(construction, 'train', config.train_per_target, config,
                       count_tokens, teacher, report, verbose_failures)
  dev_records = _build_split(dev, 'dev', config.dev_per_target, config, count_tokens,
                             teacher, report, verbose_failures)
  if verbose:
    print(report.format_table())
  return train, dev_records, report
