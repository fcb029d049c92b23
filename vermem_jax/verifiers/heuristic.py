"""Deterministic rule-based verifier: the CPU default backend.

A stand-in for the paper's frozen LLM verifiers (Appendix F.1 uses DeepSeek-V3.2): it
gives the same four local dimensions and two global dimensions on the same 0..4 scale
from lexical rules over the realized transition, so training runs end to end without an
LLM judge. It is not a semantic judge; swap in `local_model` or `openai_compatible`
for real runs through `config.verifier.backend`.

Signals (all from the inputs' scope, never labels or later states):
  * need: content words of q, plus "bridge" names found in visible items that
    mention q strongly (one hop, so a fact about q's bridge entity counts as relevant);
  * relevance: need words a text contains, relative to the most on-topic visible item;
  * grounding: share of a written text's content words found in its cited sources;
  * progress: whether the transition brings need words the context (or memory) lacked,
    removes irrelevant or duplicated items, or shrinks the context faithfully;
  * fidelity: numbers, dates and capitalized names kept and not invented.
  * global, with training labels (`base.LabeledGlobalVerifierInput`, Appendix F.3): the
    share of annotated supporting units the terminal M and C still hold (by provenance
    or wording) caps v^coh (a complete evidence chain) and v^state (critical facts kept
    accessible); the reference answer's words being present in the kept evidence is a
    second chain check. Answer correctness itself is never rescored.
Thresholds live in `HeuristicRules`; they are this project's decisions, not SPEC values.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable, Sequence

from vermem_jax.verifiers import base

_TOKEN = re.compile(r"[a-z0-9]+")
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_CAP_WORD = re.compile(r"\b[A-Z][A-Za-z\-']*[a-z]")
_SENT_SPLIT = re.compile(r"(?:^|[.!?]\s+|\n+|:\s+|\"\s*)")
# An evidence-unit id "{title}#{sent_id}" (SPEC §4); its title names the sentence's
# subject, which pronoun-led sentences ("He was born ...") do not repeat.
_EVIDENCE_REF = re.compile(r"^(.+)#\d+$")
_MONTHS = frozenset("january february march april may june july august september "
                    "october november december".split())
_STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been
before being below between both but by can could did do does doing down during each
few for from further had has have having he her here hers herself him himself his how
i if in into is it its itself just me more most my myself no nor not now of off on
once only or other our ours ourselves out over own same she should so some such than
that the their theirs them themselves then there these they this those through to too
under until up very was we were what when where which while who whom why will with
would you your yours yourself yourselves whose many much one ones s t
""".split())


@dataclasses.dataclass(frozen=True)
class HeuristicRules:
  """Thresholds of the rule-based verifier (project decisions, see module docstring).

  Attributes:
    bridge_min_hits: a visible item with at least this many q words contributes its
      numbers and capitalized names to the need (one-hop bridge entities).
    bridge_weight: a bridge name counts this fraction of a q word in relevance.
    relevance_bins: relevance score = number of these ratios reached, the ratio being
      a text's need hits over those of the most on-topic visible item (HotpotQA
      distractors share many q words, so an absolute count saturates).
    min_ref_hits: floor of that reference, so one weak match in a state of
      unrelated items does not count as fully relevant.
    support_bins: grounding score = number of these support fractions reached
      (support = share of content words found in the cited sources).
    novelty_bins: progress score bins for the share of new content words.
    reduction_bins: Summarize progress bins for the fraction of words removed.
    duplicate_overlap: share of an item's words covered by another item above which
      the item counts as a duplicate.
    conflict_overlap: share of non-key words two items must share to be statements
      about the same thing (then differing numbers/names make them conflict).
    uncited_grounding_cap: grounding cap when cited sources are not visible but the
      words occur elsewhere in the visible evidence.
    noise_fraction: context share of irrelevant items above which ∅ misses a Filter.
    noise_relevance: items whose relevance score is at most this count as noise.
  """
  bridge_min_hits: int = 2
  bridge_weight: float = 0.5
  relevance_bins: tuple[float, ...] = (1e-9, 0.2, 0.4, 0.6)
  min_ref_hits: float = 2.0
  support_bins: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)
  novelty_bins: tuple[float, ...] = (1e-9, 0.15, 0.3, 0.5)
  reduction_bins: tuple[float, ...] = (1e-9, 0.15, 0.3, 0.5)
  duplicate_overlap: float = 0.9
  conflict_overlap: float = 0.5
  uncited_grounding_cap: int = 2
  noise_fraction: float = 0.5
  noise_relevance: int = 1


