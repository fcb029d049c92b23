"""The task solver π_task of a run, built from config section `solver` (SPEC §4, §7).

One builder for training rollouts and evaluation, so both use the same backends:

  'oracle'             `envs.task_solvers.OracleEvidenceReader`: a DIAGNOSTIC
                       stand-in that holds the labels of the examples it is given and
                       answers with the reference answer exactly when what it reads
                       carries every supporting fact (tables label it so);
  'llm'                `LLMTaskSolver`: a Flax Qwen model in-process, weights from
                       `solver.hf_checkpoint`, else `model.hf_checkpoint`, else the
                       `solver_params` the caller passes;
  'openai_compatible'  `OpenAICompatibleTaskSolver`: a served model (vLLM, SGLang, a
                       hosted API) at `solver.base_url`, model `solver.model`, key from
                       the variable named by `solver.api_key_env`.

On the interactive benchmarks (`make_action_solver`) the 'llm' and
'openai_compatible' backends take the benchmark's action prompt and reply parser
(`envs.action_solvers.ActionPrompt`), and 'gold_plan' replaces the oracle:

  'gold_plan'          `envs.action_solvers.GoldPlanSolver`: a STAND-IN that replays
                       each instance's gold plan and ignores the context (tables label
                       it so).
"""

from __future__ import annotations

from typing import Any, Iterable

import ml_collections

from vermem_jax import config_util
from vermem_jax import http_chat
from vermem_jax.envs import action_solvers
from vermem_jax.envs import task_solvers
from vermem_jax.models import hf_io
from vermem_jax.train import setup as setup_lib

BACKENDS = ('oracle', 'llm', 'openai_compatible')
ACTION_BACKENDS = ('gold_plan', 'llm', 'openai_compatible')
ORACLE_LABEL = ('oracle-evidence reader — DIAGNOSTIC stand-in, not an LLM: it answers '
                'with the reference answer exactly when the context carries every '
                'supporting fact, so EM/F1/SR measure the memory, not reading')
GOLD_PLAN_LABEL = ('gold-plan solver — STAND-IN, not an LLM: it replays each '
                   "instance's gold plan and ignores the context, so SR/PR measure the "
                   'plan, the adapter and the token budget, not the memory policy')


def solver_label(config: ml_collections.ConfigDict) -> str:
  """How tables name the run's task solver (the oracle always as a diagnostic)."""
  s = config.solver
  if s.backend == 'oracle':
    return ORACLE_LABEL
  if s.backend == 'gold_plan':
    return GOLD_PLAN_LABEL
  if s.backend == 'openai_compatible':
    return f'OpenAI-compatible server: model {s.model!r} at {s.base_url}'
  path = s.hf_checkpoint or config.model.hf_checkpoint
  return f'in-process Qwen solver ({path or "the policy parameters"})'


def make_task_solver(config: ml_collections.ConfigDict, tokenizer: Any,
                     label_examples: Iterable[Any], *, solver_params: Any = None,
                     mesh: Any = None) -> task_solvers.TaskSolver:
  """The task solver of `config.solver.backend` (module docstring).

  Args:
    config: experiment config (sections `solver`, `model`).
    tokenizer: the backbone tokenizer (chat template; TN counts).
    label_examples: HotpotQA examples whose labels the oracle may hold (ignored by
      the other backends).
    solver_params: 'llm' weights (with the policy's model config) when no checkpoint
      is configured.
    mesh: where an 'llm' checkpoint's parameters are placed.

  Raises:
    ValueError: naming the bad field: an unknown backend, an 'llm' solver without
      weights, an HTTP solver without url/model or with an unset key variable.
  """
  s = config.solver
  solver_cfg = config_util.dataclass_from_mapping(task_solvers.SolverConfig, s.to_dict())
  if s.backend == 'oracle':
    return task_solvers.OracleEvidenceReader.from_examples(list(label_examples),
                                                           tokenizer=tokenizer)
  if s.backend == 'openai_compatible':
    return task_solvers.OpenAICompatibleTaskSolver(_chat_client(config), tokenizer,
                                                   config=solver_cfg)
  if s.backend != 'llm':
    raise ValueError(f'config.solver.backend: unknown {s.backend!r}; expected one of '
                     f'{BACKENDS}')
  s_cfg, s_params = _llm_weights(config, tokenizer, solver_params, mesh)
  return task_solvers.LLMTaskSolver(tokenizer, s_cfg, s_params, config=solver_cfg)


