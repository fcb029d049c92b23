"""Parity of vermem_jax's Qwen (loaded via hf_io) with transformers PyTorch, export back
to transformers, and the checkpoint error cases.

Reference: random tiny `Qwen2ForCausalLM` / `Qwen3ForCausalLM` (transformers 5.x),
float32, eval mode, written with `save_pretrained`.
"""
import copy
import json
import logging
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vermem_jax.models import hf_io  # noqa: E402
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.models import qwen_config

ATOL = 1e-4  # issue 2: max abs logit difference vs transformers float32
VOCAB = 512
SEQ = 13

# Each case: (transformers class name, config overrides, save_pretrained kwargs).
# Together they cover: Qwen2 q/k/v bias; Qwen3 q/k norm; rope_theta 1e4, 1e6, 5e6;
# head_dim != hidden/heads; GQA (4:2, 4:1) and MHA; tied and untied embeddings; a
# sharded checkpoint; a bfloat16 checkpoint; Llama (no biases, rope_theta 1e5 and
# rms_norm_eps 1e-5 like SmolLM2).
CASES = {
    "qwen2_bias_theta1e4_gqa_untied": (
        "Qwen2", dict(rope_theta=1e4, num_key_value_heads=2, tie_word_embeddings=False),
        {}),
    "qwen2_theta1e6_headdim24_tied": (
        "Qwen2", dict(rope_theta=1e6, head_dim=24, num_key_value_heads=1,
                      tie_word_embeddings=True), {}),
    "qwen3_qknorm_theta1e6_headdim24_gqa_tied": (
        "Qwen3", dict(rope_theta=1e6, head_dim=24, num_key_value_heads=1,
                      tie_word_embeddings=True), {}),
    "qwen3_theta5e6_mha_untied_sharded": (
        "Qwen3", dict(rope_theta=5e6, head_dim=16, num_key_value_heads=4,
                      tie_word_embeddings=False), dict(max_shard_size="60KB")),
    "llama_theta1e5_eps1e5_gqa_tied": (
        "Llama", dict(rope_theta=1e5, rms_norm_eps=1e-5, num_key_value_heads=2,
                      tie_word_embeddings=True), {}),
    "qwen3_theta5e6_gqa_tied_bf16": (
        "Qwen3", dict(rope_theta=5e6, head_dim=32, num_key_value_heads=2,
                      tie_word_embeddings=True), dict(bf16=True)),
}


def _hf_model(kind, overrides, seed=0):
  """Random tiny HF model in float32 with non-trivial norm scales and biases."""
  fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                rms_norm_eps=1e-6, initializer_range=0.08)
  fields.update(overrides)
  theta = fields.pop("rope_theta")
  fields["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
  cfg = getattr(transformers, f"{kind}Config")(**fields)
  torch.manual_seed(seed)
  model = getattr(transformers, f"{kind}ForCausalLM")(cfg).eval()
  with torch.no_grad():
    # Default init makes every norm scale 1 and every bias 0, which would hide a
    # mis-mapped norm or bias; perturb them.
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  return model


def _save(model, path, bf16=False, **kwargs):
  if not bf16:
    model.save_pretrained(path, **kwargs)
    return model
  copy.deepcopy(model).to(torch.bfloat16).save_pretrained(path, **kwargs)
  # The reference stays float32 with each weight rounded to the stored bf16 value. (Not
  # `.to(bfloat16).to(float32)`: that would also round the RoPE inv_freq buffer.)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(p.to(torch.bfloat16).to(torch.float32))
  return model


def _ids(batch=2, seed=0):
  return np.random.RandomState(seed).randint(0, VOCAB, (batch, SEQ)).astype(np.int32)


def _torch_logits(model, ids):
  with torch.no_grad():
    return model(torch.from_numpy(ids.astype(np.int64))).logits.float().numpy()


def _our_logits(config, params, ids):
  # Jitted: op by op, a forward compiles ~70 one-op programs.
  return np.asarray(jax.jit(qwen.Qwen(config).apply)({"params": params}, jnp.asarray(ids)))


def _assert_tree_matches_model(config, params):
  ref = jax.eval_shape(lambda: qwen.init_params(config, jax.random.PRNGKey(0)))
  assert jax.tree.structure(params) == jax.tree.structure(ref)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref)):
    assert a.shape == b.shape and a.dtype == b.dtype


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """case name -> (checkpoint folder, float32 torch reference model)."""
  out = {}
  for name, (kind, overrides, save_kwargs) in CASES.items():
    path = str(tmp_path_factory.mktemp(name))
    model = _save(_hf_model(kind, overrides), path, **save_kwargs)
    out[name] = (path, model)
  return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(saved, case):
  path, model = saved[case]
  kind, overrides, save_kwargs = CASES[case]
  config, params = hf_io.load_hf_checkpoint(path)
  assert config.qk_norm == (kind == "Qwen3")
  assert config.attention_bias == (kind == "Qwen2")
  assert config.rope_theta == overrides["rope_theta"]
  assert config.tie_word_embeddings == overrides["tie_word_embeddings"]
  if "head_dim" in overrides:
    assert config.head_dim == overrides["head_dim"]
  assert config.param_dtype == "float32"
  _assert_tree_matches_model(config, params)
  if save_kwargs.get("max_shard_size"):
    with open(os.path.join(path, hf_io.SAFETENSORS_INDEX)) as f:
      assert len(set(json.load(f)["weight_map"].values())) > 1
  ids = _ids()
  ref = _torch_logits(model, ids)
  ours = _our_logits(config, params, ids)
  assert ours.dtype == np.float32 and ours.shape == (2, SEQ, VOCAB)
  # bf16 case: our params are the exact bf16 values widened to f32 and torch runs the
  # same widened weights in f32, so only f32 arithmetic differs and ATOL still holds.
  np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)
  assert np.abs(ref).max() > 0.5  # logits are not trivially small


