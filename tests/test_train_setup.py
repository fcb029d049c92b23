"""Tests for vermem_jax.train.setup: config glue, and the trainers' steps on an 8-device
CPU mesh (data=2 x fsdp=2 x tensor=2) against a single device. The mesh part runs in a
subprocess because the device count is fixed before jax is imported."""
import hashlib
import os
import shutil
import textwrap

import jax
import ml_collections
import numpy as np
import pytest

import float_tolerance  # tests/ helper
import multidevice

from experiments.configs import common
from vermem_jax import paths
from vermem_jax.models import hf_io
from vermem_jax.models import qwen_config
from vermem_jax.train import rl_setup
from vermem_jax.train import run_setup
from vermem_jax.train import setup

_SCRIPT = textwrap.dedent("""
    import json, tempfile
    import jax, jax.numpy as jnp, numpy as np, optax
    from vermem_jax.models import qwen, sampling, sharding
    from vermem_jax.rl import batching
    from vermem_jax.train import checkpoints, optim, rl_learner, setup, sft_step

    assert jax.device_count() == 8, jax.devices()
    cfg = qwen.QwenConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, attention_bias=True,
                          qk_norm=True, tie_word_embeddings=False,
                          max_position_embeddings=512)
    params = qwen.init_params(cfg, jax.random.PRNGKey(0))
    params = jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), params)
    ref = jax.tree.map(lambda x: x + 0.01 * jnp.sign(x), params)
    rs = np.random.RandomState(0)
    decisions = []
    for i in range(8):
      p, c = int(rs.randint(5, 30)), int(rs.randint(1, 8))
      decisions.append(batching.DecisionTokens(
          tuple(rs.randint(1, 256, p).tolist()), tuple(rs.randint(1, 256, c).tolist()),
          tuple(rs.uniform(-6, -1, c).tolist()), float(rs.normal())))
    # 4 rows per micro-batch: split 4 ways over ('data', 'fsdp').
    bcfg = batching.BatchingConfig(micro_batch_size=4, length_buckets=(48,),
                                   command_buckets=(8,))
    mbs = batching.micro_batches(decisions, bcfg, pad_id=0)
    mesh = sharding.make_mesh(2, 2, 2)
    want = sharding.param_shardings(cfg, mesh)
    def max_diff(a, b):
      return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                 for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    def grad_rel_diff(s_a, s_b):
      # The first step's gradients (Adam's mu = (1 - b1) g): the largest gap in a leaf
      # over that leaf's largest entry, the quantity float_tolerance bounds.
      mus = [jax.tree.leaves(optax.tree_utils.tree_get(s, 'mu')) for s in (s_a, s_b)]
      return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))
                       / max(float(np.max(np.abs(np.asarray(x)))), 1e-30))
                 for x, y in zip(*mus))
    out = {'n_terms': sum(len(d.prompt_tokens) + len(d.command_tokens)
                          for d in decisions)}
    def same_shardings(tree, shardings):
      return all(x.sharding.is_equivalent_to(s, x.ndim)
                 for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))

    # (a) one SFT step
    opt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=4, warmup_ratio=0.0,
                                lr_schedule='linear', section='sft')
    p1, s1, m1 = sft_step.train_step(params, optim.init_optimizer(params, opt=opt),
                                     mbs, model_config=cfg, opt=opt)
    ps = sharding.shard_params(params, mesh)
    ss = setup.init_opt_state(optim.make_optimizer(opt).init, ps, mesh)
    mu = ss[1][0].mu
    out['opt_sharded'] = same_shardings(mu, want)
    out['opt_embed_shard'] = list(mu['embed_tokens']['embedding']
                                  .addressable_shards[0].data.shape)
    p2, s2, m2 = sft_step.train_step(ps, ss, mbs, model_config=cfg, opt=opt, mesh=mesh)
    out['sft'] = {'loss': [m1['loss'], m2['loss']], 'grad_rel_diff': grad_rel_diff(s1, s2),
                  'moved': max_diff(p1, params),
                  'params_sharded': same_shardings(p2, want),
                  'opt_sharded': same_shardings(s2[1][0].mu, want)}

    # (b) one GRPO learner update (KL to a different π_ref, learner θ_old)
    ropt = optim.OptimizerConfig(learning_rate=1e-3, total_steps=1, warmup_ratio=0.0,
                                 lr_schedule='constant')
    tx = optim.make_optimizer(ropt)
    lc = rl_learner.LearnerConfig(cfg, bcfg, ropt)
    q1, t1, n1 = rl_learner.learner_update(params, ref, tx.init(params), decisions, lc)
    refs = sharding.shard_params(ref, mesh)
    q2, t2, n2 = rl_learner.learner_update(ps, refs,
                                           setup.init_opt_state(tx.init, ps, mesh),
                                           decisions, lc, mesh=mesh)
    out['grpo'] = {k: [n1[k], n2[k]] for k in ('train/loss', 'train/kl',
                                               'train/grad_norm')}
    out['grpo'].update(grad_rel_diff=grad_rel_diff(t1, t2), moved=max_diff(q1, params),
                       params_sharded=same_shardings(q2, want))

    # (c) checkpoint of the sharded SFT state restores into the sharded template
    d = tempfile.mkdtemp()
    with checkpoints.PhaseCheckpointManager(d) as mgr:
      mgr.save(checkpoints.TrainState(step=1, params=p2, opt_state=s2,
                                      rng=jax.random.PRNGKey(3)))
    pa, oa = setup.abstract_train_state(cfg, optim.make_optimizer(opt).init, mesh)
    with checkpoints.PhaseCheckpointManager(d) as mgr:
      r = mgr.restore(checkpoints.TrainState(step=0, params=pa, opt_state=oa,
                                             rng=jax.random.PRNGKey(0)))
    out['ckpt'] = {'step': r.step, 'param_diff': max_diff(r.params, p2),
                   'opt_diff': max_diff(r.opt_state, s2),
                   'params_sharded': same_shardings(r.params, want),
                   'opt_sharded': same_shardings(r.opt_state[1][0].mu, want)}
    rp, _ = checkpoints.restore_params_only(d, pa)
    out['ckpt']['params_only_sharded'] = same_shardings(rp, want)

    # the trainers' sampler with FSDP/TP-sharded params under the mesh rules: greedy
    # tokens equal the single-device ones (4 rows split over data x fsdp, and 2 rows)
    prompts = [list(d.prompt_tokens) for d in decisions[:4]]
    def gen(fn, p, rows):
      return fn(cfg, p, rows, rng=0, max_new_tokens=6, temperature=0.0, top_p=1.0,
                stop_token_ids=())
    g1 = gen(sampling.generate, params, prompts)
    g2 = gen(setup.generate_fn_for(mesh), ps, prompts)
    h1 = gen(sampling.generate, params, prompts[:2])
    h2 = gen(setup.generate_fn_for(mesh), ps, prompts[:2])
    out['gen2_equal'] = bool(np.array_equal(h1.tokens, h2.tokens))
    out['gen_equal'] = bool(np.array_equal(g1.tokens, g2.tokens))
    out['gen_lp_diff'] = float(np.max(np.abs(np.asarray(g1.logprobs)
                                             - np.asarray(g2.logprobs))))
    print('RESULT', json.dumps(out))
""")


