"""Tokenizers for the policy backbone: Hugging Face folders and SentencePiece models.

`load_tokenizer(path)` returns a `Tokenizer` with one interface for both kinds:
- a Hugging Face tokenizer folder (`vocab.json` + `merges.txt` + `tokenizer_config.json`,
  optionally `tokenizer.json`), loaded offline through `transformers.AutoTokenizer`
  (`local_files_only=True`). The Qwen2.5 and Qwen3 folders share one byte-level BPE
  vocabulary (151,643 regular ids) plus their added special tokens.
- a SentencePiece `.model` file (the small "runs anywhere" default of DESIGN.md). It has
  no Jinja chat template, so `apply_chat_template` renders the ChatML-like layout
  documented on `SentencePieceTokenizer.apply_chat_template`.

`encode` never adds special tokens (Qwen has no BOS); special-token strings that occur in
the text (`<|im_start|>`, ...) are recognised as single tokens, so a rendered chat
prompt encodes to the same ids as the model saw in training.
`count_tokens` is the callable the memory package receives (`count_tokens(str) -> int`);
it memoises through a bounded LRU cache because budget checks re-count the same items.
"""

import abc
import functools
import json
import os
from typing import Any, Iterable, Mapping, Sequence

from vermem_jax.memory import token_count

# Special tokens that end a completion in the Qwen chat format (HF tokenizer_config of
# Qwen2.5/Qwen3: `<|im_end|>` is eos of the instruct models, `<|endoftext|>` of the base).
STOP_TOKEN_STRINGS = ("<|im_end|>", "<|endoftext|>")
# ChatML markers: special tokens of the Qwen vocabulary, and what `skip_special_tokens`
# drops from a SentencePiece decode (where they are ordinary user-defined pieces).
CHAT_MARKERS = ("<|im_start|>",) + STOP_TOKEN_STRINGS
# Entries kept by the `count_tokens` memo; bounded so long runs do not grow memory.
COUNT_CACHE_SIZE = 8192
# Texts longer than this (characters) are counted without entering the memo, so the memo
# holds at most COUNT_CACHE_SIZE * COUNT_CACHE_MAX_CHARS characters (~64 MB).
COUNT_CACHE_MAX_CHARS = 8192


class Tokenizer(abc.ABC):
  """Common interface of the project's tokenizers.

  Attributes:
    eos_token_id: int, id that ends a sequence (Qwen instruct: `<|im_end|>` = 151645).
    pad_token_id: int, id used for padding (Qwen: `<|endoftext|>` = 151643); falls
      back to `eos_token_id` when the tokenizer defines no pad token.
    stop_token_ids: tuple[int, ...], sorted unique ids that end a generated command:
      eos plus `<|im_end|>`/`<|endoftext|>` where the vocabulary has them (and, for HF
      folders, the `eos_token_id` list of `generation_config.json`).
    vocab_size: int, number of ids the tokenizer can emit (HF: `len(tokenizer)`,
      including added tokens; 151,665 for Qwen2.5). The model's embedding table may
      be larger (151,936 rows for Qwen).
  """

  eos_token_id: int
  pad_token_id: int
  stop_token_ids: tuple[int, ...]
  vocab_size: int

  def __init__(self):
    self._count_cached = functools.lru_cache(maxsize=COUNT_CACHE_SIZE)(self._count)

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Token ids of `text` (no BOS/EOS added). Returns list[int] of length T."""

  @abc.abstractmethod
  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` of each text (batched in the backend where it can be)."""

  @abc.abstractmethod
  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    """Text of token ids `ids` ([T] ints)."""

  @abc.abstractmethod
  def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                          add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """Renders `messages` ([{'role': ..., 'content': ...}, ...]) as one prompt string."""

  def _count(self, text: str) -> int:
    return len(self.encode(text))

  def count_tokens(self, text: str) -> int:
    """Number of tokens of `text` under `encode` (no special tokens added).

    Raises:
      TypeError: if `text` is not a str.
    """
    if not isinstance(text, str):
      raise TypeError(f"count_tokens expects str, got {type(text).__name__}")
    if len(text) > COUNT_CACHE_MAX_CHARS:
      return self._count(text)
    return self._count_cached(text)

  def __call__(self, text: str) -> int:
    """Alias of `count_tokens`, so the tokenizer itself is a `count_tokens` callable."""
    return self.count_tokens(text)

  def _stop_ids(self, extra: Iterable[int] = ()) -> tuple[int, ...]:
    ids = {self.eos_token_id, *extra}
    for s in STOP_TOKEN_STRINGS:
      i = self.token_to_id(s)
      if i is not None:
        ids.add(i)
    return tuple(sorted(i for i in ids if i is not None and i >= 0))

  @abc.abstractmethod
  def token_to_id(self, token: str) -> int | None:
    """Id of a single vocabulary entry / special token, or None if absent."""


