"""Tests for vermem_jax.train.compilation: the compile counter, the persistent cache
and the compile figures of the phase loop (train/phase_runner.py)."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vermem_jax import paths
from vermem_jax.train import checkpoints
from vermem_jax.train import compilation
from vermem_jax.train import metrics as metrics_lib
from vermem_jax.train import phase_runner
from vermem_jax.train import summaries

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A workload of several distinct programs (3 functions x 2 shapes), run in a fresh
# process with the cache config given on the command line; prints its counts.
WORKLOAD = r'''
import json, sys
import jax, jax.numpy as jnp
from vermem_jax.train import compilation
compilation.CompilationCacheConfig(compilation_cache_dir=sys.argv[1],
                                   cache_min_compile_time_secs=0.0).apply()
x = jax.device_put(jnp.arange(2.0))  # host-side setup before counting starts
start = compilation.snapshot()
fns = [jax.jit(lambda v, k=k: jnp.sin(v) * k + jnp.cumsum(v) ** k) for k in (1, 2, 3)]
for n in (64, 96):
  v = jnp.linspace(0.0, 1.0, n)
  for f in fns:
    f(v).block_until_ready()
d = compilation.snapshot() - start
print('RESULT ' + json.dumps({'compiled': d.compiled, 'hits': d.cache_hits,
                              'requested': d.requested}))
'''


def _run_workload(cache_dir):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [REPO, os.path.join(REPO, 'third_party'), os.environ.get('PYTHONPATH', '')]),
             JAX_PLATFORMS='cpu')
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  proc = subprocess.run([sys.executable, '-c', WORKLOAD, str(cache_dir)], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')][-1]
  return json.loads(line[len('RESULT '):])


def test_second_process_with_the_cache_compiles_90_percent_fewer(tmp_path):
  cold = _run_workload(tmp_path / 'cache')
  warm = _run_workload(tmp_path / 'cache')
  # 3 functions x 2 shapes, each at least one program of its own.
  assert cold['compiled'] >= 6 and cold['hits'] == 0
  assert warm['requested'] == cold['requested']
  assert warm['compiled'] <= 0.1 * cold['compiled'], (cold, warm)
  assert warm['hits'] == cold['compiled']
  # Without a cache directory nothing is read back.
  off = _run_workload('')
  assert off['hits'] == 0 and off['compiled'] == cold['compiled']


def test_counter_counts_new_shapes_only():
  f = jax.jit(lambda v: v * 3.0 - 1.0)
  a, b = jnp.ones((5,)), jnp.ones((7,))
  start = compilation.snapshot()
  f(a)
  after_one = compilation.snapshot() - start
  f(a)
  assert compilation.snapshot() - start == after_one  # the in-memory hit: no event
  f(b)
  assert (compilation.snapshot() - start).requested == after_one.requested + 1
  assert compilation.program_names(start)[-1] == 'jit(<lambda>)'


def test_default_cache_dir(monkeypatch, tmp_path):
  monkeypatch.delenv(paths.JAX_CACHE_ENV, raising=False)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert paths.default_compilation_cache_dir() == str(tmp_path / 'vermem_jax' / 'jax')
  monkeypatch.delenv('XDG_CACHE_HOME')
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  assert paths.default_compilation_cache_dir() == str(
      tmp_path / 'home' / '.cache' / 'vermem_jax' / 'jax')
  monkeypatch.setenv(paths.JAX_CACHE_ENV, '/shared/xla')
  assert paths.default_compilation_cache_dir() == '/shared/xla'


@pytest.mark.parametrize('field, value, match', [
    ('compilation_cache_dir', None, 'runtime.compilation_cache_dir'),
    ('cache_min_compile_time_secs', -1.0, 'runtime.cache_min_compile_time_secs'),
    ('cache_min_entry_size_bytes', -2, 'runtime.cache_min_entry_size_bytes'),
    ('cache_min_entry_size_bytes', 1.5, 'runtime.cache_min_entry_size_bytes'),
])
def test_bad_cache_config_names_the_field(field, value, match):
  with pytest.raises(ValueError, match=match):
    compilation.CompilationCacheConfig.from_config({field: value})


def test_bad_runtime_flag_exits_2(tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, 'experiments', 'run.py'), '--config=phase_b.py',
       f'--workdir={tmp_path}', '--config.runtime.cache_min_compile_time_secs=-3',
       '--dry_run'], capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=os.pathsep.join(
          [REPO, os.path.join(REPO, 'third_party')])))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'runtime.cache_min_compile_time_secs' in proc.stderr


class _ShapePhase:
  """A phase whose step n runs a jitted function on a vector of length
  `lengths[n - 1]` (a new length is a new program)."""

  def __init__(self, lengths):
    self.lengths = lengths
    self.fn = jax.jit(lambda v: jnp.tanh(v) * 0.5 + v.sum())

  def step(self, n):
    # Host arrays in and out: only `fn` itself is a program.
    out = np.asarray(self.fn(np.full((self.lengths[n - 1],), float(n), np.float32)))
    return phase_runner.StepResult({'value': float(out[0])}, {})

  def evaluate(self, n):
    return None

  def rows(self, n, result, evaluation, log_due):
    return [result.row] if log_due else []

  def train_state(self, n, metadata, selection):
    return checkpoints.TrainState(step=n, params={'w': np.zeros(2, np.float32)},
                                  metadata=metadata)


@pytest.mark.parametrize('lengths, after_first', [((11, 11, 11, 11), 0),
                                                  ((13, 13, 17, 13), 1)])
def test_runner_writes_compile_figures(tmp_path, lengths, after_first):
  loop = phase_runner.LoopSettings(save_every=100, log_every=100, max_to_keep=1,
                                   async_save=False, tensorboard=False,
                                   progress_bar=False)
  cfg = phase_runner.RunnerConfig(name='t', total=4, eval_every=0,
                                  max_consecutive_skips=1, loop=loop)
  with phase_runner.PhaseRunner(str(tmp_path), cfg) as runner:
    runner.run(_ShapePhase(lengths))
    figures = runner.compile_figures()
  rows = metrics_lib.read_jsonl(tmp_path / metrics_lib.METRICS_FILE)
  # log_every=100: only the last step is written; its cumulative figure still counts
  # step 3's new program.
  assert [r['step'] for r in rows] == [4]
  assert rows[-1]['compile/after_first_step'] == after_first
  assert rows[-1]['compile/programs'] == 0  # step 4 reuses what earlier steps compiled
  assert figures['compile/after_first_step'] == after_first
  assert figures['compile/programs_total'] + figures['compile/cache_hits_total'] >= 1
  line = summaries.phase_summary('sft', {'step': 4, **figures}, str(tmp_path)).splitlines()[-1]
  assert line.strip().startswith('programs compiled: ')
  assert line.endswith(f'after step 1: {after_first}')
