"""A record id cited in a command tokenizes as it does where g(s) shows it (issue 22).

The policy copies ids and text from its input into a command. With the packaged
SentencePiece model, Qwen2.5's tokenizer and SmolLM2's (issue 37), every id that a template command cites
must be the same run of pieces, starting and ending on piece boundaries, at each place
the state shows it; otherwise a copy is not a copy (the id `c2` was `[c`, `2` in the
state and `c`, `2` in `source_refs=["c2"]`).
"""

import os
import re

import pytest

import bench_support
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax import paths
from vermem_jax import tokenization
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.models import gguf_import
from vermem_jax.rl import policy

# Quoted record ids (local `c2` or qualified `0df0fc:c2`) in a command.
_ID = re.compile(r'"((?:[0-9a-f]{6}:)?[mch][1-9][0-9]*)"')


def _pieces(tok, text):
  """[(start, end, piece text)] character spans of `text`'s tokens, by prefix decoding
  (byte-level tokenizers may split a character; spans around ASCII ids stay exact)."""
  ids = tok.encode(text)
  ends = [len(tok.decode(ids[:i + 1])) for i in range(len(ids))]
  starts = [0] + ends[:-1]
  return [(a, b, text[a:b]) for a, b in zip(starts, ends)]


def _run(spans, start, end):
  """The pieces covering exactly text[start:end], or None if it is not on boundaries."""
  inside = [s for s in spans if s[0] >= start and s[1] <= end]
  if not inside or inside[0][0] != start or inside[-1][1] != end:
    return None
  return tuple(p for _, _, p in inside)


def _placements(tok, records):
  """(consistent, total) over every state placement of every id a target cites."""
  ok = total = 0
  for r in records:
    cited = {m.group(1): m.start(1) for m in _ID.finditer(r.target)}
    if not cited:
      continue
    cmd, state = _pieces(tok, r.target), _pieces(tok, r.policy_input)
    for rid, at in cited.items():
      want = _run(cmd, at, at + len(rid))
      for m in re.finditer(r'(?<![0-9A-Za-z:])' + re.escape(rid) + r'(?![0-9])',
                           r.policy_input):
        total += 1
        ok += want is not None and _run(state, m.start(), m.end()) == want
  return ok, total


def _records(tok):
  construction, dev = episodes.load_pools(
      hotpotqa.DataConfig(hotpotqa_dir=paths.hotpotqa_dir()))
  cfg = sft_config.SFTDataConfig(train_per_target=0, dev_per_target=8,
                               context_budget=320, policy_input_limit=640, seed=0)
  _, records, _ = sft_build.build_sft_set(construction[:40], dev,
                                         count_tokens=tok.count_tokens, config=cfg,
                                         verbose=False)
  return records


def test_piece_spans_by_hand():
  tok = tokenization.load_tokenizer(paths.packaged_tokenizer())
  spans = _pieces(tok, 'Filter(drop_refs=["c2"])')
  assert ''.join(p for _, _, p in spans) == 'Filter(drop_refs=["c2"])'
  at = 'Filter(drop_refs=["c2"])'.index('c2')
  assert _run(spans, at, at + 2) == ('c', '2')  # digits are single pieces


@pytest.mark.parametrize('name', ['hotpotqa-sp4k', 'qwen2.5', 'smollm2'])
def test_cited_ids_tokenize_as_in_the_state(name):
  path = {'hotpotqa-sp4k': paths.packaged_tokenizer(),
          'smollm2': paths.small_model_dir()}.get(name) or paths.tokenizer_dir(name)
  if name == 'smollm2' and not gguf_import.is_converted(path):
    bench_support.unavailable(f'no converted SmolLM2 at {path} (make install-small)')
  if not os.path.isdir(path) and not os.path.isfile(path):
    pytest.skip(f'no tokenizer at {path}')
  tok = tokenization.load_tokenizer(path)
  ok, total = _placements(tok, _records(tok))
  assert total >= 50, total  # SmolLM2's pieces fit 59 placements in these records
  assert ok == total, f'{ok} of {total} id placements tokenize as in the command'


def test_smollm2_policy_prompt_of_a_real_state():
  """x_t of a real SFT state through SmolLM2's own chat template (issue 37): its
  default system turn, x_t verbatim in the user turn, the generation prompt, and a
  command target that ends in its eos `<|im_end|>`."""
  path = paths.small_model_dir()
  if not gguf_import.is_converted(path):
    bench_support.unavailable(f'no converted SmolLM2 at {path} (make install-small)')
  tok = tokenization.load_tokenizer(path)
  record = next(r for r in _records(tok) if _ID.search(r.target))
  ids = policy.policy_prompt_ids(tok, record.policy_input)
  text = tok.decode(ids)
  system = ('<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained '
            'by Hugging Face<|im_end|>\n')
  assert text == (system + '<|im_start|>user\n' + record.policy_input
                  + '<|im_end|>\n<|im_start|>assistant\n')
  assert ids.count(tok.token_to_id('<|im_start|>')) == 3  # markers are single tokens
  target = policy.command_target_ids(tok, record.target)
  assert target[-1] == tok.eos_token_id == tok.token_to_id('<|im_end|>')
  assert tok.decode(target[:-1]) == record.target
