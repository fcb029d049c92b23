"""Where the time of one Phase B update goes (CPU, tiny scale): prints figures only.

    python experiments/benchmarks/profile_phase_update.py [--updates=2]
        [--workdir=DIR] [--set section.field=value ...] [--ab_share_prefill]
        [--out=FILE.json]

Builds the default tiny Phase B setup (`experiments/configs/phase_b.py`: tiny Qwen, the
Qwen2.5 tokenizer, HotpotQA samples, heuristic verifier, oracle reader) with the same
code as the trainer (`vermem_jax.train.rl_setup.build_setup`), takes the policy from
`<workdir>/phase_a` when given (else a random-init tiny model: same shapes, same cost),
and runs `--updates` updates exactly as `run_rl_phase` does (collect_update ->
learner_update), without checkpoints. The first update includes jit compilation; the
last one is the steady-state figure. For each update it prints seconds and shares of:

  sampling                 models.generate (policy decoding, device sync included)
  policy tokenization      chat template, encode, decode of policy prompts/commands
  environment+serialization  executor T_m, interaction T_e, g(s) rendering, episode loop
  task solver              π_task calls
  verifiers                local + global verifier (input building + scoring)
  rewards+advantages       Eq. 12-18 rewards, A^hier
  learner                  batching, loss + gradients (θ_old log-probs in the same
                           pass), optimizer step

With --ab_share_prefill every update's rollouts are collected twice with the same rng,
first with `sampling.share_prefill=False` then True (so load changes hit both alike),
each after an untimed warm-up collection of both (compilation excluded from both sides),
and the sampling seconds, prompts prefilled and sampled tokens of both are printed
(identical tokens are checked); the learner runs on the second collection. --out
writes every figure as JSON, with the load average at each update.
"""

import argparse
import ast
import copy
import dataclasses
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from absl import logging  # noqa: E402
import bench_common  # noqa: E402  (this folder is on sys.path)
import jax  # noqa: E402

from experiments.configs import common  # noqa: E402
from experiments.configs.parts import validation  # noqa: E402
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.models import sampling  # noqa: E402
from vermem_jax.rl import policy as policy_lib  # noqa: E402
from vermem_jax.rl import rollout  # noqa: E402
from vermem_jax.rl import task_selection  # noqa: E402
from vermem_jax.train import checkpoints  # noqa: E402
from vermem_jax.train import optim  # noqa: E402
from vermem_jax.train import rl_learner  # noqa: E402
from vermem_jax.train import rl_setup  # noqa: E402
from vermem_jax.train import run_setup  # noqa: E402

STAGES = (
    ('sampling', ('sampling',)),
    ('policy tokenization', ('policy_tokenization',)),
    ('environment+serialization', ('environment',)),
    ('task solver', ('solver',)),
    ('verifiers', ('verifier_local', 'verifier_global')),
    ('rewards+advantages', ('rewards_advantages',)),
)
LEARNER_PARTS = (('  batching', 'time/learner_batching_s'),
                 ('  loss + gradients', 'time/learner_grads_s'),
                 ('  optimizer step', 'time/learner_optimizer_s'))


