"""Tests for vermem_jax.eval.judges: strict parsing, retries and counted fallbacks over a
loopback OpenAI-compatible server, the local-model backend, record filling."""
import chat_server
import pytest

from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.eval import judges

KEY_ENV = 'VERMEM_TEST_JUDGE_KEY'


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
  monkeypatch.setenv(KEY_ENV, 'sk-judge-test')


class _Server(chat_server.LoopbackChatServer):

  def __init__(self, replies):
    self.replies = list(replies)
    super().__init__(self._respond)

  def _respond(self, n, body):
    reply = self.replies[min(n, len(self.replies)) - 1]
    if reply == 'sleep':
      import time
      time.sleep(0.5)  # the client times out first
      return '0.5'
    return reply


def make(server, **kw):
  cfg = dict(backend='openai_compatible', base_url=server.url, model='judge-m',
             api_key_env=KEY_ENV, timeout_s=0.2, max_retries=2, backoff_s=0.001,
             fallback='zero')
  cfg.update(kw)
  judge = judges.make_judge(judges.JudgeConfig.from_config(cfg))
  judge.sleeps = []
  judge._sleep = judge.sleeps.append  # pylint: disable=protected-access
  return judge


CONV = judges.answer_messages('Who?', 'Ada Lovelace', 'Lovelace')


@pytest.mark.parametrize('reply', ['between 0.6 and 0.7', '1.3', 'sleep'])
def test_bad_replies_are_retried_then_fall_back(reply):
  server = _Server([reply])
  try:
    judge = make(server)
    [(score, fell_back)] = judge.score([CONV])
    assert (score, fell_back) == (0.0, True)
    assert len(server.requests) == 3  # 1 + max_retries
    assert judge.counters['fallbacks'] == 1 and judge.counters['retries'] == 2
    if reply == 'sleep':
      assert judge.counters['transport_errors'] == 3
      assert judge.sleeps == [0.001, 0.002]  # backoff_s * 2**r before retry r
    else:
      assert judge.counters['malformed'] == 3
      # The re-ask carries the bad reply and the reason.
      msgs = server.requests[1]['body']['messages']
      assert msgs[-2] == {'role': 'assistant', 'content': reply}
      assert 'could not be read' in msgs[-1]['content']
    judge.close()
  finally:
    server.close()


def test_skip_fallback_reports_absent_score():
  server = _Server(['1.3'])
  try:
    judge = make(server, fallback='skip', max_retries=1)
    assert judge.score([CONV]) == [(None, True)]
    assert len(server.requests) == 2
  finally:
    server.close()


def test_retry_recovers_and_good_replies_parse():
  server = _Server(['about seven tenths', '0.7', ' 1 ', '0.25'])
  try:
    judge = make(server, max_concurrency=1)
    out = judge.score([CONV])
    assert out == [(0.7, False)]
    out = judge.score([CONV, CONV])
    assert sorted(out) == [(0.25, False), (1.0, False)]
    assert judge.counters['fallbacks'] == 0 and judge.counters['malformed'] == 1
    # The paper's judge decodes deterministically.
    assert all(r['body']['temperature'] == 0.0 for r in server.requests)
  finally:
    server.close()


@pytest.mark.parametrize('text,value', [
    ('0.7', 0.7), ('1', 1.0), ('0', 0.0), ('1.0', 1.0), ('.5', 0.5), ('  0.35\n', 0.35),
    ('<think>hmm 0.2</think>0.9', 0.9), ('0.7 because it is close', 0.7),
    ('Score: 0.5.', 0.5), ('<think>\nclose, maybe 0.7 or 0.9\n</think>\n\n0.8', 0.8),
    ('<think>a</think>The answer matches: 1', 1.0)])
def test_parse_score_accepts_one_number(text, value):
  assert judges.parse_score(text) == value


@pytest.mark.parametrize('text', ['1.3', '-0.1', '', 'seven', '0.5/1', '0.5 0.6',
                                  '1e-1', 'nan', '<think>0.8 seems right',
                                  '<think>x</think>80%'])
def test_parse_score_rejects_everything_else(text):
  with pytest.raises(judges.JudgeOutputError):
    judges.parse_score(text)


def test_config_checks():
  assert judges.make_judge(judges.JudgeConfig()) is None  # no judge
  with pytest.raises(ValueError, match='base_url'):
    judges.JudgeConfig(backend='openai_compatible')
  with pytest.raises(ValueError, match='fallback'):
    judges.JudgeConfig(fallback='midpoint')
  with pytest.raises(ValueError, match='backend'):
    judges.JudgeConfig(backend='qwen-max')


