"""vermem_jax/train/distributed.py in one process: how `initialize` decides, and that
every helper is the plain local operation without other processes. The multi-process
behaviour is tested by tests/test_multihost.py (2 processes on loopback) and the split
logic by tests/test_process_split.py."""
import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from vermem_jax.models import sharding as sharding_lib
from vermem_jax.train import distributed
from vermem_jax.train import metrics as metrics_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Options = distributed.DistributedOptions


@pytest.fixture
def no_cluster(monkeypatch):
  for var in ('JAX_COORDINATOR_ADDRESS', 'SLURM_JOB_ID', 'OMPI_MCA_orte_hnp_uri',
              'TPU_WORKER_HOSTNAMES'):
    monkeypatch.delenv(var, raising=False)


def test_single_process_unless_asked_or_detected(no_cluster, monkeypatch):
  assert distributed.initialize(Options()) == 'single'
  assert distributed.initialize(Options(mode='off')) == 'single'
  # A detected one-process job stays a plain process (SLURM would pin one GPU).
  monkeypatch.setattr(distributed, 'detected_cluster', lambda: ('SlurmCluster', 1))
  assert distributed.initialize(Options()) == 'single'
  assert not jax.distributed.is_initialized()


def test_slurm_job_is_detected(no_cluster, monkeypatch):
  # What srun sets for each task of a 2-node x 8-task job step.
  for var, value in (('SLURM_JOB_ID', '42'), ('SLURM_STEP_NODELIST', 'node[001-002]'),
                     ('SLURM_NTASKS', '16'), ('SLURM_PROCID', '3'),
                     ('SLURM_LOCALID', '3')):
    monkeypatch.setenv(var, value)
  assert distributed.detected_cluster() == ('SlurmCluster', 16)


@pytest.mark.parametrize('options, match', [
    (Options(mode='always'), '--distributed must be one of'),
    (Options(mode='off', num_processes=2), '--distributed=off contradicts'),
    (Options(coordinator_address='127.0.0.1:1', num_processes=2, process_id=2),
     r'--process_id must be in \[0, --num_processes=2\)'),
    (Options(num_processes=0), '--num_processes must be >= 1'),
    (Options(pathways=True), '--pathways needs the pathwaysutils package'),
])
def test_bad_flags_are_named(no_cluster, options, match):
  if options.pathways and importlib.util.find_spec('pathwaysutils') is not None:
    pytest.skip('pathwaysutils is installed here')
  with pytest.raises(ValueError, match=match):
    distributed.initialize(options)
  assert not jax.distributed.is_initialized()


def test_explicit_flags_or_coordinator_variable(no_cluster, monkeypatch):
  assert not Options().explicit
  assert Options(process_id=0).explicit
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '10.0.0.1:8476')
  assert Options().explicit


def test_helpers_are_local_in_one_process():
  assert (distributed.process_index(), distributed.process_count()) == (0, 1)
  assert distributed.is_primary() and distributed.process_group() is None
  assert distributed.share(10) == (0, 10)
  assert distributed.share(10, index=1, count=3) == (4, 7)
  obj = {'a': np.arange(3)}
  assert distributed.allgather_object(obj) == [obj]
  assert distributed.broadcast_object(obj) is obj
  assert distributed.on_primary(lambda: 5) == 5
  assert distributed.agree(lambda: 6) == 6
  with pytest.raises(ValueError, match='bad row'):
    distributed.agree(lambda: (_ for _ in ()).throw(ValueError('bad row')))
  distributed.check_same('the data', distributed.digest([1, 2]))
  distributed.barrier('nothing to wait for')
  mesh = sharding_lib.make_mesh(1, 1, 1)
  rows = NamedSharding(mesh, PartitionSpec(('data', 'fsdp')))
  x = np.arange(12, dtype=np.int32).reshape(4, 3)
  assert distributed.local_rows(rows, x.shape) == slice(0, 4)
  placed = distributed.global_batch_array(x, rows)
  assert placed.sharding == rows
  np.testing.assert_array_equal(distributed.to_host(placed), x)
  np.testing.assert_array_equal(distributed.tree_to_host({'y': jnp.ones(2)})['y'],
                                np.ones(2))


def test_disabled_metric_writers_check_rows_but_write_nothing(tmp_path):
  d = tmp_path / 'phase_a'
  writer = metrics_lib.MetricsWriter(d, resume_step=0, enabled=False)
  writer.write(1, {'train/loss': 1.0})
  with pytest.raises(ValueError, match='not a number'):
    writer.write(2, {'train/loss': 'x'})
  writer.close()
  table = metrics_lib.AdvantageTable(d, 'phase_a', resume_update=0, enabled=False)
  with pytest.raises(ValueError, match='missing columns'):
    table.add_rows([{'update': 1}])
  table.close()
  assert not d.exists()


def test_cli_rejects_bad_device_ids_before_anything_runs(tmp_path):
  res = subprocess.run(
      [sys.executable, os.path.join(REPO, 'experiments', 'run.py'), '--config=sft',
       f'--workdir={tmp_path / "w"}', '--local_device_ids=0,x'],
      cwd=REPO, capture_output=True, text=True, timeout=120,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert res.returncode == 2, res.stderr
  assert 'error: --local_device_ids=0,x: expected comma-separated device numbers' in (
      res.stderr)
  assert 'Traceback' not in res.stderr
  assert not (tmp_path / 'w').exists()