def _parse_set(items):
  out = {}
  for item in items or ():
    path, _, text = item.partition('=')
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    out[path.strip()] = value
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--updates', type=int, default=2)
  parser.add_argument('--workdir', default=None,
                      help='take the policy from <workdir>/phase_a (default: random init)')
  parser.add_argument('--set', action='append', default=[],
                      help='config override section.field=value (repeatable)')
  parser.add_argument('--ab_share_prefill', action='store_true',
                      help='collect each update with and without shared prefill')
  bench_common.add_out_flag(parser)
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)

  config = common.get_config('phase_b')
  for path, value in _parse_set(args.set).items():
    section, field = path.split('.')
    config[section][field] = value
  validation.validate_config(config)
  t0 = time.perf_counter()
  setup = rl_setup.build_setup(run_setup.RunSetup.from_config(config))
  t_setup = time.perf_counter() - t0
  mc, rl = setup.run.model.config, setup.run.rl
  if args.workdir:
    shapes = jax.eval_shape(lambda k: qwen.init_params(mc, k), jax.random.PRNGKey(0))
    params, _ = checkpoints.restore_params_only(os.path.join(args.workdir, 'phase_a'),
                                                shapes)
    source = f'{args.workdir}/phase_a'
  else:
    params = qwen.init_params(mc, jax.random.PRNGKey(int(config.seed)))
    source = 'random init'
  ref_params = params
  t0 = time.perf_counter()
  running, _ = rl_setup.init_running_stats(setup)
  t_stats = time.perf_counter() - t0
  opt_state = optim.make_optimizer(rl.opt).init(params)
  policy = policy_lib.SamplerPolicy(mc, params, setup.tokenizer,
                                    sampling_config=setup.run.sampling,
                                    batch_buckets=(rl.rollout.num_rollouts,))
  print(f'Phase B, tiny scale: {rl.rollout.tasks_per_update} tasks x '
        f'{rl.rollout.rollouts_per_task} rollouts, policy input <= '
        f'{config.memory.policy_input_limit} tokens, commands <= '
        f'{config.sampling.max_command_tokens} tokens, policy from {source}; '
        f'{jax.device_count()} {jax.default_backend()} device(s), '
        f'{os.cpu_count()} CPUs')
  print(f'setup (episodes, solver, verifier): {t_setup:.2f} s; running-stats init: '
        f'{t_stats:.2f} s\n')
  unshared = policy_lib.SamplerPolicy(
      mc, params, setup.tokenizer,
      sampling_config=dataclasses.replace(setup.run.sampling, share_prefill=False),
      batch_buckets=(rl.rollout.num_rollouts,))
  seed = int(config.seed)
  report = {'config': {'tasks_per_update': rl.rollout.tasks_per_update,
                       'rollouts_per_task': rl.rollout.rollouts_per_task,
                       'share_prefill': setup.run.sampling.share_prefill,
                       'policy': source}, 'updates': []}

  def collect(pol, n, stats):
    pol.params = params
    ids = task_selection.select_tasks(len(setup.train_specs), n,
                                      rl.rollout.tasks_per_update, seed=seed)
    before = sampling.prefill_counts()
    compiles_before = sampling.compile_count()
    t0 = time.perf_counter()
    res = rollout.collect_update(
        [setup.train_specs[i] for i in ids], pol, setup.solver, setup.verifier,
        setup.collect, rng=task_selection.update_rng(seed, n),
        count_tokens=setup.tokenizer.count_tokens, running_stats=stats,
        phase='phase_b', update=n)
    after = sampling.prefill_counts()
    counts = {k: after[k] - before[k] for k in after}
    counts['compiles'] = sampling.compile_count() - compiles_before
    return res, time.perf_counter() - t0, counts

  for n in range(1, args.updates + 1):
    entry = {'update': n, 'load_average': os.getloadavg()[0]}
    if args.ab_share_prefill:
      # Untimed warm-up of both sides with the same rng (so the same shapes): sharing
      # meets more (prefill rows, batch) shapes than the unshared path, and a shape's
      # first call compiles (~3 s here), which would otherwise be timed as sampling.
      for pol in (unshared, policy):
        collect(pol, n, copy.deepcopy(running))
      # A copy of the running statistics: the A run must not advance them.
      base, base_s, base_counts = collect(unshared, n, copy.deepcopy(running))
      entry['unshared'] = {'collect_s': base_s,
                           'sampling_s': base.timings['sampling'],
                           'sampling_share_of_collection': base.timings['sampling']
                                                           / base_s, **base_counts}
    t0 = time.perf_counter()
    result, _, counts = collect(policy, n, running)
    t1 = time.perf_counter()
    entry['shared' if args.ab_share_prefill else 'collection'] = {
        'collect_s': t1 - t0, 'sampling_s': result.timings['sampling'],
        'sampling_share_of_collection': result.timings['sampling'] / (t1 - t0),
        **counts}
    if args.ab_share_prefill:
      same = [a.command_ids == b.command_ids
              for a, b in zip(base.decisions, result.decisions)]
      entry['same_commands'] = bool(len(base.decisions) == len(result.decisions)
                                    and all(same))
    params, opt_state, learn = rl_learner.learner_update(
        params, ref_params, opt_state, result.decision_tokens(),
        dataclasses.replace(setup.learner, model_config=mc))
    jax.block_until_ready(params)
    t2 = time.perf_counter()
    total = t2 - t0
    t = result.timings
    label = 'first (includes jit compilation)' if n == 1 else 'steady state'
    print(f'update {n} [{label}]: {total:.2f} s, {result.num_decisions} decisions, '
          f'{int(result.metrics["rollout/policy_calls"])} sampler calls, '
          f'{int(learn["train/num_micro_batches"])} learner micro-batches')
    print(f'  {"stage":28s} {"seconds":>8s} {"share":>7s}')
    rows = [(name, sum(t[k] for k in keys)) for name, keys in STAGES]
    other = (t1 - t0) - sum(v for _, v in rows)
    rows.append(('collection overhead', other))
    rows.append(('learner', t2 - t1))
    for name, sec in rows:
      print(f'  {name:28s} {sec:8.2f} {100 * sec / total:6.1f}%')
    for name, key in LEARNER_PARTS:
      print(f'  {name:28s} {learn[key]:8.2f} {100 * learn[key] / total:6.1f}%')
    entry.update(total_s=total, stages={name: sec for name, sec in rows},
                 learner_parts={name.strip(): learn[key] for name, key in LEARNER_PARTS})
    if args.ab_share_prefill:
      u, s = entry['unshared'], entry['shared']
      print(f'  shared prefill A/B (same rng; load average {entry["load_average"]:.1f}):'
            f' sampling {u["sampling_s"]:.2f} s -> {s["sampling_s"]:.2f} s '
            f'({u["sampling_s"] / s["sampling_s"]:.2f}x), prompts prefilled '
            f'{u["prefilled"]} -> {s["prefilled"]} of {s["rows"]} rows (compiles '
            f'during the timed runs: {u["compiles"]}, {s["compiles"]}), sampling share '
            f'of collection {100 * u["sampling_share_of_collection"]:.1f}% -> '
            f'{100 * s["sampling_share_of_collection"]:.1f}%, same commands: '
            f'{entry["same_commands"]}')
    report['updates'].append(entry)
    print()
  bench_common.write_figures(args.out, report)


if __name__ == '__main__':
  main()