def test_unset_api_key_is_named(monkeypatch):
  monkeypatch.delenv(KEY_ENV)
  with pytest.raises(ValueError, match=KEY_ENV):
    judges.make_judge(judges.JudgeConfig.from_config(dict(
        backend='openai_compatible', base_url='http://x', model='m', api_key_env=KEY_ENV)))


def test_local_model_judge_through_the_sampler_interface(qwen25_tokenizer_dir,
                                                         monkeypatch):
  # The real chat template, encoder and LocalChatGenerator (shared with the local
  # verifier, whose test runs the tiny model itself), with a fake `generate` that
  # answers malformed until the re-ask, then a number.
  import numpy as np
  from vermem_jax import tokenization
  from vermem_jax.models import sampling
  tok = tokenization.load_tokenizer(qwen25_tokenizer_dir)
  calls = []

  def fake_generate(config, params, prompts, *, rng, max_new_tokens, temperature,
                    top_p, stop_token_ids, pad_token_id):
    calls.append((len(prompts), temperature, max_new_tokens))
    rows = []
    for ids in prompts:
      text = tok.decode(ids)
      assert text.rstrip().endswith('<|im_start|>assistant')
      reply = '0.6' if 'could not be read' in text else 'roughly six tenths'
      rows.append(tok.encode(reply) + [tok.eos_token_id])
    toks = np.full((len(rows), max(map(len, rows))), pad_token_id, np.int32)
    for i, r in enumerate(rows):
      toks[i, :len(r)] = r
    return sampling.GenerationOutput(tokens=toks, logprobs=np.zeros(toks.shape),
                                     lengths=np.array([len(r) for r in rows]))

  monkeypatch.setattr(sampling, 'generate', fake_generate)
  from vermem_jax.models import qwen
  judge = judges.make_judge(judges.JudgeConfig(backend='local_model', batch_size=2),
                            tokenizer=tok, model_config=qwen.QwenConfig.preset('tiny'),
                            params={})
  assert judge.score([CONV, CONV, CONV]) == [(0.6, False)] * 3
  # Batches of 2, the short last one padded to 2 rows (one batch shape).
  assert calls == [(2, 0.0, 1024)] * 4
  assert judge.counters['malformed'] == 3 and judge.counters['fallbacks'] == 0


def test_reasoning_judge_over_loopback_scores_after_its_think_block():
  # A reasoning model's reply: the block holds other numbers, the verdict follows it.
  server = _Server(['<think>The reference says 1912; the agent wrote 1912 but adds a '
                    'wrong month, so 0.6 or 0.9?</think>\n0.8'])
  try:
    judge = make(server)
    assert judge.score([CONV]) == [(0.8, False)]
    assert judge.counters['malformed'] == 0 and judge.counters['fallbacks'] == 0
    # The request leaves room for the block (paper config: 1,024 new tokens).
    assert server.requests[0]['body']['max_tokens'] == 1024
  finally:
    server.close()


def test_judge_records_fills_scores_and_skips_unanswered(hotpotqa_dir):
  ex = hotpotqa_sources.load_examples('json', 'validation', data_dir=hotpotqa_dir)[0]
  seen = []

  def complete(convs):
    seen.extend(convs)
    return ['0.8' if 'grade answers' in c[0]['content'] else '0.4' for c in convs]

  judge = judges.Judge(judges.JudgeConfig(), complete)
  records = [{'question_id': ex.id, 'answer': 'x', 'final_ltm': ['entry one']},
             {'question_id': ex.id, 'answer': None, 'final_ltm': []}]
  judges.judge_records(records, {ex.id: ex}, judge)
  assert [(r['j_judge'], r['mq']) for r in records] == [(0.8, 0.4), (0.0, 0.4)]
  assert records[1]['judge_fallback'] is False
  # 1 answer call (the unanswered episode is not sent) + 2 memory calls.
  assert len(seen) == 3
  mq_user = seen[1][1]['content']
  assert ex.answer in mq_user and 'entry one' in mq_user
  sup = hotpotqa.supporting_unit_ids(ex)
  units = {u.id: u for u in hotpotqa.evidence_units(ex)}
  assert all(units[u].text.strip() in mq_user for u in sup)
  assert '(no entries)' in seen[2][1]['content']
  # Base has no long-term memory: MQ is not asked for, and stays absent (None).
  seen.clear()
  base = [{'question_id': ex.id, 'answer': 'x', 'final_ltm': []}]
  judges.judge_records(base, {ex.id: ex}, judge, memory=False)
  assert base[0]['j_judge'] == 0.8 and base[0].get('mq') is None
  assert base[0].get('mq_fallback') is None and len(seen) == 1
