"""The policy input g(s) written out plainly, without any cache: the reference the
tests hold `memory.serialization.render_policy_input` (and its caches in
memory/render_cache.py) against, and the baseline of experiments/benchmarks/bench_memory.py.

It shares the line renderers and the allocation of memory/serialization.py (the pieces
of the specification) and redoes every count, so a stale cache or a false counter
declaration shows up as a different text.
"""
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import render_cache
from vermem_jax.memory import serialization as ser
from vermem_jax.memory import state as st


def render_policy_input_reference(state, count_tokens, *, allowed_ops,
                                  limit=ser.DEFAULT_LIMIT, shares=ser.DEFAULT_SHARES,
                                  context_budget=2048, local_ids=False):
  """Uncached reference of `serialization.render_policy_input` (same output; slow).

  The specification written out plainly: every line is rendered and counted afresh
  with `count_tokens` (costs under `render_cache.cost_model(count_tokens)`, see the module
  docstring) and every attempt's whole text is recounted. Tests compare the cached
  path with it; benchmarks use it as the baseline. Same Args / Returns / Raises as
  `render_policy_input`.
  """
  if limit <= 0:
    raise ValueError(f'limit must be positive, got {limit}')
  bad = [op for op in allowed_ops if op not in cmds.ALL_OPS]
  if bad:
    raise ValueError(f'allowed_ops has unknown ops {bad}')
  model = render_cache.cost_model(count_tokens)
  if model == render_cache.SPLITS:
    def cost(piece):
      return count_tokens(piece + '\n')
  else:
    cost = count_tokens
  sep = count_tokens('\n') if model == render_cache.GENERIC else 0
  instr = ser.instruction_block(allowed_ops)
  tail = 'STATE END\nCommand:'
  active = [e for e in state.M if e.status == st.ACTIVE]
  m_lines = [(ser._m_line(e), cost(ser._m_line(e))) for e in active]
  c_lines = [(ser._c_line(it), cost(ser._c_line(it))) for it in state.C]
  h_lines = [(ser._h_line(ev), cost(ser._h_line(ev))) for ev in state.H]
  n_deleted = len(state.M) - len(active)
  c_tokens = sum(it.tokens for it in state.C)
  env = ser._env_item(state)

  def headers(km, kc, kh):
    return [f'LONG-TERM MEMORY ({len(active)} active, {n_deleted} deleted; {km} not '
            'shown)',
            f'ACTIVE CONTEXT ({c_tokens}/{context_budget} tokens; current environment '
            f'item {env}; {kc} not shown)',
            f'HISTORY (most recent first; {len(state.H)} events; {kh} not shown)']

  def assemble(task, hdr, m_keep, c_keep, h_keep):
    out = [instr, task, hdr[0]] + [m_lines[i][0] for i in sorted(m_keep)]
    out += [hdr[1]] + [c_lines[i][0] for i in sorted(c_keep)]
    out += [hdr[2]] + [h_lines[i][0] for i in sorted(h_keep, reverse=True)]
    return '\n'.join(out + [tail])

  shrink, q_chars = 0, None
  for _ in range(ser._MAX_RETRIES):
    q, ts = state.q, state.task_state
    if q_chars is not None:
      q = q if len(q) <= q_chars else q[:q_chars] + '...[truncated]'
      ts = ts if len(ts) <= q_chars else ts[:q_chars] + '...[truncated]'
    task = ser._task_block(q, ts)
    base = cost(instr) + cost(task) + count_tokens(tail) + 5 * sep
    needs = [sum(t + sep for _, t in lines) for lines in (m_lines, c_lines, h_lines)]
    everything = (range(len(m_lines)), range(len(c_lines)), range(len(h_lines)))
    full = base + sum(cost(h) for h in headers(0, 0, 0)) + sum(needs)
    if shrink == 0 and full <= limit:
      text, room = assemble(task, headers(0, 0, 0), *everything), limit - full + sum(
          needs)
    else:
      fixed = base + sum(cost(h) for h in headers(len(active), len(state.C),
                                                  len(state.H)))
      room = max(0, limit - fixed - shrink)
      alloc = ser._allocate(needs, room, shares)
      m_pick, _ = ser._select([(i, m_lines[i][1]) for i in reversed(range(len(m_lines)))],
                          alloc[0], sep)
      first = [i for i, it in enumerate(state.C) if it.protected or
               it.kind == st.INSTRUCTION or it.id == state.env_item_id]
      rest = [i for i in reversed(range(len(state.C))) if i not in first]
      c_pick, _ = ser._select([(i, c_lines[i][1]) for i in first + rest], alloc[1], sep)
      h_pick, _ = ser._select([(i, h_lines[i][1]) for i in reversed(range(len(h_lines)))],
                          alloc[2], sep)
      hdr = headers(len(active) - len(m_pick), len(state.C) - len(c_pick),
                    len(state.H) - len(h_pick))
      text = assemble(task, hdr, m_pick, c_pick, h_pick)
    total = count_tokens(text)
    if total <= limit:
      return ser.localize_ids(text, state.ns) if local_ids else text
    step = ser._next_attempt(state, total, limit, room, shrink, q_chars)
    if step is None:
      break
    shrink, q_chars = step
  raise ser._limit_too_small(limit)