def _validate_messages(messages: Sequence[Mapping[str, str]]) -> None:
  if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
    raise ValueError("messages must be a list of {'role', 'content'} dicts")
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
      raise ValueError(f"message {i} must be a mapping with 'role' and 'content': {m!r}")


def render_chatml(messages: Sequence[Mapping[str, str]],
                  add_generation_prompt: bool = True) -> str:
  """ChatML-like fallback layout (same as Qwen2.5's template without a default system).

  Each message becomes `<|im_start|>{role}\\n{content}<|im_end|>\\n`; with
  `add_generation_prompt` the string ends in `<|im_start|>assistant\\n`. No system
  message is inserted.
  """
  _validate_messages(messages)
  parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
  if add_generation_prompt:
    parts.append("<|im_start|>assistant\n")
  return "".join(parts)


class HFTokenizer(Tokenizer):
  """A Hugging Face tokenizer folder (fast tokenizer built by `transformers`).

  `encode`/`count_tokens`/`encode_batch` go straight to the Rust `tokenizers` backend.
  Source: transformers `AutoTokenizer.from_pretrained(path, local_files_only=True)`.
  """

  def __init__(self, path: str):
    super().__init__()
    # transformers is heavy to import; only HF folders pay for it. It serves tokenizers
    # only here, so its import-time advice that PyTorch is missing (models unavailable)
    # does not apply; a user's own TRANSFORMERS_NO_ADVISORY_WARNINGS setting wins.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import transformers  # pylint: disable=g-import-not-at-top

    try:
      self.hf = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
      raise ValueError(f"cannot load a Hugging Face tokenizer from {path!r}: {e}") from e
    self.path = path
    self._backend = getattr(self.hf, "backend_tokenizer", None)
    # g(s) (memory.serialization) sums per-line counts instead of recounting the whole
    # render when the counter is proven to split after newlines; see memory.token_count.
    self.splits_after_newline = (
        self._backend is not None and token_count.tokenizer_json_splits_after_newline(
            json.loads(self._backend.to_str())))
    self.vocab_size = len(self.hf)
    eos = self.hf.eos_token_id
    if eos is None:
      raise ValueError(f"tokenizer at {path!r} defines no eos_token")
    self.eos_token_id = int(eos)
    pad = self.hf.pad_token_id
    self.pad_token_id = int(pad) if pad is not None else self.eos_token_id
    self.stop_token_ids = self._stop_ids(self._generation_eos_ids(path))

  def _generation_eos_ids(self, path: str) -> list[int]:
    gen = os.path.join(path, "generation_config.json")
    if not os.path.isfile(gen):
      return []
    try:
      with open(gen) as f:
        eos = json.load(f).get("eos_token_id")
    except (OSError, ValueError) as e:
      raise ValueError(f"malformed {gen}: {e}") from e
    if eos is None:
      return []
    ids = eos if isinstance(eos, list) else [eos]
    # Only ids the tokenizer can actually emit are meaningful stop ids.
    return [int(i) for i in ids if 0 <= int(i) < self.vocab_size]

  def encode(self, text: str) -> list[int]:
    if self._backend is not None:
      return self._backend.encode(text, add_special_tokens=False).ids
    return self.hf.encode(text, add_special_tokens=False)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    texts = list(texts)
    if self._backend is not None:
      return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]
    return [self.hf.encode(t, add_special_tokens=False) for t in texts]

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                          add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """Renders with the folder's Jinja chat template (HF `apply_chat_template`).

    Extra kwargs reach the template (Qwen3: `enable_thinking=False`). Folders without
    a template use `render_chatml`.
    """
    _validate_messages(messages)
    if not getattr(self.hf, "chat_template", None):
      return render_chatml(messages, add_generation_prompt)
    return self.hf.apply_chat_template(
        [dict(m) for m in messages], tokenize=False,
        add_generation_prompt=add_generation_prompt, **kwargs)

  def token_to_id(self, token: str) -> int | None:
    if self._backend is not None:
      i = self._backend.token_to_id(token)
      return None if i is None else int(i)
    i = self.hf.convert_tokens_to_ids(token)
    return None if i is None or i == self.hf.unk_token_id else int(i)


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece `.model` file (google/sentencepiece `SentencePieceProcessor`).

  Special ids: `eos_token_id` is the model's eos id (`</s>`), or `<|im_end|>` if the
  model was trained without eos; `pad_token_id` is the pad id if trained with one,
  else eos. Train with `user_defined_symbols=['<|im_start|>', '<|im_end|>']` so the
  ChatML fallback markers are single tokens (`vermem_jax.tokenizer_build` does, and
  adds `<|endoftext|>`, `∅` and the newline).

  `splits_after_newline` (memory.token_count) is declared when
  `sentencepiece_splits_after_newline` proves it from the model file. SentencePiece
  maps spaces to U+2581 and back, so a text that itself contains U+2581 does not
  round-trip through encode/decode (it decodes as a space).
  """

  def __init__(self, path: str):
    super().__init__()
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    self.path = path
    self.sp = spm.SentencePieceProcessor()
    try:
      self.sp.Load(path)
    except (OSError, RuntimeError) as e:
      raise ValueError(f"cannot load SentencePiece model {path!r}: {e}") from e
    self.splits_after_newline = sentencepiece_splits_after_newline(
        self.sp.serialized_model_proto())
    self._marker_ids = frozenset(i for i in map(self.token_to_id, CHAT_MARKERS)
                                 if i is not None)
    self.vocab_size = int(self.sp.GetPieceSize())
    eos = int(self.sp.eos_id())
    if eos < 0:
      eos = self.token_to_id("<|im_end|>")
    if eos is None or eos < 0:
      raise ValueError(f"SentencePiece model {path!r} has neither eos nor <|im_end|>")
    self.eos_token_id = eos
    pad = int(self.sp.pad_id())
    self.pad_token_id = pad if pad >= 0 else self.eos_token_id
    self.stop_token_ids = self._stop_ids()

  def encode(self, text: str) -> list[int]:
    return list(self.sp.EncodeAsIds(text))

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [list(x) for x in self.sp.Encode(list(texts), out_type=int)]

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    ids = [int(i) for i in ids]
    if skip_special_tokens:
      ids = [i for i in ids if not (self.sp.IsControl(i) or self.sp.IsUnknown(i))
             and i not in self.stop_token_ids and i not in self._marker_ids]
    return self.sp.DecodeIds(ids)

  def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                          add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """ChatML-like fallback (`render_chatml`); extra kwargs are accepted and ignored."""
    del kwargs  # No Jinja template: options such as enable_thinking do not apply.
    return render_chatml(messages, add_generation_prompt)

  def token_to_id(self, token: str) -> int | None:
    i = int(self.sp.PieceToId(token))
    if i == self.sp.unk_id() and token != self.sp.IdToPiece(i):
      return None
    return i


def sentencepiece_splits_after_newline(model_proto: bytes) -> bool:
  """Whether a SentencePiece model meets the premises of `splits_after_newline`.

  True only for a BPE model with identity normalization (no rule table), no dummy
  prefix, no whitespace clean-up, and the newline as a USER_DEFINED piece. Then
  `count(a + "\\n" + b) == count(a) + 1 + count(b)` for all strings a, b: the input is
  not rewritten (identity, nothing added or removed), a user-defined symbol is matched
  as one frozen symbol before BPE, and BPE never merges a pair containing a frozen
  symbol; every merge is local to a pair, so the greedy merges on the two sides of the
  newline are those of a and b encoded alone. Hence `count(a + "\\n") + count(b)` is
  the same sum (tests/test_tokenization.py checks it on random strings).

  Args:
    model_proto: the serialized `ModelProto` (`SentencePieceProcessor.
      serialized_model_proto()`).
  Returns:
    bool; False for anything else, including a proto that does not parse.
  """
  try:
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(model_proto)
  except Exception:  # pylint: disable=broad-except
    return False
  norm = m.normalizer_spec
  if (m.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.BPE
      or norm.name != "identity" or norm.normalization_rule_tsv
      or norm.precompiled_charsmap or norm.add_dummy_prefix
      or norm.remove_extra_whitespaces):
    return False
  user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
  return any(p.piece == "\n" and p.type == user_defined for p in m.pieces)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """Loads a tokenizer offline.

  Args:
    path: a Hugging Face tokenizer folder (e.g. `paths.tokenizer_dir('qwen2.5')`) or a
      SentencePiece `.model` file.

  Returns:
    `HFTokenizer` or `SentencePieceTokenizer`.

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError: if the folder/file is not a loadable tokenizer.
  """
  path = check_tokenizer_path(path)
  if os.path.isfile(path):
    return SentencePieceTokenizer(path)
  return HFTokenizer(path)


# Files of a Hugging Face tokenizer folder; one of them must be present (transformers
# builds a fast tokenizer from tokenizer.json, or from vocab.json + merges.txt).
HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json",
                      "tokenizer.model")


def check_tokenizer_path(path: str | os.PathLike) -> str:
  """Cheap check (no transformers import) that `path` can be a tokenizer; returns it.

  Used by `load_tokenizer` and by config validation before a run starts.

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: a file that is not a SentencePiece `.model`, or a folder with none of
      HF_TOKENIZER_FILES (e.g. a model folder saved without its tokenizer).
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"tokenizer path {path!r} does not exist")
  if os.path.isfile(path):
    if not path.endswith(".model"):
      raise ValueError(f"tokenizer file {path!r} is not a SentencePiece .model file; "
                       "pass a Hugging Face tokenizer folder or a .model file")
    return path
  if not any(os.path.isfile(os.path.join(path, n)) for n in HF_TOKENIZER_FILES):
    raise ValueError(f"tokenizer folder {path!r} holds none of {HF_TOKENIZER_FILES}; "
                     "point it at a Hugging Face tokenizer folder (e.g. the Qwen "
                     "checkpoint folder with tokenizer.json) or a SentencePiece .model")
  return path


