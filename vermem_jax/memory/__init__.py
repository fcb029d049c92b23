"""vermem_jax.memory: the VerMem memory environment (plain Python).

No module here imports JAX; bm25s, imported at the first Retrieve, loads jax.lax itself
when JAX is installed (bm25_index.py).

s_t = (q, M_t, C_t, H_t) (state), the command grammar (commands), the checked memory
transition T_m with constraint costs (executor), the interaction transition T_e
(interaction) and the bounded policy input g(s) (serialization). SPEC §1–3.

Import each name from the module that defines it; this package re-exports nothing.
"""
