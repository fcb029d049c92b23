"""Policy-prompt lengths of paper-shaped episodes: bucket padding and shared prefixes.

    python experiments/benchmarks/prompt_buckets.py [--phase=phase_b] [--episodes=64]
        [--scale=paper] [--out=FILE.json]

Builds `--episodes` internal-dev episodes of the phase at the config's scale (paper:
policy_input_limit 8,192, the Qwen2.5 tokenizer from the shared data) and runs them
through the episode loop (`envs.environment.run_episodes`, all episodes in one batch
as one dev chunk) with a scripted policy: each episode's reference command
(`ScenarioSpec.reference_command`) at its first decision, the null command ∅ after
it, so the state grows only by what the schedule brings (observations, the query).
The task solver always asks for more (`continue`), so every episode runs its whole
schedule: the prompts cover every state size the schedule reaches (an upper bound on
what a policy that answers early sees). Every policy prompt (x_t in the chat template)
is tokenized; printed:

- the prompt-length distribution (tokens: min, quartiles, max) and decisions;
- per bucket scheme (the config's `sampling.prompt_buckets`, powers of two, multiples
  of 256 / 512, quarter octaves, each ending at the longest legal prompt): buckets, the padded/real prefill-token ratio
  with each prompt in its own bucket ('row'), and per sampler call as the sampler pads
  it (every distinct prompt of a call padded to the bucket of the call's longest:
  'call');
- the per-call figure of the config's buckets when the episodes' calls are split into
  chunks of the rollout batch (internal dev at paper scale: 800 episodes), in input
  order and by prompt length (what `models.batch_chunks` does);
- how much of g(s_t+1) repeats g(s_t) as a token prefix (the longest common prefix of
  consecutive prompts of an episode): the share of prefill tokens a cross-decision
  prefix cache could skip.

It asserts nothing (docs/compilation.md has the figures and the command).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from bench_common import add_out_flag, quiet_bm25s, write_figures
from experiments.configs import common
from experiments.configs.parts import derived
from experiments.configs.parts import library
from vermem_jax.envs import environment
from vermem_jax.envs import episode_types
from vermem_jax.envs import episodes as episodes_lib
from vermem_jax import paths
from vermem_jax.envs import task_solvers
from vermem_jax.memory import commands as mcommands
from vermem_jax.memory import serialization
from vermem_jax.rl import policy as policy_lib
from vermem_jax.train import setup as setup_lib


class _ScriptedPolicy:
  """Reference command first, ∅ after; records the prompt ids of every call."""

  def __init__(self, tokenizer, first_commands):
    self.tokenizer = tokenizer
    self.first = dict(first_commands)  # rendered x_0 -> reference command
    self.calls: list[list[tuple[int, ...]]] = []

  def __call__(self, inputs):
    ids = [tuple(policy_lib.policy_prompt_ids(self.tokenizer, x)) for x in inputs]
    self.calls.append(ids)
    return [episode_types.PolicyOutput(text=self.first.pop(x, mcommands.NULL_SYMBOL),
                                       input_tokens=len(p), prompt_ids=p)
            for x, p in zip(inputs, ids)]


class _ContinueSolver(task_solvers.TaskSolver):
  """Never answers, so an episode ends at its decision limit."""

  def solve(self, inputs):
    return [task_solvers.SolverOutput(task_solvers.CONTINUE, None, 'Continue', 0, 0)
            for _ in inputs]


def _bucket(n: int, buckets) -> int:
  return next(b for b in buckets if b >= n)


def padding_ratios(calls, buckets) -> dict[str, float]:
  """{'buckets', 'row', 'call'}: padded over real prefill tokens of the recorded
  calls, each prompt in its own bucket ('row') or every distinct prompt of a call in
  the bucket of the call's longest ('call'; module docstring)."""
  real = sum(len(p) for call in calls for p in call)
  row = sum(_bucket(len(p), buckets) for call in calls for p in call)
  distinct = [set(call) for call in calls]
  real_distinct = sum(len(p) for call in distinct for p in call)
  padded_call = sum(len(call) * _bucket(max(len(p) for p in call), buckets)
                    for call in distinct)
  return {'buckets': len(buckets), 'row': row / real, 'call': padded_call / real_distinct}


def chunked_calls(calls, size: int, by_length: bool):
  """Each recorded call split into sampler calls of at most `size` prompts, in input
  order or by prompt length (models/batch_chunks.py takes the latter)."""
  out = []
  for call in calls:
    rows = sorted(call, key=len) if by_length else list(call)
    out += [rows[i:i + size] for i in range(0, len(rows), size)]
  return out


