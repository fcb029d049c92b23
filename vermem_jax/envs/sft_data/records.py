"""SFT records (x_i, u*_i) and the build report (SPEC §4, paper D.3).

`cmds.ALL_OPS` are the eight classes of the set: the seven tools and ∅ ('Null'), exactly
balanced per split.
"""

from __future__ import annotations

import collections
import dataclasses

from vermem_jax.memory import commands as cmds
from vermem_jax.memory import state as mstate


@dataclasses.dataclass(frozen=True)
class SFTRecord:
  """One supervised decision (x_i, u*_i).

  Attributes:
    policy_input: x_i = g(s_i) (the prompt; no loss on it).
    target: u*_i as canonical command text (the only tokens with loss).
    op: target op name (one of cmds.ALL_OPS).
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
      lines.append(f'{split}: ' + ', '.join(f'{op}={per[op]}' for op in cmds.ALL_OPS))
    lines.append(f'attempts={self.attempts} duplicates={self.duplicates} '
                 f'filter_failures={dict(self.filter_failures)} '
                 f'teacher: requests={self.teacher_requests} '
                 f'accepted={self.teacher_accepted} rejected={self.teacher_rejected} '
                 f'errors={self.teacher_errors}')
    return '\n'.join(lines)
