"""Accelerators and efficiencies of the time plan (experiments/benchmarks/plan_time.py).

Peak figures are the vendors' data sheets (docs/time-plan.md cites each page); the
efficiencies and the verifier latency are decisions, not measurements, until
experiments/benchmarks/gpu_check.py measures them on a lent device (docs/time-plan.md,
"Assumptions").
"""

from vermem_jax.train import time_plan

# name -> chips, dense bf16 FLOP/s per chip, HBM bytes/s per chip, chip-to-chip bytes/s
# per chip (one direction), HBM GB per chip, JAX's device_kind. Data sheets count
# decimal units.
HARDWARE = {
    # NVIDIA H100 SXM5 data sheet: 1,979 TFLOPS bf16 with sparsity (989 dense),
    # 3.35 TB/s HBM3, NVLink 900 GB/s (both directions).
    'h100x8': time_plan.Hardware('8 x H100 SXM 80 GB', 8, 989e12, 3.35e12, 450e9, 80,
                                 'H100'),
    # NVIDIA H200 SXM data sheet: same tensor cores, 4.8 TB/s HBM3e, 141 GB.
    'h200x8': time_plan.Hardware('8 x H200 SXM 141 GB', 8, 989e12, 4.8e12, 450e9, 141,
                                 'H200'),
    # Cloud TPU v5p page: 459 TFLOPS bf16, 2,765 GB/s HBM2e, 95 GB, ICI 4,800 Gbps.
    # A v5p-8 slice is 4 chips (its name counts TensorCores).
    'v5p-8': time_plan.Hardware('TPU v5p-8 (4 chips)', 4, 459e12, 2.765e12, 600e9, 95,
                                'TPU v5p'),
    # Cloud TPU v5e page: 197 TFLOPS bf16, 819 GB/s HBM2, 16 GB, ICI 1,600 Gbps.
    'v5e-8': time_plan.Hardware('TPU v5e-8 (8 chips)', 8, 197e12, 0.819e12, 200e9, 16,
                                'TPU v5 lite'),
}

# Shares of the peaks a stage reaches (decisions; docs/time-plan.md "Assumptions").
EFFICIENCY = time_plan.Efficiency(
    prefill_mfu=0.5,    # large matmuls, flash attention
    learner_mfu=0.4,    # + remat, FSDP collectives partly exposed
    decode_hbm=0.7,     # weight and KV-cache streaming per token step
    collective=0.7,     # all-gather / reduce-scatter over NVLink or ICI
)

# Seconds for one batched verifier request (a 7B-class judge behind an OpenAI-compatible
# server, ~2k prompt tokens, verifier.max_new_tokens = 48); an assumption to replace by
# the endpoint's measured latency (docs/time-plan.md).
VERIFIER_CALL_S = 2.0
