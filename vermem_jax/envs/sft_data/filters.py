"""The seven deterministic filters of paper D.3 and the dedupe key (SPEC §4).

Every SFT candidate (template or teacher) passes the seven filters of
`check_candidate`, each really run, with no repair:
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
hash, the op and the canonical argument tuple (`dedupe_key`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from vermem_jax.memory import checks
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import state as mstate

FILTER_NAMES = ('one_operation', 'op_allowed', 'required_args', 'refs_exist',
                'same_instance', 'transition_valid', 'no_leakage')
# Label words that must never be written by a target unless the policy input has them.
LABEL_MARKERS = ('supporting fact', 'supporting_facts', 'sup_fact', 'gold evidence',
                 'reference answer', 'answer:', 'answer =', 'label:')
_WORD = re.compile(r'\w+')
_WRITTEN_ARGS = ('content', 'new_content', 'summary', 'query')


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
  else:  # schema-valid (problems starts as schema_problems): qualify local ids
    cmd = mexec.qualify_command(cmd, state.ns)  # a local id (`c2`) is this task's
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
