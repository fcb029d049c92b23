"""Tests for vermem_jax.envs.episodes (public entry: pools, SFT set, phase episodes).

The leakage test defines precisely what "the policy input never contains the reference
answer as a label or any supporting-fact annotation" means, checked on every example
of both sample files:
  1. Answer independence: for every train-sample example (the split construction
     draws from), rebuilding its states with the answer replaced by a sentinel gives
     byte-identical policy inputs x (so the answer field never reaches x; the answer
     *string* may still occur inside evidence sentences, which are the same in both
     builds). Checks 2 and 3 run on the dev-distractor sample too.
  2. No annotation: no supporting-fact unit id ("{title}#{sent_id}") occurs in x, and
     the scaffold of x (everything outside the quoted record texts) has no label
     marker ('supporting', 'gold', 'answer:', 'label', 'sup_fact').
  3. Provenance of texts: every word of every quoted record text in x (question, task
     state, M/C/H texts) is a word of the example's question, context sentences or
     titles, or of the fixed construction vocabulary (instruction, task states).
"""
import dataclasses
import html
import json
import random
import re

import pytest

from vermem_jax.envs import episode_types
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources
from vermem_jax.envs.scenarios import initial_state as scenario_states
from vermem_jax.envs.scenarios import build as scenario_build
from vermem_jax.envs.scenarios.initial_state import (CONTINUE_ACTION, INSTRUCTION_TEXT,
                                                     QUERY_PREFIX, TASK_STATES)
from vermem_jax.envs.sft_data import build as sft_build
from vermem_jax.envs.sft_data import config as sft_config
from vermem_jax.envs.scenarios import views as scenario_views
from vermem_jax.envs.scenarios import spec as scenario_spec
from vermem_jax.envs.sft_data import templates as sft_templates
from vermem_jax.memory import commands as cmds
from vermem_jax.memory import config as mconfig
from vermem_jax.memory import executor as mexec
from vermem_jax.memory import serialization
from vermem_jax.memory.token_count import count_whitespace_tokens as count

SENTINEL = 'Qzxv Sentinel Answer 7391'
_WORD = re.compile(r'\w+')
_RECORD = re.compile(r'^(?:\[[^\]]*\]|question:|task state:) (".*")$', re.M)
_MARKERS = ('supporting', 'gold', 'answer:', 'label', 'sup_fact')


@pytest.fixture(scope='module')
def all_examples(hotpotqa_dir):
  train = hotpotqa_sources.load_examples('json', 'train', data_dir=hotpotqa_dir)
  dev = hotpotqa_sources.load_examples('json', 'validation', data_dir=hotpotqa_dir)
  return train + dev


def _words(text):
  return set(_WORD.findall(text.casefold()))


def _fixed_vocabulary():
  """Words of the construction's own fixed texts (instruction, task states, ...)."""
  texts = [INSTRUCTION_TEXT, CONTINUE_ACTION, QUERY_PREFIX]
  texts += list(TASK_STATES.values())
  return _words(' '.join(texts))


def _inputs_for(example, i):
  """Policy inputs of one SFT template state and one episode s_0 per phase."""
  view = scenario_views.build_view(example, count)
  xs = []
  templates = sft_templates.TEMPLATES
  for k in range(len(templates)):
    t = templates[(i + k) % len(templates)]
    out = t.build(view, random.Random(f'{example.id}:{t.name}'), count, 2048)
    if out is not None:
      xs.append(serialization.render_policy_input(
          out[0], count, allowed_ops=cmds.PHASE_OPS[t.phases[0]]))
      break
  for phase in scenario_spec.PHASES:
    fams = scenario_spec.FAMILIES[phase]
    for k in range(len(fams)):
      spec = scenario_build.build_episode(example, phase, fams[(i + k) % len(fams)],
                                    count_tokens=count, view=view)
      if spec is not None:
        xs.append(serialization.render_policy_input(
            spec.initial_state, count, allowed_ops=cmds.PHASE_OPS[phase]))
        break
  return xs


def test_policy_inputs_never_leak_answer_or_annotations(all_examples, hotpotqa_dir):
  train_ids = {ex.id for ex in hotpotqa_sources.load_examples('json', 'train',
                                                               data_dir=hotpotqa_dir)}
  vocab = _fixed_vocabulary()
  n_inputs = 0
  for i, ex in enumerate(all_examples):
    xs = _inputs_for(ex, i)
    assert len(xs) == 4, ex.id
    if ex.id in train_ids:  # 1. x does not depend on the answer
      masked = dataclasses.replace(ex, answer=SENTINEL)
      assert _inputs_for(masked, i) == xs, ex.id
    allowed = _words(ex.question) | vocab
    for para in ex.context:
      allowed |= _words(para.title) | _words(' '.join(para.sentences))
      allowed |= _words(html.unescape(para.title))
    sup_ids = hotpotqa.supporting_unit_ids(ex)
    for x in xs:
      n_inputs += 1
      assert not [u for u in sup_ids if u in x], ex.id  # 2. no unit ids at all
      literals = _RECORD.findall(x)
      assert literals
      scaffold = _RECORD.sub('', x).casefold()
      assert not [m for m in _MARKERS if m in scaffold], ex.id
      for lit in literals:
        # Digits may differ: stale entries carry a perturbed number (a conflict).
        extra = {w for w in _words(json.loads(lit)) - allowed if not w.isdigit()}
        assert not extra, (ex.id, extra)  # 3. texts come from the example
  assert n_inputs == 4 * len(all_examples)


