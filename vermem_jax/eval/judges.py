"""Answer judge (J_judge) and memory-quality judge (MQ) for HotpotQA (paper C.5-C.6).

Both ask an independent model for ONE number in [0, 1]:
  * J_judge compares the question, the reference answer and the agent's answer
    (equivalent -> 1.0, minor slip 0.8-0.9, partly right 0.6-0.7, some right with a
    major error 0.4-0.5, mostly wrong 0.2-0.3, wrong / contradictory / irrelevant
    0.0-0.1). An episode without an answer scores 0.0 without a call (decision: an
    absent answer cannot be correct).
  * MQ judges the active entries of the terminal LTM (soft-deleted ones excluded)
    against the question, the reference answer and the annotated supporting facts:
    coverage of the supporting facts, relevance and consistency, absence of noise.
The prompts are our own wording of the paper's rubrics.

Backends (config `eval.judge.backend`): 'openai_compatible' (an HTTP chat-completions
server through `http_chat.ChatClient`; key from the variable named by
`eval.judge.api_key_env`)
and 'local_model' (a Flax Qwen checkpoint through the project's sampler,
`verifiers.local_model.LocalChatGenerator`). '' = no judge: J_judge and MQ are then
reported as absent, never replaced by another number.

Replies are read as the paper asks (`parse_score`): once a reasoning block
(<think>…</think>, Qwen3 / DeepSeek-R1 style) is removed, the reply must contain exactly
one number and it must lie in [0, 1] — "0.7", "Score: 0.7" and "0.7 because ..." give
0.7; "0.5/1", "0.5 or 0.6", 1.3 and an unclosed reasoning block (the reply limit cut
it) are malformed. `max_new_tokens` (paper config: 1,024) leaves room for a reasoning
block before the number. A malformed reply is re-asked with the reason appended; a retryable
transport failure (timeout, 5xx, refused connection) is re-sent after a backoff of
`backoff_s * 2**r` seconds. After `max_retries` retries the configured fallback
applies: 'zero' (score 0.0) or 'skip' (None: left out of the mean); either way the
record is flagged and the fallbacks are counted and reported. The judges never run
during training or checkpoint selection (paper C.8).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from vermem_jax import config_util
from vermem_jax import http_chat
from vermem_jax import tokenization
from vermem_jax.envs import hotpotqa
from vermem_jax.verifiers import local_model

_LOG = logging.getLogger(__name__)

BACKENDS = ('', 'openai_compatible', 'local_model')
FALLBACKS = ('zero', 'skip')
# The HTTP endpoint's defaults (keys `eval.judge.base_url`, ... of the config).
DEFAULT_CHAT = http_chat.ChatBackendConfig(
    api_key_env='VERMEM_JUDGE_API_KEY', timeout_s=60.0, max_concurrency=8, max_retries=2,
    backoff_s=1.0, section='eval.judge')

ANSWER_SYSTEM = (
    'You grade answers to questions, independently of whoever wrote them. Compare the '
    "agent's answer with the reference answer and give one score from 0.0 to 1.0:\n"
    '1.0 - correct, or equivalent in meaning to the reference;\n'
    '0.8 to 0.9 - correct apart from a small omission or wording problem;\n'
    '0.6 to 0.7 - partly correct, an important part missing;\n'
    '0.4 to 0.5 - some correct content next to a major mistake;\n'
    '0.2 to 0.3 - largely wrong, little relevant content;\n'
    '0.0 to 0.1 - wrong, contradicting the reference, or beside the point.\n'
    'Reply with the number only, with no words around it.')

MEMORY_SYSTEM = (
    "You grade an agent's long-term memory, kept while it worked on one question, "
    'independently of whoever built it. Judge the stored entries on three things: do '
    'they contain the supporting facts needed for the answer; are they relevant to the '
    'question and consistent with the facts; are they free of irrelevant, repeated or '
    'misleading material. Give one score from 0.0 to 1.0:\n'
    '1.0 - complete, relevant, consistent and without noise;\n'
    '0.8 to 0.9 - almost complete, one small gap or one irrelevant entry;\n'
    '0.6 to 0.7 - useful, but important supporting content is missing;\n'
    '0.4 to 0.5 - some useful evidence buried in much noise;\n'
    '0.2 to 0.3 - little relevant content, serious errors;\n'
    '0.0 to 0.1 - unsupported, irrelevant or unusable.\n'
    'Reply with the number only, with no words around it.')

RETRY_TEXT = ('Your reply could not be read as a score ({error}). Reply with a single '
              'number between 0.0 and 1.0 and nothing else.')

_THINK = re.compile(r'<think>.*?</think>', re.DOTALL)
# A signed decimal: '-0.2' is one (out-of-range) number, not 0.2.
_NUMBER = re.compile(r'[-+]?(?:\d+(?:\.\d*)?|\.\d+)')


class JudgeOutputError(ValueError):
  """The judge's reply is not one number in [0, 1]; the message says why."""


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
  """Judge settings: the keys of config section `eval.judge` (`from_config`), the
  endpoint's flat keys gathered in `chat`.

  Attributes:
    backend: '' (no judge), 'openai_compatible' or 'local_model'.
    chat: keys `eval.judge.base_url`, `model`, `api_key_env`, `timeout_s`,
      `max_concurrency`, `max_retries`, `backoff_s` (http_chat.ChatBackendConfig):
      the HTTP endpoint root (…/v1) and the model served there (the paper used a
      fixed Qwen-Max snapshot); the API key is never logged or stored; `max_retries`
      extra attempts per example after a malformed reply or a retryable transport
      failure (decision: 2), `backoff_s` the base of the transport-retry backoff.
      local_model: `chat.model` is the preset of random weights (tests only).
    fallback: 'zero' or 'skip' once retries are spent (counted either way).
    checkpoint_path: local_model: HF Qwen folder ('' = random weights of `chat.model`,
      a preset name — tests only). tokenizer_path: '' = the run's tokenizer.
    max_new_tokens: reply limit in tokens; a reasoning model writes its <think> block
      before the number, so this bounds that block too (decision: 1,024 in the
      paper config; a bare number needs a few tokens).
    batch_size: local_model prompts per generate call.
    temperature: 0 = deterministic (paper C.6).
    max_section_chars: each free-text section of a prompt is cut to this length.
    seed: local_model PRNG seed.
  """
  backend: str = ''
  chat: http_chat.ChatBackendConfig = DEFAULT_CHAT
  fallback: str = 'zero'
  checkpoint_path: str = ''
  tokenizer_path: str = ''
  max_new_tokens: int = 1024
  batch_size: int = 16
  temperature: float = 0.0
  max_section_chars: int = 12000
  seed: int = 0

  def __post_init__(self):
    if self.backend not in BACKENDS:
      raise ValueError(f'eval.judge.backend={self.backend!r}; expected one of {BACKENDS}')
    if self.fallback not in FALLBACKS:
      raise ValueError(f'eval.judge.fallback={self.fallback!r}; expected one of '
                       f'{FALLBACKS}')
    if self.backend == 'openai_compatible':
      self.chat.check_endpoint()
    for name, low in (('max_new_tokens', 1), ('batch_size', 1), ('temperature', 0),
                      ('max_section_chars', 100)):
      if getattr(self, name) < low:
        raise ValueError(f'eval.judge.{name} must be >= {low}, got {getattr(self, name)}')

  @classmethod
  def from_config(cls, section: Mapping[str, Any], *, strict: bool = False
                  ) -> 'JudgeConfig':
    """From config section `eval.judge` (dict or ConfigDict; flat keys).

    Raises:
      ValueError: a bad value, named; with `strict`, a key that is not a setting.
    """
    chat, rest = http_chat.ChatBackendConfig.split(section, defaults=DEFAULT_CHAT)
    return config_util.dataclass_from_mapping(cls, rest, strict=strict,
                                              what='JudgeConfig',
                                              overrides={'chat': chat})


