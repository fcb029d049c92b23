"""experiments/benchmarks/sft_decisions.py: teacher-forced tool choice per class."""

import types

import jax
import numpy as np
import pytest

import benchmark_scripts
from vermem_jax import paths
from vermem_jax import tokenization
from vermem_jax.models import qwen
from vermem_jax.models.qwen_config import QwenConfig
from vermem_jax.train import sft_examples


@pytest.fixture(scope='module')
def script():
  return benchmark_scripts.load('sft_decisions')


def _example(rng, op, prompt_len, command):
  prompt = tuple(int(x) for x in rng.integers(300, 4000, prompt_len))
  return sft_examples.SFTExample(prompt, tuple(command), types.SimpleNamespace(op=op))


@pytest.mark.slow  # ~35 s
def test_figures_match_rows_scored_one_by_one(script):
  # Reference: each row alone, unpadded, softmax in NumPy float64.
  tok = tokenization.load_tokenizer(paths.packaged_tokenizer())
  mc = QwenConfig.preset('tiny-sp4k', dtype='float32')
  params = qwen.init_params(mc, jax.random.PRNGKey(1))
  rng = np.random.default_rng(0)
  examples = [_example(rng, 'Add', 40, (8, 911, 7, 3951, 3)),
              _example(rng, 'Add', 75, (8, 911, 3)),
              _example(rng, 'Null', 9, (5, 3)),
              _example(rng, 'Filter', 130, (12, 7, 3))]
  got = script.decision_figures(mc, params, examples, tok, batch_size=3)
  want = {}
  for e in examples:
    seq = np.asarray([e.prompt_tokens + e.command_tokens], np.int32)
    logits = np.asarray(qwen.Qwen(mc).apply({'params': params}, seq), np.float64)[0]
    step = logits[len(e.prompt_tokens) - 1:len(seq[0]) - 1]
    p = np.exp(step[0] - step[0].max())
    p /= p.sum()
    w = want.setdefault(e.record.op, {'n': 0, 'decision': 0.0, 'p_tool': 0.0,
                                      'tokens': 0.0})
    w['n'] += 1
    w['decision'] += step[0].argmax() == e.command_tokens[0]
    w['p_tool'] += p[e.command_tokens[0]]
    w['tokens'] += (step.argmax(-1) == np.asarray(e.command_tokens)).mean()
  assert set(got) == {'Add', 'Null', 'Filter'}
  for op, w in want.items():
    assert got[op]['n'] == w['n']
    for k in ('decision', 'p_tool', 'tokens'):
      np.testing.assert_allclose(got[op][k], w[k] / w['n'], rtol=1e-5, atol=1e-7,
                                 err_msg=f'{op} {k}')
    # A random model does not pick these tools: 'instead' names what it picks.
    assert (got[op]['instead'] == '') == (got[op]['decision'] == 1.0)


def test_missing_workdir_is_an_error_with_status_2(script, tmp_path, capsys):
  assert script.main([f'--workdir={tmp_path}']) == 2
  assert f'--workdir={tmp_path}' in capsys.readouterr().err


def test_sft_folder_itself_gets_a_hint(script, tmp_path, capsys):
  (tmp_path / 'sft').mkdir()
  assert script.main([f'--workdir={tmp_path / "sft"}']) == 2
  assert 'pass the run directory that holds sft/' in capsys.readouterr().err


def test_unknown_override_is_an_error_with_status_2(script, tmp_path, capsys):
  assert script.main([f'--workdir={tmp_path}', '--override', 'model.bogus=1']) == 2
  assert 'model.bogus: no such config field' in capsys.readouterr().err


def test_first_per_class_keeps_order_and_count(script):
  ops = ['Add', 'Null', 'Add', 'Delete', 'Add', 'Null']
  records = [types.SimpleNamespace(op=op, i=i) for i, op in enumerate(ops)]
  kept = script.first_per_class(records, 2)
  assert [r.i for r in kept] == [0, 1, 2, 3, 5]
  assert script.first_per_class(records, 1) == [records[0], records[1], records[3]]
