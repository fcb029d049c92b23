"""How a document enters the environment (SPEC §7 decision; issue 23).

One rule for the phase generators (`envs.scenarios`) and the evaluation
(`eval.episodes`): a document of at most `ExecutorConfig.chunk_tokens` tokens
(`memory.config.document_chunk_tokens`: `max_doc_tokens`, at most a quarter of C's
budget) is one observation; a longer one is revealed in consecutive sentence chunks,
each its own observation and H event, titled like the document ("Title: s_i s_j").
T_e (memory.interaction) keeps chunk_tokens of C free, so any chunk held only in H
can be restored. Training documents were capped at the budget share before, while
validation passages (25-747 tokens of the tiny tokenizer, median 153) went in whole
against a 320-token budget: a state the policy never saw in training.
"""

from __future__ import annotations

from typing import Callable, Sequence


def sentence_chunks(title: str, sentences: Sequence[str], cap: int,
                    count_tokens: Callable[[str], int]) -> list[tuple[int, ...]]:
  """Groups a document's sentences into the chunks it is revealed in.

  Args:
    title: the document's display title (each chunk's text starts "title: ").
    sentences: its sentences, in order (stripped, non-empty).
    cap: the most tokens of one chunk's text (`ExecutorConfig.chunk_tokens`).
    count_tokens: `str -> int` backbone counter (tokens).

  Returns:
    Sentence-index tuples, in order, covering every sentence once: [all of them]
    when the whole text fits `cap`, else greedy runs of consecutive sentences whose
    `chunk_text` fits `cap`; a sentence that alone exceeds `cap` is a chunk of its
    own (it can only be kept in H).

  Raises:
    ValueError: cap < 1.
  """
  if cap < 1:
    raise ValueError(f'chunk cap must be >= 1 token, got {cap}')
  n = len(sentences)
  if not n or count_tokens(chunk_text(title, sentences)) <= cap:
    return [tuple(range(n))] if n else []
  chunks, current = [], []
  for i in range(n):
    trial = current + [i]
    if current and count_tokens(
        chunk_text(title, [sentences[j] for j in trial])) > cap:
      chunks.append(tuple(current))
      current = [i]
    else:
      current = trial
  chunks.append(tuple(current))
  return chunks


def chunk_text(title: str, sentences: Sequence[str]) -> str:
  """The observation text of a chunk: 'Title: sentence sentence ...'."""
  return f'{title}: ' + ' '.join(sentences)
