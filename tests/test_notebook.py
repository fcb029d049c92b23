"""Executes experiments/notebooks/advantage_statistics.ipynb with nbclient on the tiny
curriculum's workdir (tests/test_curriculum_e2e.py, run once per pytest process)."""
import os
import re

import nbclient
import nbformat
import pytest

from test_curriculum_e2e import curriculum_workdir  # pylint: disable=g-bad-import-order
from vermem_jax.train import metrics as metrics_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, 'experiments', 'notebooks', 'advantage_statistics.ipynb')
FIGURES = ('advantages_by_operation', 'rejected_share', 'monitors',
           'rejection_preference')
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def _execute(workdir, fig_dir, run_dir, monkeypatch):
  monkeypatch.setenv('VERMEM_WORKDIR', str(workdir))
  monkeypatch.setenv('VERMEM_FIG_DIR', str(fig_dir))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  # 'python3' is ipykernel's kernel; jupyter_client starts it with sys.executable, so
  # it runs in this interpreter's environment (the project's venv).
  client = nbclient.NotebookClient(nb, kernel_name='python3', timeout=300,
                                   resources={'metadata': {'path': str(run_dir)}})
  client.execute()
  return nb


def test_notebook_plots_the_tiny_run(tmp_path, monkeypatch):
  workdir = curriculum_workdir()
  fig_dir = tmp_path / 'figures'
  nb = _execute(workdir, fig_dir, tmp_path, monkeypatch)
  outputs = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs]
  assert not [o for o in outputs if o.output_type == 'error']
  images = [o for o in outputs if o.output_type == 'display_data'
            and 'image/png' in o.get('data', {})]
  assert len(images) == len(FIGURES)
  for name in FIGURES:
    path = fig_dir / f'{name}.png'
    assert path.exists(), name
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, name
  text = ''.join(o.get('text', '') for o in outputs if o.output_type == 'stream')
  for phase in ('phase_a', 'phase_b', 'phase_c'):
    rows = metrics_lib.read_jsonl(os.path.join(workdir, phase,
                                               metrics_lib.ADVANTAGES_FILE))
    assert f'{phase}: {len(rows)} decisions over 1 updates' in text


def test_notebook_names_a_missing_workdir(tmp_path, monkeypatch):
  with pytest.raises(nbclient.exceptions.CellExecutionError, match='no RL phase logs'):
    _execute(tmp_path / 'empty', tmp_path / 'figures', tmp_path, monkeypatch)


def test_notebook_without_workdir_says_what_to_set_and_creates_nothing(tmp_path,
                                                                      monkeypatch):
  monkeypatch.delenv('VERMEM_WORKDIR', raising=False)
  monkeypatch.delenv('VERMEM_FIG_DIR', raising=False)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, kernel_name='python3', timeout=300,
                                   resources={'metadata': {'path': str(tmp_path)}})
  with pytest.raises(nbclient.exceptions.CellExecutionError, match='set VERMEM_WORKDIR'):
    client.execute()
  assert not os.listdir(tmp_path)


# The logs of a real default run (`make run`: SFT -> A -> B at the tiny scale), trimmed
# to the files the notebook reads (tests/data/default_run/README.md says how they were
# made). Unlike the test curriculum's single update of an untrained policy, they hold
# several operation types and monitors that move.
DEFAULT_RUN = os.path.join(REPO, 'tests', 'data', 'default_run')


def test_notebook_on_a_default_run_shows_operations_and_moving_monitors(tmp_path,
                                                                        monkeypatch):
  nb = _execute(DEFAULT_RUN, tmp_path / 'figures', tmp_path, monkeypatch)
  outputs = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs]
  assert not [o for o in outputs if o.output_type == 'error']
  text = ''.join(o.get('text', '') for o in outputs if o.output_type == 'stream')
  for phase in ('phase_a', 'phase_b'):
    rows = metrics_lib.read_jsonl(os.path.join(DEFAULT_RUN, phase,
                                               metrics_lib.ADVANTAGES_FILE))
    ops = {r['operation'] for r in rows}
    assert len(ops) > 1, (phase, ops)
    assert f'{phase}: {len(ops)} operation types' in text
    monitors = [r['monitor/m_all'] for r in metrics_lib.read_jsonl(
        os.path.join(DEFAULT_RUN, phase, metrics_lib.METRICS_FILE)) if 'monitor/m_all' in r]
    assert max(monitors) - min(monitors) > 0.01, (phase, monitors)
    assert f'{phase}: monitor/m_all first' in text
  for name in FIGURES:
    assert (tmp_path / 'figures' / f'{name}.png').exists(), name
  # Rejection preference recomputed from advantages.jsonl (these logs predate the
  # logged share: '-'). Phase B's update 1, from the file: the 4 executable decisions
  # at A^hier -5.0, the 12 rejected at 8 x -1.0 and 4 x -0.5 -> mean -0.833, all 4
  # executable below it; update 2 has no executable decision (NaN).
  assert re.search(r'phase_b +1 +-0\.833 +-5\.000 +1\.00 +-\n', text), text
  assert re.search(r'phase_b +2 +-0\.625 +nan +nan +-\n', text), text