@pytest.fixture(scope='module')
def mesh_result():
  return multidevice.run_on_8_devices(_SCRIPT)


def _mesh_reassociation(mesh_result) -> float:
  """Relative tolerance of a sharded sum of the script's tokens (float_tolerance)."""
  return float_tolerance.reassociation_atol(mesh_result['n_terms'], 1.0)


@pytest.mark.slow  # the shared 8-device subprocess (mesh_result) takes ~85 s
def test_sft_step_on_mesh_matches_single_device(mesh_result):
  """The sharded step sums the same token losses in another order: loss and gradient
  agree to (summed tokens) x float32 eps (float_tolerance; Adam's step itself would
  magnify the rounding of near-zero gradient entries)."""
  r, rel = mesh_result['sft'], _mesh_reassociation(mesh_result)
  assert r['loss'][0] == pytest.approx(r['loss'][1], rel=rel)  # mean of positive CE
  assert r['moved'] > 1e-4  # the step really changed the params (Adam: ~lr 1e-3)
  assert r['grad_rel_diff'] <= rel
  assert r['params_sharded'] and r['opt_sharded']


@pytest.mark.slow  # the shared 8-device subprocess (mesh_result) takes ~85 s
def test_optimizer_state_is_sharded_like_the_params(mesh_result):
  assert mesh_result['opt_sharded']
  # embedding [256, 64] as ('tensor', 'fsdp') on 2 x 2: each device holds 128 x 32
  assert mesh_result['opt_embed_shard'] == [128, 32]


