"""One OpenAI-compatible chat-completions client on the standard library (urllib).

Shared by the HTTP verifier backend (`verifiers.openai_compatible`) and the optional
SFT teacher (`envs.sft_data.teacher`); it sits below both packages
(stdlib only) so the import order memory <- models <- envs <- verifiers holds.

Protocol: POST `{'model', 'messages', 'temperature', 'max_tokens'}` as JSON to
`{base_url}/chat/completions`; the reply text is `choices[0].message.content`.

Failure classes (`ChatError.retryable`):
  * retryable: timeouts, refused/reset connections, HTTP 408/409/425/429 and 5xx,
    unreadable or non-text response bodies;
  * not retryable: every other HTTP error (400, 401, 403, 404, ...).

`ChatClient.complete` retries retryable failures up to `max_retries` times after a
backoff of `backoff_s * 2**r` seconds for retry r (0-based). Callers that run their
own retry loop (the verifier re-asks on unparsable replies) use `max_retries=0`.
`complete_many` runs at most `max_concurrency` requests at a time (thread pool) and
returns failures in place instead of raising.

The API key is read once, at construction, from the environment variable named by
`api_key_env`; it lives only in the Authorization header and is never logged, put in
`repr` or in an error message.

`ChatBackendConfig` holds one endpoint's settings as every caller reads them (the
verifier, the evaluation judge, the task solver, the SFT teacher) and builds its client.
The experiment config keeps each caller's endpoint keys flat in its own section
(`verifier.base_url`, `eval.judge.timeout_s`, `solver.max_retries`,
`sft.teacher_model`, ...); `ChatBackendConfig.split` is the one place that reads them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping, Sequence

# HTTP statuses worth retrying besides every 5xx: request timeout, conflict, too early,
# rate limit.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429})

# The endpoint fields of ChatBackendConfig, as config keys (after a section's prefix),
# with the type each value is read as.
ENDPOINT_FIELDS = {'base_url': str, 'model': str, 'api_key_env': str, 'timeout_s': float,
                   'max_concurrency': int, 'max_retries': int, 'backoff_s': float}


@dataclasses.dataclass(frozen=True)
class ChatBackendConfig:
  """One OpenAI-compatible chat endpoint: the settings the verifier (config section
  `verifier`), the judge (`eval.judge`), the task solver (`solver`) and the SFT teacher
  (`sft.teacher_*`) share.

  Attributes:
    base_url: server root, e.g. 'http://127.0.0.1:8001/v1' ('' = none configured);
      the defaults and docs give each role its port: verifier 8001, task solver 8002,
      judge 8003, SFT teacher 8004 (docs/serving.md).
    model: model name sent in every request.
    api_key_env: environment variable holding the API key ('' = no authentication).
    timeout_s: per-request timeout (seconds, > 0).
    max_concurrency: requests in flight at once (>= 1).
    max_retries: extra attempts after a retryable failure (>= 0); see `client`.
    backoff_s: base of the exponential retry backoff (seconds, >= 0).
    section: the config section the values come from ('verifier', 'eval.judge',
      'solver', 'sft'); names the field in errors.
    key_prefix: the prefix of the endpoint keys in that section ('teacher_' for
      `sft.teacher_base_url`, ...; '' for the others).
  Raises:
    ValueError: a number out of range, naming `<section>.<key_prefix><field>`.
  """
  base_url: str = ''
  model: str = ''
  api_key_env: str = ''
  timeout_s: float = 60.0
  max_concurrency: int = 1
  max_retries: int = 0
  backoff_s: float = 1.0
  section: str = 'chat'
  key_prefix: str = ''

  def __post_init__(self):
    if not self.timeout_s > 0:
      raise ValueError(f'{self.field("timeout_s")} must be > 0, got {self.timeout_s}')
    for name, low in (('max_concurrency', 1), ('max_retries', 0), ('backoff_s', 0)):
      if getattr(self, name) < low:
        raise ValueError(f'{self.field(name)} must be >= {low}, got '
                         f'{getattr(self, name)}')

  def field(self, name: str) -> str:
    """The config field of endpoint setting `name`, e.g. 'sft.teacher_timeout_s'."""
    return f'{self.section}.{self.key_prefix}{name}'

  @classmethod
  def split(cls, section: Mapping[str, Any], *, defaults: 'ChatBackendConfig'
            ) -> tuple['ChatBackendConfig', dict[str, Any]]:
    """Reads the endpoint out of a config section whose keys are flat.

    Args:
      section: the section's values (dict or ConfigDict), e.g. `config.verifier`.
      defaults: the caller's defaults; its `section` and `key_prefix` say where the
        keys are (`<key_prefix><field>`, e.g. 'teacher_base_url') and name them in
        errors. A key the section lacks keeps its default.
    Returns:
      (the checked ChatBackendConfig, the section's other keys as a dict).
    Raises:
      ValueError: a value of the wrong type or out of range, naming the field.
    """
    rest = dict(section)
    values = {}
    for name, kind in ENDPOINT_FIELDS.items():
      key = defaults.key_prefix + name
      if key not in rest:
        continue
      value = rest.pop(key)
      try:
        values[name] = '' if value is None and kind is str else kind(value)
      except (TypeError, ValueError) as e:
        raise ValueError(f'{defaults.field(name)}: expected {kind.__name__}, got '
                         f'{value!r}') from e
    return dataclasses.replace(defaults, **values), rest

  def check_endpoint(self) -> None:
    """Raises ValueError unless base_url and model are both set (naming them)."""
    if not (self.base_url and self.model):
      raise ValueError(f"{self.field('base_url')}: {self.field('backend')}="
                       f"'openai_compatible' needs {self.field('base_url')} and "
                       f"{self.field('model')}")

  def client(self, *, require_api_key: bool, retry_in_client: bool) -> 'ChatClient':
    """The endpoint's `ChatClient`.

    Args:
      require_api_key: a set `api_key_env` naming an unset variable is an error.
      retry_in_client: the client retries transport failures (`max_retries`,
        `backoff_s`); False for callers that run their own retry rounds (the verifier
        and the judge also re-ask on unparsable replies).
    Raises:
      ValueError: no endpoint (`check_endpoint`) or a required key missing.
    """
    self.check_endpoint()
    return ChatClient(self.base_url, self.model, api_key_env=self.api_key_env,
                      require_api_key=require_api_key,
                      api_key_field=self.field('api_key_env'),
                      timeout_s=self.timeout_s,
                      max_retries=self.max_retries if retry_in_client else 0,
                      backoff_s=self.backoff_s, max_concurrency=self.max_concurrency)


class ChatError(Exception):
  """A failed chat / generation request (timeout, HTTP error, connection failure,
  unreadable reply). Messages never contain credentials.

  Attributes:
    retryable: whether re-sending the same request may succeed.
  """

  def __init__(self, message: str, retryable: bool = True):
    super().__init__(message)
    self.retryable = retryable


def is_retryable_status(code: int) -> bool:
  """True for HTTP statuses a later identical request may get past (5xx, 408, ...)."""
  return code >= 500 or code in RETRYABLE_STATUS


def read_api_key(api_key_env: str, *, required: bool, field: str = 'api_key_env'
                 ) -> str | None:
  """The API key held by environment variable `api_key_env`, or None.

  Args:
    api_key_env: variable name; '' means no authentication.
    required: raise when `api_key_env` is set but the variable is unset or empty
      (else return None: a local server without auth).
    field: the config field to name in the error (e.g. 'verifier.api_key_env').

  Raises:
    ValueError: naming the variable (never its value) when required and missing.
  """
  if not api_key_env:
    return None
  key = os.environ.get(api_key_env)
  if key:
    return key
  if required:
    raise ValueError(
        f'{field} names {api_key_env!r}, which is unset or empty; set it or use '
        f"{field.rsplit('.', 1)[-1]}='' for a server without auth")
  return None


class ChatClient:
  """Client of one OpenAI-compatible chat-completions endpoint (vLLM, SGLang, hosted).

  Args:
    base_url: endpoint root, e.g. 'http://127.0.0.1:8001/v1' (a trailing '/' is ok).
    model: model name sent with each request.
    api_key_env: name of the environment variable holding the key ('' = no auth).
    require_api_key: raise at construction when `api_key_env` is unset (else send no
      Authorization header).
    api_key_field: config field named in that error.
    timeout_s: per-request timeout (seconds).
    max_retries: extra attempts of `complete` on retryable failures (>= 0).
    backoff_s: base of the exponential backoff (seconds, >= 0).
    max_concurrency: requests in flight at once in `complete_many` (>= 1).
    sleep: `seconds -> None`, replaced in tests.

  Raises:
    ValueError: empty base_url/model, bad numbers, or a required key missing.
  """

  def __init__(self, base_url: str, model: str, *, api_key_env: str = '',
               require_api_key: bool = False, api_key_field: str = 'api_key_env',
               timeout_s: float = 60.0, max_retries: int = 0, backoff_s: float = 1.0,
               max_concurrency: int = 1, sleep: Callable[[float], None] = time.sleep):
    if not base_url or not model:
      raise ValueError('ChatClient needs base_url and model')
    if timeout_s <= 0:
      raise ValueError(f'ChatClient timeout_s must be > 0, got {timeout_s}')
    if max_retries < 0 or backoff_s < 0:
      raise ValueError('ChatClient max_retries and backoff_s must be >= 0')
    if max_concurrency < 1:
      raise ValueError(
          f'ChatClient max_concurrency must be >= 1, got {max_concurrency}')
    self.url = base_url.rstrip('/') + '/chat/completions'
    self.model = model
    self.timeout_s = timeout_s
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self.max_concurrency = max_concurrency
    self.sleep = sleep
    self._headers = {'Content-Type': 'application/json'}
    key = read_api_key(api_key_env, required=require_api_key, field=api_key_field)
    if key:
      self._headers['Authorization'] = 'Bearer ' + key
    self._pool = None

  def __repr__(self):  # explicit: the headers (key) are never shown
    return f'ChatClient(url={self.url!r}, model={self.model!r})'

  def request_once(self, messages: Sequence[dict], *, max_tokens: int,
                   temperature: float) -> str | ChatError:
    """One POST, no retry. Returns the reply text, or the failure as a ChatError."""
    body = json.dumps({'model': self.model, 'messages': list(messages),
                       'temperature': temperature,
                       'max_tokens': max_tokens}).encode('utf-8')
    req = urllib.request.Request(self.url, data=body, headers=self._headers,
                                 method='POST')
    timed_out = ChatError(f'timed out after {self.timeout_s}s waiting for {self.url}')
    try:
      with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
        raw = resp.read()
    except urllib.error.HTTPError as e:
      e.close()
      return ChatError(f'HTTP {e.code} from {self.url}',
                       retryable=is_retryable_status(e.code))
    except (TimeoutError, socket.timeout):
      return timed_out
    except urllib.error.URLError as e:
      if isinstance(e.reason, (TimeoutError, socket.timeout)):
        return timed_out
      return ChatError(f'connection to {self.url} failed: {type(e.reason).__name__}')
    except OSError as e:  # ConnectionError and friends
      return ChatError(f'connection to {self.url} failed: {type(e).__name__}')
    try:
      content = json.loads(raw)['choices'][0]['message']['content']
    except (ValueError, KeyError, IndexError, TypeError):
      return ChatError(f'unreadable chat-completions response from {self.url}')
    if not isinstance(content, str):
      return ChatError(f'non-text message content from {self.url}')
    return content

  def complete(self, messages: Sequence[dict], *, max_tokens: int,
               temperature: float) -> str:
    """The reply text of one chat completion, retrying retryable failures.

    Raises:
      ChatError: the last failure once retries are spent, or a non-retryable one.
    """
    for attempt in range(self.max_retries + 1):
      if attempt > 0 and self.backoff_s > 0:
        self.sleep(self.backoff_s * 2 ** (attempt - 1))
      reply = self.request_once(messages, max_tokens=max_tokens,
                                temperature=temperature)
      if not isinstance(reply, ChatError):
        return reply
      if not reply.retryable:
        break
    raise reply

  def complete_many(self, conversations: Sequence[Sequence[dict]], *,
                    max_tokens: int, temperature: float) -> list[str | ChatError]:
    """`complete` for each conversation, in order, at most `max_concurrency` at once;
    failures are returned in place, not raised."""

    def one(messages):
      try:
        return self.complete(messages, max_tokens=max_tokens, temperature=temperature)
      except ChatError as e:
        return e

    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(
          max_workers=self.max_concurrency, thread_name_prefix='chat-http')
    return list(self._pool.map(one, conversations))

  def close(self) -> None:
    """Stops the worker threads of `complete_many` (the client stays usable)."""
    if self._pool is not None:
      self._pool.shutdown(wait=True)
      self._pool = None
