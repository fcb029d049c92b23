"""Tests for vermem_jax.envs.sft_data.config (SFTDataConfig, SPEC §4)."""
import pytest

from vermem_jax.envs.sft_data.config import SFTDataConfig


def test_config_validation():
  with pytest.raises(ValueError, match='boundary_fraction'):
    SFTDataConfig(boundary_fraction=0.1)
  with pytest.raises(ValueError, match='teacher_backend'):
    SFTDataConfig(teacher_backend='grpc')
  with pytest.raises(ValueError, match='teacher_base_url'):
    SFTDataConfig(teacher_backend='openai_compatible')
  cfg = SFTDataConfig.from_config({'train_per_target': 8, 'dev_per_target': 4,
                                   'learning_rate': 2e-5, 'template_fraction': 0.5})
  assert cfg.train_per_target == 8 and cfg.teacher_fraction == 0.5
