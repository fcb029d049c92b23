"""config_util.dataclass_from_mapping on a small dataclass."""
import dataclasses

import ml_collections
import pytest

from vermem_jax import config_util


@dataclasses.dataclass(frozen=True)
class _Cfg:
  a: int = 1
  b: str = 'x'
  derived: int = dataclasses.field(default=0, init=False)

  def __post_init__(self):
    if self.a < 0:
      raise ValueError('_Cfg.a must be >= 0')


def test_ignores_foreign_keys_and_applies_overrides():
  cfg = config_util.dataclass_from_mapping(
      _Cfg, {'a': 3, 'learning_rate': 1e-5, 'derived': 9}, overrides={'b': 'y'})
  assert cfg == _Cfg(a=3, b='y') and cfg.derived == 0  # non-init field not passed
  # overrides win over the section
  assert config_util.dataclass_from_mapping(_Cfg, {'a': 3},
                                            overrides={'a': 5}).a == 5


def test_configdict_section():
  cd = ml_collections.ConfigDict({'a': 7, 'b': 'z', 'other': [1]})
  assert config_util.dataclass_from_mapping(_Cfg, cd) == _Cfg(a=7, b='z')


def test_strict_names_unknown_and_known_keys():
  with pytest.raises(ValueError,
                     match=r"unknown sect config keys \['c', 'derived'\]; known: "
                     r"\['a', 'b'\]"):
    config_util.dataclass_from_mapping(_Cfg, {'a': 1, 'c': 2, 'derived': 1},
                                       strict=True, what='sect')
  with pytest.raises(ValueError, match='unknown _Cfg config keys'):
    config_util.dataclass_from_mapping(_Cfg, {'zz': 1}, strict=True)
  assert config_util.dataclass_from_mapping(_Cfg, {'b': 'q'}, strict=True) == _Cfg(
      b='q')


def test_validation_and_bad_override_raise():
  with pytest.raises(ValueError, match='must be >= 0'):
    config_util.dataclass_from_mapping(_Cfg, {'a': -1})
  with pytest.raises(TypeError):
    config_util.dataclass_from_mapping(_Cfg, {}, overrides={'nope': 1})
