"""Pretraining of the tiny base (vermem_jax.train.pretrain; issue 22)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import common
from vermem_jax import paths
from vermem_jax import tokenization
from vermem_jax.envs import episodes
from vermem_jax.envs import hotpotqa
from vermem_jax.models import hf_io
from vermem_jax.models import qwen
from vermem_jax.models.qwen_config import QwenConfig
from vermem_jax.train import checkpoints
from vermem_jax.train import pretrain as pt
from vermem_jax.train import pretrain_data as pd
from vermem_jax.train import run_setup

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_config(**overrides):
  values = common.get_config('pretrain').pretrain.to_dict()
  values.update(steps=3, copy_only_steps=1, batch_size=2, seq_len=160, log_every=1,
                probe_every=0, probe_rows=4)
  values['task_weights'] = tuple(values['task_weights'])
  values.update(overrides)
  return pd.PretrainConfig(**values)


def small_run(save_every=1000, **overrides):
  """The typed setup of the pretrain config, shrunk (Flax lm1b's habit: one short run
  of the real config)."""
  c = common.get_config('pretrain')
  c.pretrain.update(dict(steps=3, copy_only_steps=1, batch_size=2, seq_len=160,
                         log_every=1, probe_every=0, probe_rows=4))
  c.pretrain.update(overrides)
  c.checkpoint.save_every = save_every
  c.metrics.tensorboard = False
  c.metrics.progress_bar = False
  return run_setup.RunSetup.from_config(c)


def metrics_rows(directory):
  """metrics.jsonl without its wall-clock fields."""
  with open(os.path.join(directory, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if k not in ('time', 'seconds')} for r in rows]


@pytest.fixture(scope='module')
def tok():
  return tokenization.load_tokenizer(paths.packaged_tokenizer())


@pytest.fixture(scope='module')
def construction():
  pool, _ = episodes.load_pools(hotpotqa.DataConfig(hotpotqa_dir=paths.hotpotqa_dir()))
  return pool


@pytest.fixture(scope='module')
def rows(tok, construction):
  cfg = small_config()
  corpus = pd.build_corpus(construction[:60], tok, cfg.probe_fraction, seed=0)
  return pd.RowMaker(corpus, cfg)


def test_probe_questions_are_held_out(tok, construction):
  corpus = pd.build_corpus(construction[:60], tok, 0.1, seed=0)
  train = {p.tobytes() for p in corpus.train_paragraphs}
  probe = {p.tobytes() for p in corpus.probe_paragraphs}
  assert probe and train and not train & probe


def _targets(tokens, target):
  return tokens[target > 0].tolist()


def test_copy_row_targets_the_copy_after_its_first_token(rows):
  rng = np.random.default_rng(3)
  tokens, target = rows.copy(rng, step=10_000)
  nl = np.flatnonzero(tokens == rows.newline)
  sep = int(nl[-1])
  assert tokens[sep + 1] == rows.quote
  copy = _targets(tokens, target)
  # x is the len(copy)+1 tokens before the separator; the target is x[1:].
  x = tokens[sep - len(copy) - 1:sep].tolist()
  assert copy == x[1:] and tokens[sep + 2] == x[0]
  assert 10 <= len(x) <= 32 and target[:sep + 3].sum() == 0


def test_span_row_copies_a_span_of_its_paragraph(rows):
  rng = np.random.default_rng(4)
  tokens, target = rows.span(rng, rows.corpus.train_paragraphs, length=32)
  span = _targets(tokens, target)
  assert len(span) == 31
  first = int(np.flatnonzero(target)[0]) - 1  # the span's first token, not a target
  whole = tokens[first:first + 32].tolist()
  para = tokens[1:first - 2].tolist()
  assert any(para[i:i + 32] == whole for i in range(len(para) - 31))


def test_quote_and_cite_rows_by_text(rows, tok):
  rng = np.random.default_rng(5)
  tokens, target = rows.quote_row(rng, rows.corpus.train_sentences)
  text = tok.decode(tokens[tokens != tok.pad_token_id].tolist())
  asked = text.split('\nquote "')[1].split('"')[0]
  quoted = tok.decode(_targets(tokens, target))
  line = [l for l in text.split('\n') if l.startswith(f'["{asked}" ')][0]
  # The record's text and its closing quote (cut where a row exceeds seq_len).
  assert quoted and line.split('] "', 1)[1].startswith(quoted)
  tokens, target = rows.cite_row(rng, rows.corpus.train_sentences)
  text = tok.decode(tokens[tokens != tok.pad_token_id].tolist())
  cited = tok.decode(_targets(tokens, target))
  assert cited.endswith('"') and f'["{cited[:-1]}" ' in text
  prefix = text.split('\ncite "')[1].split('"')[0]
  line = [l for l in text.split('\n') if l.startswith(f'["{cited[:-1]}" ')][0]
  assert line.split('] "', 1)[1].startswith(prefix)


def test_next_token_loss_matches_numpy(tok):
  mc = QwenConfig.preset('tiny-sp4k', dtype='float32')
  params = qwen.init_params(mc, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 4096, (2, 12)).astype(np.int32)
  target = (rng.random((2, 12)) < 0.5).astype(np.float32)
  # Jitted: run op by op, the two would compile ~160 one-op programs (~6 s).
  loss, acc = jax.jit(pt.next_token_loss, static_argnums=0)(
      mc, params, jnp.asarray(tokens), jnp.asarray(target))
  logits = np.asarray(jax.jit(qwen.Qwen(mc).apply)({'params': params}, tokens),
                      np.float64)
  lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  nll = lse[:, :-1] - np.take_along_axis(logits[:, :-1], tokens[:, 1:, None], -1)[..., 0]
  w = target[:, 1:]
  hit = logits[:, :-1].argmax(-1) == tokens[:, 1:]
  np.testing.assert_allclose(float(loss), (nll * w).sum() / w.sum(), rtol=1e-4)
  np.testing.assert_allclose(float(acc), (hit * w).sum() / w.sum(), rtol=1e-6)


def test_short_pretraining_writes_a_base_that_loads_with_identical_logits(
    tmp_path, tok, construction):
  run = small_run()
  mc = run.model.config
  directory = str(tmp_path / 'pretrain')
  params, final = pt.pretrain(run, construction[:60], tok, directory)
  assert final['step'] == 3 and final['complete']
  assert set(final['probe']) == {'span_copy_accuracy', 'id_copy_accuracy', 'text_loss'}
  rows = metrics_rows(directory)
  assert [r['step'] for r in rows] == [1, 2, 3]
  # The last row carries the final probe, rounded.
  assert rows[-1]['probe/text_loss'] == round(final['probe']['text_loss'], 4)
  out = tmp_path / 'base'
  pt.write_base(mc, params, paths.packaged_tokenizer(), str(out), {'steps': 3})
  assert {'config.json', 'model.safetensors', 'tokenizer.model',
          'pretrain_info.json'} <= set(os.listdir(out))
  loaded_cfg, loaded = hf_io.load_hf_checkpoint(str(out), dtype='float32')
  assert loaded_cfg.num_hidden_layers == mc.num_hidden_layers
  assert loaded_cfg.vocab_size == mc.vocab_size
  ids = jnp.asarray([tok.encode('Paris: Paris is the capital of France.')])
  f32 = QwenConfig.preset('tiny-sp4k', dtype='float32')
  stored = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32),
                                  params)  # the folder stores bfloat16
  want = jax.jit(qwen.Qwen(f32).apply)({'params': stored}, ids)
  got = jax.jit(qwen.Qwen(loaded_cfg.replace(dtype='float32')).apply)(
      {'params': loaded}, ids)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert tokenization.load_tokenizer(str(out / 'tokenizer.model')).encode('a "c2"') == \
      tok.encode('a "c2"')


def test_packaged_base_loads_and_copies(tok, rows):
  base = paths.packaged_base()
  mc, params = hf_io.load_hf_checkpoint(base, dtype='float32')
  assert mc.vocab_size == tok.vocab_size
  info = json.load(open(os.path.join(base, 'pretrain_info.json')))
  assert 'stand_in' in info
  probe_rows = pd.RowMaker(pd.build_corpus(
      episodes.load_pools(hotpotqa.DataConfig(hotpotqa_dir=paths.hotpotqa_dir()))[0],
      tok, info['pretrain']['probe_fraction'], info['pretrain']['seed']), small_config())
  probe = pt.copy_probe(mc.replace(dtype='bfloat16', attn_implementation='sdpa'),
                        params, probe_rows, n=32, seed=7)
  assert probe['span_copy_accuracy'] >= 0.8, probe  # packaged: 0.84 (64 rows)
  assert probe['id_copy_accuracy'] >= 0.25, probe  # packaged: 0.39 (64 rows)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match='task_weights must sum to 1'):
    small_config(task_weights=(0.5, 0.5, 0.5, 0.0, 0.0))
  with pytest.raises(ValueError, match='copy_seq_len'):
    small_config(copy_seq_len=40)
  # A shortened run names the steps it is checked against, not only the bad value.
  with pytest.raises(ValueError, match=r'copy_only_steps must be in \[0, steps\] = '
                                       r'\[0, 3\], got 5'):
    small_config(copy_only_steps=5)
  # From the config section, the message names the section once.
  section = common.get_config('pretrain').pretrain.to_dict()
  section.update(steps=10, copy_only_steps=1000)
  with pytest.raises(ValueError) as e:
    pd.PretrainConfig.from_section(section)
  assert str(e.value) == ('config.pretrain: copy_only_steps must be in [0, steps] = '
                          '[0, 10], got 1000'), str(e.value)
  with pytest.raises(ValueError, match='pretrain builds the CPU stand-in'):
    common.get_config('pretrain', 'paper')
  c = common.get_config('pretrain')
  c.pretrain.bogus = 1
  with pytest.raises(ValueError, match=r"config.pretrain: unknown field\(s\) \['bogus'\]"):
    run_setup.RunSetup.from_config(c)
  c = common.get_config('pretrain')
  c.model.hf_checkpoint = paths.packaged_base()
  with pytest.raises(ValueError, match='config.model.hf_checkpoint: pretraining starts '
                                       'from random weights'):
    run_setup.RunSetup.from_config(c)


@pytest.mark.slow
def test_cli_pretrain_writes_the_base_and_refuses_bad_flags(tmp_path):
  base = [sys.executable, 'experiments/run.py', '--config=pretrain.py',
          f'--workdir={tmp_path}']
  short = ['--config.pretrain.steps=2', '--config.pretrain.copy_only_steps=1',
           '--config.pretrain.batch_size=2',
           '--config.pretrain.probe_rows=2', '--config.pretrain.log_every=1']
  r = subprocess.run(base + short, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'copy probe on held-out construction-pool paragraphs' in r.stdout
  folder = tmp_path / 'pretrain' / 'base'
  assert (folder / 'model.safetensors').exists()
  assert len((tmp_path / 'pretrain' / 'metrics.jsonl').read_text().splitlines()) == 2
  # The same command again resumes the finished run: no step, the same probe, the base
  # written again.
  probe_line = r.stdout.strip().splitlines()[-1].split(';')[1]
  (folder / 'model.safetensors').unlink()
  again = subprocess.run(base + short, cwd=REPO, capture_output=True, text=True,
                         timeout=600)
  assert again.returncode == 0, again.stderr[-2000:]
  assert again.stdout.strip().splitlines()[-1].split(';')[1] == probe_line
  assert (folder / 'model.safetensors').exists()
  assert len((tmp_path / 'pretrain' / 'metrics.jsonl').read_text().splitlines()) == 2
  r = subprocess.run(base + ['--config.pretrain.learning_rate=-1'], cwd=REPO,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 2 and 'config.pretrain: ' in r.stderr and 'learning_rate' in r.stderr


# ------------------------------------------------------------------------- resume
# 7 steps, a row every 3, checkpoints every 2: a run stopped after step 5 resumes from
# step 4, inside the row window 4..6, and redoes step 5.
RESUME = dict(steps=7, copy_only_steps=2, log_every=3)


@pytest.fixture(scope='module')
def resume_runs(tmp_path_factory, tok, construction):
  """(uninterrupted directory, its params, resumed directory, its params)."""
  pool = construction[:60]
  run = small_run(save_every=2, **RESUME)
  whole = str(tmp_path_factory.mktemp('whole') / 'pretrain')
  params, final = pt.pretrain(run, pool, tok, whole)
  assert final['complete']
  resumed = str(tmp_path_factory.mktemp('resumed') / 'pretrain')
  _, stopped = pt.pretrain(run, pool, tok, resumed, stop=5)
  assert stopped['step'] == 5 and not stopped['complete']
  with checkpoints.PhaseCheckpointManager(resumed) as mgr:
    assert mgr.latest_step() == 4
  params_resumed, final_resumed = pt.pretrain(run, pool, tok, resumed)
  assert final_resumed['step'] == 7 and final_resumed['complete']
  assert final_resumed['probe'] == final['probe']
  return whole, params, resumed, params_resumed


@pytest.mark.slow
def test_resumed_pretraining_ends_with_the_uninterrupted_params(resume_runs):
  whole, params, resumed, params_resumed = resume_runs
  np.testing.assert_equal(jax.device_get(params_resumed), jax.device_get(params))
  # The rows too: the step-4 checkpoint holds the batch generator and the row window.
  assert metrics_rows(resumed) == metrics_rows(whole)
  assert [r['step'] for r in metrics_rows(whole)] == [3, 6, 7]
  with checkpoints.PhaseCheckpointManager(whole) as a, \
      checkpoints.PhaseCheckpointManager(resumed) as b:
    sa, sb = a.restore(), b.restore()
  assert sa.step == sb.step == 7 and sa.data_position == sb.data_position
  np.testing.assert_equal(jax.device_get(sb.opt_state), jax.device_get(sa.opt_state))


@pytest.mark.slow
def test_resume_with_other_settings_is_refused_naming_them(resume_runs, tok,
                                                           construction):
  whole = resume_runs[0]
  with pytest.raises(ValueError, match=r'holds a pretraining run with different '
                     r'settings \(learning_rate: 0.001 -> 0.002, seed: 0 -> 1\)'):
    pt.pretrain(small_run(save_every=2, learning_rate=2e-3, seed=1, **RESUME),
                construction[:60], tok, whole)
  # Cadences are not part of the trajectory: the finished run is taken as it is.
  relogged = small_run(save_every=2, **dict(RESUME, log_every=1))
  params, final = pt.pretrain(relogged, construction[:60], tok, whole)
  assert final['step'] == 7
  np.testing.assert_equal(jax.device_get(params), jax.device_get(resume_runs[1]))
  # Another construction pool: the same settings, another corpus.
  with pytest.raises(ValueError, match='was trained on a corpus of'):
    pt.pretrain(small_run(save_every=2, **RESUME), construction[:40], tok, whole)


def test_trajectory_fingerprint_leaves_out_the_cadences():
  base = pt.trajectory_fingerprint(small_run())
  assert pt.trajectory_fingerprint(small_run(log_every=5, probe_every=2, probe_rows=8,
                                             max_consecutive_skips=9)) == base
  assert base['task_weights'] == [0.25, 0.2, 0.25, 0.15, 0.15]  # JSON form, as stored
  assert base['model'] == 'tiny-sp4k' and base['learning_rate'] == 1e-3
  other = pt.trajectory_fingerprint(small_run(copy_only_steps=2))
  assert {k for k in base if base[k] != other[k]} == {'copy_only_steps'}


def test_train_step_reports_a_non_finite_step():
  mc = QwenConfig.preset('tiny-sp4k', dtype='float32')
  params = qwen.init_params(mc, jax.random.PRNGKey(0))
  tx = pt.pretrain_optimizer(small_config())
  step = pt.make_train_step(mc, tx)
  tokens = np.arange(24, dtype=np.int32).reshape(2, 12) + 300
  targets = np.ones((2, 12), np.float32)
  new, _, loss, _, finite = step(params, tx.init(params), tokens, targets)
  assert bool(finite) and np.isfinite(float(loss))
  assert not np.array_equal(np.asarray(new['embed_tokens']['embedding']),
                            np.asarray(params['embed_tokens']['embedding']))
  bad = jax.tree_util.tree_map(lambda x: x, params)
  bad['norm']['scale'] = bad['norm']['scale'].at[0].set(np.nan)
  *_, loss, _, finite = step(bad, tx.init(bad), tokens, targets)
  assert not bool(finite) and not np.isfinite(float(loss))
