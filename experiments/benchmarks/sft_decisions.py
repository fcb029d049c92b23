r"""Does SFT learn the decisions, or only the text? Teacher-forced tool choice per class.

    python experiments/benchmarks/sft_decisions.py --workdir=workdir          # after make run
    python experiments/benchmarks/sft_decisions.py --workdir=runs/l4 \
        --override model.hf_checkpoint=None model.num_hidden_layers=4      # the run's settings
    python experiments/benchmarks/sft_decisions.py --scale=small --per_class=4 \
        --workdir=runs/smol                                  # SmolLM2 (docs/real-weights.md)

Loads the SFT checkpoint of `<workdir>/sft` (the step Phase A starts from), rebuilds the
SFT set of the tiny config (seeded by `episodes.seed`, not by the run's seed: every run
of the tiny config trains and scores on the same records) and feeds every train and
dev record teacher-forced: prompt x_i, then the target command u*_i. A run made with
other model settings needs the same `--override`s (a checkpoint whose parameters do not
fit the config's model is refused). Per target class it prints, for the train and the
dev records:

  decision   share of records whose most likely first command token is the target's
             (each tool name with its opening parenthesis, e.g. `Add(`, and ∅ is one
             token of the packaged tokenizer, so the first command token is the tool
             choice);
  p(tool)    mean probability of the target's tool token;
  tokens     share of the command's tokens predicted right (teacher-forced);
  instead    (train) the first token most often predicted when it is wrong; blank when
             it is never wrong.

A class whose train decision share is low while its token share is high has the
command text learnt but not when to use it: more epochs on the same records do not
help there, since the records are already fitted token by token. The dev `decision`
share bounds the SFT summary's greedy tool accuracy from above: a greedy command that
starts with the right tool can still fail to parse, and then counts as unparseable.

With SmolLM2's tokenizer (`--scale=small`) a tool name is one to three pieces without
its parenthesis (`Add`, `Ret` + `rieve`, `Select` + `Ep` + `isode`; ∅ two byte pieces);
the first pieces of the eight classes still differ, so the first command token still
names the tool. `--per_class=N` scores
only the first N records of each class per split, for a model whose forward pass is
slow on a CPU.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import pathlib
import sys

_REPO = pathlib.Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
  sys.path.insert(0, str(_REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bench_common  # noqa: E402
import learning_curve  # noqa: E402
from vermem_jax.envs import episodes  # noqa: E402
from vermem_jax.envs.sft_data import build as sft_build  # noqa: E402
from vermem_jax.memory import commands as cmds  # noqa: E402
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.train import checkpoints  # noqa: E402
from vermem_jax.train import run_setup  # noqa: E402
from vermem_jax.train import setup  # noqa: E402
from vermem_jax.train import sft_examples  # noqa: E402

_BATCH = 8


@functools.partial(jax.jit, static_argnums=0)
def _logits(model_config, params, tokens):
  """[B, T, V] float32 logits; compiled once per config and shape for both splits."""
  return qwen.Qwen(model_config).apply({'params': params}, tokens).astype(jnp.float32)


def decision_figures(model_config, params, examples, tokenizer,
                     batch_size: int = _BATCH) -> dict[str, dict[str, float | str]]:
  """Teacher-forced figures per target class (module docstring).

  Args:
    model_config: the policy's QwenConfig.
    params: its parameters.
    examples: `sft_examples.SFTExample`s (prompt ids, command ids + stop token).
    tokenizer: decodes the predicted first tokens for 'instead'.
    batch_size: rows per forward pass (rows are right-padded to the batch's longest).
  Returns:
    {op: {'n', 'decision', 'p_tool', 'tokens' (floats in [0, 1] but 'n'),
          'instead' (decoded token, '' when every decision is right)}}.
  """
  hits, probs, tok_acc, counts = (collections.defaultdict(float) for _ in range(4))
  wrong = collections.defaultdict(collections.Counter)
  pad = tokenizer.pad_token_id
  for start in range(0, len(examples), batch_size):
    batch = examples[start:start + batch_size]
    # One shape per bucket of 64 tokens keeps the compilations few.
    longest = max(len(e.prompt_tokens) + len(e.command_tokens) for e in batch)
    width = -(-longest // 64) * 64
    rows = np.full((batch_size, width), pad, np.int32)
    for j, e in enumerate(batch):
      seq = e.prompt_tokens + e.command_tokens
      rows[j, :len(seq)] = seq
    logits = np.asarray(_logits(model_config, params, jnp.asarray(rows)))
    for j, e in enumerate(batch):
      first, n = len(e.prompt_tokens) - 1, len(e.command_tokens)
      step = logits[j, first:first + n]  # step[k] predicts command token k
      target = np.asarray(e.command_tokens)
      p = np.exp(step[0] - step[0].max())
      p /= p.sum()
      op = e.record.op
      guess = int(step[0].argmax())
      counts[op] += 1
      hits[op] += float(guess == target[0])
      probs[op] += float(p[target[0]])
      tok_acc[op] += float((step.argmax(-1) == target).mean())
      if guess != target[0]:
        wrong[op][tokenizer.decode([guess]).strip() or repr(tokenizer.decode([guess]))] += 1
  out = {}
  for op in counts:
    k = counts[op]
    instead = wrong[op].most_common(1)
    out[op] = {'n': int(k), 'decision': hits[op] / k, 'p_tool': probs[op] / k,
               'tokens': tok_acc[op] / k, 'instead': instead[0][0] if instead else ''}
  return out


def first_per_class(records, n: int) -> list:
  """The first `n` records of each class (`record.op`), in their order."""
  seen = collections.Counter()
  out = []
  for r in records:
    if seen[r.op] < n:
      seen[r.op] += 1
      out.append(r)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', default='workdir',
                      help='a run directory holding sft/ (make run writes workdir/)')
  parser.add_argument('--scale', default='tiny', choices=('tiny', 'small'),
                      help="the run's config scale")
  parser.add_argument('--per_class', type=int, default=0,
                      help='score the first N records of each class per split (0: all)')
  parser.add_argument('--override', type=learning_curve.parse_override, nargs='+',
                      action='extend', default=[], metavar='SECTION.FIELD=VALUE',
                      help="the run's config overrides, e.g. model.num_hidden_layers=4")
  bench_common.add_out_flag(parser)
  args = parser.parse_args(argv)
  directory = os.path.join(args.workdir, 'sft')
  try:
    config = learning_curve.phase_config('sft', 42, args.override, args.scale)
    run = run_setup.RunSetup.from_config(config)
    tok = setup.load_tokenizer_for(config)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  model_config = run.model.config
  shapes = jax.eval_shape(lambda: qwen.init_params(model_config, jax.random.PRNGKey(0)))
  try:
    if not os.path.isdir(directory):
      hint = (' (pass the run directory that holds sft/, not sft/ itself)'
              if os.path.basename(os.path.normpath(args.workdir)) == 'sft' else '')
      raise FileNotFoundError(f'no SFT run in {directory}{hint}')
    params, step = checkpoints.restore_params_only(directory, shapes)
  except OSError as e:
    print(f'error: --workdir={args.workdir}: {e}', file=sys.stderr)
    return 2
  except (ValueError, checkpoints.CheckpointError) as e:
    print(f'error: --workdir={args.workdir}: {e} (a run of other model settings needs '
          'the same --override)', file=sys.stderr)
    return 2
  construction, dev_pool = episodes.load_pools(run.data)
  train, dev, _ = sft_build.build_sft_set(construction, dev_pool,
                                          count_tokens=tok.count_tokens,
                                          config=run.sft.data, verbose=False)
  limits = sft_examples.learner_limits(run.batching.length_buckets,
                                       run.batching.command_buckets,
                                       run.sampling.max_command_tokens)
  figures = {}
  for split, records in (('train', train), ('dev', dev)):
    if args.per_class > 0:
      records = first_per_class(records, args.per_class)
    examples, _ = sft_examples.tokenize_records(records, tok, **limits)
    figures[split] = decision_figures(model_config, params, examples, tok)
  print(f'SFT decisions, teacher-forced: {directory} step {step}; records per class '
        f'(train / dev) in the last column')
  print(f'{"":<14}{"---------- train records ----------":>42}  '
        f'{"-- dev records --":>22}')
  print(f'{"class":<14}{"decision":>9}{"p(tool)":>9}{"tokens":>8}  {"instead":<14}'
        f'{"decision":>14}{"tokens":>8}{"n":>10}')
  for op in cmds.ALL_OPS:
    if op not in figures['train']:
      continue
    t, d = figures['train'][op], figures['dev'].get(op)
    name = cmds.NULL_SYMBOL if op == cmds.NULL else op
    dev_cols = (f'{d["decision"]:>14.2f}{d["tokens"]:>8.2f}' if d else f'{"-":>14}{"-":>8}')
    counts = f'{t["n"]} / {d["n"] if d else 0}'
    print(f'{name:<14}{t["decision"]:>9.2f}{t["p_tool"]:>9.2f}{t["tokens"]:>8.2f}  '
          f'{t["instead"]:<14}{dev_cols}{counts:>10}')
  print('decision: share whose most likely first command token is the target tool; '
        'p(tool): its mean probability; tokens: command tokens predicted right; '
        'instead: the commonest wrong first token (blank: never wrong); all '
        'teacher-forced (the docstring has more)')
  if args.out:
    bench_common.write_figures(args.out, figures)
  return 0


if __name__ == '__main__':
  sys.exit(main())
