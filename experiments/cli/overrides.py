"""A command's config overrides, and the configs of the phases it runs first.

Overrides apply to every phase a command runs: a prerequisite phase gets its own
defaults with this command's `--config.<field>` values on top (`phase_config`).
"""

from __future__ import annotations

from typing import Any, Sequence

import ml_collections

from experiments.configs import common
from experiments.configs.parts import derived
from vermem_jax import paths


def config_leaves(cfg: Any, prefix: str = '') -> dict[str, Any]:
  """Every leaf field of a ConfigDict: 'section.field' -> value (nested sections dotted)."""
  out = {}
  for key, value in cfg.items():
    path = f'{prefix}{key}'
    if isinstance(value, ml_collections.ConfigDict):
      out.update(config_leaves(value, path + '.'))
    else:
      out[path] = value
  return out


def config_overrides(config: ml_collections.ConfigDict,
                     override_paths: Sequence[str] | None = None) -> dict[str, Any]:
  """The overridden fields of `config` -> their values.

  With `override_paths` (the `--config.<field>` flags the user passed): exactly those
  fields, even where a value equals the default. Without (a config edited in code): the
  fields that differ from the phase/scale defaults, leaving out fields derived from
  others (bucket fields, the tiny tokenizer path) whose value is still the derived one.
  """
  leaves = config_leaves(config)
  if override_paths is not None:
    return {p: leaves[p] for p in dict.fromkeys(override_paths) if p in leaves}
  default = common.get_config(config.phase, f'scale={config.scale}')
  base = config_leaves(default)
  derived_values = dict(derived.derived_buckets(config))
  if config.scale == 'tiny':
    derived_values['tokenizer.path'] = paths.tokenizer_path(config.tokenizer.name,
                                                            config.data.data_dir)
  return {k: v for k, v in leaves.items()
          if k != 'phase' and (k not in base or base[k] != v)
          and not (k in derived_values and derived_values[k] == v)}


def phase_config(phase: str, scale: str,
                 overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """The config of a prerequisite phase: its defaults + this command's overrides."""
  cfg = common.get_config(phase, f'scale={scale}')
  for path, value in overrides.items():
    node = cfg
    *parents, leaf = path.split('.')
    try:
      for p in parents:
        node = node[p]
      if leaf in node:
        node[leaf] = value
    except KeyError:
      continue
  return cfg
