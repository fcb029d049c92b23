"""ExecutorConfig: numbers of the memory environment (SPEC §1–3).

Field names equal the keys of `config.memory` in experiments/configs, so the config
layer builds it as `ExecutorConfig(**config.memory)`.
"""

import collections
import dataclasses
from typing import Iterable

from vermem_jax.memory import commands

# Violation kinds of the constraint channel (SPEC §3; paper Appendix F.5, Table 24).
VIOLATION_KINDS = ('parse', 'unknown_tool', 'bad_argument', 'missing_id',
                   'foreign_ref', 'unsupported_write', 'unjustified_delete',
                   'protected_removal', 'context_overflow', 'budget_exceeded',
                   'leakage', 'op_not_allowed')
# The two commonest causes of a rejection, reported apart in the phase summaries, by
# the kind of T_m's violation (a rejection's first; T_m stops at the first of these
# three, so a rejection has at most one part): 'unparseable' (text that is not a
# command, or names no known tool) and 'not_allowed' (a parsed call to a tool outside
# the phase's set).
REJECTION_PARTS = {'parse': 'unparseable', 'unknown_tool': 'unparseable',
                   'op_not_allowed': 'not_allowed'}


def rejection_parts(first_kinds: Iterable[str]) -> dict[str, int]:
  """{'unparseable': n, 'not_allowed': n} (REJECTION_PARTS) over the first violation
  kinds of rejected decisions; a kind of neither part counts in neither."""
  parts = collections.Counter(REJECTION_PARTS.get(kind) for kind in first_kinds)
  return {part: parts[part] for part in ('unparseable', 'not_allowed')}


