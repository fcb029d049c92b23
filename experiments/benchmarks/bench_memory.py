"""Decisions per second of the memory environment: parse + T_m + g(s).

States are the size of a Phase C HotpotQA episode: the 10 context paragraphs of a real
sample question as observations (C and H), tens of LTM entries built from its sentences.
Each simulated rollout starts from the shared initial state and runs a script of 9
decisions covering all seven tools, ∅ and a malformed command; every decision is
parsed, executed and the next policy input g(s) rendered (limit 8,192 tokens).

Usage:
  .venv/bin/python experiments/benchmarks/bench_memory.py [--decisions 20000]
      [--tokenizer qwen2.5|none] [--question 0] [--reference] [--out=FILE.json]

CPU seconds (time.process_time) are the figure to compare across machines: on a shared
machine the wall-clock rate also counts time spent waiting for a core. Prints
decisions/second (CPU and wall) with the whitespace counter and, unless --tokenizer
none, with the Qwen2.5 tokenizer counter as users pass it (`load_tokenizer(...)
.count_tokens`, which declares nothing: g(s) recounts its whole output) and the same
counter declaring `splits_after_newline` (g(s) sums cached per-line counts). With
--reference each counter also runs the uncached reference g(s) and the speedup over it
is printed (same decisions, same outputs).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
# The uncached reference g(s) lives with the tests that hold the cache against it.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', 'tests'))

import bench_common  # noqa: E402  (this folder is on sys.path)
import memory_reference  # noqa: E402  (tests/ is on sys.path)

from vermem_jax.memory import executor as mexec
from vermem_jax.memory import commands as cmds_lib
from vermem_jax.memory import interaction
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import state as mstate
from vermem_jax import paths  # noqa: E402
from vermem_jax.envs import hotpotqa  # noqa: E402
from vermem_jax import tokenization  # noqa: E402
from vermem_jax.memory import render_cache  # noqa: E402
from vermem_jax.memory import serialization  # noqa: E402
from vermem_jax.memory import token_count  # noqa: E402


def build_state(example, count_tokens, cfg, n_entries=30):
  """Initial Phase-C-like state for one HotpotQA example."""
  s = mstate.new_state(example['_id'], example['question'], count_tokens,
                   instruction='Answer the question using the active context.',
                   task_state='all 10 paragraphs read',
                   forbidden=(example['answer'],))
  sentences = []
  for title, sents in example['context']:
    s, _ = interaction.interact(s, f'read "{title}"', f'{title}: ' + ''.join(sents),
                       count_tokens, cfg,
                       observation_refs=tuple(f'{title}#{i}' for i in range(len(sents))))
    sentences += [(title, i, t.strip()) for i, t in enumerate(sents) if t.strip()]
  for title, i, text in sentences[:n_entries]:
    s, _ = mstate.add_entry(s, text, count_tokens, source_refs=(f'{title}#{i}',))
  return s


def script(s, example):
  ns = s.ns
  c = [it.id for it in s.C]          # c[0] instruction, c[1..10] paragraphs
  obs_h = [it.origin for it in s.C[1:]]
  words = example['question'].split()
  para = s.C[3].text
  return [
      cmds_lib.format_command(cmds_lib.Command('Retrieve', {'query': ' '.join(words[:6])})),
      cmds_lib.format_command(cmds_lib.Command('Add', {
          'content': para.split(': ', 1)[1][:200], 'source_refs': [c[3]]})),
      cmds_lib.format_command(cmds_lib.Command('Filter', {'drop_refs': [c[5], c[6]]})),
      cmds_lib.format_command(cmds_lib.Command('SelectEpisode', {'selected_refs': [obs_h[4]]})),
      cmds_lib.format_command(cmds_lib.Command('Update', {
          'memory_id': f'{ns}:m2', 'new_content': s.C[4].text[:150],
          'source_refs': [c[4]]})),
      cmds_lib.format_command(cmds_lib.Command('Summarize', {
          'source_refs': [c[7]], 'summary': ' '.join(s.C[7].text.split()[:6])})),
      cmds_lib.format_command(cmds_lib.Command('Delete', {'memory_id': f'{ns}:m3',
                                              'reason': 'superseded'})),
      '∅',
      'Add(content="unterminated',
  ]


def bench(example, count_tokens, n_decisions, label, render):
  """Runs rollouts of the script until `n_decisions`; returns decisions per CPU-s.

  Every rollout starts from the shared initial state with its own task-state text (as
  K rollouts of a real batch diverge), so no policy input repeats between rollouts and
  memoized whole-text counts never hit; per-record caches do, as in training.
  """
  cfg = mconfig.ExecutorConfig()
  base = build_state(example, count_tokens, cfg)
  cmds = script(base, example)
  x = render(base, count_tokens, allowed_ops=cfg.ops, limit=cfg.policy_input_limit,
             shares=cfg.policy_view_shares, context_budget=cfg.context_budget)
  # Warm-up rollout (fills the caches as the first of K rollouts would) also checks
  # that the script does what it should.
  s = base
  outcomes = []
  for text in cmds:
    t = mexec.execute(s, text, cfg, count_tokens)
    outcomes.append(t.accepted)
    s = t.state_after
    render(s, count_tokens, allowed_ops=cfg.ops, limit=cfg.policy_input_limit,
           shares=cfg.policy_view_shares, context_budget=cfg.context_budget)
  assert outcomes == [True] * 8 + [False], outcomes
  n = 0
  rollout = 0
  c0 = time.process_time()
  t0 = time.perf_counter()
  while n < n_decisions:
    rollout += 1
    s = mstate.set_task_state(base, f'all 10 paragraphs read (rollout {rollout})')
    for text in cmds:
      t = mexec.execute(s, text, cfg, count_tokens)  # parses the text itself
      s = t.state_after
      render(s, count_tokens, allowed_ops=cfg.ops, limit=cfg.policy_input_limit,
             shares=cfg.policy_view_shares, context_budget=cfg.context_budget)
      n += 1
  dt = time.perf_counter() - t0
  cpu = time.process_time() - c0
  print(f'{label:>28}: {n / cpu:9.0f} decisions per CPU-second, {n / dt:9.0f} per '
        f'wall second ({n} decisions, {cpu:.2f} s CPU, {dt:.2f} s wall; state: '
        f'{len(base.M)} LTM entries, {len(base.C)} C items '
        f'({base.context_tokens()} tokens), {len(base.H)} H events; '
        f'g(s) = {count_tokens(x)} tokens; cost model '
        f'{render_cache.cost_model(count_tokens)})', flush=True)
  return n / cpu


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--decisions', type=int, default=20000)
  p.add_argument('--tokenizer', default='qwen2.5',
                 help="tokenizer folder name under the data dir, or 'none'")
  p.add_argument('--question', type=int, default=0)
  p.add_argument('--reference', action='store_true',
                 help='also run the uncached reference g(s) '
                      '(memory_reference.render_policy_input_reference) and print '
                      'the speedup of the cached path over it')
  bench_common.add_out_flag(p)
  args = p.parse_args()
  example = hotpotqa.read_json_rows(hotpotqa.find_split_file('train'))[args.question]
  counters = [('whitespace', token_count.count_whitespace_tokens, args.decisions)]
  if args.tokenizer != 'none':
    tok = tokenization.load_tokenizer(paths.tokenizer_dir(args.tokenizer))
    # What users pass today (Tokenizer.count_tokens: memoized, declares nothing, so
    # g(s) recounts its whole output every call) ...
    counters.append((args.tokenizer, tok.count_tokens, max(200, args.decisions // 50)))
    # ... and the same counter declaring splits_after_newline where its tokenizer.json
    # meets the premises of the proof in vermem_jax/memory/token_count.py (Qwen does).
    proven = token_count.tokenizer_json_splits_after_newline(
        json.loads(tok.hf.backend_tokenizer.to_str()))
    declared = token_count.declare(tok.count_tokens, splits_after_newline=proven)
    counters.append((f'{args.tokenizer}+splits_after_newline', declared,
                     max(1000, args.decisions // 4)))
  rates = {}
  figures = {'decisions_per_cpu_s': rates}
  for label, counter, n in counters:
    rates[label] = bench(example, counter, n, label, serialization.render_policy_input)
    if args.reference:
      ref = bench(example, counter, max(200, n // 20), label + ' reference',
                  memory_reference.render_policy_input_reference)
      figures[f'{label} reference decisions_per_cpu_s'] = ref
      print(f'{"":>28}  speedup over the uncached reference g(s): '
            f'{rates[label] / ref:.1f}x')
  if args.tokenizer != 'none':
    ws = rates['whitespace']
    for label, rate in rates.items():
      if label != 'whitespace':
        print(f'ratio whitespace / {label}: {ws / rate:.1f}x')
    print(f'speedup of declaring splits_after_newline: '
          f'{rates[f"{args.tokenizer}+splits_after_newline"] / rates[args.tokenizer]:.1f}x')

  bench_common.write_figures(args.out, figures)


if __name__ == '__main__':
  main()
