"""experiments/export.py: a phase's selected checkpoint as a Hugging Face folder that
transformers (PyTorch) loads with our logits, and that the evaluation runs as hf:DIR."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import jinja2
import numpy as np
import pytest

from experiments.configs import common
from vermem_jax.eval import evaluate
from vermem_jax.models import qwen
from vermem_jax.train import checkpoints
from vermem_jax.train import export
from vermem_jax.train import setup as setup_lib

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def exported(random_sft_workdir, tmp_path_factory):
  out = str(tmp_path_factory.mktemp('export') / 'sft')
  config = common.get_config('sft')
  meta = export.export(config, random_sft_workdir, 'sft', out)
  return config, out, meta


def test_transformers_logits_equal_ours(exported, random_sft_workdir):
  config, out, meta = exported
  assert meta['step'] == 3 and meta['phase'] == 'sft'
  for name in ('config.json', 'model.safetensors', 'tokenizer.model',
               'tokenizer_config.json', 'vermem_export.json'):
    assert os.path.getsize(os.path.join(out, name)) > 0
  # Our forward pass at float32 on the restored checkpoint (the reference).
  mc = setup_lib.model_config_from(config).replace(dtype='float32')
  shapes, _ = setup_lib.abstract_train_state(mc, lambda p: (),
                                            setup_lib.make_mesh(
                                                setup_lib.MeshConfig.from_section(config.model)))
  params, _ = checkpoints.restore_params_only(
      checkpoints.phase_dir(random_sft_workdir, 'sft'), shapes, prefer_best=True)
  ids = np.random.default_rng(0).integers(0, mc.vocab_size, (2, 24))
  ours = np.asarray(jax.jit(qwen.Qwen(mc).apply)({'params': params}, jnp.asarray(ids)))
  model = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
  assert np.abs(ours).max() > 0.1
  np.testing.assert_allclose(theirs, ours, atol=2e-4, rtol=2e-4)


def test_tokenizer_and_chat_template_render_the_policy_prompt(exported):
  from vermem_jax import tokenization
  from vermem_jax.rl import policy as policy_lib
  config, out, _ = exported
  tok = setup_lib.load_tokenizer_for(config)
  assert isinstance(tok, tokenization.SentencePieceTokenizer)
  x = 'STATE BEGIN\nTASK\nquestion: "Who?"\nSTATE END\nCommand:'
  prompt = policy_lib.policy_prompt_text(tok, x)
  # The exported SentencePiece model gives the run's ids; its Jinja template (what a
  # server renders) gives the run's prompt text.
  copy = tokenization.load_tokenizer(os.path.join(out, 'tokenizer.model'))
  assert copy.encode(prompt) == tok.encode(prompt)
  template = json.load(open(os.path.join(out, 'tokenizer_config.json')))['chat_template']
  rendered = jinja2.Template(template).render(
      messages=[{'role': 'user', 'content': x}], add_generation_prompt=True)
  assert rendered == prompt


def test_evaluation_accepts_the_export_as_hf(exported, tmp_path):
  config, out, _ = exported
  c = common.get_config('eval_hotpotqa')
  c.sampling.max_command_tokens = 16
  c.eval.num_questions = 1
  c.eval.seeds = (42,)
  c.eval.policies = f'exported=hf:{out}'
  c.eval.output_dir = str(tmp_path / 'eval')
  res = evaluate.run_evaluation(c, str(tmp_path))
  data = json.load(open(res['paths']['json']))
  assert data['meta']['policies']['exported'][0]['path'] == out
  assert '| exported |' in res['table']


def test_cli_refuses_a_missing_phase(tmp_path):
  out = subprocess.run(
      [sys.executable, 'experiments/export.py', f'--workdir={tmp_path}',
       '--phase=phase_c', f'--out={tmp_path}/x'], cwd=REPO, capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=REPO))
  assert out.returncode == 2 and 'phase_c' in out.stderr


@pytest.mark.parametrize('args, error', [
    (['--phase=phase_d'], 'error: --phase=phase_d: expected one of sft, phase_a, '
     'phase_b, phase_c'),
    (['--phase', 'phase_d'], 'error: --phase=phase_d: expected one of sft, phase_a, '
     'phase_b, phase_c'),
    (['--config=nosuch.py'], "error: --config=nosuch.py: no such file, and 'nosuch.py' "
     'is not in'),
    (['--out={tmp}/afile'], "error: --out='{tmp}/afile' is a file; pass a new or empty "
     'folder'),
])
def test_cli_bad_input_is_one_error_line_with_status_2(args, error, tmp_path):
  (tmp_path / 'afile').write_text('kept')
  out = subprocess.run(
      [sys.executable, 'experiments/export.py', f'--workdir={tmp_path}',
       f'--out={tmp_path}/x', *[a.format(tmp=tmp_path) for a in args]], cwd=REPO,
      capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'))
  assert out.returncode == 2
  lines = [l for l in out.stderr.strip().splitlines() if l.startswith('error')]
  assert len(lines) == 1 and lines[0].startswith(error.format(tmp=tmp_path)), out.stderr
  assert 'Traceback' not in out.stderr
  assert os.listdir(tmp_path) == ['afile'] and (tmp_path / 'afile').read_text() == 'kept'