@pytest.mark.slow  # the shared 8-device subprocess (mesh_result) takes ~85 s
def test_grpo_update_on_mesh_matches_single_device(mesh_result):
  r, rel = mesh_result['grpo'], _mesh_reassociation(mesh_result)
  # loss: terms of size |A| <= ~3 (standard normal advantages); KL, grad norm: relative.
  assert r['train/loss'][0] == pytest.approx(r['train/loss'][1], abs=3 * rel)
  for key in ('train/kl', 'train/grad_norm'):
    assert r[key][0] == pytest.approx(r[key][1], rel=rel), key
  assert r['train/kl'][0] > 0
  assert r['moved'] > 1e-5
  assert r['grad_rel_diff'] <= rel
  assert r['params_sharded']


@pytest.mark.slow  # the shared 8-device subprocess (mesh_result) takes ~85 s
def test_sharded_checkpoint_restores_into_sharded_template(mesh_result):
  r = mesh_result['ckpt']
  assert r['step'] == 1
  assert r['param_diff'] == 0.0 and r['opt_diff'] == 0.0
  assert r['params_sharded'] and r['opt_sharded'] and r['params_only_sharded']


@pytest.mark.slow  # the shared 8-device subprocess (mesh_result) takes ~85 s
def test_sampler_with_sharded_params_matches_single_device(mesh_result):
  assert mesh_result['gen_equal'] and mesh_result['gen2_equal']
  assert mesh_result['gen_lp_diff'] <= 1e-5


def _config(**model):
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict(dict(
      preset='tiny', hf_checkpoint=None, dtype='float32', param_dtype='float32',
      remat=False, mesh_data=-1, mesh_fsdp=1, mesh_tensor=1))
  c.model.update(model)
  c.tokenizer = ml_collections.ConfigDict(dict(path=None))
  return c


def _mesh_shape(c, n):
  return setup.MeshConfig.from_section(c.model).shape(n)


def test_mesh_shape_from_config():
  assert _mesh_shape(_config(), 8) == (8, 1, 1)
  assert _mesh_shape(_config(mesh_fsdp=2, mesh_tensor=2), 8) == (2, 2, 2)
  assert _mesh_shape(_config(mesh_data=1, mesh_fsdp=8), 8) == (1, 8, 1)
  with pytest.raises(ValueError, match='mesh_fsdp'):
    _mesh_shape(_config(mesh_fsdp=3), 8)
  with pytest.raises(ValueError, match='must equal the 8 devices'):
    _mesh_shape(_config(mesh_data=2, mesh_fsdp=2), 8)
  with pytest.raises(ValueError, match='>= 1'):
    _mesh_shape(_config(mesh_tensor=0), 8)


def test_model_config_and_tokenizer_checks(qwen25_tokenizer_dir):
  c = _config()
  assert setup.model_config_from(c) == qwen_config.QwenConfig.preset('tiny', dtype='float32',
                                                              param_dtype='float32',
                                                              remat=False)
  with pytest.raises(ValueError, match='config.tokenizer.path'):
    setup.tokenizer_path(c)
  c.model.preset = 'no-such-model'
  with pytest.raises(ValueError, match='config.model.preset'):
    setup.model_config_from(c)
  c = _config()
  c.tokenizer.path = str(qwen25_tokenizer_dir)
  tok = setup.load_tokenizer_for(c, setup.model_config_from(c))
  assert tok.vocab_size <= 151936
  small = qwen_config.QwenConfig.preset('tiny').replace(vocab_size=1000)
  with pytest.raises(ValueError, match=r'config.tokenizer.path: .*1000'):
    setup.load_tokenizer_for(c, small)