def common_prefix(a, b) -> int:
  """Length of the longest common prefix of two token sequences."""
  n = min(len(a), len(b))
  diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
  return int(diff[0]) if len(diff) else n


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--phase', default='phase_b', choices=('phase_a', 'phase_b',
                                                             'phase_c'))
  parser.add_argument('--episodes', type=int, default=64)
  parser.add_argument('--scale', default='paper', choices=('paper', 'tiny'))
  add_out_flag(parser)
  args = parser.parse_args()
  quiet_bm25s()
  config = common.get_config(args.phase, f'scale={args.scale}')
  if args.scale == 'paper':
    config.tokenizer.path = paths.tokenizer_dir('qwen2.5')
  libs = library.library_configs(config)
  tok = setup_lib.load_tokenizer(setup_lib.tokenizer_path(config))
  scfg = dataclasses.replace(libs['episodes'], num_train=0, num_dev=args.episodes)
  construction, dev_pool = episodes_lib.load_pools(libs['data'])
  _, specs = episodes_lib.build_phase_episodes(libs['memory'].phase, construction,
                                               dev_pool, count_tokens=tok.count_tokens,
                                               config=scfg)
  # x_0 of each spec, rendered as the episode loop renders it, -> its reference command.
  first = {}
  for s in specs:
    ecfg = environment.executor_config_for(s, libs['memory'])
    first[serialization.render_policy_input(
        s.initial_state, tok.count_tokens, allowed_ops=ecfg.ops,
        limit=ecfg.policy_input_limit, context_budget=ecfg.context_budget,
        local_ids=ecfg.local_ids)] = s.reference_command
  policy = _ScriptedPolicy(tok, first)
  results = environment.run_episodes(specs, policy, _ContinueSolver(), count_tokens=tok.count_tokens,
                                     executor_config=libs['memory'], env_config=libs['env'])
  lengths = np.array([len(p) for call in policy.calls for p in call])
  decisions = [r.num_decisions for r in results]
  # Consecutive prompts of one episode: call t holds the live episodes in spec order.
  per_episode: dict[int, list[tuple[int, ...]]] = {}
  live = list(range(len(specs)))
  for call in policy.calls:
    for i, p in zip(live, call):
      per_episode.setdefault(i, []).append(p)
    live = [i for i in live if len(per_episode[i]) < decisions[i]]
  shared = total_next = 0
  for prompts in per_episode.values():
    for a, b in zip(prompts, prompts[1:]):
      shared += common_prefix(a, b)
      total_next += len(b)
  # Every scheme ends at the longest legal prompt, as the config's does.
  largest = int(config.memory.policy_input_limit) + int(
      config.sampling.prompt_overhead_tokens)
  schemes = {
      'config': tuple(config.sampling.prompt_buckets),
      'powers of two': tuple(derived.power_of_two_buckets(256, largest)),
      'multiples of 256': tuple(derived.linear_buckets(256, largest, 256)),
      'multiples of 512': tuple(derived.linear_buckets(512, largest, 512)),
      'quarter octaves': tuple(derived.quarter_octave_buckets(256, largest)),
  }
  chunk = int(config.rl.tasks_per_update) * int(config.rl.rollouts_per_task)
  buckets = schemes['config']
  chunks = {f'chunks of {chunk}, {name}': padding_ratios(
      chunked_calls(policy.calls, chunk, by_length), buckets)
            for name, by_length in (('input order', False), ('by length', True))}
  figures = {
      'phase': args.phase, 'scale': args.scale, 'episodes': len(specs),
      'prompts': int(lengths.size), 'calls': len(policy.calls),
      'decisions_mean': float(np.mean(decisions)),
      'length_quantiles': {q: int(np.percentile(lengths, q)) for q in (0, 25, 50, 75, 100)},
      'schemes': {k: padding_ratios(policy.calls, v) for k, v in schemes.items()},
      'next_prompt_prefix_share': shared / max(total_next, 1),
      'chunks': chunks,
  }
  print(f'{args.phase} ({args.scale}): {len(specs)} dev episodes, {lengths.size} prompts '
        f'in {len(policy.calls)} calls, {np.mean(decisions):.1f} decisions/episode')
  print('prompt tokens (min, 25%, 50%, 75%, max):',
        ', '.join(str(v) for v in figures['length_quantiles'].values()))
  for name, r in figures['schemes'].items():
    print(f'  {name:<18s} {r["buckets"]:>3d} buckets   padded/real: per row '
          f'{r["row"]:.3f}, per call {r["call"]:.3f}')
  for name, r in chunks.items():
    print(f'  config buckets, {name:<26s} padded/real per call {r["call"]:.3f}')
  print(f'g(s_t+1) tokens that repeat g(s_t) as a prefix: '
        f'{figures["next_prompt_prefix_share"]:.3f}')
  write_figures(args.out, figures)


if __name__ == '__main__':
  main()