def parse_score(text: str) -> float:
  """The score in a judge reply (paper C.6: a reply containing one number).

  The reasoning blocks (<think>…</think>) are removed; what remains must contain
  exactly one decimal number (sign included), within [0, 1].

  Args:
    text: the judge's reply.

  Returns:
    The score in [0, 1] ('<think>…</think> 0.8' -> 0.8, 'Score: 0.7.' -> 0.7).

  Raises:
    JudgeOutputError: no number, two or more ('0.5/1', '1e-1'), one outside [0, 1]
      ('1.3', '-0.1'), or a reasoning block left open (the reply was cut).
  """
  if not isinstance(text, str):
    raise JudgeOutputError(f'reply is {type(text).__name__}, not text')
  body = _THINK.sub('', text)
  if '<think>' in body:
    raise JudgeOutputError('the reasoning block is not closed (reply cut at '
                           'eval.judge.max_new_tokens?)')
  numbers = _NUMBER.findall(body)
  if len(numbers) != 1:
    raise JudgeOutputError(f'expected exactly one number, found {len(numbers)} in '
                           f'{body.strip()[:60]!r}')
  value = float(numbers[0])
  if not 0.0 <= value <= 1.0:
    raise JudgeOutputError(f'{value} is outside [0, 1]')
  return value


