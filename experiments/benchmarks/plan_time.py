r"""Time plan of the RL curriculum: seconds per update, per stage, and hours per phase
on named hardware, before renting it (nothing runs on an accelerator).

    python experiments/benchmarks/plan_time.py --config=phase_b.py
    ... --config=phase_b.py --model=qwen3-4b-instruct-2507 --hardware=h100x8,v5p-8
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python \
        experiments/benchmarks/plan_time.py --config=phase_b.py --check

For the phase config (paper scale) it measures a sample of paper-shaped episodes of
each RL phase (the scenario builders, the Qwen2.5 tokenizer, a scripted policy that
writes the null command, the oracle-evidence reader as solver: decisions per episode,
g(s) tokens of each decision, solver prompt tokens; command lengths from the
scenarios' reference commands), caches it (`--episodes_json`), and prints
`train.time_plan`'s seconds per update of each stage and its share on each hardware of
experiments/configs/parts/hardware.py, hours for the phase and for the curriculum
(phase_a + phase_b + phase_c updates, each with its own episode sample).
`--check` compiles the memory plan's learner and sampler programs
(`train.memory_plan.make_plan`) for the config's model cut to 2 layers (unscanned, so
XLA counts every layer) and prints the analytic FLOPs over `cost_analysis()`.
docs/time-plan.md has the table, the assumptions and their sources.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import bench_common  # noqa: E402  (this folder is on sys.path)
import plan_memory  # noqa: E402
from experiments.configs.parts import hardware  # noqa: E402
from vermem_jax import paths  # noqa: E402
from vermem_jax import tokenization  # noqa: E402
from vermem_jax.envs import environment  # noqa: E402
from vermem_jax.envs import episode_types  # noqa: E402
from vermem_jax.envs import episodes  # noqa: E402
from vermem_jax.envs import task_solvers  # noqa: E402
from vermem_jax.envs.scenarios import build as scenario_build  # noqa: E402
from vermem_jax.memory import commands  # noqa: E402
from vermem_jax.rl import policy as policy_lib  # noqa: E402
from vermem_jax.train import memory_plan  # noqa: E402
from vermem_jax.train import run_setup  # noqa: E402
from vermem_jax.train import time_plan  # noqa: E402

PHASES = {'phase_a': 'A', 'phase_b': 'B', 'phase_c': 'C'}
STAGE_NAMES = ('rollout_prefill', 'rollout_decode', 'rollout_solver', 'learner',
               'optimizer', 'verifier', 'dev_prefill', 'dev_decode', 'dev_solver')


def measure_episodes(phase: str, num: int, seed: int = 0) -> dict[str, Any]:
  """A measured sample of `num` Phase-`phase` episodes ('A' | 'B' | 'C'): the
  `time_plan.EpisodeShape` fields as JSON lists (module docstring)."""
  del seed  # the builders are deterministic under their config's seed
  tok = tokenization.load_tokenizer(paths.tokenizer_dir('qwen2.5'))
  overhead = policy_lib.prompt_overhead_tokens(tok)
  construction, _ = episodes.load_pools()
  specs = scenario_build.build_episodes(construction, phase, count_tokens=tok.count_tokens,
                                        num=num)

  def null_policy(inputs):
    return [episode_types.PolicyOutput(text=commands.NULL_SYMBOL) for _ in inputs]

  solver = task_solvers.OracleEvidenceReader.from_examples(construction, tokenizer=tok)
  results = environment.run_episodes(specs, null_policy, solver,
                                     count_tokens=tok.count_tokens)
  return {
      'decisions': [len(r.decisions) for r in results],
      'prompts': [[tok.count_tokens(d.policy_input) + overhead for d in r.decisions]
                  for r in results],
      # + 1: the end-of-turn token the sampler stops on.
      'commands': [tok.count_tokens(s.reference_command) + 1 for s in specs],
      'solver_prompts': [r.solver_input_tokens // r.task_steps for r in results
                         if r.task_steps] or [0],
      'solver_calls': [r.task_steps for r in results],
  }


def episode_shape(phase_key: str, args) -> time_plan.EpisodeShape:
  """The phase's sample from `--episodes_json` (measured and stored when missing)."""
  store = {}
  if os.path.exists(args.episodes_json):
    with open(args.episodes_json, encoding='utf-8') as f:
      store = json.load(f)
  key = f'{PHASES[phase_key]}:{args.episodes}'
  if key not in store:
    print(f'measuring {args.episodes} Phase {PHASES[phase_key]} episodes ...', flush=True)
    store[key] = measure_episodes(PHASES[phase_key], args.episodes)
    os.makedirs(os.path.dirname(os.path.abspath(args.episodes_json)), exist_ok=True)
    with open(args.episodes_json, 'w', encoding='utf-8') as f:
      json.dump(store, f)
  return time_plan.EpisodeShape(**store[key])


