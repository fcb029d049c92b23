r"""Can the tiny base copy? The copy probe of a pretrained base against random weights.

    python experiments/benchmarks/copy_probe.py                     # the packaged base
    python experiments/benchmarks/copy_probe.py --base=runs/base/pretrain/base --rows=256

Loads a base folder (default: the packaged `vermem_jax/assets/tiny_base`, a CPU
stand-in for a pretrained Qwen made by `experiments/run.py --config=pretrain.py`) and
measures, on construction-pool paragraphs held out from its pretraining
(`vermem_jax.train.pretrain`): the per-token copy accuracy of 32-token spans (teacher
forced, tokens 2..32; goal >= 0.95), the share of ids copied whole from a record list
(id copy), and the next-token loss of the held-out text; then the same for a randomly
initialised model of the same shape. Prints one table; `--out` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

_REPO = pathlib.Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
  sys.path.insert(0, str(_REPO))

import jax  # noqa: E402

import bench_common  # noqa: E402
from experiments.configs import common  # noqa: E402
from vermem_jax import paths  # noqa: E402
from vermem_jax import tokenization  # noqa: E402
from vermem_jax.envs import episodes  # noqa: E402
from vermem_jax.envs import hotpotqa  # noqa: E402
from vermem_jax.models import hf_io  # noqa: E402
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.train import pretrain  # noqa: E402
from vermem_jax.train import pretrain_data  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--base', default=paths.packaged_base(), help='base HF folder')
  parser.add_argument('--rows', type=int, default=128, help='probe rows per measure')
  parser.add_argument('--seed', type=int, default=7, help='probe rows seed')
  bench_common.add_out_flag(parser)
  args = parser.parse_args(argv)
  info_path = os.path.join(args.base, 'pretrain_info.json')
  try:
    model_config, params = hf_io.load_hf_checkpoint(args.base, dtype='float32')
    with open(info_path) as f:
      made = json.load(f)['pretrain']
    tok = tokenization.load_tokenizer(os.path.join(args.base, 'tokenizer.model'))
  except (OSError, ValueError, KeyError) as e:
    print(f'error: --base={args.base}: {e}', file=sys.stderr)
    return 2
  if args.rows < 1:
    print('error: --rows must be >= 1', file=sys.stderr)
    return 2
  model_config = model_config.replace(dtype='bfloat16', attn_implementation='sdpa')
  section = common.get_config('pretrain').pretrain.to_dict()
  section.update(made)  # the split and lengths the base was made with
  config = pretrain_data.PretrainConfig.from_section(section)
  construction, _ = episodes.load_pools(
      hotpotqa.DataConfig(hotpotqa_dir=paths.hotpotqa_dir()))
  rows = pretrain_data.RowMaker(pretrain_data.build_corpus(
      construction, tok, config.probe_fraction, config.seed), config)
  random_params = qwen.init_params(model_config, jax.random.PRNGKey(0))
  figures = {}
  print(f'copy probe, {args.rows} rows each, on held-out construction-pool paragraphs '
        f'({len(rows.corpus.probe_paragraphs)}); base: {args.base} (a CPU stand-in '
        f'for a pretrained Qwen)')
  print(f'{"model":<14}{"span copy":>11}{"id copy":>9}{"text loss":>11}')
  for name, p in (('base', params), ('random init', random_params)):
    probe = pretrain.copy_probe(model_config, p, rows, args.rows, args.seed)
    figures[name] = probe
    print(f'{name:<14}{probe["span_copy_accuracy"]:>11.3f}'
          f'{probe["id_copy_accuracy"]:>9.3f}{probe["text_loss"]:>11.3f}')
  print('span copy: per-token accuracy of 32-token spans (goal >= 0.95); id copy: ids '
        'copied whole; text loss: nats per token')
  if args.out:
    bench_common.write_figures(args.out, figures)
  return 0


if __name__ == '__main__':
  sys.exit(main())
