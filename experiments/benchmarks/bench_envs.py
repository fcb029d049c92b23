"""Speed of the data and episode layers (CPU): prints figures, asserts nothing.

    python experiments/benchmarks/bench_envs.py [--episodes=200] [--tokenizer]
        [--out=FILE.json]

Reports: HotpotQA JSON load (examples/s), TFDS prepare + read with tfds.data_source,
the 90/10 split, and the batched episode loop (episodes/s and decisions/s, with the
oracle reader and a ∅ policy) on Phase A/B/C scenarios from the construction pool,
under the whitespace counter and optionally the Qwen2.5 tokenizer.
"""

import tempfile

from bench_common import add_out_flag, episodes_parser, quiet_bm25s, timed, write_figures
from vermem_jax import paths
from vermem_jax.envs import environment as env
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.envs import task_solvers as ts
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.memory.token_count import count_whitespace_tokens


def main():
  parser = episodes_parser(200)
  parser.add_argument("--tokenizer", action="store_true",
                      help="also run the loop with the Qwen2.5 tokenizer counter")
  add_out_flag(parser)
  args = parser.parse_args()
  quiet_bm25s()
  figures = {}

  for split in ("train", "validation"):
    exs, dt = timed(lambda s=split: hotpotqa_sources.load_examples("json", s))
    print(f"json load {split:10s}: {len(exs):5d} examples in {dt:.3f}s "
          f"({len(exs) / dt:,.0f}/s)")
    figures[f"json_load_{split}_examples_per_s"] = len(exs) / dt
  with tempfile.TemporaryDirectory() as tmp:
    _, dt_prep = timed(lambda: hotpotqa_sources.load_examples("tfds", "train",
                                                              tfds_data_dir=tmp))
    exs, dt_read = timed(lambda: hotpotqa_sources.load_examples("tfds", "train",
                                                                tfds_data_dir=tmp))
    print(f"tfds train: prepare+read {dt_prep:.2f}s, read {dt_read:.3f}s "
          f"({len(exs) / dt_read:,.0f}/s)")
    figures.update(tfds_prepare_read_s=dt_prep, tfds_read_examples_per_s=len(exs) / dt_read)
  train = hotpotqa_sources.load_examples("json", "train")
  (cons, dev), dt = timed(lambda: hotpotqa.split_train_pools(train))
  print(f"split: {len(cons)} construction / {len(dev)} dev in {dt * 1e3:.2f} ms")
  figures["split_ms"] = dt * 1e3

  try:
    from vermem_jax.envs.scenarios import build as scenario_build  # pylint: disable=import-outside-toplevel
  except ImportError:
    print("scenarios module not available; skipping the episode loop")
    write_figures(args.out, figures)
    return
  counters = [("whitespace", count_whitespace_tokens)]
  if args.tokenizer:
    from vermem_jax.tokenization import load_tokenizer  # pylint: disable=import-outside-toplevel
    tok = load_tokenizer(paths.tokenizer_dir("qwen2.5"))
    counters.append(("qwen2.5", tok.count_tokens))
  oracle = ts.OracleEvidenceReader.from_examples(train)
  for name, count in counters:
    for phase in ("A", "B", "C"):
      specs, dt_build = timed(lambda p=phase, c=count: scenario_build.build_episodes(
          cons, p, count_tokens=c, num=args.episodes))
      res, dt_run = timed(lambda s=specs, c=count, p=phase: env.run_episodes(
          s, lambda xs: ["∅"] * len(xs), oracle, count_tokens=c,
          executor_config=ExecutorConfig(phase=p)))
      n_dec = sum(r.num_decisions for r in res)
      print(f"[{name}] phase {phase}: build {len(specs)} episodes {dt_build:.2f}s; "
            f"run {dt_run:.2f}s = {len(res) / dt_run:,.0f} episodes/s, "
            f"{n_dec / dt_run:,.0f} decisions/s")
      figures[f"{name}_phase_{phase}"] = {"build_s": dt_build,
                                           "episodes_per_s": len(res) / dt_run,
                                           "decisions_per_s": n_dec / dt_run}
  write_figures(args.out, figures)


if __name__ == "__main__":
  main()