# ----------------------------------------------------------------------------- text


def tokens(text: str) -> list[str]:
  """Lowercased alphanumeric tokens of `text`."""
  return _TOKEN.findall(text.lower())


_SUFFIXES = ("ing", "ed", "er", "or", "es", "s")


def _stem(word: str) -> str:
  """Crude suffix stripping so 'directed', 'director' and 'direct' match."""
  if word.isdigit():
    return word
  for suf in _SUFFIXES:
    if word.endswith(suf) and len(word) - len(suf) >= 4:
      return word[: -len(suf)]
  return word


def content_terms(text: str) -> set[str]:
  """Stemmed content words: tokens minus stopwords and single letters."""
  return {_stem(t) for t in tokens(text)
          if t not in _STOPWORDS and (len(t) > 1 or t.isdigit())}


def key_facts(text: str) -> set[str]:
  """Numbers, month names and capitalized names (lowercased) that fidelity tracks.

  Capitalized words that only start a sentence are skipped; stopwords never count.
  """
  facts = {n.replace(",", "") for n in _NUMBER.findall(text)}
  facts |= {t for t in tokens(text) if t in _MONTHS}
  starts = {m.end() for m in _SENT_SPLIT.finditer(text)}
  for m in _CAP_WORD.finditer(text):
    word = m.group(0).lower()
    if m.start() in starts or word in _STOPWORDS:
      continue
    facts.update(tokens(word))
  return facts


def numbers_and_dates(text: str) -> set[str]:
  return ({n.replace(",", "") for n in _NUMBER.findall(text)}
          | {t for t in tokens(text) if t in _MONTHS})


def _fact_vocab(text: str) -> set[str]:
  """What a key fact is checked against: tokens plus normalized numbers."""
  return set(tokens(text)) | {n.replace(",", "") for n in _NUMBER.findall(text)}


def _fraction(part: int, whole: int, empty: float = 1.0) -> float:
  return part / whole if whole else empty


def _bin(x: float, thresholds: Sequence[float]) -> int:
  """Number of thresholds reached (0..4 for four thresholds)."""
  return sum(1 for t in thresholds if x >= t)


def _clip(score: float) -> int:
  return int(min(base.SCORE_MAX, max(base.SCORE_MIN, score)))


def _join(items: Iterable[base.ItemView]) -> str:
  return "\n".join(it.text for it in items)


# ------------------------------------------------------------------- need / relevance


@dataclasses.dataclass(frozen=True)
class _Need:
  q_terms: frozenset[str]
  bridge: frozenset[str]
  weight: float
  ref_hits: float  # need hits of the most on-topic visible item
  bins: tuple[float, ...]

  def hits(self, terms: set[str]) -> float:
    return len(terms & self.q_terms) + self.weight * len(terms & self.bridge)

  def relevance(self, text: str) -> int:
    """0 (no need word) .. 4 (as on-topic as the best visible item, or close)."""
    h = self.hits(content_terms(text))
    if h <= 0:
      return 0
    return _bin(h / max(self.ref_hits, h), self.bins)


def _need(question: str, items: Sequence[base.ItemView], rules: HeuristicRules) -> _Need:
  q = frozenset(content_terms(question))
  bridge = set()
  for it in items:
    if len(content_terms(it.text) & q) >= rules.bridge_min_hits:
      bridge |= {_stem(f) for f in key_facts(it.text)} - q
  need = _Need(q, frozenset(bridge), rules.bridge_weight, 0.0, rules.relevance_bins)
  best = max((need.hits(content_terms(it.text)) for it in items), default=0.0)
  return dataclasses.replace(need, ref_hits=max(best, rules.min_ref_hits))


