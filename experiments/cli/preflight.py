"""Checks that fail in seconds, before any phase trains: a mistyped workdir or an
unreachable verifier should not surface after the first phase's work.

(The tokenizer/model check is the config layer's:
`experiments.configs.parts.validation.check_tokenizer_fits_model`.)
"""

from __future__ import annotations

import os

from absl import logging
import ml_collections

from experiments.configs.parts import library


def check_workdir_writable(workdir: str, *, create: bool = True) -> None:
  """Creates `workdir` if needed and proves a file can be written there.

  Runs before any training so a read-only or mistyped path fails in a second, not
  after the first phase's work. With `create=False` (a dry run, which writes nothing)
  it checks without writing: `workdir`, or the nearest folder above it that exists
  (where it would be created), must be a writable directory.

  Raises:
    ValueError: naming the path and the OS error.
  """
  import tempfile  # pylint: disable=g-import-not-at-top
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f'--workdir={workdir} is a file, not a directory; pass a directory '
                     '(it is created when missing)')
  if not create:
    existing = os.path.abspath(workdir)
    while not os.path.exists(existing):
      existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
      why = 'not a directory' if not os.path.isdir(existing) else 'not writable'
      raise ValueError(f'--workdir={workdir}: cannot write there ({existing} is {why}); '
                       'pass a writable --workdir')
    return
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=workdir, prefix='.write_test'):
      pass
  except OSError as e:
    raise ValueError(f'--workdir={workdir}: cannot write there ({e.strerror or e}); '
                     'pass a writable --workdir') from e


def check_verifier_endpoint(config: ml_collections.ConfigDict) -> None:
  """For `verifier.backend='openai_compatible'`: builds the verifier (API key variable
  set?) and sends one request (server up, URL and model right?) before any training.

  Raises:
    ValueError: `config.verifier: ...` naming what failed.
  """
  if config.verifier.backend != 'openai_compatible':
    return
  from vermem_jax.verifiers import backends  # pylint: disable=g-import-not-at-top
  try:
    verifier = backends.make_verifier(library.library_configs(config)['verifier'])
    try:
      verifier.preflight()
    finally:
      verifier.close()
  except ValueError as e:
    if str(e).startswith('config.'):
      raise
    raise ValueError(f'config.verifier: {e}') from e


def check_local_verifier(config: ml_collections.ConfigDict) -> None:
  """For `verifier.backend='local_model'` without `verifier.checkpoint_path` (random
  weights, whose scores are noise: the tests' setting): says so before any training,
  not after. (A named folder that does not exist is the config layer's error.)"""
  v = config.verifier
  if v.backend == 'local_model' and not v.get('checkpoint_path'):
    logging.warning('verifier.backend=local_model without verifier.checkpoint_path: the '
                    'verifier has random weights, so r^local and r^global are noise; set '
                    '--config.verifier.checkpoint_path=<HF checkpoint folder>')