def test_model_dimensions_from_the_command_line(tmp_path):
  """`--config.model.<dim>=...` overrides the preset's architecture (issue 9); head_dim
  follows hidden_size / heads unless given; a checkpoint keeps its own shapes."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  c = common.get_config('sft')
  c.model.hf_checkpoint = None  # dimensions shape a random init of the preset
  c.model.hidden_size, c.model.num_hidden_layers, c.model.intermediate_size = 128, 3, 384
  mc = setup.model_config_from(c)
  preset = qwen_config.QwenConfig.preset(common.get_config('sft').model.preset)
  assert (mc.hidden_size, mc.num_hidden_layers, mc.intermediate_size) == (128, 3, 384)
  assert mc.head_dim == 128 // preset.num_attention_heads
  assert mc.vocab_size == preset.vocab_size
  assert setup.model_identity(c).endswith(
      'hidden_size=128 intermediate_size=384 num_hidden_layers=3')
  c = common.get_config('sft')
  c.model.hf_checkpoint = None
  c.model.head_dim = 0
  with pytest.raises(ValueError, match='config.model.head_dim: must be a positive int'):
    setup.model_config_from(c)
  c = common.get_config('sft')
  c.model.hf_checkpoint = None
  c.model.num_attention_heads = 3   # 256 is not divisible by 3
  with pytest.raises(ValueError, match='config.model.num_attention_heads: .*divisible'):
    setup.model_config_from(c)
  c = common.get_config('sft')
  c.model.hf_checkpoint = str(tmp_path)
  c.model.hidden_size = 128
  with pytest.raises(ValueError, match='config.model.hidden_size: .*brings its own'):
    setup.model_config_from(c)
  # The real CLI: the flags reach the model config (a dry run validates it, so a shape
  # the model rejects is an error naming the flag's field).
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def cli(*args):
    return subprocess.run([sys.executable, os.path.join(repo, 'experiments', 'run.py'),
                           '--config=sft', *args, '--dry_run',
                           f'--workdir={tmp_path / "wd"}'],
                          capture_output=True, text=True, timeout=120)
  res = cli('--config.model.hidden_size=128', '--config.model.num_hidden_layers=3')
  assert res.returncode == 2 and '--config.model.hf_checkpoint=' in res.stderr
  res = cli('--config.model.hf_checkpoint=', '--config.model.hidden_size=128',
            '--config.model.num_hidden_layers=3')
  assert res.returncode == 0, res.stderr
  assert 'config.model.hidden_size = 128' in res.stdout
  assert 'config.model.num_hidden_layers = 3' in res.stdout
  res = cli('--config.model.hf_checkpoint=', '--config.model.num_attention_heads=3')
  assert res.returncode == 2
  assert 'error: config.model.num_attention_heads: ' in res.stderr


@pytest.mark.parametrize('on', [False, True])
def test_loaded_checkpoint_takes_execution_settings_from_the_config(on):
  c = common.get_config('sft')  # tiny: model.hf_checkpoint = the packaged base
  c.model.remat = c.model.scan_layers = on
  c.model.attn_implementation = 'eager' if on else 'blockwise'
  c.model.attn_block_q = c.model.attn_block_kv = 128 if on else 256
  mc = setup.model_config_from(c)
  assert (mc.remat, mc.scan_layers) == (on, on)
  mesh = setup.make_mesh(setup.MeshConfig.from_section(c.model))
  cfg, _ = setup.init_or_load_params(mc, jax.random.PRNGKey(0), mesh,
                                     hf_checkpoint=c.model.hf_checkpoint,
                                     param_dtype=mc.param_dtype)
  assert (cfg.remat, cfg.scan_layers) == (on, on)
  assert (cfg.attn_implementation, cfg.attn_block_q, cfg.attn_block_kv) == (
      ('eager', 128, 128) if on else ('blockwise', 256, 256))
  assert cfg == mc  # the checkpoint's architecture is the config's
  # The tiny default's own kernel reaches SFT (it was dropped here once).
  assert common.get_config('sft').model.attn_implementation == 'sdpa'


def test_opt_state_shardings_follow_param_paths():
  """Leaves at a parameter's dict path and shape take its sharding; the rest replicate."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from vermem_jax.models import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(data=jax.device_count())
  params = {'a': {'kernel': np.zeros((4, 2), np.float32)}, 'b': np.zeros(3, np.float32)}
  marks = {'a': {'kernel': 'K'}, 'b': 'B'}
  shapes = jax.eval_shape(optax.adam(1e-3).init, params)
  out = setup.opt_state_shardings(shapes, params, marks, mesh)
  assert out[0].mu == marks and out[0].nu == marks
  assert out[0].count == setup.replicated(mesh)


