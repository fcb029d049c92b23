"""Tests for vermem_jax.envs.sft_data.teacher (the optional OpenAI-compatible one)."""
import collections
import dataclasses

import chat_server

from vermem_jax.envs.sft_data.build import build_sft_set
from vermem_jax.envs.sft_data.config import DEFAULT_TEACHER, SFTDataConfig
from vermem_jax.memory.commands import ALL_OPS
from vermem_jax.envs.sft_data.teacher import OpenAICompatibleTeacher
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor as mexec
from vermem_jax.memory.token_count import count_whitespace_tokens as count


def _alternating_teacher(n, body):
  del body
  # Alternate: a valid ∅, then a malformed command.
  return '∅' if n % 2 == 1 else 'Add(content="unterminated'


def test_teacher_candidates_pass_the_same_filters(pools, monkeypatch, capsys):
  construction, dev = pools
  server = chat_server.LoopbackChatServer(_alternating_teacher)
  try:
    monkeypatch.setenv('VERMEM_TEST_TEACHER_KEY', 'sk-test-secret-123')
    cfg = SFTDataConfig.from_config(dict(
        train_per_target=2, dev_per_target=0, template_fraction=0.5,
        teacher_backend='openai_compatible',
        teacher_base_url=server.url,
        teacher_model='teacher-test', teacher_api_key_env='VERMEM_TEST_TEACHER_KEY'))
    train, _, report = build_sft_set(construction, dev, count_tokens=count,
                                     config=cfg, verbose=True)
  finally:
    server.close()
  printed = capsys.readouterr().out
  seen = [(r['path'], r['auth'], r['body']) for r in server.requests]
  assert seen and all(p == '/v1/chat/completions' for p, _, _ in seen)
  assert all(a == 'Bearer sk-test-secret-123' for _, a, _ in seen)
  assert seen[0][2]['model'] == 'teacher-test'
  user = seen[0][2]['messages'][1]['content']
  assert 'STATE BEGIN' in user and 'Allowed operations' in user
  assert 'sk-test-secret-123' not in printed
  # One teacher ∅ is kept for the Null class; malformed replies are discarded.
  teacher = [r for r in train if r.source == 'teacher']
  assert [r.op for r in teacher] == ['Null'] and teacher[0].target == '∅'
  assert report.teacher_accepted == 1 and report.teacher_rejected >= 1
  assert collections.Counter(r.op for r in train) == {op: 2 for op in ALL_OPS}
  assert all(mexec.execute(r.state, r.target, mconfig.ExecutorConfig(phase=r.phase),
                           count).accepted for r in train)


def test_unreachable_teacher_falls_back_to_templates(pools):
  construction, _ = pools
  teacher = OpenAICompatibleTeacher(dataclasses.replace(
      DEFAULT_TEACHER, base_url='http://127.0.0.1:9/v1', model='m', timeout_s=2.0))
  cfg = SFTDataConfig(train_per_target=2, dev_per_target=0)
  train, _, report = build_sft_set(construction, [], count_tokens=count,
                                   config=cfg, teacher=teacher, verbose=False)
  assert len(train) == 16 and all(r.source == 'template' for r in train)
  assert report.teacher_errors >= 1
