"""How often HotpotQA evaluation states offer a recovery SelectEpisode (issue 23).

    python experiments/benchmarks/recovery_states.py [--questions=300] [--out=FILE.json]

Builds the evaluation episodes of `--questions` validation questions (seed 42's draw,
`eval.episodes.select_questions`) at the tiny scale (context budget 320, g(s) limit
640, the packaged 4k SentencePiece counter, local ids) and at the paper's budget
(2,048, limit 8,192, the Qwen2.5 tokenizer), runs them with the oracle reader and ∅
at every decision (the states the environment itself produces), and prints
`eval.recovery.recovery_counts` summed over the episodes (select_accepted: states
where SelectEpisode of the newest observation held only in H would be accepted), and
in how many episodes the first passage is missing from H_0.

Prints figures, asserts nothing.
"""

import collections

from bench_common import add_out_flag, episodes_parser, quiet_bm25s, timed, write_figures
from vermem_jax import paths
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.envs import task_solvers
from vermem_jax.eval import episodes
from vermem_jax.eval import recovery
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.memory import state as mstate
from vermem_jax.tokenization import load_tokenizer

SCALES = (('tiny', 320, 640, True, 'hotpotqa-sp4k'),
          ('paper', 2048, 8192, False, 'qwen2.5'))


def main():
  parser = episodes_parser(300)
  parser.add_argument('--questions', type=int, default=300)
  add_out_flag(parser)
  args = parser.parse_args()
  quiet_bm25s()
  examples = hotpotqa_sources.load_examples('json', 'validation')
  questions = episodes.select_questions(examples, args.questions, 42)
  figures = {}
  for name, budget, limit, local_ids, tok_name in SCALES:
    tok = load_tokenizer(paths.tokenizer_path(tok_name))
    count = tok.count_tokens
    cfg = ExecutorConfig(context_budget=budget, policy_input_limit=limit,
                         local_ids=local_ids)
    solver = task_solvers.OracleEvidenceReader.from_examples(questions, tokenizer=tok)
    specs = [episodes.build_episode(ex, count_tokens=count, executor_config=cfg)
             for ex in questions]
    lost = sum(not any(ev.kind == mstate.EV_OBSERVATION for ev in s.initial_state.H)
               for s in specs)
    results, dt = timed(lambda: episodes.run(specs, episodes.base_policy, solver,
                                             count_tokens=count, executor_config=cfg))
    totals = collections.Counter()
    for r in results:
      totals.update(recovery.recovery_counts(r, count, cfg))
    print(f'{name:5s} budget {budget:5d}: {len(specs)} episodes ({dt:.1f}s): '
          + ', '.join(f'{k} {totals[k]}' for k in recovery.COUNT_FIELDS)
          + f'; first passage missing from H_0 in {lost}')
    figures[name] = dict(totals, first_passage_not_in_h=lost)
  write_figures(args.out, figures)


if __name__ == '__main__':
  main()
