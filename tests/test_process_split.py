"""An update split over processes (rl/process_split.py, the collective mode of
rl/policy.SamplerPolicy, task_selection.BoundPolicy.drain, rl_selection.dev_evaluation)
against the same update in one process.

The processes are threads here, joined by `ThreadGroup` (an allgather over a barrier),
so the split logic is checked exactly and fast; tests/test_multihost.py runs the real
thing on JAX's distributed runtime.
"""
import dataclasses
import threading

import jax
import numpy as np
import pytest

# The tokenizer and oracle fixtures, the scripted policy and the collection helper.
from test_rollout import K, Scripted, _collect, _family_specs, oracle, tok  # noqa: F401  pylint: disable=g-bad-import-order,unused-import
from vermem_jax.envs import episode_types
from vermem_jax.memory.config import ExecutorConfig
from vermem_jax.models import qwen_config
from vermem_jax.models import sampling
from vermem_jax.rl import policy as pol
from vermem_jax.rl import process_split
from vermem_jax.rl import rollout
from vermem_jax.rl import running_stats
from vermem_jax.rl import task_selection
from vermem_jax.train import rl_phase
from vermem_jax.train import rl_selection
from vermem_jax.verifiers.backends import make_verifier


class _Shared:

  def __init__(self, count):
    self.slots = [None] * count
    self.barrier = threading.Barrier(count, timeout=60)
    self.calls = 0


class ThreadGroup:
  """The process-group interface (`index`, `count`, `allgather`) over threads."""

  def __init__(self, index, shared):
    self.index, self.count, self._shared = index, len(shared.slots), shared

  def allgather(self, obj):
    self._shared.barrier.wait()
    self._shared.slots[self.index] = obj
    self._shared.barrier.wait()
    out = list(self._shared.slots)
    if self.index == 0:
      self._shared.calls += 1
    return out


def run_processes(count, fn):
  """[fn(group) for each of `count` thread-processes] (raises the first error)."""
  shared = _Shared(count)
  results, errors = [None] * count, [None] * count

  def target(i):
    try:
      results[i] = fn(ThreadGroup(i, shared))
    except BaseException as e:  # pylint: disable=broad-except
      errors[i] = e
      shared.barrier.abort()
  threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  for e in errors:
    if e is not None and not isinstance(e, threading.BrokenBarrierError):
      raise e
  assert not any(errors), errors
  return results


# ----------------------------------------------------------------------------- pieces
def test_blocks_are_contiguous_and_cover_everything():
  assert [process_split.block(5, i, 2) for i in range(2)] == [(0, 3), (3, 5)]
  assert [process_split.block(7, i, 3) for i in range(3)] == [(0, 3), (3, 5), (5, 7)]
  ids = [11, 12, 13, 14, 15]
  parts = run_processes(2, lambda g: process_split.split_tasks(ids, g))
  assert parts == [[11, 12, 13], [14, 15]]
  assert process_split.split_tasks(ids, None) == ids


def test_an_error_on_one_process_is_raised_on_all():
  def work(group):
    def fn():
      if group.index == 1:
        raise ValueError('config.data.data_dir: missing on this host')
      return 'ok'
    try:
      process_split.run_and_share(fn, group.allgather, group.index)
    except ValueError as e:
      return str(e)
    return None
  assert run_processes(2, work) == ['config.data.data_dir: missing on this host'] * 2
  # Without an error, every process gets everyone's shared part.
  got = run_processes(3, lambda g: process_split.run_and_share(
      lambda: {'me': g.index}, g.allgather, g.index, share=lambda r: r['me']))
  assert got == [({'me': i}, [0, 1, 2]) for i in range(3)]


# ----------------------------------------------------------------------------- an update
@pytest.fixture(scope='module')
def four_tasks(pools, tok, oracle):
  """Four Phase B tasks whose reference command lets the oracle answer at once."""
  families = ('select_episode', 'retrieve')
  specs = (_family_specs(pools[0], tok, families, 1024, solved_by=oracle)
           + _family_specs(pools[0][40:], tok, families, 1024, solved_by=oracle))
  assert len({s.episode_id for s in specs}) == 4
  return specs


