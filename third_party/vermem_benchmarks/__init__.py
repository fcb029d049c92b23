"""Adapters of the paper's interactive benchmarks for vermem_jax (optional extras).

One sub-package per benchmark (scienceworld, babyai, pddl, alfworld), each exposing
`BENCHMARK` (see `vermem_jax.envs.interactive.Benchmark`) and importing its benchmark
package lazily, so `import vermem_benchmarks` needs none of them. The core reaches
them by name: `vermem_jax.envs.interactive.load_benchmark('pddl')`.
"""
