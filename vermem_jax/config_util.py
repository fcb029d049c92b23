"""Builds the library's typed config dataclasses from config sections (plain Python).

The experiment ConfigDict keeps one section per layer (`data`, `episodes`, `sft`,
`verifier`, ...) whose keys equal the dataclass field names (team contract); a section
may hold keys for other consumers too, so most builders ignore keys a class lacks,
while user-facing entry points (e.g. `verifiers.make_verifier`) reject them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

T = TypeVar('T')


def dataclass_from_mapping(cls: type[T], mapping: Mapping[str, Any], *,
                           strict: bool = False, what: str | None = None,
                           overrides: Mapping[str, Any] | None = None) -> T:
  """`cls(**mapping)` restricted to `cls`'s init fields, then `overrides` on top.

  Args:
    cls: a dataclass type.
    mapping: a dict-like config section (dict, ConfigDict, ...).
    strict: raise on keys `cls` lacks instead of ignoring them.
    what: the section's name in that error (default: `cls.__name__`).
    overrides: values set by the caller (not filtered: a wrong name is a TypeError
      from `cls`, i.e. a programming error).

  Returns:
    The `cls` instance (its `__post_init__` validates the values).

  Raises:
    ValueError: strict and unknown keys (named, with the known ones).
  """
  values = dict(mapping)
  names = {f.name for f in dataclasses.fields(cls) if f.init}
  unknown = sorted(set(values) - names)
  if strict and unknown:
    raise ValueError(f'unknown {what or cls.__name__} config keys {unknown}; known: '
                     f'{sorted(names)}')
  kwargs = {k: v for k, v in values.items() if k in names}
  kwargs.update(overrides or {})
  return cls(**kwargs)