def test_left_padding_matches_transformers(saved):
  path, model = saved["qwen3_qknorm_theta1e6_headdim24_gqa_tied"]
  config, params = hf_io.load_hf_checkpoint(path)
  ids = _ids()
  mask = np.ones_like(ids)
  mask[0, :4] = 0
  pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    ref = model(torch.from_numpy(ids.astype(np.int64)),
                attention_mask=torch.from_numpy(mask.astype(np.int64)),
                position_ids=torch.from_numpy(pos.astype(np.int64))).logits.numpy()
  ours = np.asarray(jax.jit(qwen.Qwen(config).apply)(
      {"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], ref[real], atol=ATOL, rtol=0)


def test_dtype_cast_keeps_bf16_values(saved):
  path, model = saved["qwen3_theta5e6_gqa_tied_bf16"]
  config, params = hf_io.load_hf_checkpoint(path, dtype=jnp.bfloat16)
  assert config.param_dtype == "bfloat16"
  _assert_tree_matches_model(config, params)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  emb = model.model.embed_tokens.weight.detach().numpy()
  np.testing.assert_array_equal(
      np.asarray(params["embed_tokens"]["embedding"], np.float32), emb)
  q = model.model.layers[1].self_attn.q_proj.weight.detach().numpy()
  np.testing.assert_array_equal(
      np.asarray(params["layers_1"]["self_attn"]["q_proj"]["kernel"], np.float32), q.T)


@pytest.mark.parametrize("case,shard", [
    ("qwen2_bias_theta1e4_gqa_untied", None),
    ("qwen3_qknorm_theta1e6_headdim24_gqa_tied", "40KB"),
    ("llama_theta1e5_eps1e5_gqa_tied", None),
])
def test_export_loads_in_transformers(saved, tmp_path, case, shard):
  config, params = hf_io.load_hf_checkpoint(saved[case][0])
  out = tmp_path / "export"
  hf_io.save_hf_checkpoint(config, params, out, max_shard_size=shard)
  files = sorted(os.listdir(out))
  if shard:
    assert hf_io.SAFETENSORS_INDEX in files
    assert sum(f.endswith(".safetensors") for f in files) > 1
  else:
    assert files == ["config.json", "model.safetensors"]
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(out), dtype=torch.float32).eval()
  assert type(model).__name__ == CASES[case][0] + "ForCausalLM"
  ids = _ids(seed=1)
  np.testing.assert_allclose(_torch_logits(model, ids), _our_logits(config, params, ids),
                             atol=ATOL, rtol=0)
  # And back: identical config and parameters.
  config2, params2 = hf_io.load_hf_checkpoint(out)
  assert config2 == config
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_export_model_without_bias_and_bf16(tmp_path):
  # A Qwen2-layout model without q/k/v bias: transformers' Qwen2 always has biases,
  # so export writes zeros; stored as bfloat16.
  config = qwen_config.QwenConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8, attention_bias=False,
                           tie_word_embeddings=False, rope_theta=1e4)
  params = qwen.init_params(config, jax.random.PRNGKey(3))
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(
      jax.random.PRNGKey(4), x.shape, x.dtype), params)
  hf_io.save_hf_checkpoint(config, params, tmp_path, dtype="bfloat16")
  with open(tmp_path / "config.json") as f:
    cfg = json.load(f)
  assert cfg["torch_dtype"] == "bfloat16" and cfg["model_type"] == "qwen2"
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), dtype=torch.float32).eval()
  rounded = jax.tree.map(
      lambda x: jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), params)
  ids = _ids()
  np.testing.assert_allclose(_torch_logits(model, ids), _our_logits(config, rounded, ids),
                             atol=ATOL, rtol=0)
  assert not model.model.layers[0].self_attn.q_proj.bias.any()


