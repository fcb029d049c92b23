"""Imports a script of experiments/benchmarks as a module, for tests of its functions.

The scripts run as `python experiments/benchmarks/<name>.py` and import their folder's
helpers (`bench_common`) by bare name, so the folder is on sys.path while one loads.
"""
import importlib
import os
import sys

FOLDER = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', 'experiments',
                                      'benchmarks'))


def load(name):
  """The module experiments/benchmarks/<name>.py (cached by Python after the first)."""
  sys.path.insert(0, FOLDER)
  try:
    return importlib.import_module(name)
  finally:
    sys.path.pop(0)
