"""http_chat.ChatClient against a loopback chat-completions server started here."""
import chat_server
import pytest

from vermem_jax import http_chat

SECRET = 'sk-test-chat-5ecret'
KEY_ENV = 'VERMEM_TEST_CHAT_KEY'


class _Server(chat_server.LoopbackChatServer):
  """`script` lists the status of each request in turn (200 = a reply echoing the
  last user message), its last entry repeating; `body` overrides 200 bodies."""

  def __init__(self):
    self.script = [200]
    self.body = None
    super().__init__(self._respond)
    self.url += '/'  # a trailing '/' on base_url must not double it

  def _respond(self, n, body):
    status = self.script[min(n, len(self.script)) - 1]
    if status != 200:
      return status
    return self.body or 'echo ' + body['messages'][-1]['content']


@pytest.fixture
def server():
  s = _Server()
  yield s
  s.close()


def client(server, **kw):
  args = dict(api_key_env=KEY_ENV, timeout_s=2.0, max_retries=3, backoff_s=0.5)
  args.update(kw)
  c = http_chat.ChatClient(server.url, 'chat-model', **args)
  c.sleeps = []
  c.sleep = c.sleeps.append
  return c


def msgs(text):
  return [{'role': 'system', 'content': 'sys'}, {'role': 'user', 'content': text}]


def test_payload_auth_and_reply(server, monkeypatch):
  monkeypatch.setenv(KEY_ENV, SECRET)
  c = client(server)
  assert c.complete(msgs('hi'), max_tokens=7, temperature=0.25) == 'echo hi'
  (req,) = server.requests
  assert req['path'] == '/v1/chat/completions'  # trailing '/' of base_url dropped
  assert req['auth'] == f'Bearer {SECRET}'
  assert req['body'] == {'model': 'chat-model', 'messages': msgs('hi'),
                         'temperature': 0.25, 'max_tokens': 7}
  assert c.sleeps == []
  assert SECRET not in repr(c)


def test_no_key_variable_sends_no_auth(server, monkeypatch):
  monkeypatch.delenv(KEY_ENV, raising=False)
  c = client(server)  # optional key: a local server without auth
  assert c.complete(msgs('a'), max_tokens=1, temperature=0.0) == 'echo a'
  assert server.requests[0]['auth'] is None


def test_required_key_names_the_variable_only(monkeypatch):
  monkeypatch.delenv(KEY_ENV, raising=False)
  with pytest.raises(ValueError, match=rf"cfg.key_env names '{KEY_ENV}'.*key_env=''"):
    http_chat.ChatClient('http://x/v1', 'm', api_key_env=KEY_ENV,
                         require_api_key=True, api_key_field='cfg.key_env')
  monkeypatch.setenv(KEY_ENV, SECRET)
  c = http_chat.ChatClient('http://x/v1', 'm', api_key_env=KEY_ENV,
                           require_api_key=True)
  assert SECRET not in repr(c)


@pytest.mark.parametrize('kw', [dict(base_url=''), dict(model=''),
                                dict(timeout_s=0), dict(max_retries=-1),
                                dict(backoff_s=-1.0), dict(max_concurrency=0)])
def test_bad_arguments(kw):
  args = dict(base_url='http://x/v1', model='m')
  args.update(kw)
  with pytest.raises(ValueError):
    http_chat.ChatClient(args.pop('base_url'), args.pop('model'), **args)


@pytest.mark.parametrize('status', [500, 503, 429, 408])
def test_retryable_status_backs_off_exponentially_then_succeeds(server, status):
  server.script = [status, status, status, 200]
  c = client(server, max_retries=3, backoff_s=0.5)
  assert c.complete(msgs('x'), max_tokens=4, temperature=0.0) == 'echo x'
  assert len(server.requests) == 4 and c.sleeps == [0.5, 1.0, 2.0]


def test_retries_exhausted_raises_last_error(server, monkeypatch):
  monkeypatch.setenv(KEY_ENV, SECRET)
  server.script = [502]
  c = client(server, max_retries=2, backoff_s=0.1)
  with pytest.raises(http_chat.ChatError, match=r'HTTP 502 from http://127\.0\.0\.1:'
                     r'\d+/v1/chat/completions') as e:
    c.complete(msgs('x'), max_tokens=4, temperature=0.0)
  assert e.value.retryable and SECRET not in str(e.value)
  assert len(server.requests) == 3 and c.sleeps == [0.1, 0.2]


@pytest.mark.parametrize('status', [400, 401, 403, 404])
def test_non_retryable_status_is_not_retried(server, status):
  server.script = [status]
  c = client(server, max_retries=3)
  with pytest.raises(http_chat.ChatError, match=f'HTTP {status}') as e:
    c.complete(msgs('x'), max_tokens=4, temperature=0.0)
  assert not e.value.retryable and len(server.requests) == 1 and c.sleeps == []


@pytest.mark.parametrize('body, message', [
    (b'<html>not json</html>', 'unreadable chat-completions response'),
    (b'{"choices": []}', 'unreadable chat-completions response'),
    (b'{"choices": [{"message": {"content": null}}]}', 'non-text message content'),
])
def test_bad_bodies_are_retryable_errors(server, body, message):
  server.body = body
  c = client(server, max_retries=1)
  reply = c.request_once(msgs('x'), max_tokens=4, temperature=0.0)
  assert isinstance(reply, http_chat.ChatError) and reply.retryable
  assert message in str(reply)
  with pytest.raises(http_chat.ChatError, match=message):
    c.complete(msgs('x'), max_tokens=4, temperature=0.0)
  assert len(server.requests) == 3  # request_once + two attempts of complete