def _stats():
  stats = running_stats.RunningStats()
  stats.init_from({'Null': [0.2, 0.6], 'SelectEpisode': [0.5, 0.9],
                   'Retrieve': [0.4, 0.8]})
  return stats


def _split_update(specs, tok, oracle, count):
  """The update collected by `count` thread-processes: (local results, gathered
  results, each process's running statistics)."""
  def work(group):
    mine = process_split.split_tasks(specs, group)
    stats = _stats()
    res = rollout.collect_update(
        mine, Scripted(mine), oracle, make_verifier({'backend': 'heuristic'}),
        rollout.CollectConfig(rollouts_per_task=K, executor_config=ExecutorConfig(
            phase='B', context_budget=1024, policy_input_limit=2048)),
        rng=jax.random.PRNGKey(0), count_tokens=tok.count_tokens, running_stats=stats,
        phase='phase_b', update=1, group=group)
    return res, process_split.gather_result(res, group), stats
  return run_processes(count, work)


def _decision_key(d):
  return (d.index, d.task, d.rollout, d.trajectory, d.step, d.command, d.op, d.accepted,
          d.cost, d.r_local, d.a_local, d.a_global, d.a_hier)


@pytest.mark.parametrize('count', [2, 3])
def test_split_update_equals_the_single_process_update(four_tasks, tok, oracle, count):
  stats = _stats()
  one = _collect(four_tasks, Scripted(four_tasks), tok, oracle, stats=stats,
                 budget=1024, limit=2048)
  # >= 8 ∅ decisions: A^local of ∅ uses the batch statistics of the whole update.
  assert one.advantages.local_ops['Null'].source == 'batch'
  parts = _split_update(four_tasks, tok, oracle, count)
  # Each process holds its own block, with indices into the whole update ...
  local = [d for res, _, _ in parts for d in res.decisions]
  assert [_decision_key(d) for d in local] == [_decision_key(d) for d in one.decisions]
  assert [len(res.trajectories) for res, _, _ in parts] == [
      K * (b - a) for a, b in (process_split.block(4, i, count) for i in range(count))]
  for res, whole, run_stats in parts:
    # ... and every process the same advantages, statistics and whole-update records.
    assert run_stats.to_dict() == stats.to_dict()
    assert [_decision_key(d) for d in whole.decisions] == [
        _decision_key(d) for d in one.decisions]
    assert [t.rewards for t in whole.trajectories] == [
        t.rewards for t in one.trajectories]
    assert whole.advantage_rows() == one.advantage_rows()
    assert [(d.prompt_ids, d.command_ids, d.logprobs) for d in whole.decisions] == [
        (d.prompt_ids, d.command_ids, d.logprobs) for d in one.decisions]
    for k in ('a_hier', 'a_local', 'a_global', 'traj_a_global', 'traj_a_task'):
      np.testing.assert_array_equal(getattr(whole.advantages, k),
                                    getattr(one.advantages, k))
    timeless = lambda m: {k: v for k, v in m.items() if not k.startswith('time/')}
    assert timeless(whole.metrics) == timeless(one.metrics)
    # The light trajectories keep every count of the episode (tokens, tool calls,
    # rejected calls) that the phase's summary row reads.
    assert rl_phase.rollout_summary(whole) == rl_phase.rollout_summary(one)
    assert set(whole.timings) == set(one.timings)
  t = one.trajectories[0]
  t = dataclasses.replace(t, result=dataclasses.replace(
      t.result, tool_calls=2, rejected_tool_calls=3, task_steps=4))
  light = process_split._light_trajectory(t).result  # pylint: disable=protected-access
  assert (light.spec, light.decisions, light.final_state) == (None, (), None)
  heavy = ('spec', 'decisions', 'final_state')
  assert {f.name: getattr(light, f.name) for f in dataclasses.fields(light)
          if f.name not in heavy} == {f.name: getattr(t.result, f.name) for f in
                                      dataclasses.fields(light) if f.name not in heavy}