def _cut(text: str, limit: int) -> str:
  return text if len(text) <= limit else text[:limit] + ' [...]'


def answer_messages(question: str, reference: str, answer: str, *,
                    max_chars: int = 12000) -> list[dict[str, str]]:
  """Chat messages of the answer judge for one episode."""
  user = (f'Question:\n{_cut(question, max_chars)}\n\n'
          f'Reference answer:\n{_cut(reference, max_chars)}\n\n'
          f"Agent's answer:\n{_cut(answer, max_chars)}\n\nScore (0.0 to 1.0):")
  return [{'role': 'system', 'content': ANSWER_SYSTEM}, {'role': 'user', 'content': user}]


def memory_messages(question: str, reference: str, supporting_facts: Sequence[str],
                    entries: Sequence[str], *, max_chars: int = 12000
                    ) -> list[dict[str, str]]:
  """Chat messages of the memory-quality judge for one terminal LTM."""
  facts = '\n'.join(f'- {f}' for f in supporting_facts) or '(none annotated)'
  stored = '\n'.join(f'[{i + 1}] {e}' for i, e in enumerate(entries)) or '(no entries)'
  user = (f'Question:\n{_cut(question, max_chars)}\n\n'
          f'Reference answer:\n{_cut(reference, max_chars)}\n\n'
          f'Supporting facts (annotated):\n{_cut(facts, max_chars)}\n\n'
          f'Active long-term memory entries at the end of the episode:\n'
          f'{_cut(stored, max_chars)}\n\nScore (0.0 to 1.0):')
  return [{'role': 'system', 'content': MEMORY_SYSTEM}, {'role': 'user', 'content': user}]


# A backend: conversations -> one reply text (or a ChatError) per conversation.
Complete = Callable[[list[list[dict]]], list]


class Judge:
  """Scores conversations with retries and a counted fallback (module docstring).

  Args:
    config: JudgeConfig (retries, backoff, fallback).
    complete: the backend call, conversations -> reply texts / `http_chat.ChatError`s.
    sleep: replaced in tests.

  Attributes:
    counters: 'requests', 'retries', 'malformed', 'transport_errors', 'fallbacks'.
  """

  def __init__(self, config: JudgeConfig, complete: Complete, *,
               sleep: Callable[[float], None] = time.sleep,
               close: Optional[Callable[[], None]] = None):
    self.config = config
    self._complete = complete
    self._sleep = sleep
    self._close = close
    self.counters = dict.fromkeys(('requests', 'retries', 'malformed',
                                   'transport_errors', 'fallbacks'), 0)

  def score(self, conversations: Sequence[list[dict]]
            ) -> list[tuple[Optional[float], bool]]:
    """(score or None, fallback used) per conversation, in order."""
    n = len(conversations)
    scores: list[Optional[float]] = [None] * n
    current = [list(c) for c in conversations]
    pending = list(range(n))
    failed: list[int] = []
    for attempt in range(self.config.chat.max_retries + 1):
      if not pending:
        break
      if attempt:
        self.counters['retries'] += len(pending)
      replies = self._complete([current[i] for i in pending])
      if len(replies) != len(pending):
        raise RuntimeError(f'judge backend returned {len(replies)} replies for '
                           f'{len(pending)} requests')
      self.counters['requests'] += len(pending)
      next_pending, transport = [], False
      for i, reply in zip(pending, replies):
        if isinstance(reply, http_chat.ChatError):
          self.counters['transport_errors'] += 1
          _LOG.warning('judge request failed (attempt %d): %s', attempt + 1, reply)
          (next_pending if reply.retryable else failed).append(i)
          transport = transport or reply.retryable
          continue
        try:
          scores[i] = parse_score(reply)
        except JudgeOutputError as e:
          self.counters['malformed'] += 1
          current[i] = list(conversations[i]) + [
              {'role': 'assistant', 'content': str(reply)[:2000]},
              {'role': 'user', 'content': RETRY_TEXT.format(error=e)}]
          next_pending.append(i)
      pending = next_pending
      if transport and pending and attempt < self.config.chat.max_retries and (
          self.config.chat.backoff_s > 0):
        self._sleep(self.config.chat.backoff_s * 2 ** attempt)
    failed = sorted(failed + pending)
    self.counters['fallbacks'] += len(failed)
    if failed:
      _LOG.warning('judge: %d of %d examples unscored after %d attempts; fallback=%s',
                   len(failed), n, self.config.chat.max_retries + 1, self.config.fallback)
    value = 0.0 if self.config.fallback == 'zero' else None
    out = [(s, False) for s in scores]
    for i in failed:
      out[i] = (value, True)
    return out

  def close(self) -> None:
    if self._close is not None:
      self._close()


