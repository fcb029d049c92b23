"""Tests for vermem_jax.envs.answer_metrics against hand-computed official behaviour."""

import pytest

from vermem_jax.envs import answer_metrics as hm
from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_sources


@pytest.mark.parametrize("text, expected", [
    ("The  Quick, Brown fox!", "quick brown fox"),
    ("An apple a day", "apple day"),
    ("theater ANTHEM", "theater anthem"),  # articles only as whole words
    ("U.S.A.", "usa"),
    ("  \t\n", ""),
    ("the", ""),
    ("Jean-Luc's  car", "jeanlucs car"),  # punctuation removed, not split
    ("a-b", "ab"),
])
def test_normalize_answer(text, expected):
  assert hm.normalize_answer(text) == expected


def test_exact_match():
  assert hm.exact_match("Barack Obama", "barack obama.") == 1.0
  assert hm.exact_match("The Beatles", "Beatles") == 1.0
  assert hm.exact_match("Beatles band", "Beatles") == 0.0
  assert hm.exact_match("", "the") == 1.0  # both normalize to ""


def test_f1_hand_cases():
  # pred tokens {cat, sat}; gold {cat, sat, on, mat}: P = 1, R = 1/2, F1 = 2/3.
  assert hm.f1_score("the cat sat", "cat sat on the mat") == pytest.approx(2 / 3)
  f1, p, r = hm.f1_precision_recall("the cat sat", "cat sat on the mat")
  assert (p, r) == (1.0, 0.5)
  # Multiset overlap: x x y vs x y y -> common {x:1, y:1}: P = R = 2/3.
  assert hm.f1_score("x x y", "x y y") == pytest.approx(2 / 3)
  assert hm.f1_score("Paris", "paris") == 1.0
  assert hm.f1_score("London", "Paris") == 0.0
  assert hm.f1_score("", "") == 0.0  # no tokens -> 0, as the official script


def test_f1_yes_no_noanswer_all_or_nothing():
  assert hm.f1_score("yes", "yes") == 1.0
  assert hm.f1_score("Yes.", "yes") == 1.0
  assert hm.f1_score("yes", "no") == 0.0
  # A partial overlap with a special answer on either side scores 0 in F1.
  assert hm.f1_score("yes it is", "yes") == 0.0
  assert hm.f1_score("no", "no way") == 0.0
  assert hm.f1_score("noanswer", "no answer") == 0.0
  # Without the special case this pair would score 2/3.
  assert hm.f1_score("yes", "yes sir") == 0.0


def test_type_errors():
  with pytest.raises(TypeError, match="text must be a str"):
    hm.normalize_answer(None)
  with pytest.raises(TypeError):
    hm.f1_score("a", 3)


def test_gold_answers_score_one_against_themselves(raw_rows):
  rows = raw_rows("validation")
  answers = [r["answer"] for r in rows[:50]]
  assert answers
  for a in answers:
    assert hm.exact_match(a, a) == 1.0
    if hm.normalize_answer(a):
      assert hm.f1_score(a, a) == 1.0


def test_supporting_fact_recall(hotpotqa_dir):
  ex = hotpotqa_sources.load_examples('json', 'validation', data_dir=hotpotqa_dir)[1]
  sup = hotpotqa.supporting_unit_ids(ex)
  assert hm.supporting_fact_recall(sup, ex) == 1.0
  assert hm.supporting_fact_recall(sup[:1], ex) == pytest.approx(1 / len(sup))
  assert hm.supporting_fact_recall([], ex) == 0.0