def update_shape(config) -> time_plan.UpdateShape:
  """`time_plan.UpdateShape` of a phase config (its typed setup)."""
  run = run_setup.RunSetup.from_config(config)
  rl = config.rl
  dev = int(rl.eval_episodes) or int(config.episodes.num_dev)
  return time_plan.UpdateShape(
      tasks=int(rl.tasks_per_update), rollouts=int(rl.rollouts_per_task),
      prompt_buckets=tuple(int(b) for b in run.sampling.prompt_buckets),
      max_command_tokens=int(run.sampling.max_command_tokens),
      solver_new_tokens=int(run.solver.config.max_new_tokens),
      micro_batch=int(run.batching.micro_batch_size),
      length_buckets=tuple(int(b) for b in run.batching.length_buckets),
      command_buckets=tuple(int(b) for b in run.batching.command_buckets),
      mini_batches=int(rl.mini_batches_per_iteration), iterations=int(rl.num_iterations),
      eval_every=int(rl.eval_every), dev_episodes=dev,
      verifier_batch=int(config.verifier.batch_size),
      verifier_concurrency=int(config.verifier.max_concurrency),
      share_prefill=bool(run.sampling.share_prefill))


def plan_phase(phase_key: str, args, overrides) -> dict[str, Any]:
  """{hardware: {stage: seconds}} per update of one phase, its updates and shapes."""
  config = plan_memory.phase_config(phase_key, args.scale, args.model, overrides)
  mc = run_setup.RunSetup.from_config(config).model.config
  shape = update_shape(config)
  ep = episode_shape(phase_key, args)
  work = time_plan.update_work(mc, shape, ep)
  out = {}
  for name in args.hardware.split(','):
    out[name] = time_plan.stage_seconds(work, hardware.HARDWARE[name], hardware.EFFICIENCY,
                                        args.verifier_call_s, shape.verifier_concurrency)
  return {'seconds': out, 'updates': int(config.rl.num_updates),
          'episode': {'decisions_mean': float(np.mean(ep.decisions)),
                      'prompt_mean': float(np.mean([p for e in ep.prompts for p in e])),
                      'prompt_max': int(max(p for e in ep.prompts for p in e)),
                      'command_mean': float(np.mean(ep.commands)),
                      'command_max': int(max(ep.commands)),
                      'solver_prompt_mean': float(np.mean(ep.solver_prompts))},
          'model': f'{mc.num_hidden_layers} layers, hidden {mc.hidden_size}'}


def check_costs(args, overrides) -> dict[str, float]:
  """Analytic FLOPs over XLA's cost_analysis() of the memory plan's learner and
  sampler programs, for the config's model cut to 2 unscanned layers (one device)."""
  small = dict(overrides, **{'model.num_hidden_layers': 2, 'model.scan_layers': False,
                             'model.mesh_data': 1, 'model.mesh_fsdp': 1,
                             'model.mesh_tensor': 1, 'batching.micro_batch_size': 1,
                             'batching.length_buckets': (512,),
                             'batching.command_buckets': (64,)})
  config = plan_memory.phase_config(args.config, args.scale, args.model, small)
  s = memory_plan.plan_settings(config, 1)
  s = dataclasses.replace(s, rollout_rows=1, shared_prefill_rows=1, prompt_len=128,
                          max_new_tokens=16)
  plan = memory_plan.make_plan(s, stages=('learner', 'sampler'), devices=jax.devices()[:1])
  mc = s.model_config
  return {
      'learner': time_plan.learner_flops(mc, 1, 512, 64) / plan.stages['learner']['flops'],
      'sampler': time_plan.generate_flops(mc, 1, 1, 128, 16, 1)
                 / plan.stages['sampler']['flops']}