def make_action_solver(config: ml_collections.ConfigDict, tokenizer: Any,
                       action_prompt: str, *, solver_params: Any = None,
                       mesh: Any = None) -> task_solvers.TaskSolver:
  """The action solver of an interactive benchmark (`config.solver.backend`):
  'gold_plan' (an empty `GoldPlanSolver`; the caller adds each instance's plan with
  `set_plan`), 'llm' or 'openai_compatible' with `ActionPrompt(action_prompt)`.

  Args:
    config, tokenizer, solver_params, mesh: as `make_task_solver`.
    action_prompt: the benchmark's action rules (`Benchmark.action_prompt`).

  Raises:
    ValueError: naming the field: 'oracle' (HotpotQA only) or an unknown backend, an
      'llm' solver without weights, an HTTP solver without url/model.
  """
  s = config.solver
  solver_cfg = config_util.dataclass_from_mapping(task_solvers.SolverConfig, s.to_dict())
  prompt = action_solvers.ActionPrompt(action_prompt)
  if s.backend == 'gold_plan':
    return action_solvers.GoldPlanSolver({}, tokenizer=tokenizer, rules=action_prompt)
  if s.backend == 'openai_compatible':
    return task_solvers.OpenAICompatibleTaskSolver(
        _chat_client(config), tokenizer, config=solver_cfg, messages_fn=prompt.messages,
        parse_fn=prompt.parse)
  if s.backend != 'llm':
    raise ValueError(f'config.solver.backend: {s.backend!r} cannot act in an '
                     f'interactive benchmark; expected one of {ACTION_BACKENDS} (the '
                     'oracle-evidence reader answers HotpotQA questions only)')
  s_cfg, s_params = _llm_weights(config, tokenizer, solver_params, mesh)
  return action_solvers.llm_action_solver(tokenizer, s_cfg, s_params, action_prompt,
                                          config=solver_cfg)


def _chat_client(config: ml_collections.ConfigDict) -> http_chat.ChatClient:
  s = config.solver
  chat = http_chat.ChatBackendConfig(
      base_url=s.get('base_url') or '', model=s.get('model') or '',
      api_key_env=s.api_key_env, timeout_s=float(s.timeout_s),
      max_concurrency=int(s.max_concurrency), max_retries=int(s.max_retries),
      section='solver')
  try:
    chat.check_endpoint()
  except ValueError as e:
    raise ValueError(f'config.solver.base_url: {e}') from e
  return chat.client(require_api_key=True, retry_in_client=True)


def _llm_weights(config: ml_collections.ConfigDict, tokenizer: Any, solver_params: Any,
                 mesh: Any) -> tuple[Any, Any]:
  """(QwenConfig, params) of the 'llm' solver (module docstring)."""
  s = config.solver
  path = s.hf_checkpoint or config.model.hf_checkpoint
  if path:
    s_cfg, s_params = hf_io.load_hf_checkpoint(path, dtype=config.model.param_dtype,
                                               mesh=mesh)
    s_cfg = s_cfg.replace(dtype=config.model.dtype)
    field = ('config.solver.hf_checkpoint' if s.hf_checkpoint
             else 'config.model.hf_checkpoint')
    setup_lib.check_tokenizer_fits(tokenizer, s_cfg, field=field)
  elif solver_params is not None:
    s_cfg, s_params = setup_lib.model_config_from(config), solver_params
  else:
    raise ValueError('config.solver.hf_checkpoint: the llm task solver needs weights '
                     '(set solver.hf_checkpoint or model.hf_checkpoint), or use '
                     "solver.backend='oracle' (HotpotQA) / 'gold_plan' (benchmarks)")
  return s_cfg, s_params
