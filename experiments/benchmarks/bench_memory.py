"""Decisions per second of the memory environment: parse + T_m + g(s).

States are the size of a Phase C HotpotQA episode: the 10 context paragraphs of a real
sample question as observations (C and H), tens of LTM entries built from its sentences.
Each simulated rollout starts from the shared initial state and runs a script of 9
decisions covering all seven tools, ∅ and a malformed command; every decision is
parsed, executed and the next policy input g(s) rendered (limit 8,192 tokens).

Usage:
  .venv/bin/python experiments/benchmarks/bench_memory.py [--decisions 20000]
      [--tokenizer qwen2.5|none] [--question 0]

CPU seconds (time.process_time) are the figure to compare across machines: on a shared
machine the wall-clock rate also counts time spent waiting for a core. Prints
decisions/second with the whitespace counter and (unless --tokenizer none) with
the Qwen2.5 tokenizer counter (transformers AutoTokenizer on the shared tokenizer files).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))

from vermem_jax import memory as mm  # noqa: E402
from vermem_jax import paths  # noqa: E402


def build_state(example, count_tokens, cfg, n_entries=30):
  """Initial Phase-C-like state for one HotpotQA example."""
  s = mm.new_state(example['_id'], example['question'], count_tokens,
                   instruction='Answer the question using the active context.',
                   task_state='all 10 paragraphs read',
                   forbidden=(example['answer'],))
  sentences = []
  for title, sents in example['context']:
    s, _ = mm.interact(s, f'read "{title}"', f'{title}: ' + ''.join(sents),
                       count_tokens, cfg,
                       observation_refs=tuple(f'{title}#{i}' for i in range(len(sents))))
    sentences += [(title, i, t.strip()) for i, t in enumerate(sents) if t.strip()]
  for title, i, text in sentences[:n_entries]:
    s, _ = mm.add_entry(s, text, count_tokens, source_refs=(f'{title}#{i}',))
  return s


def script(s, example):
  ns = s.ns
  c = [it.id for it in s.C]          # c[0] instruction, c[1..10] paragraphs
  obs_h = [it.origin for it in s.C[1:]]
  words = example['question'].split()
  para = s.C[3].text
  return [
      mm.format_command(mm.Command('Retrieve', {'query': ' '.join(words[:6])})),
      mm.format_command(mm.Command('Add', {
          'content': para.split(': ', 1)[1][:200], 'source_refs': [c[3]]})),
      mm.format_command(mm.Command('Filter', {'drop_refs': [c[5], c[6]]})),
      mm.format_command(mm.Command('SelectEpisode', {'selected_refs': [obs_h[4]]})),
      mm.format_command(mm.Command('Update', {
          'memory_id': f'{ns}:m2', 'new_content': s.C[4].text[:150],
          'source_refs': [c[4]]})),
      mm.format_command(mm.Command('Summarize', {
          'source_refs': [c[7]], 'summary': ' '.join(s.C[7].text.split()[:6])})),
      mm.format_command(mm.Command('Delete', {'memory_id': f'{ns}:m3',
                                              'reason': 'superseded'})),
      '∅',
      'Add(content="unterminated',
  ]


def bench(example, count_tokens, n_decisions, label):
  cfg = mm.ExecutorConfig()
  base = build_state(example, count_tokens, cfg)
  cmds = script(base, example)
  # Warm-up rollout also checks that the script does what it should.
  s = base
  outcomes = []
  for text in cmds:
    t = mm.execute(s, text, cfg, count_tokens)
    outcomes.append(t.accepted)
    s = t.state_after
  assert outcomes == [True] * 8 + [False], outcomes
  x = mm.render_policy_input(base, count_tokens, allowed_ops=cfg.ops,
                             limit=cfg.policy_input_limit)
  n = 0
  c0 = time.process_time()
  t0 = time.perf_counter()
  while n < n_decisions:
    s = base
    for text in cmds:
      t = mm.execute(s, text, cfg, count_tokens)  # parses the text itself
      s = t.state_after
      mm.render_for_config(s, count_tokens, cfg)
      n += 1
  dt = time.perf_counter() - t0
  cpu = time.process_time() - c0
  print(f'{label:>12}: {n / cpu:10.0f} decisions per CPU-second, {n / dt:10.0f} per '
        f'wall second ({n} decisions, {cpu:.2f} s CPU, {dt:.2f} s wall; state: '
        f'{len(base.M)} LTM entries, {len(base.C)} C items '
        f'({base.context_tokens()} tokens), {len(base.H)} H events; '
        f'g(s) = {count_tokens(x)} tokens)')
  return n / cpu


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--decisions', type=int, default=20000)
  p.add_argument('--tokenizer', default='qwen2.5')
  p.add_argument('--question', type=int, default=0)
  args = p.parse_args()
  with open(os.path.join(paths.hotpotqa_dir(), 'train_sample.json')) as f:
    example = json.load(f)[args.question]
  ws = bench(example, mm.count_whitespace_tokens, args.decisions, 'whitespace')
  if args.tokenizer != 'none':
    from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
    tok = AutoTokenizer.from_pretrained(paths.tokenizer_dir(args.tokenizer))

    def qwen_count(text):
      return len(tok.encode(text, add_special_tokens=False))
    qw = bench(example, qwen_count, max(200, args.decisions // 50), args.tokenizer)
    print(f'ratio whitespace/{args.tokenizer}: {ws / qw:.1f}x')


if __name__ == '__main__':
  main()
