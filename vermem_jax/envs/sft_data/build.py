"""Builds the balanced SFT train and dev sets (SPEC §4, paper D.1–D.3).

Per split and target, examples are visited in a seeded permutation; each attempt
draws a template (boundary until the class's `boundary_fraction` quota is met, then
standard) and a phase among the template's subspaces, builds the state, optionally
asks the teacher, runs the seven filters (`filters.check_candidate`) and drops
duplicates (`filters.dedupe_key`), until the class holds exactly `*_per_target`
records. Train records come from the construction pool, dev records from the
internal-dev pool.
"""

from __future__ import annotations

import math
import random

from vermem_jax.envs.scenarios.views import build_view
from vermem_jax.envs.sft_data.config import SFTDataConfig
from vermem_jax.envs.sft_data.filters import check_candidate, dedupe_key
from vermem_jax.envs.sft_data.records import SFTBuildReport, SFTRecord
from vermem_jax.envs.sft_data.teacher import (OpenAICompatibleTeacher, TeacherError,
                                              teacher_messages)
from vermem_jax.envs.sft_data.template_kit import pick
from vermem_jax.envs.sft_data.templates import templates_for
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import serialization
from vermem_jax.memory.config import ExecutorConfig


def _record(state, cmd, *, template, phase, split, source, policy_input, local_ids):
  target = cmds.format_command(cmd)
  if local_ids:  # the target writes ids (refs and free text) as x_i shows them
    target = serialization.localize_ids(target, state.ns)
  return SFTRecord(policy_input=policy_input, target=target,
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
  for op in cmds.ALL_OPS:
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
      template = pick(rng, templates_for(op, boundary))
      view = views.get(ex.id)
      if view is None:
        view = views[ex.id] = build_view(
            ex, count_tokens, max_doc_sentences=config.max_doc_sentences,
            max_doc_tokens=config.max_doc_tokens)
      if not view.facts:
        continue  # no supporting fact resolves: nothing to build states around
      phase = pick(rng, template.phases)
      built = template.build(view, rng, count_tokens, config.context_budget, phase)
      if built is None:
        continue
      state, cmd = built
      x = serialization.render_policy_input(
          state, count_tokens, allowed_ops=cmds.PHASE_OPS[phase],
          limit=config.policy_input_limit, context_budget=config.context_budget,
          local_ids=config.local_ids)
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
                             split=split, source=source, policy_input=x,
                             local_ids=config.local_ids))
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
    `*_per_target` records of every target in cmds.ALL_OPS, in target order.

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