def test_export_rejects_bad_params(tmp_path):
  config = qwen_config.QwenConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8)
  params = qwen.init_params(config, jax.random.PRNGKey(0))
  bad = jax.tree.map(lambda x: x, params)
  del bad["layers_0"]["mlp"]["up_proj"]
  bad["norm"]["scale"] = jnp.ones((33,))
  bad["extra"] = {"kernel": jnp.ones((2,))}
  with pytest.raises(ValueError) as err:
    hf_io.save_hf_checkpoint(config, bad, tmp_path)
  for name in ("layers_0/mlp/up_proj/kernel", "norm/scale", "extra/kernel"):
    assert name in str(err.value)
  assert not os.listdir(tmp_path)
  with pytest.raises(ValueError, match="max_shard_size"):
    hf_io.save_hf_checkpoint(config, params, tmp_path, max_shard_size="lots")


# ----------------------------------------------------------------------- bad checkpoints


def _copy_single(saved, case, dst):
  """A copy of a single-file checkpoint whose tensors the test may edit."""
  src = saved[case][0]
  os.makedirs(dst, exist_ok=True)
  with open(os.path.join(src, "config.json")) as f:
    config_text = f.read()
  with open(os.path.join(dst, "config.json"), "w") as f:
    f.write(config_text)
  return load_file(os.path.join(src, "model.safetensors"))


