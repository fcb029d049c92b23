"""Tests for vermem_jax.envs.action_solvers (action prompts, reply parsing, gold plans)."""
import pytest

from test_task_solvers import _FakeGenerate
from vermem_jax.envs import action_solvers as acts
from vermem_jax.envs import interactive
from vermem_jax.envs import task_solvers as ts


@pytest.fixture(scope="module")
def tokenizer(qwen25_tokenizer_dir):
  from vermem_jax.tokenization import load_tokenizer
  return load_tokenizer(qwen25_tokenizer_dir)


@pytest.mark.parametrize("reply,action", [
    ("Action: go to red ball 1", "go to red ball 1"),
    ("I should look first.\naction:  look around.", "look around"),
    ("Next action: `open fridge 1`", "open fridge 1"),
    ("<think>Action: wrong</think>\nAction: stack a on b", "stack a on b"),
    ("move forward\nthen more", "move forward"),  # no 'Action:' line: the first line
    ("Action:\n\nturn left", "turn left"),  # a bare Action line: the next line
    ("", None),
    ("<think>only thoughts", None),
])
def test_parse_action_reply(reply, action):
  assert acts.parse_action_reply(reply) == (ts.ACTION, action)


def test_action_prompt_messages_escape_and_name_the_rules():
  prompt = acts.ActionPrompt("Say 'add N'.")
  inp = ts.SolverInput("toy/0", "Reach <|im_end|> 5.", "The counter shows 0.")
  system, user = prompt.messages(inp)
  assert system["role"] == "system" and "Say 'add N'." in system["content"]
  assert interactive.CHECK_VALID_ACTIONS in system["content"]
  assert "<|im_end|>" not in user["content"] and "Reach" in user["content"]
  assert "The counter shows 0." in user["content"]
  assert "(empty)" in prompt.messages(ts.SolverInput("t", "q", " "))[1]["content"]


def test_llm_solver_with_action_prompt(tokenizer):
  replies = ["Action: open fridge 1", "take apple 1"]
  fake = _FakeGenerate(tokenizer, replies)
  prompt = acts.ActionPrompt("ALFWorld rules.")
  solver = acts.llm_action_solver(tokenizer, None, None, "ALFWorld rules.", generate_fn=fake)
  inputs = [ts.SolverInput(f"g{i}", "Put an apple in the fridge.", f"obs {i}")
            for i in range(2)]
  outs = solver.solve(inputs)
  for inp, ids, out in zip(inputs, fake.calls[0]["prompts"], outs):
    assert ids == tokenizer.encode(prompt.render(tokenizer, inp))
    assert out.input_tokens == len(ids) and out.kind == ts.ACTION and out.answer is None
  assert [o.action for o in outs] == ["open fridge 1", "take apple 1"]


def test_gold_plan_solver_replays_per_task(tokenizer):
  solver = acts.GoldPlanSolver({"a": ["x", "y"], "b": ["z"]})
  mk = lambda t: ts.SolverInput(t, "task", "ctx")
  outs = solver.solve([mk("a"), mk("b")]) + solver.solve([mk("a"), mk("b")])
  assert [o.action for o in outs] == ["x", "z", "y", interactive.CHECK_VALID_ACTIONS]
  assert all(o.kind == ts.ACTION and o.input_tokens == 0 for o in outs)
  solver.restart("a")
  assert solver.solve([mk("a")])[0].action == "x"
  with pytest.raises(KeyError, match="no plan"):
    solver.solve([mk("c")])
  counted = acts.GoldPlanSolver({"a": ["x"]}, tokenizer=tokenizer, rules="R.")
  (out,) = counted.solve([mk("a")])
  assert out.input_tokens == len(tokenizer.encode(
      acts.ActionPrompt("R.").render(tokenizer, mk("a"))))
  assert out.output_tokens == len(tokenizer.encode("Action: x")) + 1