def test_sft_targets_do_not_depend_on_answer(hotpotqa_dir):
  examples = hotpotqa_sources.load_examples('json', 'train', data_dir=hotpotqa_dir)
  construction, dev = hotpotqa.split_train_pools(examples)
  cfg = sft_config.SFTDataConfig(train_per_target=4, dev_per_target=2)
  train, dev_r, _ = sft_build.build_sft_set(construction, dev, count_tokens=count,
                                           config=cfg, verbose=False)
  masked = [dataclasses.replace(ex, answer=SENTINEL) for ex in construction]
  masked_dev = [dataclasses.replace(ex, answer=SENTINEL) for ex in dev]
  train_m, dev_m, _ = sft_build.build_sft_set(masked, masked_dev, count_tokens=count,
                                             config=cfg, verbose=False)
  assert [(r.policy_input, r.target) for r in train + dev_r] == [
      (r.policy_input, r.target) for r in train_m + dev_m]


def test_build_phase_episodes_uses_the_right_pools(hotpotqa_dir):
  construction, dev = episodes.load_pools(
      hotpotqa.DataConfig(hotpotqa_dir=hotpotqa_dir))
  assert len(construction) + len(dev) == 592 and dev
  cfg = scenario_spec.ScenarioConfig(num_train=12, num_dev=6)
  for phase in scenario_spec.PHASES:
    train, dev_specs = episodes.build_phase_episodes(phase, construction, dev,
                                                     count_tokens=count, config=cfg)
    assert len(train) == 12 and len(dev_specs) == 6
    assert {s.example.id for s in train} <= {ex.id for ex in construction}
    assert {s.example.id for s in dev_specs} <= {ex.id for ex in dev}
    assert all(isinstance(s, episode_types.EpisodeSpec) for s in train + dev_specs)
    assert all(s.phase == phase and s.family in scenario_spec.FAMILIES[phase]
               for s in train + dev_specs)


@pytest.fixture(scope='module')
def qwen_tok(qwen25_tokenizer_dir):
  from vermem_jax import tokenization  # pylint: disable=import-outside-toplevel
  return tokenization.load_tokenizer(qwen25_tokenizer_dir)


def test_sft_set_with_real_qwen_tokenizer(hotpotqa_dir, qwen_tok):
  examples = hotpotqa_sources.load_examples('json', 'train', data_dir=hotpotqa_dir)
  construction, dev = hotpotqa.split_train_pools(examples)
  cfg = sft_config.SFTDataConfig(train_per_target=2, dev_per_target=1,
                               context_budget=1024)
  train, dev_records, _ = sft_build.build_sft_set(
      construction, dev, count_tokens=qwen_tok.count_tokens, config=cfg,
      verbose=False)
  assert len(train) == 16 and len(dev_records) == 8
  for r in train + dev_records:
    assert r.state.context_tokens() <= 1024
    for it in r.state.C:
      assert it.tokens == len(qwen_tok.encode(it.text))
    cfg_x = mconfig.ExecutorConfig(phase=r.phase, context_budget=1024)
    assert mexec.execute(r.state, r.target, cfg_x, qwen_tok.count_tokens).accepted
    assert qwen_tok.count_tokens(r.policy_input) <= cfg.policy_input_limit


def test_episodes_with_real_qwen_tokenizer(hotpotqa_dir, qwen_tok):
  tok = qwen_tok
  examples = hotpotqa_sources.load_examples('json', 'train', data_dir=hotpotqa_dir)
  construction, _ = hotpotqa.split_train_pools(examples)
  cfg = scenario_spec.ScenarioConfig(context_budget=1024, rollout_limit=6)
  for phase in scenario_spec.PHASES:
    specs = scenario_build.build_episodes(construction[:30], phase,
                                    count_tokens=tok.count_tokens, config=cfg, num=5)
    for s in specs:
      s0 = s.initial_state
      assert scenario_states.validate_initial_state(s0, tok.count_tokens, 1024,
                                             example=s.example) == []
      assert s0.context_tokens() <= 1024
      assert sum(len(tok.encode(it.text)) for it in s0.C) == s0.context_tokens()
      tr = mexec.execute(s0, s.reference_command,
                         mconfig.ExecutorConfig(phase=phase, context_budget=1024),
                         tok.count_tokens)
      assert tr.accepted, tr.message
      assert s.max_decisions <= 6