def test_rl_setup_preflights_the_http_verifier(monkeypatch):
  """An unreachable OpenAI-compatible verifier stops the phase before any rollout
  (scoring alone would turn every score into the fallback)."""
  monkeypatch.setenv('VERMEM_VERIFIER_API_KEY', 'test-key')
  c = common.get_config('phase_b')
  c.verifier.backend = 'openai_compatible'
  c.verifier.base_url = 'http://127.0.0.1:9/v1'  # discard port: connection refused
  c.verifier.timeout_s = 2.0
  with pytest.raises(ValueError, match=r'verifier endpoint check failed.*127\.0\.0\.1:9'):
    rl_setup.build_setup(run_setup.RunSetup.from_config(c))


def _hf_folder(path, weights: bytes, config: bytes = b'{"model_type": "qwen2"}'):
  os.makedirs(path)
  with open(os.path.join(path, 'config.json'), 'wb') as f:
    f.write(config)
  with open(os.path.join(path, 'model.safetensors'), 'wb') as f:
    f.write(weights)
  return str(path)


def test_checkpoint_digest_is_the_content_not_the_path(tmp_path, monkeypatch):
  """A copied folder keeps its digest; a changed weight or config changes it; above
  DIGEST_FULL_BYTES only the sampled chunks count (the documented limit)."""
  weights = np.random.default_rng(0).bytes(3 * 2**20)
  a = _hf_folder(tmp_path / 'a', weights)
  ref = hashlib.sha256(b'{"model_type": "qwen2"}' + f'model.safetensors:{len(weights)}'
                       .encode() + weights).hexdigest()[:16]
  assert hf_io.checkpoint_digest(a) == 'sha256:' + ref
  assert hf_io.checkpoint_digest(_hf_folder(tmp_path / 'elsewhere', weights)) == (
      'sha256:' + ref)
  flipped = bytearray(weights)
  flipped[2**20 + 7] ^= 1
  assert hf_io.checkpoint_digest(_hf_folder(tmp_path / 'b', bytes(flipped))) != (
      'sha256:' + ref)
  assert hf_io.checkpoint_digest(
      _hf_folder(tmp_path / 'c', weights, b'{"model_type": "qwen3"}')) != 'sha256:' + ref
  # Sampled: 16 chunks of 1 MiB over 32 MiB start every 31/15 MiB (~2.07), so the first
  # and last bytes are read and byte 1.5 MiB, between the first two chunks, is not.
  monkeypatch.setattr(hf_io, 'DIGEST_FULL_BYTES', 0)
  big = np.random.default_rng(1).bytes(32 * 2**20)
  base = hf_io.checkpoint_digest(_hf_folder(tmp_path / 'big', big))
  for k, (offset, changes) in enumerate([(0, True), (len(big) - 1, True),
                                         (2**20 + 2**19, False)]):
    b = bytearray(big)
    b[offset] ^= 1
    got = hf_io.checkpoint_digest(_hf_folder(tmp_path / f'big{k}', bytes(b)))
    assert (got != base) == changes, offset
  with pytest.raises(FileNotFoundError, match='no model.safetensors'):
    hf_io.checkpoint_digest(tmp_path)


def test_model_identity_resumes_a_moved_base_and_older_path_runs(tmp_path):
  """The fingerprint's model is the base's digest: a run resumes after the base (or
  the clone holding it) moved; a run stored with the old path form resumes from that
  path and is refused, naming both forms, from another."""
  moved = tmp_path / 'moved_base'
  shutil.copytree(paths.packaged_base(), moved)
  c = common.get_config('sft')
  at_home = setup.model_identity(c)
  assert at_home.startswith('hf-checkpoint sha256:')
  c.model.hf_checkpoint = str(moved)
  assert setup.model_identity(c) == at_home
  stored = {'fingerprint': {'model': at_home, 'seed': 42}}
  setup.check_resume(stored, {'model': setup.model_identity(c), 'seed': 42}, '/ckpt')
  older = {'fingerprint': {'model': str(paths.packaged_base()), 'seed': 42}}
  now = {'model': at_home, 'seed': 42}
  setup.check_resume(older, now, '/ckpt',
                     older_forms=setup.older_identity_forms(paths.packaged_base()))
  with pytest.raises(ValueError, match=r"model: '.*tiny_base' -> 'hf-checkpoint sha256:"):
    setup.check_resume(older, now, '/ckpt',
                       older_forms=setup.older_identity_forms(str(moved)))
  assert setup.older_identity_forms('') == {}
  c.model.hf_checkpoint = str(tmp_path / 'missing')
  with pytest.raises(ValueError, match='config.model.hf_checkpoint'):
    setup.model_identity(c)
