"""Speed of the training-data builders (CPU): prints figures, asserts nothing.

    python experiments/benchmarks/bench_episodes.py [--episodes=100] [--no-tokenizer]
        [--out=FILE.json]

Reports, from the HotpotQA train sample (construction pool for train, internal-dev pool
for dev):
  - the tiny-scale SFT set (SFTDataConfig defaults: 32 train / 8 dev per target,
    8 targets, all seven filters run per record): seconds and records/s;
  - `--episodes` Phase A, B and C episodes each (initial state, schedule, executor
    check of the reference command): seconds and episodes/s;
under the whitespace counter and (unless --no-tokenizer) the Qwen2.5 tokenizer
(memoized counts, as the training code uses it).
"""

from bench_common import add_out_flag, episodes_parser, quiet_bm25s, timed, write_figures
from vermem_jax.envs.scenarios import build as scenario_build
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax.envs.scenarios import spec as scenario_spec
from vermem_jax import paths
from vermem_jax.envs import episodes
from vermem_jax.memory.token_count import count_whitespace_tokens


def _run(name, count_tokens, construction, dev, n_episodes) -> dict:
  """Prints and returns the figures of one token counter."""
  cfg = sft_config.SFTDataConfig()
  (train, dev_records, report), dt = timed(lambda: sft_build.build_sft_set(
      construction, dev, count_tokens=count_tokens, config=cfg, verbose=False))
  n = len(train) + len(dev_records)
  print(f'[{name}] SFT tiny set: {len(train)} train + {len(dev_records)} dev records '
        f'({cfg.train_per_target}/{cfg.dev_per_target} per target) in {dt:.2f}s '
        f'({n / dt:,.0f} records/s; {report.attempts} candidate states, '
        f'{report.duplicates} duplicates, filter failures '
        f'{sum(report.filter_failures.values())})')
  total = dt
  figures = {'sft_records_per_s': n / dt, 'sft_s': dt}
  scfg = scenario_spec.ScenarioConfig()
  for phase in scenario_spec.PHASES:
    specs, dt = timed(lambda p=phase: scenario_build.build_episodes(
        construction, p, count_tokens=count_tokens, config=scfg, num=n_episodes))
    total += dt
    print(f'[{name}] Phase {phase}: {len(specs)} episodes in {dt:.2f}s '
          f'({len(specs) / dt:,.0f} episodes/s)')
    figures[f'phase_{phase}_episodes_per_s'] = len(specs) / dt
  print(f'[{name}] total (SFT tiny set + {n_episodes} episodes x 3 phases): '
        f'{total:.2f}s')
  figures['total_s'] = total
  return figures


def main():
  parser = episodes_parser(100)
  parser.add_argument('--no-tokenizer', action='store_true',
                      help='skip the Qwen2.5 tokenizer run')
  add_out_flag(parser)
  args = parser.parse_args()
  quiet_bm25s()
  (construction, dev), dt = timed(episodes.load_pools)
  print(f'pools: {len(construction)} construction + {len(dev)} internal-dev examples '
        f'(load + split {dt:.2f}s)')
  figures = {'whitespace': _run('whitespace', count_whitespace_tokens, construction, dev,
                                args.episodes)}
  if not args.no_tokenizer:
    from vermem_jax import tokenization  # pylint: disable=import-outside-toplevel
    tok, dt = timed(
        lambda: tokenization.load_tokenizer(paths.tokenizer_dir('qwen2.5')))
    print(f'qwen2.5 tokenizer load {dt:.2f}s')
    figures['qwen2.5'] = _run('qwen2.5', tok.count_tokens, construction, dev,
                              args.episodes)
  write_figures(args.out, figures)


if __name__ == '__main__':
  main()
