"""The interaction transition s_{t+1} = T_e(s~_t, b_t, z_{t+1}) (paper Eq. 3, A.1).

`interact` appends the task action b_t (step t) and the observation z_{t+1} (step t+1)
to H (`observe`: every observation is recorded in H), then adds the observation to C
as an 'observation' item that becomes the current environment state (`env_item_id`,
which Filter and Summarize may not remove).

Admission (SPEC §7 decision, one rule for training and evaluation): an observation
enters C only while C keeps `ExecutorConfig.chunk_tokens` free afterwards, i.e. while
C + z <= context_budget - chunk_tokens. No document observation is longer than
chunk_tokens (`envs.documents`), so whatever T_e leaves in H only can be restored by a
SelectEpisode until the policy itself fills that room (Retrieve, SelectEpisode). An
observation not admitted stays in H only, no C item holds the current environment
state, and the overflow cost (`cost_context_overflow`, SPEC §3) is returned so the
episode loop charges it to the last memory decision (F.5: terminal and interaction
budget violations attach to the preceding decision; the caller caps the decision's
total at `cost_cap`).

With `evict_oldest=True` (the Base baseline of paper C.4, which has no memory policy
and so no use for restore room: C keeps the newest observations that fit its whole
budget) an observation that does not fit first evicts the oldest unprotected C items,
in C order, until it fits; the evicted texts stay in H. An observation that would not
fit even with every unprotected item gone evicts nothing and stays in H only.
"""


from vermem_jax.memory import state as st


def interact(state, task_action, observation, count_tokens, config, *,
             observation_refs=(), task_state=None, protected=False, evict_oldest=False):
  """T_e: records b_t and z_{t+1} and builds the next active context.

  Args:
    state: s~_t (after the memory transition).
    task_action: task solver action b_t (str; '' or None records nothing).
    observation: environment observation z_{t+1} (str; '' or None adds nothing).
    count_tokens: `str -> int` counter (tokens of the backbone tokenizer).
    config: ExecutorConfig (context_budget, chunk_tokens, cost_context_overflow).
    observation_refs: evidence-unit ids of the observation (environment provenance,
      e.g. HotpotQA `"{title}#{sent_id}"`); become its source_refs and evidence.
    task_state: new current environment state text (None keeps the old one).
    protected: mark the observation's C item as protected evidence (trusted caller).
    evict_oldest: make room by dropping the oldest unprotected C items (module
      docstring; Base only).

  Returns:
    (s_{t+1}, overflow_cost): overflow_cost is 0.0, or cost_context_overflow when the
    observation could not enter C.
  """
  t = state.step
  if task_action:
    state, _ = st.add_history(state, st.EV_TASK_ACTION, str(task_action),
                              count_tokens, step=t)
  state = state.evolve(step=t + 1)
  if task_state is not None:
    state = st.set_task_state(state, task_state)
  if not observation:
    return state, 0.0
  return observe(state, observation, count_tokens, config,
                 observation_refs=observation_refs, step=t + 1, protected=protected,
                 evict_oldest=evict_oldest)


def admission_limit(config, evict_oldest=False):
  """The most tokens C may hold after admitting an observation (module docstring):
  context_budget - chunk_tokens, or the whole budget for Base (`evict_oldest`)."""
  if evict_oldest:
    return config.context_budget
  return config.context_budget - config.chunk_tokens


def observe(state, observation, count_tokens, config, *, observation_refs=(), step=None,
            protected=False, evict_oldest=False):
  """Records observation z in H and admits it into C (module docstring).

  Also builds s_0's first observation (eval.episodes), so that it follows the same
  rule as every later one.

  Args:
    state: the state to extend.
    observation: the observation text (non-empty str).
    count_tokens: `str -> int` counter (tokens).
    config: ExecutorConfig (context_budget, chunk_tokens, cost_context_overflow).
    observation_refs: evidence-unit ids of the observation.
    step: the H event's step (default: state.step).
    protected: mark the C item as protected evidence (trusted caller).
    evict_oldest: Base's rule (module docstring).

  Returns:
    (state, overflow_cost): overflow_cost 0.0, or cost_context_overflow when the
    observation stays in H only.
  """
  refs = tuple(observation_refs)
  state, event_id = st.add_history(state, st.EV_OBSERVATION, str(observation),
                                   count_tokens, source_refs=refs, step=step)
  tokens = state.H[-1].tokens
  limit = admission_limit(config, evict_oldest)
  if state.context_tokens() + tokens > limit and evict_oldest:
    state = _evict_oldest(state, tokens, limit)
  if state.context_tokens() + tokens > limit:
    return state.evolve(env_item_id=None), config.cost_context_overflow
  item = st.ContextItem(
      id=st.make_id(state.ns, 'c', state.next_c), kind=st.OBSERVATION,
      text=state.H[-1].text, source_refs=state.H[-1].source_refs,
      evidence=state.H[-1].evidence,
      protected=bool(protected), origin=event_id, tokens=tokens)
  return state.evolve(C=state.C + (item,), next_c=state.next_c + 1,
                             env_item_id=item.id), 0.0


def _evict_oldest(state, tokens, budget):
  """`state` with its oldest unprotected C items dropped until `tokens` more fit in
  `budget`; unchanged when they would not fit even with all of them dropped."""
  keep_min = sum(it.tokens for it in state.C if it.protected)
  if keep_min + tokens > budget:
    return state
  c = list(state.C)
  total = state.context_tokens()
  while total + tokens > budget:
    i = next(i for i, it in enumerate(c) if not it.protected)
    total -= c.pop(i).tokens
  env_item = state.env_item_id if any(it.id == state.env_item_id for it in c) else None
  return state.evolve(C=tuple(c), env_item_id=env_item)