def document_chunk_tokens(context_budget, max_doc_tokens):
  """The most tokens one document observation may have: `max_doc_tokens`, and at
  most a quarter of C's budget, so several documents and the room to restore one
  fit together (SPEC §7 decision: one rule for how a document enters the
  environment, used by the phase generators and the evaluation).

  Args:
    context_budget: C_t's budget (tokens).
    max_doc_tokens: the configured document cap (tokens).

  Returns:
    int >= 1 (tokens).
  """
  return max(1, min(int(max_doc_tokens), int(context_budget) // 4))


@dataclasses.dataclass(frozen=True)
class ExecutorConfig:
  """Configuration of T_m / T_e / g(s).

  Attributes:
    phase: curriculum phase 'A' | 'B' | 'C'; selects the operation subspace.
    allowed_ops: explicit op names overriding the phase subspace (None: PHASE_OPS).
    context_budget: token budget of C_t (SPEC §1 decision: 2,048 tokens).
    max_doc_tokens: document cap (SPEC §7 decision, `chunk_tokens`): a document
      longer than `chunk_tokens` enters the environment in sentence chunks, each its
      own observation, and T_e admits an observation into C only while C keeps
      `chunk_tokens` free, so any chunk held only in H can be restored by
      SelectEpisode (memory.interaction). The config ties it to
      `episodes.max_doc_tokens`, the phase generators' cap.
    retrieve_top_k: Retrieve results (SPEC §2 decision: top-k = 3).
    policy_input_limit: token limit of x_t = g(s_t) (SPEC §1: 8,192).
    policy_view_shares: (M, C, H) shares of g(s)'s remaining tokens when the views
      must be truncated (decision; SPEC §1 fixes only "budgeted views").
    bm25_k1, bm25_b: BM25 parameters (library defaults; SPEC gives none).
    max_command_chars: longer command texts are unparseable (input bound, decision).
    history_command_max_chars: a rejected command is stored in H truncated to this.
    max_tool_calls: tool budget per episode; 0 means no limit (SPEC §3 'tool budget').
    check_numbers_on_write: Add/Update content must pass the number/date support
      check that Summarize uses (source support, Appendix A.4).
    local_ids: g(s) shows this task's record ids without their namespace (`c2`, not
      `0df0fc:c2`; `serialization.localize_ids`). The executor accepts both forms
      either way (`state.qualify_id`). Decision: off at paper scale (SPEC's ids as
      stored); on at the CPU scale, where a small model trained from scratch does
      not learn to copy the 6 hex digits (issue 9: 8 of 8 Filter and SelectEpisode
      dev predictions had the right `c<n>`/`h<n>` under a wrong namespace).
    cost_*: constraint cost per violation kind (SPEC §3 decision, Table 24 defaults).
    cost_op_not_allowed: an op outside the phase subspace is treated like an unknown
      tool for that phase (decision; SPEC §3 'unknown tool 1.0').
    cost_cap: costs of one decision are summed over distinct kinds and capped (F.5).
  """
  phase: str = 'C'
  allowed_ops: tuple | None = None
  context_budget: int = 2048
  max_doc_tokens: int = 320
  retrieve_top_k: int = 3
  policy_input_limit: int = 8192
  policy_view_shares: tuple = (0.25, 0.45, 0.30)
  bm25_k1: float = 1.5
  bm25_b: float = 0.75
  max_command_chars: int = 16384
  history_command_max_chars: int = 2000
  max_tool_calls: int = 0
  check_numbers_on_write: bool = True
  local_ids: bool = False
  cost_parse: float = 1.0
  cost_unknown_tool: float = 1.0
  cost_bad_argument: float = 0.5
  cost_missing_id: float = 0.5
  cost_foreign_ref: float = 1.0
  cost_unsupported_write: float = 0.5
  cost_unjustified_delete: float = 0.5
  cost_protected_removal: float = 1.0
  cost_context_overflow: float = 0.5
  cost_budget_exceeded: float = 0.5
  cost_leakage: float = 1.0
  cost_op_not_allowed: float = 1.0
  cost_cap: float = 1.0

  def __post_init__(self):
    if self.phase not in commands.PHASE_OPS:
      raise ValueError(f'ExecutorConfig.phase must be one of '
                       f'{sorted(commands.PHASE_OPS)}, got {self.phase!r}')
    if self.allowed_ops is not None:
      ops = tuple(self.allowed_ops)
      bad = [o for o in ops if o not in commands.ALL_OPS]
      if bad:
        raise ValueError(f'ExecutorConfig.allowed_ops has unknown ops {bad}; ops are '
                         f'{commands.ALL_OPS}')
      object.__setattr__(self, 'allowed_ops', ops)
    shares = tuple(float(x) for x in self.policy_view_shares)
    if len(shares) != 3 or min(shares) < 0 or sum(shares) > 1.0 + 1e-9:
      raise ValueError('ExecutorConfig.policy_view_shares must be 3 non-negative '
                       f'fractions summing to at most 1, got {self.policy_view_shares!r}')
    object.__setattr__(self, 'policy_view_shares', shares)
    for name in ('context_budget', 'max_doc_tokens', 'policy_input_limit',
                 'max_command_chars',
                 'history_command_max_chars'):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f'ExecutorConfig.{name} must be positive, got '
                         f'{getattr(self, name)!r}')
    for name in ('retrieve_top_k', 'max_tool_calls'):
      if int(getattr(self, name)) < 0:
        raise ValueError(f'ExecutorConfig.{name} must be >= 0')
    for kind in VIOLATION_KINDS + ('cap',):
      if float(getattr(self, 'cost_' + kind)) < 0:
        raise ValueError(f'ExecutorConfig.cost_{kind} must be >= 0')

  @property
  def chunk_tokens(self):
    """Tokens of the largest document observation, and the room T_e keeps free in
    C for a restore (`document_chunk_tokens`)."""
    return document_chunk_tokens(self.context_budget, self.max_doc_tokens)

  @property
  def ops(self):
    """Allowed op names of this configuration."""
    return (self.allowed_ops if self.allowed_ops is not None
            else commands.PHASE_OPS[self.phase])

  def cost(self, kind):
    """Constraint cost of one violation of `kind` (SPEC §3)."""
    return float(getattr(self, 'cost_' + kind))