def _overlap(a: set[str], b: set[str]) -> float:
  """Share of `a` covered by `b`."""
  return _fraction(len(a & b), len(a), empty=0.0)


def _conflicts(x: str, y: str, rules: HeuristicRules) -> bool:
  """Same statement (shared non-key words) with different numbers or names."""
  kx, ky = key_facts(x), key_facts(y)
  wx, wy = content_terms(x) - kx, content_terms(y) - ky
  if not wx or _overlap(wx, wy) < rules.conflict_overlap:
    return False
  return bool(kx - _fact_vocab(y)) and bool(ky - _fact_vocab(x))


def _is_duplicate(x: str, others: Iterable[str], rules: HeuristicRules) -> bool:
  tx = content_terms(x)
  return any(_overlap(tx, content_terms(o)) >= rules.duplicate_overlap for o in others)


# --------------------------------------------------------------------------- verifier


class HeuristicVerifier(base.Verifier):
  """Rule-based local and global verifier (deterministic, no model).

  Same interface and 0..4 scale as the LLM backends; never malformed, so retries and
  fallbacks never trigger.
  """

  def __init__(self, config: base.VerifierConfig | None = None,
               rules: HeuristicRules | None = None):
    super().__init__(config or base.VerifierConfig())
    self.rules = rules or HeuristicRules()
    self._by_ref: dict[str, base.ItemView] = {}  # items of the input being scored

  def _score_local(self, inputs):
    return [self.score_local_one(x) for x in inputs]

  def _score_global(self, inputs):
    return [self.score_global_one(x) for x in inputs]

  # ---------------------------------------------------------------------- local

  def score_local_one(self, inp: base.LocalVerifierInput) -> base.LocalScores:
    """Rule-based local scores of one executed decision (Appendix F.2 dimensions)."""
    visible = inp.context_before + inp.memory_before + inp.visible_evidence
    self._by_ref = {}
    for it in visible + inp.transition.context_added + inp.transition.ltm_added:
      self._by_ref.setdefault(it.ref, it)
    need = _need(inp.question, [self._topical(it) for it in visible], self.rules)
    fn = getattr(self, f"_local_{inp.op}")
    rel, grd, prog, fid = fn(inp, need)
    return base.LocalScores(_clip(rel), _clip(grd), _clip(prog), _clip(fid))

  def _titles(self, refs: Iterable[str]) -> list[str]:
    """Titles of the evidence units behind `refs`, following source_refs."""
    titles, seen, todo = set(), set(), list(refs)
    while todo:
      r = todo.pop()
      if r in seen:
        continue
      seen.add(r)
      m = _EVIDENCE_REF.match(r)
      if m:
        titles.add(m.group(1))
      elif r in self._by_ref:
        todo.extend(self._by_ref[r].source_refs)
    return sorted(titles)

  def _topical(self, item: base.ItemView) -> base.ItemView:
    """`item` with its source titles appended, for relevance only."""
    titles = self._titles((item.ref,) + tuple(item.source_refs))
    if not titles:
      return item
    return dataclasses.replace(item, text=f"{item.text} [from {'; '.join(titles)}]")

  def _relevance(self, need, items: Iterable[base.ItemView]) -> int:
    return need.relevance(_join(self._topical(it) for it in items))

  def _sources(self, inp, refs: Sequence[str]) -> tuple[str, bool]:
    """Text of the cited sources; (all visible text, False) when none resolve."""
    pool = {}
    for it in inp.visible_evidence + inp.context_before + inp.memory_before:
      pool.setdefault(it.ref, it.text)
    found = [pool[r] for r in refs if r in pool]
    if found:
      return "\n".join(found), True
    return _join(inp.visible_evidence + inp.context_before), False

  def _grounding(self, text: str, source: str, cited: bool) -> int:
    score = _bin(_overlap(content_terms(text), content_terms(source)),
                 self.rules.support_bins)
    return score if cited else min(score, self.rules.uncited_grounding_cap)

  @staticmethod
  def _fidelity_of_write(text: str, source: str) -> int | None:
    """4 - 2 per number/date/name in `text` absent from `source`; None if none."""
    facts = key_facts(text)
    if not facts:
      return None
    return _clip(4 - 2 * len(facts - _fact_vocab(source)))

  def _local_Add(self, inp, need):
    added = inp.transition.ltm_added
    text = _join(added)
    refs = [r for it in added for r in it.source_refs]
    source, cited = self._sources(inp, refs)
    rel = self._relevance(need, added)
    grd = self._grounding(text, source, cited)
    novelty = 1.0 - _overlap(content_terms(text),
                             content_terms(_join(inp.memory_before)))
    prog = min(rel, _bin(novelty, self.rules.novelty_bins))
    fid = self._fidelity_of_write(text, source)
    return rel, grd, prog, grd if fid is None else fid

  def _local_Update(self, inp, need):
    ups = inp.transition.ltm_updated
    before, after = _join(u.before for u in ups), _join(u.after for u in ups)
    refs = [r for u in ups for r in u.after.source_refs]
    source, cited = self._sources(inp, refs)
    new_terms = content_terms(after) - content_terms(before)
    rel = self._relevance(need, [u.after for u in ups])
    if new_terms:
      grd = self._grounding(" ".join(sorted(new_terms)), source, cited)
      prog = min(rel, grd)
    else:  # a rewrite that adds nothing
      grd = self._grounding(after, source + "\n" + before, cited)
      prog = 1
    fid = self._fidelity_of_write(after, source + "\n" + before)
    return rel, grd, prog, grd if fid is None else fid

  def _local_Delete(self, inp, need):
    deleted = inp.transition.ltm_deleted
    text = _join(deleted)
    gone = {it.ref for it in deleted}
    others = [it.text for it in inp.memory_before if it.ref not in gone]
    evidence = others + [it.text for it in inp.visible_evidence + inp.context_before]
    redundant = _is_duplicate(text, others, self.rules)
    superseded = any(_conflicts(text, e, self.rules) for e in evidence)
    reason = str(inp.arguments.get("reason", "")).strip()
    if redundant or superseded:
      return 4, (4 if reason else 3), 4, 4
    if self._relevance(need, deleted) <= self.rules.noise_relevance:
      return 3, (3 if reason else 2), 3, 4
    # A relevant, unique, uncontradicted entry: the deletion loses needed facts.
    lost = key_facts(text) - _fact_vocab("\n".join(evidence))
    return 1, 0, 0, (0 if lost else 1)

  def _missing_gain(self, need, added: Sequence[base.ItemView],
                    context: Sequence[base.ItemView]) -> float:
    covered = content_terms(_join(context))
    new = content_terms(_join(added)) - covered
    return need.hits(new)

  def _insertion_scores(self, inp, need, added, origin: Sequence[base.ItemView]):
    """Shared by Retrieve and SelectEpisode: items copied into C from M or H."""
    gain = self._missing_gain(need, added, inp.context_before)
    prog = 0 if gain <= 0 else _clip(1 + math.floor(gain))
    noisy = sum(1 for it in added
                if self._relevance(need, [it]) <= self.rules.noise_relevance)
    if added and noisy / len(added) > self.rules.noise_fraction:
      prog -= 1
    origin_texts = {it.text.strip() for it in origin}
    if origin_texts:
      verbatim = sum(1 for it in added if it.text.strip() in origin_texts)
      copied = _bin(_fraction(verbatim, len(added)), self.rules.support_bins)
    else:
      copied = 4 if all(it.source_refs for it in added) else 2
    return prog, copied

  def _local_Retrieve(self, inp, need):
    added = inp.transition.context_added
    query = str(inp.arguments.get("query", "")) or inp.command
    rel = need.relevance(query)
    if not added:
      return rel, 2, 0, 4
    prog, copied = self._insertion_scores(inp, need, added, inp.memory_before)
    if prog <= 0:  # nothing the context lacked: the retrieval served no need
      rel = min(rel, 1)
    return rel, copied, prog, copied

  def _local_SelectEpisode(self, inp, need):
    added = inp.transition.context_added
    rel = max((self._relevance(need, [it]) for it in added), default=0)
    prog, copied = self._insertion_scores(inp, need, added, inp.visible_evidence)
    if prog <= 0:
      rel = min(rel, 1)
    return rel, copied, prog, copied

  def _local_Filter(self, inp, need):
    removed = inp.transition.context_removed
    gone = {it.ref for it in removed}
    remaining = [it.text for it in inp.context_before if it.ref not in gone]
    noise, lost = 0.0, 0
    kept_terms = content_terms("\n".join(remaining))
    for it in removed:
      rel_it = self._relevance(need, [it])
      if rel_it <= self.rules.noise_relevance or _is_duplicate(
          it.text, remaining, self.rules):
        noise += 1
      elif rel_it >= 3 and need.hits(content_terms(it.text) - kept_terms) > 0:
        lost += 1  # on-topic and not covered by what stays
      else:
        noise += 0.5  # loosely related: dropping it is neither clearly right nor wrong
    frac = _fraction(noise, len(removed), empty=0.0)
    rel = _bin(frac, (1e-9, 0.5, 0.75, 1.0))
    prog = min(1, rel) if lost else rel
    return rel, rel, prog, 4 - 2 * lost

  def _local_Summarize(self, inp, need):
    removed = inp.transition.context_removed
    summary = _join(inp.transition.context_added)
    source = _join(removed)
    rel = max(self._relevance(need, inp.transition.context_added),
              self._relevance(need, removed) - 1)
    grd = self._grounding(summary, source, True)
    t = inp.transition
    if t.context_tokens_before is not None and t.context_tokens_after is not None:
      before, after = t.context_tokens_before, t.context_tokens_after
      reduction = _fraction(before - after, before, empty=0.0)
    else:
      reduction = 1.0 - _fraction(len(tokens(summary)), len(tokens(source)), 1.0)
    need_src = (content_terms(source) & (need.q_terms | need.bridge))
    retained = _fraction(len(need_src & content_terms(summary)), len(need_src))
    prog = min(_bin(reduction, self.rules.reduction_bins),
               _bin(retained, self.rules.support_bins))
    src_numbers = numbers_and_dates(source)
    kept = _fraction(len(src_numbers & _fact_vocab(summary)), len(src_numbers))
    invented = key_facts(summary) - _fact_vocab(source)
    fid = _bin(kept, self.rules.support_bins) - 2 * len(invented)
    names = key_facts(source) - numbers_and_dates(source)
    if names and _overlap(names, _fact_vocab(summary)) < 0.5:
      fid -= 1
    return rel, grd, prog, fid

  def _local_Null(self, inp, need):
    allowed = set(inp.allowed_ops)
    context_terms = content_terms(_join(inp.context_before))
    memory_terms = content_terms(_join(inp.memory_before))
    pending_evidence = False
    if allowed & set(base.STM_OPS):
      in_context = {c.text.strip() for c in inp.context_before}
      outside = [it for it in inp.memory_before + inp.visible_evidence
                 if it.text.strip() not in in_context
                 and self._relevance(need, [it]) >= 3]  # on-topic, reachable
      gain = need.hits(content_terms(_join(outside)) - context_terms)
      pending_evidence |= gain >= 1
    if allowed & {"Add"}:
      for it in inp.context_before + inp.visible_evidence:
        if it.kind == "instruction":
          continue
        if (self._relevance(need, [it]) >= 3
            and _overlap(content_terms(it.text), memory_terms) < 0.5):
          pending_evidence = True  # a relevant fact nobody stored
    noisy = False
    if "Filter" in allowed:
      items = [it for it in inp.context_before if it.kind != "instruction"]
      irrelevant = sum(1 for it in items
                       if self._relevance(need, [it]) <= self.rules.noise_relevance)
      noisy = bool(items) and irrelevant / len(items) > self.rules.noise_fraction
    if pending_evidence:
      return 1, 1, 1, 4
    if noisy:
      return 2, 2, 2, 4
    return 4, 4, 4, 4

  # --------------------------------------------------------------------- global

  def score_global_one(self, inp: base.GlobalVerifierInput) -> base.GlobalScores:
    """Rule-based v^coh and v^state for one trajectory (Appendix F.3 dimensions)."""
    kept = inp.terminal_context + inp.terminal_ltm
    kept_text = _join(kept)
    kept_terms = content_terms(kept_text)
    q_terms = content_terms(inp.question)
    q_cov = _overlap(q_terms, kept_terms) if q_terms else 0.0
    cov_score = _bin(q_cov, (1e-9, 0.3, 0.5, 0.7))
    answer = (inp.final_answer or "").strip()
    if not answer:
      coh = 0
    else:
      a_terms = content_terms(answer)
      if not a_terms or answer.lower().strip(" .") in ("yes", "no"):
        coh = cov_score  # a yes/no answer rests on the question's entities alone
      else:
        support = _overlap(a_terms, kept_terms)
        seen = _overlap(a_terms, content_terms(_join(inp.observed_evidence)))
        coh = min(_bin(support, self.rules.support_bins), cov_score)
        if support == 0 and seen > 0:
          coh = 1  # the answer was observed but not kept in the evidence chain
    chain_facts, chain = self._label_chain(inp, kept, kept_terms)
    if chain is not None and answer:
      yes_no = not content_terms(answer) or answer.lower().strip(" .") in ("yes", "no")
      coh = chain if yes_no else min(coh, chain)  # a yes/no answer: the chain decides
    ltm = [it.text for it in inp.terminal_ltm]
    if not ltm:
      state = min(2, cov_score)
    else:
      observed = _join(inp.observed_evidence) if inp.observed_evidence else kept_text
      grounded = sum(
          1 for t in ltm
          if _overlap(content_terms(t), content_terms(observed))
          >= self.rules.support_bins[2])
      state = _bin(grounded / len(ltm), self.rules.support_bins)
      problems = 0
      for i, a in enumerate(ltm):
        for b in ltm[i + 1:]:
          if _conflicts(a, b, self.rules) or _is_duplicate(a, [b], self.rules):
            problems += 1
      state = min(state - problems, max(cov_score, 1))
    if chain_facts is not None:
      state = min(state, max(1, chain_facts))  # critical facts no longer accessible
    return base.GlobalScores(_clip(coh), _clip(state))

  def _label_chain(self, inp: base.GlobalVerifierInput, kept, kept_terms
                   ) -> tuple[int | None, int | None]:
    """(supporting-unit coverage score, chain score) from training labels, 0..4 each.

    A supporting unit counts as kept when its id is in the provenance closure of the
    terminal M and C items (source_refs followed through observed and deleted items),
    or when its sentence's content words are (support_bins[2]) covered by the kept
    text. The chain score is the lower of that and the coverage of the reference
    answer's words (non yes/no answers only). None where no label applies.
    """
    reference, facts = base.global_labels(inp)
    parts = []
    fact_score = None
    if facts:
      pool = {it.ref: it for it in
              inp.observed_evidence + inp.deleted_ltm + inp.terminal_ltm
              + inp.terminal_context}
      closure, todo = set(), [r for it in kept for r in (it.ref,) + it.source_refs]
      while todo:
        r = todo.pop()
        if r in closure:
          continue
        closure.add(r)
        if r in pool:
          todo.extend(pool[r].source_refs)
      covered = 0
      for f in facts:
        words = content_terms(f.text)
        if f.ref in closure or (
            words and _overlap(words, kept_terms) >= self.rules.support_bins[2]):
          covered += 1
      fact_score = _bin(covered / len(facts), self.rules.support_bins)
      parts.append(fact_score)
    ref = (reference or "").strip()
    ref_terms = content_terms(ref)
    if ref_terms and ref.lower().strip(" .") not in ("yes", "no"):
      parts.append(_bin(_overlap(ref_terms, kept_terms), self.rules.support_bins))
    return fact_score, (min(parts) if parts else None)
