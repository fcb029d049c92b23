"""vermem_jax.models: Qwen2/2.5/3 in Flax Linen, KV-cache sampler, sharding, HF I/O.

Modules (import them directly; this package re-exports nothing): qwen_config
(QwenConfig, PRESETS), qwen (Qwen, init_params, lm_head_weight, lm_head_logits), kv_cache
(init_cache), layers, attention, sampling (generate, GenerationOutput), decode_head
(the next token and its log-probability from one pass over the vocabulary), hf_io
(load_hf_checkpoint, save_hf_checkpoint), sharding.
"""