def make_judge(config: JudgeConfig, *, tokenizer: Any = None, model_config: Any = None,
               params: Any = None) -> Optional[Judge]:
  """The configured judge, or None when `config.backend` is ''.

  Args:
    config: JudgeConfig.
    tokenizer: local_model: the tokenizer when `config.tokenizer_path` is ''.
    model_config, params: local_model: already loaded weights (both or neither).

  Raises:
    ValueError: an unset API key variable, a missing tokenizer, bad weights.
  """
  if not config.backend:
    return None
  if config.backend == 'openai_compatible':
    # The judge's own rounds retry (also unparsable replies); the client does not.
    client = config.chat.client(require_api_key=True, retry_in_client=False)
    return Judge(config, lambda convs: client.complete_many(
        convs, max_tokens=config.max_new_tokens, temperature=config.temperature),
                 close=client.close)
  if (model_config is None) != (params is None):
    raise ValueError('make_judge: pass both model_config and params, or neither')
  if model_config is None:
    model_config, params = local_model.load_model(config.checkpoint_path, config.chat.model,
                                                  config.seed)
  if config.tokenizer_path:
    tokenizer = tokenization.load_tokenizer(config.tokenizer_path)
  if tokenizer is None:
    raise ValueError('eval.judge.tokenizer_path: the local_model judge needs a tokenizer')
  gen = local_model.LocalChatGenerator(
      model_config, params, tokenizer, max_new_tokens=config.max_new_tokens,
      temperature=config.temperature, batch_size=config.batch_size, seed=config.seed)
  return Judge(config, gen.complete_many)


def judge_records(records: Sequence[dict], examples: Mapping[str, Any], judge: Judge,
                  *, max_chars: int = 12000, memory: bool = True) -> None:
  """Fills `j_judge`, `mq`, `judge_fallback`, `mq_fallback` of records in place.

  Args:
    records: `eval.metrics.episode_record` dicts (their 'answer' and 'final_ltm', the
      active terminal LTM contents, are judged).
    examples: question id -> hotpotqa.Example (reference answer, supporting facts).
    judge: the judge.
    memory: judge MQ. False for a policy without long-term memory (Base, paper C.4):
      `mq` stays None and is reported as "—", not as the score of an empty memory.
  """
  answer_convs, answer_idx, memory_convs = [], [], []
  for i, r in enumerate(records):
    ex = examples[r['question_id']]
    if r['answer'] is None:
      r['j_judge'], r['judge_fallback'] = 0.0, False
    else:
      answer_convs.append(answer_messages(ex.question, ex.answer, r['answer'],
                                          max_chars=max_chars))
      answer_idx.append(i)
    if not memory:
      continue
    units = {u.id: u for u in hotpotqa.evidence_units(ex)}
    facts = [f'{units[u].title}: {units[u].text.strip()}'
             for u in hotpotqa.supporting_unit_ids(ex)]
    memory_convs.append(memory_messages(ex.question, ex.answer, facts,
                                        list(r.get('final_ltm') or ()),
                                        max_chars=max_chars))
  for i, (s, fb) in zip(answer_idx, judge.score(answer_convs) if answer_convs else []):
    records[i]['j_judge'], records[i]['judge_fallback'] = s, fb
  if not memory:
    return
  for r, (s, fb) in zip(records, judge.score(memory_convs) if memory_convs else []):
    r['mq'], r['mq_fallback'] = s, fb
