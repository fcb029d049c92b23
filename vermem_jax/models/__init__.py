"""vermem_jax.models: Qwen2/2.5/3 in Flax Linen, KV-cache sampler, sharding, HF I/O.

Public API: QwenConfig, PRESETS, Qwen, init_cache, lm_head_logits, generate,
GenerationOutput, load_hf_checkpoint, save_hf_checkpoint.
"""

from vermem_jax.models.qwen import PRESETS
from vermem_jax.models.qwen import Qwen
from vermem_jax.models.qwen import QwenConfig
from vermem_jax.models.qwen import init_cache
from vermem_jax.models.qwen import init_params
from vermem_jax.models.qwen import lm_head_logits
from vermem_jax.models.sampling import GenerationOutput
from vermem_jax.models.sampling import generate
from vermem_jax.models.hf_io import load_hf_checkpoint, save_hf_checkpoint
