"""The `--config` flag and its `--config.<field>` overrides, read from argv before absl.

`--config` takes a path or a bare name (`phase_b`, `phase_b.py`) resolved against
experiments/configs/; text after ':' is the scale argument. A bad config file or a
misspelled override field is reported here as one `ValueError` line, not as an absl
traceback from inside ml_collections.
"""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

import ml_collections

CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / 'configs'


def resolve_config_path(value: str) -> str:
  """Maps `--config` text to a config file path, keeping any ':arg' suffix.

  'phase_b', 'phase_b.py', 'phase_b.py:scale=paper' -> '<repo>/experiments/configs/
  phase_b.py[:scale=paper]'; an existing path is kept as given.

  Raises:
    ValueError: neither a file nor a known config name (lists the known names).
  """
  path, sep, arg = value.partition(':')
  if os.path.isfile(path):
    return value
  name = path if path.endswith('.py') else path + '.py'
  candidate = CONFIG_DIR / name
  if os.sep not in path and candidate.is_file():
    return str(candidate) + sep + arg
  known = sorted(p.stem for p in CONFIG_DIR.glob('*.py')
                 if p.stem not in ('__init__', 'common'))
  raise ValueError(f'--config={value}: no such file, and {name!r} is not in {CONFIG_DIR} '
                   f'(known configs: {", ".join(known)})')


def resolve_config_argv(argv: Sequence[str]) -> list[str]:
  """Rewrites `--config=NAME` / `--config NAME` in argv to real paths (before absl parses).

  `--config.<field>=...` overrides are left alone.
  """
  out = list(argv)
  i = 1
  while i < len(out):
    a = out[i]
    if a == '--':
      break
    if a.startswith('--config='):
      out[i] = '--config=' + resolve_config_path(a[len('--config='):])
    elif a == '--config' and i + 1 < len(out):
      out[i + 1] = resolve_config_path(out[i + 1])
      i += 1
    i += 1
  return out


def _load_config_file(value: str) -> ml_collections.ConfigDict:
  """Builds the config named by a resolved `--config` value the way config_flags does
  (`module.get_config(*args after ':')`), so its errors can be reported cleanly."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path, sep, arg = value.partition(':')
  spec = importlib.util.spec_from_file_location('_vermem_cli_config', path)
  if spec is None or spec.loader is None:
    raise ValueError(f'--config={value}: {path} is not a Python config file')
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not hasattr(module, 'get_config'):
      raise ValueError(f'{path} defines no get_config()')
    return module.get_config(*([arg] if sep else []))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'--config={value}: {e}') from e


def _override_path(arg: str) -> str | None:
  """'rl.learning_rate' for '--config.rl.learning_rate=3e-6' (or the bare flag)."""
  for prefix in ('--config.', '-config.'):
    if arg.startswith(prefix):
      return arg[len(prefix):].partition('=')[0]
  return None


def config_override_args(argv: Sequence[str]) -> list[tuple[str, str]]:
  """The `--config.<field>` flags in argv, as (field path, flag text) pairs in order.

  `--config.seed 1` (value as the next argument) becomes ('seed', '--config.seed=1'),
  so every flag text is one shell word that reproduces the override.
  """
  out = []
  i = 1
  while i < len(argv):
    a = argv[i]
    if a == '--':
      break
    path = _override_path(a)
    if path:
      text = '--' + a.lstrip('-')
      if '=' not in a and i + 1 < len(argv) and not argv[i + 1].startswith('-'):
        text += '=' + argv[i + 1]
        i += 1
      out.append((path, text))
    i += 1
  return out


def check_config_argv(argv: Sequence[str]) -> None:
  """Checks a resolved argv's `--config` file and `--config.<field>` names before absl.

  Without this, a bad scale argument or a misspelled field surfaces as an absl
  traceback from inside ml_collections (`AttributeError: "'nonexistent'"`).

  Raises:
    ValueError: the config file cannot be built (e.g. `:scale=huge`), an override
      sets `scale` (only `--config=<phase>.py:scale=...` can), or an override
      names a field the config lacks (lists the section's fields, with a close match).
  """
  import difflib  # pylint: disable=g-import-not-at-top
  value = None
  for i, a in enumerate(argv):
    if a == '--':
      break
    if a.startswith('--config='):
      value = a[len('--config='):]
    elif a == '--config' and i + 1 < len(argv):
      value = argv[i + 1]
  overrides = [p for p in map(_override_path, argv) if p]
  if value is None:
    return  # main() reports the missing --config
  if 'scale' in overrides:
    # The scale picks every number when the file builds the config; overriding the
    # field afterwards would relabel tiny values as paper ones.
    name = pathlib.Path(value.partition(':')[0]).stem
    raise ValueError(f'--config.scale cannot change the scale of a built config; pass '
                     f'--config={name}.py:scale=paper instead')
  config = _load_config_file(value)
  if not isinstance(config, ml_collections.ConfigDict):
    return  # not ours to check
  for path in overrides:
    node, done = config, []
    for key in path.split('.'):
      if not isinstance(node, ml_collections.ConfigDict) or key not in node:
        where = 'config' + ''.join('.' + d for d in done)
        if not isinstance(node, ml_collections.ConfigDict):
          raise ValueError(f'--config.{path}: {where} is a value, not a section')
        known = sorted(node.keys())
        close = difflib.get_close_matches(key, known, n=1)
        hint = f' (did you mean {close[0]!r}?)' if close else ''
        raise ValueError(f'--config.{path}: {where} has no field {key!r}{hint}; its '
                         f'fields: {", ".join(known)}')
      node = node[key]
      done.append(key)