def check_tokenizer_model_compat(tokenizer: Tokenizer, model_config: Any) -> None:
  """Raises if the tokenizer can emit ids the model has no embedding row for.

  Qwen checkpoints pad the embedding table (151,936 rows) beyond the tokenizer's
  151,665 ids, so `tokenizer.vocab_size <= model_config.vocab_size` is the condition
  (an id >= vocab_size would index past the embedding table: JAX clamps out-of-range
  gathers silently, so without this check training runs on garbage rows). Trainers
  call it once, before the first step. The special ids (eos, pad, stop ids) are
  checked too, since generation and padding use them directly.

  Args:
    tokenizer: a `Tokenizer` (needs `vocab_size`, `eos_token_id`, `pad_token_id`,
      `stop_token_ids`).
    model_config: a `models.QwenConfig` (needs `vocab_size`).
  Raises:
    ValueError: naming both sizes and the offending ids, e.g. a Qwen3 tokenizer with a
      tiny custom model, or a SentencePiece model with a Qwen checkpoint.
  """
  model_vocab = int(model_config.vocab_size)
  tok_vocab = int(tokenizer.vocab_size)
  special = {"eos_token_id": tokenizer.eos_token_id,
             "pad_token_id": tokenizer.pad_token_id}
  for i in getattr(tokenizer, "stop_token_ids", ()):
    special[f"stop_token_ids[{i}]"] = i
  bad_special = {k: v for k, v in special.items()
                 if v is not None and not 0 <= int(v) < model_vocab}
  if tok_vocab > model_vocab or bad_special:
    where = getattr(tokenizer, "path", type(tokenizer).__name__)
    raise ValueError(
        f"tokenizer {where!r} does not fit the model: it has {tok_vocab} ids but the "
        f"model's vocab_size (embedding rows) is {model_vocab}"
        + (f"; special ids out of range: {bad_special}" if bad_special else "")
        + ". Use the tokenizer that belongs to the checkpoint (config.tokenizer.path) "
        "or a model config with vocab_size >= the tokenizer's size")


__all__ = [
    "Tokenizer", "HFTokenizer", "SentencePieceTokenizer", "load_tokenizer",
    "check_tokenizer_path", "check_tokenizer_model_compat",
    "render_chatml", "STOP_TOKEN_STRINGS", "CHAT_MARKERS",
    "sentencepiece_splits_after_newline",
]
