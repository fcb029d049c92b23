"""Task solvers that act in interactive benchmarks (paper Eq. 3, App. C.2–C.3).

On ALFWorld, ScienceWorld, PDDL and BabyAI the task solver does not answer a question:
after each memory decision it reads (q, C̃_t) and proposes the next environment action
b_t, which `envs.interactive.InteractiveEnv.step` plays. Its output is a
`task_solvers.SolverOutput` of kind 'action' with the action text in `.action`.

Pieces:
  * `ActionPrompt(benchmark_rules)` — the chat messages of the action-format prompt
    (our own wording; the paper gives none) and its reply parser. Any chat backend uses
    them: the in-process Flax Qwen solver
    (`task_solvers.LLMTaskSolver(..., messages_fn=p.messages, parse_fn=p.parse)`) and
    an OpenAI-compatible HTTP solver (`ChatClient.complete(p.messages(inp), ...)`, then
    `p.parse(reply)`).
  * `parse_action_reply` — the line 'Action: <action>' of a reply; a reply without one
    plays its first non-empty line (the environment then says whether it understood).
  * `GoldPlanSolver` — a scripted stand-in that replays each instance's gold plan
    (ScienceWorld's gold sequence, a hand-written PDDL plan, a BabyAI bot path). It
    ignores the context entirely, so a success it scores measures the plan and the
    adapter, never the memory policy: label such numbers 'gold-plan solver'.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional, Sequence

from vermem_jax.envs import interactive
from vermem_jax.envs import task_solvers
from vermem_jax.memory import serialization

# Our own wording of the shared part of the action prompt.
ACTION_SYSTEM_PROMPT = (
    "You are an agent that completes a task in a text-based environment by choosing "
    "one action at a time. After each action the environment replies with what "
    "happened; your working context holds the task, recent observations and any notes "
    "recalled from memory.\n\n{rules}\n\n"
    "Reply with exactly one line of the form 'Action: <action>'. If you are unsure "
    "which actions are possible, reply 'Action: " + interactive.CHECK_VALID_ACTIONS
    + "'.")

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_ACTION_LINE = re.compile(r"^\s*(?:next\s+)?action\s*[:：]\s*(.*?)\s*$", re.IGNORECASE)


def parse_action_reply(text: str) -> tuple[str, Optional[str]]:
  """(kind, action) of a solver reply: ('action', <text>) for the first line
  'Action: <text>' (any case, Qwen3 `<think>` blocks ignored); a bare 'Action:' line
  takes the next non-empty line; a reply without such a line plays its first
  non-empty line. ('action', None) when the reply is empty — the episode loop plays ''
  and the environment answers that no action was given."""
  lines = [l for l in _THINK.sub("", text).splitlines() if l.strip()]
  for i, line in enumerate(lines):
    m = _ACTION_LINE.match(line)
    if m:
      action = interactive.normalize_action(m.group(1))
      if not action and i + 1 < len(lines):
        action = interactive.normalize_action(lines[i + 1])
      if action:
        return task_solvers.ACTION, action
  action = interactive.normalize_action("\n".join(lines))
  return task_solvers.ACTION, (action or None)


@dataclasses.dataclass(frozen=True)
class ActionPrompt:
  """The action-format prompt of one benchmark.

  Attributes:
    rules: the benchmark's action syntax and conventions (`Benchmark.action_prompt`).
  """
  rules: str

  def messages(self, inp: task_solvers.SolverInput) -> list[dict[str, str]]:
    """Chat messages for one solver call: system = shared frame + the benchmark's
    rules; user = the task q and the working context C̃_t. Data text passes through
    `memory.serialization.escape_markup` (no chat-template tokens can be injected)."""
    task = serialization.escape_markup(inp.question)
    context = serialization.escape_markup(inp.context) if inp.context.strip() else (
        "(empty)")
    user = (f"Task: {task}\n\nWorking context:\n{context}\n\n"
            "What is your next action? Reply with 'Action: ...'.")
    return [{"role": "system", "content": ACTION_SYSTEM_PROMPT.format(rules=self.rules)},
            {"role": "user", "content": user}]

  def parse(self, text: str) -> tuple[str, Optional[str]]:
    """`parse_action_reply`."""
    return parse_action_reply(text)

  def render(self, tokenizer, inp: task_solvers.SolverInput) -> str:
    """The full prompt string (the tokenizer's chat template, generation prompt on)."""
    return tokenizer.apply_chat_template(self.messages(inp), add_generation_prompt=True)


def llm_action_solver(tokenizer, model_config, params, rules: str, **kwargs
                      ) -> task_solvers.LLMTaskSolver:
  """The in-process Qwen solver with a benchmark's action prompt (kwargs as
  `task_solvers.LLMTaskSolver`: config, rng, generate_fn)."""
  prompt = ActionPrompt(rules)
  return task_solvers.LLMTaskSolver(tokenizer, model_config, params,
                                    messages_fn=prompt.messages, parse_fn=prompt.parse,
                                    **kwargs)


class GoldPlanSolver(task_solvers.TaskSolver):
  """Replays a fixed action list per task instance (a diagnostic stand-in).

  The i-th call for a task id returns the plan's i-th action; past the end it repeats
  the help command 'check valid actions' (no step is spent, the episode then ends
  by its limits). With a tokenizer and rules, token counts are those the LLM action
  prompt and this reply would have, so TN stays comparable; otherwise 0.

  Args:
    plans: task id (= instance id) -> actions.
    tokenizer: optional, for token counts.
    rules: the benchmark's action rules (needed with a tokenizer).

  Raises (from solve):
    KeyError: a task id without a plan.
  """

  def __init__(self, plans: Mapping[str, Sequence[str]], *, tokenizer=None,
               rules: str = ""):
    self.plans = {k: tuple(v) for k, v in plans.items()}
    self.tokenizer = tokenizer
    self.prompt = ActionPrompt(rules)
    self._cursor: dict[str, int] = {}

  def restart(self, task_id: Optional[str] = None) -> None:
    """Rewinds one task's plan (or all) to its first action."""
    if task_id is None:
      self._cursor.clear()
    else:
      self._cursor.pop(task_id, None)

  def solve(self, inputs: Sequence[task_solvers.SolverInput]
            ) -> list[task_solvers.SolverOutput]:
    outs = []
    for inp in inputs:
      if inp.task_id not in self.plans:
        raise KeyError(f"GoldPlanSolver has no plan for task {inp.task_id!r}")
      plan = self.plans[inp.task_id]
      i = self._cursor.get(inp.task_id, 0)
      self._cursor[inp.task_id] = i + 1
      action = plan[i] if i < len(plan) else interactive.CHECK_VALID_ACTIONS
      text = f"Action: {action}"
      n_in = n_out = 0
      if self.tokenizer is not None:
        n_in = self.tokenizer.count_tokens(self.prompt.render(self.tokenizer, inp))
        n_out = self.tokenizer.count_tokens(text) + 1  # + end-of-turn token
      outs.append(task_solvers.SolverOutput(task_solvers.ACTION, None, text, n_in, n_out,
                                            action=action))
    return outs