def test_timeout_is_retryable(server):
  server.delay_s = 0.4
  c = client(server, timeout_s=0.1, max_retries=1, backoff_s=0.0)
  with pytest.raises(http_chat.ChatError, match=r'timed out after 0\.1s') as e:
    c.complete(msgs('x'), max_tokens=4, temperature=0.0)
  assert e.value.retryable and len(server.requests) == 2
  assert c.sleeps == []  # backoff_s=0: no sleep at all


def test_connection_refused_is_retryable():
  c = http_chat.ChatClient('http://127.0.0.1:9/v1', 'm', timeout_s=1.0)
  reply = c.request_once(msgs('x'), max_tokens=4, temperature=0.0)
  assert isinstance(reply, http_chat.ChatError) and reply.retryable
  assert str(reply).startswith('connection to http://127.0.0.1:9/v1/chat/completions '
                               'failed: ')


def test_complete_many_order_failures_in_place_and_bounded_concurrency(server):
  server.delay_s = 0.05
  server.script = [200, 200, 401, 200]  # the 3rd request fails (max_concurrency=1)
  c = client(server, max_concurrency=1)
  out = c.complete_many([msgs(str(k)) for k in range(4)], max_tokens=2,
                        temperature=0.0)
  assert out[:2] == ['echo 0', 'echo 1'] and out[3] == 'echo 3'
  assert isinstance(out[2], http_chat.ChatError) and not out[2].retryable
  c.close()
  server.script = [200]
  c = client(server, max_concurrency=3)
  out = c.complete_many([msgs(str(k)) for k in range(9)], max_tokens=2,
                        temperature=0.0)
  assert out == [f'echo {k}' for k in range(9)]
  assert server.max_in_flight == 3
  c.close()
  # usable again after close (a fresh pool)
  assert c.complete_many([msgs('z')], max_tokens=2, temperature=0.0) == ['echo z']
  c.close()


def test_retryable_status_table():
  assert [http_chat.is_retryable_status(s) for s in (500, 599, 408, 409, 425, 429)] == [
      True] * 6
  assert [http_chat.is_retryable_status(s) for s in (400, 401, 403, 404, 422)] == [
      False] * 5


def test_chat_backend_config_checks_and_builds_the_client(monkeypatch):
  for field, value, message in (('timeout_s', 0.0, 'verifier.timeout_s must be > 0'),
                                ('max_concurrency', 0, 'verifier.max_concurrency must '
                                                       'be >= 1'),
                                ('max_retries', -1, 'verifier.max_retries must be >= 0'),
                                ('backoff_s', -0.5, 'verifier.backoff_s must be >= 0')):
    with pytest.raises(ValueError, match=message):
      http_chat.ChatBackendConfig(**{field: value}, section='verifier')
  empty = http_chat.ChatBackendConfig(section='eval.judge')
  with pytest.raises(ValueError, match=r"eval.judge.backend='openai_compatible' needs "
                                       r'eval.judge.base_url and eval.judge.model'):
    empty.client(require_api_key=False, retry_in_client=True)
  monkeypatch.delenv('CHAT_TEST_KEY', raising=False)
  cfg = http_chat.ChatBackendConfig(base_url='http://127.0.0.1:9/v1/', model='m',
                                    api_key_env='CHAT_TEST_KEY', timeout_s=5.0,
                                    max_concurrency=3, max_retries=2, backoff_s=0.5,
                                    section='solver')
  with pytest.raises(ValueError, match='solver.api_key_env'):
    cfg.client(require_api_key=True, retry_in_client=True)
  retrying = cfg.client(require_api_key=False, retry_in_client=True)
  assert (retrying.url, retrying.model, retrying.timeout_s) == (
      'http://127.0.0.1:9/v1/chat/completions', 'm', 5.0)
  assert (retrying.max_retries, retrying.backoff_s, retrying.max_concurrency) == (2, 0.5, 3)
  assert cfg.client(require_api_key=False, retry_in_client=False).max_retries == 0


def test_split_reads_a_sections_flat_endpoint_keys():
  """The endpoint keys of a flat config section (with the teacher's prefix) become one
  ChatBackendConfig; the other keys come back untouched; missing keys keep the
  caller's defaults; errors name the config field."""
  defaults = http_chat.ChatBackendConfig(api_key_env='DEFAULT_KEY', timeout_s=30.0,
                                         section='sft', key_prefix='teacher_')
  section = {'teacher_base_url': 'http://h:1/v1', 'teacher_model': 'm',
             'teacher_timeout_s': 5, 'teacher_max_tokens': 99, 'base_url': 'other',
             'learning_rate': 2e-5}
  chat, rest = http_chat.ChatBackendConfig.split(section, defaults=defaults)
  assert (chat.base_url, chat.model, chat.api_key_env, chat.timeout_s) == (
      'http://h:1/v1', 'm', 'DEFAULT_KEY', 5.0)
  assert isinstance(chat.timeout_s, float)
  assert (chat.max_retries, chat.max_concurrency, chat.section) == (0, 1, 'sft')
  assert rest == {'teacher_max_tokens': 99, 'base_url': 'other', 'learning_rate': 2e-5}
  with pytest.raises(ValueError, match=r'^sft.teacher_timeout_s must be > 0, got 0.0'):
    http_chat.ChatBackendConfig.split({'teacher_timeout_s': 0}, defaults=defaults)
  with pytest.raises(ValueError, match=r'^sft.teacher_max_retries: expected int'):
    http_chat.ChatBackendConfig.split({'teacher_max_retries': 'two'}, defaults=defaults)
  with pytest.raises(ValueError, match=r"^sft.teacher_base_url: sft.teacher_backend="
                                       r"'openai_compatible' needs sft.teacher_base_url "
                                       r'and sft.teacher_model$'):
    http_chat.ChatBackendConfig(section='sft', key_prefix='teacher_').check_endpoint()
