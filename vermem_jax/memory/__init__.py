"""vermem_jax.memory: the VerMem memory environment (plain Python, no JAX).

s_t = (q, M_t, C_t, H_t) (state), the command grammar (commands), the checked memory
transition T_m with constraint costs (executor), the interaction transition T_e
(interaction) and the bounded policy input g(s) (serialization). SPEC §1–3.
"""

from vermem_jax.memory.commands import (ADD, ALL_OPS, DELETE, FILTER, INVALID_OP,
                                        LTM_OPS, NULL, NULL_SYMBOL, PHASE_OPS,
                                        RETRIEVE, SELECT_EPISODE, STM_OPS, SUMMARIZE,
                                        UPDATE, Command, ParseError, format_command,
                                        parse_command)
from vermem_jax.memory.config import VIOLATION_KINDS, ExecutorConfig
from vermem_jax.memory.executor import Transition, Violation, execute
from vermem_jax.memory.interaction import interact
from vermem_jax.memory.serialization import render_for_config, render_policy_input
from vermem_jax.memory.state import (ContextItem, HistoryEvent, LTMEntry, LTMVersion,
                                     MemoryState, add_context, add_entry, add_history,
                                     new_state, set_task_state, task_namespace,
                                     union_refs)
from vermem_jax.memory.token_count import count_whitespace_tokens

__all__ = [
    'ADD', 'ALL_OPS', 'DELETE', 'FILTER', 'INVALID_OP', 'LTM_OPS', 'NULL',
    'NULL_SYMBOL', 'PHASE_OPS', 'RETRIEVE', 'SELECT_EPISODE', 'STM_OPS', 'SUMMARIZE',
    'UPDATE', 'Command', 'ParseError', 'format_command', 'parse_command',
    'VIOLATION_KINDS', 'ExecutorConfig', 'Transition', 'Violation', 'execute',
    'interact', 'render_policy_input', 'render_for_config', 'ContextItem',
    'HistoryEvent', 'LTMEntry', 'LTMVersion', 'MemoryState', 'add_context',
    'add_entry', 'add_history', 'new_state', 'set_task_state', 'task_namespace',
    'union_refs', 'count_whitespace_tokens',
]