def _write(dst, tensors):
  save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def test_tied_checkpoint_with_redundant_lm_head(saved, tmp_path, caplog):
  case = "qwen2_theta1e6_headdim24_tied"
  tensors = _copy_single(saved, case, tmp_path)
  assert "lm_head.weight" not in tensors
  _write(tmp_path, {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]})
  config, params = hf_io.load_hf_checkpoint(tmp_path)
  assert "lm_head" not in params
  ids = _ids()
  np.testing.assert_allclose(_our_logits(config, params, ids),
                             _torch_logits(saved[case][1], ids), atol=ATOL, rtol=0)
  # A stale head: transformers ties it to the embedding anyway; so do we, with a warning.
  _write(tmp_path, {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"] + 1})
  with caplog.at_level(logging.WARNING):
    _, params2 = hf_io.load_hf_checkpoint(tmp_path)
  assert "lm_head.weight differs" in caplog.text
  np.testing.assert_array_equal(params2["embed_tokens"]["embedding"],
                                tensors["model.embed_tokens.weight"])
  _write(tmp_path, {**tensors, "lm_head.weight": np.zeros((VOCAB, 32), np.float32)})
  with pytest.raises(ValueError, match=r"lm_head\.weight \[512, 32\]"):
    hf_io.load_hf_checkpoint(tmp_path)


def test_float16_checkpoint(saved, tmp_path):
  case = "qwen2_bias_theta1e4_gqa_untied"
  tensors = _copy_single(saved, case, tmp_path)
  _write(tmp_path, {k: v.astype(np.float16) for k, v in tensors.items()})
  config, params = hf_io.load_hf_checkpoint(tmp_path)
  assert params["layers_0"]["mlp"]["down_proj"]["kernel"].dtype == jnp.float32
  ref = copy.deepcopy(saved[case][1])
  with torch.no_grad():
    for p in ref.parameters():
      p.copy_(p.to(torch.float16).to(torch.float32))
  ids = _ids()
  np.testing.assert_allclose(_our_logits(config, params, ids), _torch_logits(ref, ids),
                             atol=ATOL, rtol=0)


def test_missing_unknown_and_misshaped_tensors_named_together(saved, tmp_path):
  tensors = _copy_single(saved, "qwen2_bias_theta1e4_gqa_untied", tmp_path)
  del tensors["model.layers.1.mlp.up_proj.weight"]
  del tensors["model.layers.0.self_attn.k_proj.bias"]
  tensors["model.layers.0.self_attn.extra.weight"] = np.ones((4, 4), np.float32)
  tensors["model.norm.weight"] = np.ones((65,), np.float32)
  _write(tmp_path, tensors)
  with pytest.raises(ValueError) as err:
    hf_io.load_hf_checkpoint(tmp_path)
  msg = str(err.value)
  for name in ("model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.k_proj.bias",
               "model.layers.0.self_attn.extra.weight", "model.norm.weight [65]"):
    assert name in msg
  assert "missing" in msg and "unknown" in msg and "wrong shapes" in msg


@pytest.mark.parametrize("problem", ["missing", "unknown", "shape", "dtype"])
def test_each_tensor_problem_alone(saved, tmp_path, problem):
  tensors = _copy_single(saved, "qwen3_qknorm_theta1e6_headdim24_gqa_tied", tmp_path)
  name = "model.layers.1.self_attn.q_norm.weight"
  if problem == "missing":
    del tensors[name]
  elif problem == "unknown":
    tensors["model.layers.2.self_attn.q_norm.weight"] = tensors[name]
    name = "model.layers.2.self_attn.q_norm.weight"
  elif problem == "shape":
    tensors[name] = np.ones((16,), np.float32)
  else:
    tensors[name] = np.ones((24,), np.int32)
  _write(tmp_path, tensors)
  with pytest.raises(ValueError, match=name.replace(".", r"\.")):
    hf_io.load_hf_checkpoint(tmp_path)


def test_truncated_and_corrupt_files(saved, tmp_path):
  tensors = _copy_single(saved, "qwen2_bias_theta1e4_gqa_untied", tmp_path)
  _write(tmp_path, tensors)
  file = tmp_path / "model.safetensors"
  data = file.read_bytes()
  file.write_bytes(data[: len(data) - 100])
  with pytest.raises(ValueError, match=r"truncated.*model\.safetensors"):
    hf_io.load_hf_checkpoint(tmp_path)
  file.write_bytes(b"\x07" * 64)
  with pytest.raises(ValueError, match=r"model\.safetensors"):
    hf_io.load_hf_checkpoint(tmp_path)


def test_bad_sharded_checkpoints(saved, tmp_path):
  src = saved["qwen3_theta5e6_mha_untied_sharded"][0]
  for f in os.listdir(src):
    (tmp_path / f).write_bytes((open(os.path.join(src, f), "rb").read()))
  with open(tmp_path / hf_io.SAFETENSORS_INDEX) as f:
    index = json.load(f)
  shard = sorted(set(index["weight_map"].values()))[1]
  data = (tmp_path / shard).read_bytes()
  (tmp_path / shard).write_bytes(data[:-8])
  with pytest.raises(ValueError, match=shard.replace(".", r"\.")):
    hf_io.load_hf_checkpoint(tmp_path)
  os.remove(tmp_path / shard)
  with pytest.raises(ValueError, match="missing shard files.*" + shard.replace(".", r"\.")):
    hf_io.load_hf_checkpoint(tmp_path)
  (tmp_path / hf_io.SAFETENSORS_INDEX).write_text("{not json")
  with pytest.raises(ValueError, match="malformed safetensors index"):
    hf_io.load_hf_checkpoint(tmp_path)


def test_missing_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_io.load_hf_checkpoint(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps(hf_io.hf_config_dict(
      qwen_config.QwenConfig(vocab_size=VOCAB))))
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf_io.load_hf_checkpoint(tmp_path)


_MESH_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    from vermem_jax.models import hf_io, qwen, sharding
    path = sys.argv[1]
    mesh = sharding.make_mesh(data=1, fsdp=2, tensor=4)
    config, params = hf_io.load_hf_checkpoint(path, mesh=mesh)
    config1, params1 = hf_io.load_hf_checkpoint(path)
    want = sharding.param_shardings(config, mesh)
    for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
      assert x.sharding == s, (x.sharding, s)
    spec = params["layers_0"]["mlp"]["gate_proj"]["kernel"].sharding.spec
    assert spec == P("fsdp", "tensor"), spec
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 512, (2, 13)), jnp.int32)
    with sharding.use_sharding(mesh):
      out = jax.jit(qwen.Qwen(config).apply)({"params": params}, ids)
    ref = qwen.Qwen(config1).apply({"params": params1}, ids)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=0)
    print("OK")
""")


def test_load_onto_mesh(saved, tmp_path):
  # A fresh process: the 8 fake CPU devices must be set before jax initializes.
  path = saved["qwen2_bias_theta1e4_gqa_untied"][0]
  script = tmp_path / "mesh_check.py"
  script.write_text(_MESH_SCRIPT)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, str(script), path], capture_output=True,
                        text=True, env=env, timeout=300, check=False)
  assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
