r"""Downloads the official HotpotQA train and dev-distractor files (docs/data.md).

    python experiments/download_data.py --data_dir=/data/vermem
    python experiments/run.py --config=phase_c.py:scale=paper \
        --config.data.data_dir=/data/vermem ...

The files land in `<data_dir>/hotpotqa/` under their official names, where the loader
prefers them over the packaged samples (`--config.data.data_dir=<data_dir>`, or
`VERMEM_DATA_DIR=<data_dir>`). URLs, sha256 sums and transfer settings are fields of
`experiments/configs/download/hotpotqa.py`, overridden with `--config.<field>=value`
(e.g. `--config.files.train.url=...`). Each file shows a progress bar, resumes an
interrupted transfer from `<file>.part`, and is renamed to its final name only after
its sha256 matched. Errors (offline, HTTP status, sha256 mismatch, a missing sum
without `--allow_unverified`, bad flags) print one line and exit with status 2.
"""

from __future__ import annotations

import os
import pathlib
import sys

_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
  sys.path.insert(0, str(_REPO_ROOT))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments.cli import config_argv  # noqa: E402
from vermem_jax import paths  # noqa: E402
from vermem_jax.envs import hotpotqa_download  # noqa: E402

# Not among the run configs beside it (run.py lists those), so in a folder of its own.
DEFAULT_CONFIG = config_argv.CONFIG_DIR / 'download' / 'hotpotqa.py'
_CONFIG = config_flags.DEFINE_config_file(
    'config', None, f'The download config: URLs, sha256 sums, transfer settings '
    f'(default {DEFAULT_CONFIG}).', lock_config=True)
_DATA_DIR = flags.DEFINE_string(
    'data_dir', None, 'Data root; the files go to <data_dir>/hotpotqa/.')
_FILES = flags.DEFINE_list(
    'files', None, 'Names in config.files to fetch (default: all of them).')
_ALLOW_UNVERIFIED = flags.DEFINE_bool(
    'allow_unverified', False, 'Accept a file whose config has no sha256.')


def main(argv) -> int:
  if len(argv) > 1:
    raise hotpotqa_download.DownloadError(f'unexpected arguments {argv[1:]}')
  if not _DATA_DIR.value:
    raise hotpotqa_download.DownloadError('--data_dir is required (the data root)')
  config = _CONFIG.value
  names = _FILES.value or list(config.files.keys())
  unknown = sorted(set(names) - set(config.files.keys()))
  if unknown:
    raise hotpotqa_download.DownloadError(
        f'--files: unknown {unknown}; known: {sorted(config.files.keys())}')
  dest = paths.hotpotqa_dir(os.path.abspath(_DATA_DIR.value))
  for name in names:
    f = config.files[name]
    path = hotpotqa_download.download_file(
        hotpotqa_download.FileSpec(url=f.url, filename=f.filename, sha256=f.sha256),
        dest, timeout_s=config.timeout_s, chunk_bytes=config.chunk_bytes,
        retries=config.retries, allow_unverified=_ALLOW_UNVERIFIED.value)
    print(f'{name}: {path} ({"sha256 ok" if f.sha256 else "unverified"})')
  print(f'use it with --config.data.data_dir={os.path.abspath(_DATA_DIR.value)} '
        f'(or {paths.DATA_DIR_ENV}={os.path.abspath(_DATA_DIR.value)})')
  return 0


def _main(argv) -> None:
  try:
    sys.exit(main(argv))
  except hotpotqa_download.DownloadError as e:
    print(f'download_data: error: {e}', file=sys.stderr)
    sys.exit(2)


def entry() -> None:
  """Parses the flags here, so bad flags and config overrides (a misspelled field, a
  value the field cannot take) are one error line with exit status 2."""
  argv = list(sys.argv)
  if any(a in ('-h', '--help', '--helpshort') for a in argv[1:]):
    app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
  if not any(a == '--config' or a.startswith('--config=') for a in argv[1:]):
    argv.insert(1, f'--config={DEFAULT_CONFIG}')
  try:
    argv = config_argv.resolve_config_argv(argv)
    config_argv.check_config_argv(argv)
    remaining = flags.FLAGS(argv)
  except (ValueError, flags.Error) as e:
    print(f'download_data: error: {e}', file=sys.stderr)
    sys.exit(2)
  app.run(_main, argv=argv, flags_parser=lambda unused_argv: remaining)


if __name__ == '__main__':
  entry()
