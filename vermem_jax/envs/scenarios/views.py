"""Example views: the documents and supporting facts of an example, capped.

SPEC §4, paper Appendix D.1 (training-instance construction) and D.4. `build_view`
turns a HotpotQA example into gold and distractor documents (`Doc`, sentence- and
token-capped so several fit the context budget) and its supporting facts (`Fact`).
The supporting-fact labels only choose content; they are never written into a state.
Shared by the phase generators and the SFT templates (`envs.sft_data`).
"""

from __future__ import annotations

import dataclasses
import functools
import html

from vermem_jax.envs import documents
from vermem_jax.envs import hotpotqa
from vermem_jax.memory import bm25_index


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
    return documents.chunk_text(self.display_title, self.sentences)

  def chunks(self, cap, count_tokens):
    """The document as it enters the environment (`envs.documents`): [self] when
    its text fits `cap` tokens, else one Doc per sentence chunk, in order."""
    groups = documents.sentence_chunks(self.display_title, self.sentences, cap,
                                       count_tokens)
    if len(groups) <= 1:
      return [self]
    return [dataclasses.replace(self, unit_ids=tuple(self.unit_ids[i] for i in g),
                                sentences=tuple(self.sentences[i] for i in g),
                                gold_mask=tuple(self.gold_mask[i] for i in g))
            for g in groups]

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