def format_table(phase_key: str, r: dict[str, Any]) -> str:
  """The per-stage table of one phase (seconds and share per hardware)."""
  names = list(r['seconds'])
  lines = [f'| stage | ' + ' | '.join(names) + ' |',
           '| --- |' + ' --- |' * len(names)]
  totals = {n: sum(r['seconds'][n].values()) for n in names}
  for stage in STAGE_NAMES:
    cells = [f'{r["seconds"][n][stage]:.1f} s ({r["seconds"][n][stage] / totals[n]:.0%})'
             for n in names]
    lines.append(f'| {stage} | ' + ' | '.join(cells) + ' |')
  lines.append('| **per update** | ' + ' | '.join(f'**{totals[n]:.1f} s**'
                                                   for n in names) + ' |')
  lines.append(f'| {phase_key} ({r["updates"]} updates) | ' + ' | '.join(
      f'{totals[n] * r["updates"] / 3600:.1f} h' for n in names) + ' |')
  return '\n'.join(lines)


def _parser():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--config', default='phase_b.py', help='RL phase config (phase_a/b/c)')
  ap.add_argument('--scale', default='paper')
  ap.add_argument('--model', default=None, help='preset name or HF config.json')
  ap.add_argument('--hardware', default=','.join(hardware.HARDWARE),
                  help=f'comma-separated, of {sorted(hardware.HARDWARE)}')
  ap.add_argument('--episodes', type=int, default=64, help='sampled episodes per phase')
  ap.add_argument('--episodes_json', default=os.path.join(
      os.path.expanduser('~'), '.cache', 'vermem_jax', 'plan_time_episodes.json'),
                  help='cache of the measured episode samples')
  ap.add_argument('--verifier_call_s', type=float, default=hardware.VERIFIER_CALL_S,
                  help='assumed seconds per batched verifier request')
  ap.add_argument('--check', action='store_true',
                  help='print analytic / cost_analysis() FLOPs of the learner and sampler')
  ap.add_argument('--set', action='append', default=[], metavar='SECTION.FIELD=VALUE')
  bench_common.add_out_flag(ap)
  return ap


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  phase = args.config[:-3] if args.config.endswith('.py') else args.config
  try:
    if phase not in PHASES:
      raise ValueError(f'--config must be one of {sorted(PHASES)} (.py), got '
                       f'{args.config!r}')
    unknown = sorted(set(args.hardware.split(',')) - set(hardware.HARDWARE))
    if unknown:
      raise ValueError(f'unknown --hardware {unknown}; known: {sorted(hardware.HARDWARE)}')
    if args.episodes < 1:
      raise ValueError(f'--episodes must be >= 1, got {args.episodes}')
    args.config = phase
    overrides = plan_memory.overrides_from(args.set)
    plan_memory.phase_config(phase, args.scale, args.model, overrides)
  except (ValueError, KeyError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  figures = {}
  if args.check:
    figures['check'] = check_costs(args, overrides)
    print('analytic / cost_analysis() FLOPs: ' + ', '.join(
        f'{k} {v:.3f}' for k, v in figures['check'].items()))
  results = {p: plan_phase(p, args, overrides) for p in PHASES}
  r = results[phase]
  e = r['episode']
  print(f'plan_time: {phase}:scale={args.scale}, {r["model"]}; episodes: '
        f'{e["decisions_mean"]:.2f} decisions, g(s) {e["prompt_mean"]:.0f} tokens mean '
        f'({e["prompt_max"]} max), command {e["command_mean"]:.0f} ({e["command_max"]} '
        f'max), solver prompt {e["solver_prompt_mean"]:.0f}; verifier request '
        f'{args.verifier_call_s:g} s (assumed)')
  print(format_table(phase, r))
  print('\ncurriculum (phase_a + phase_b + phase_c, one seed):')
  for name in r['seconds']:
    hours = {p: sum(x['seconds'][name].values()) * x['updates'] / 3600
             for p, x in results.items()}
    print(f'  {hardware.HARDWARE[name].name}: ' + ', '.join(
        f'{p} {h:.1f} h' for p, h in hours.items()) + f'; total {sum(hours.values()):.1f} h')
  figures['phases'] = results
  bench_common.write_figures(args.out, figures)
  return 0


if __name__ == '__main__':
  sys.exit(main())