# ----------------------------------------------------------------------------- sampler
class FakeGenerate:
  """A generate_fn whose row b's tokens depend on (its prompt, b, the batch size, the
  key), as the real sampler's do; it records each call's batch."""

  def __init__(self):
    self.batches = []

  def __call__(self, config, params, prompts, *, rng, max_new_tokens, **unused):
    del config, params
    self.batches.append([tuple(p) for p in prompts])
    seed = int(np.asarray(jax.random.key_data(rng) if jax.dtypes.issubdtype(
        rng.dtype, jax.dtypes.prng_key) else rng).sum())
    b = len(prompts)
    tokens = np.zeros((b, max_new_tokens), np.int32)
    logprobs = np.zeros((b, max_new_tokens), np.float32)
    for i, p in enumerate(prompts):
      h = (sum(p) * 31 + i * 7 + b * 13 + seed) % 1000
      tokens[i, :2] = [100 + h, 200 + h]
      logprobs[i, :2] = [-h / 1000, -1.0]
    return sampling.GenerationOutput(tokens, logprobs, np.full((b,), 2, np.int32))


def _policy(tok, generate, group=None, batch=8):
  return pol.SamplerPolicy(
      qwen_config.QwenConfig.preset('tiny'), None, tok,
      sampling_config=pol.PolicySamplingConfig(max_command_tokens=4),
      batch_buckets=(batch,), generate_fn=generate, group=group)


def test_collective_sampler_samples_the_single_process_batch(tok):
  inputs = [[f'state {i} of process 0' for i in range(3)], ['state 0 of process 1']]
  # Process 0 has episodes for 3 rounds, process 1 for 1 round.
  rounds = [3, 1]
  single_gen = FakeGenerate()
  single = _policy(tok, single_gen)
  bound = task_selection.BoundPolicy(single, 0)
  want = [bound(inputs[0] + inputs[1])]
  want += [bound(inputs[0]) for _ in range(rounds[0] - 1)]

  gens = [FakeGenerate(), FakeGenerate()]

  def work(group):
    me = group.index
    b = task_selection.BoundPolicy(_policy(tok, gens[me], group), 0)
    outs = [b(inputs[me]) for _ in range(rounds[me])]
    joined = b.drain()
    return outs, joined, b.calls
  parts = run_processes(2, work)
  # Every process ran every round's generate on the same global batch as one process.
  assert gens[0].batches == gens[1].batches == single_gen.batches
  assert [len(b) for b in single_gen.batches] == [8, 8, 8]
  (outs0, joined0, calls0), (outs1, joined1, calls1) = parts
  assert (joined0, joined1) == (0, 2) and calls0 == calls1 == 3
  text = lambda outs: [[(o.token_ids, o.logprobs, o.prompt_ids) for o in r] for r in outs]
  assert text(outs0)[0] + text(outs1)[0] == text([want[0]])[0]
  assert text(outs0)[1:] == text(want[1:])


# ----------------------------------------------------------------------------- dev scores
def test_split_dev_evaluation_equals_one_process(four_tasks, tok, oracle):
  kwargs = dict(count_tokens=tok.count_tokens,
                executor_config=ExecutorConfig(phase='B', context_budget=1024,
                                               policy_input_limit=2048),
                env_config=episode_types.EnvConfig(), seed=0, metric='r_task')
  reference = lambda xs, rng: ['∅'] * len(xs)
  one = rl_selection.dev_evaluation(four_tasks, reference, oracle, **kwargs)
  split = run_processes(2, lambda g: rl_selection.dev_evaluation(
      four_tasks, reference, oracle, group=g, **kwargs))
  assert split == [one, one]
  assert one['dev/episodes'] == 4.0
