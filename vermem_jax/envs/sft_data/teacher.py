"""Optional SFT teacher over an OpenAI-compatible chat-completions endpoint (paper D.2).

Off by default (`SFTDataConfig.teacher_backend`). For a state built by a template the
teacher receives x_i, the allowed operations and the visible record ids, never the
answer or future observations; its reply must pass the same seven filters
(`filters.check_candidate`) and be of the class being filled, else it is discarded
(not repaired) and that state's template target is used (`build`). Transport is
`vermem_jax.http_chat`. The API key is read from the environment variable named by
`sft.teacher_api_key_env` and never logged.
"""

from __future__ import annotations

from vermem_jax import http_chat
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import state as mstate


# Our own wording of the teacher instruction (paper D.2 describes its content).
TEACHER_SYSTEM_PROMPT = (
    'You label training data for a memory manager. Read the memory-decision state and '
    'reply with the single best memory command for it, or the null command when '
    'nothing should change. Rely only on what the state shows; never use outside '
    'knowledge or guess an answer. Guidance: Add stores a new durable fact that '
    'long-term memory lacks; Update revises an entry that new evidence corrects or '
    'completes; Delete retires an entry that is wrong, obsolete or duplicated; '
    'Retrieve brings stored facts into the context when they are missing there; '
    'Filter drops context items that do not help the question; SelectEpisode brings '
    'back earlier events of this task from the history; Summarize shortens relevant '
    'but long context items faithfully; the null command keeps everything as is. '
    'Output exactly one command in the syntax the state lists, with no explanation, '
    'no markdown and no second command.')


def teacher_messages(policy_input, state, phase):
  """Chat messages for the teacher: x_i, the allowed ops and the visible record ids."""
  allowed = ', '.join(op if op != cmds.NULL else cmds.NULL_SYMBOL
                      for op in cmds.PHASE_OPS[phase])
  ids = [e.id for e in state.active_entries()] + [it.id for it in state.C] + [
      h.id for h in state.H if h.kind not in mstate.POLICY_AUTHORED_EVENTS]
  user = (f'{policy_input}\n\nAllowed operations: {allowed}\n'
          f'Record ids you may cite: {", ".join(ids)}\n'
          'Reply with one command only.')
  return [{'role': 'system', 'content': TEACHER_SYSTEM_PROMPT},
          {'role': 'user', 'content': user}]


class TeacherError(RuntimeError):
  """The teacher endpoint failed or answered in an unexpected shape."""


class OpenAICompatibleTeacher:
  """Teacher over an OpenAI-compatible chat-completions endpoint (`http_chat`).

  The API key comes from the environment variable `chat.api_key_env`, read when the
  teacher is built (optional for local endpoints), and is sent only in the
  Authorization header; it is never logged or put in an error message.

  Args:
    chat: the endpoint (`SFTDataConfig.teacher`, keys `sft.teacher_*`); its
      `max_retries` retryable transport failures are re-sent with exponential backoff
      (default none: a failed state falls back to its template).
    max_tokens, temperature: decoding of the reply.

  Raises:
    ValueError: no base_url or model (naming `sft.teacher_base_url`).
  """

  def __init__(self, chat: http_chat.ChatBackendConfig, *, max_tokens: int = 256,
               temperature: float = 0.7):
    self.chat = chat
    self.max_tokens = max_tokens
    self.temperature = temperature
    self._client = chat.client(require_api_key=False, retry_in_client=True)
    self.url = self._client.url

  @classmethod
  def from_config(cls, config):
    """From an `SFTDataConfig`."""
    return cls(config.teacher, max_tokens=config.teacher_max_tokens,
               temperature=config.teacher_temperature)

  def __call__(self, messages):
    """Returns the reply text of one chat completion (stripped). Raises TeacherError."""
    try:
      content = self._client.complete(messages, max_tokens=self.max_tokens,
                                      temperature=self.temperature)
    except http_chat.ChatError as e:
      raise TeacherError(f'teacher endpoint: {e}') from None
    return content.strip()
