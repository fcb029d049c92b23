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

import dataclasses
from typing import Any, Iterable

import jax
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


@dataclasses.dataclass(frozen=True)
class SolverSetup:
  """The task solver's settings (config sections `solver` and `model`), typed once.

  Attributes:
    backend: one of BACKENDS or ACTION_BACKENDS (checked when the solver is made).
    config: the generation settings every backend shares.
    hf_checkpoint: the 'llm' backend's weights: `solver.hf_checkpoint`, else
      `model.hf_checkpoint` ('' = none: the caller's `solver_params`).
    checkpoint_field: the config field `hf_checkpoint` came from (errors name it).
    dtype: the policy's compute dtype (`model.dtype`): an 'llm' solver only decodes,
      so its weights are held in it (bf16 at paper scale; a frozen copy cast from the
      policy's parameters when it has no checkpoint of its own).
    batch_size: rows of every 'llm' generate call: the rollout batch
      (`rl.tasks_per_update * rl.rollouts_per_task`); more live episodes run in
      chunks of it, fewer are padded to it (`models.batch_chunks`).
    prompt_buckets: the policy's prompt buckets (`sampling.prompt_buckets`), so the
      solver's prompts take the policy's padded lengths (docs/compilation.md).
    chat: the 'openai_compatible' endpoint, keys `solver.base_url`, `model`,
      `api_key_env`, `timeout_s`, `max_retries`, `max_concurrency` (checked whatever
      the backend).
  """
  backend: str
  config: task_solvers.SolverConfig
  hf_checkpoint: str = ''
  checkpoint_field: str = 'config.model.hf_checkpoint'
  dtype: str = 'float32'
  batch_size: int = 64
  prompt_buckets: tuple[int, ...] | None = None
  chat: http_chat.ChatBackendConfig = task_solvers.DEFAULT_CHAT

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'SolverSetup':
    """From sections `solver` and `model`.

    Raises:
      ValueError: an endpoint value out of range, naming `solver.<field>`.
    """
    s = config.solver
    chat, rest = http_chat.ChatBackendConfig.split(s.to_dict(), defaults=task_solvers.DEFAULT_CHAT)
    return cls(backend=str(s.backend),
               config=config_util.dataclass_from_mapping(task_solvers.SolverConfig, rest),
               hf_checkpoint=str(s.hf_checkpoint or config.model.hf_checkpoint or ''),
               checkpoint_field=('config.solver.hf_checkpoint' if s.hf_checkpoint
                                 else 'config.model.hf_checkpoint'),
               dtype=str(config.model.dtype),
               batch_size=int(config.rl.tasks_per_update) * int(config.rl.rollouts_per_task),
               prompt_buckets=(tuple(int(b) for b in config.sampling.prompt_buckets)
                               if config.sampling.prompt_buckets else None),
               chat=chat)


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


def make_task_solver(solver: SolverSetup, tokenizer: Any, label_examples: Iterable[Any], *,
                     solver_params: Any = None, model_config: Any = None,
                     mesh: Any = None) -> task_solvers.TaskSolver:
  """The task solver of `solver.backend` (module docstring).

  Args:
    solver: the solver's settings.
    tokenizer: the backbone tokenizer (chat template; TN counts).
    label_examples: HotpotQA examples whose labels the oracle may hold (ignored by
      the other backends).
    solver_params, model_config: 'llm' weights and their QwenConfig (the policy's)
      when no checkpoint is configured.
    mesh: where an 'llm' checkpoint's parameters are placed.

  Raises:
    ValueError: naming the bad field: an unknown backend, an 'llm' solver without
      weights, an HTTP solver without url/model or with an unset key variable.
  """
  if solver.backend == 'oracle':
    return task_solvers.OracleEvidenceReader.from_examples(list(label_examples),
                                                           tokenizer=tokenizer)
  if solver.backend == 'openai_compatible':
    return task_solvers.OpenAICompatibleTaskSolver(_chat_client(solver), tokenizer,
                                                   config=solver.config)
  if solver.backend != 'llm':
    raise ValueError(f'config.solver.backend: unknown {solver.backend!r}; expected one '
                     f'of {BACKENDS}')
  s_cfg, s_params = _llm_weights(solver, tokenizer, solver_params, model_config, mesh)
  return task_solvers.LLMTaskSolver(tokenizer, s_cfg, s_params, config=solver.config,
                                    **_llm_decoding(solver, mesh))


def make_action_solver(solver: SolverSetup, tokenizer: Any, action_prompt: str, *,
                       solver_params: Any = None, model_config: Any = None,
                       mesh: Any = None) -> task_solvers.TaskSolver:
  """The action solver of an interactive benchmark (`solver.backend`): 'gold_plan'
  (an empty `GoldPlanSolver`; the caller adds each instance's plan with `set_plan`),
  'llm' or 'openai_compatible' with `ActionPrompt(action_prompt)`.

  Args:
    solver, tokenizer, solver_params, model_config, mesh: as `make_task_solver`.
    action_prompt: the benchmark's action rules (`Benchmark.action_prompt`).

  Raises:
    ValueError: naming the field: 'oracle' (HotpotQA only) or an unknown backend, an
      'llm' solver without weights, an HTTP solver without url/model.
  """
  prompt = action_solvers.ActionPrompt(action_prompt)
  if solver.backend == 'gold_plan':
    return action_solvers.GoldPlanSolver({}, tokenizer=tokenizer, rules=action_prompt)
  if solver.backend == 'openai_compatible':
    return task_solvers.OpenAICompatibleTaskSolver(
        _chat_client(solver), tokenizer, config=solver.config,
        messages_fn=prompt.messages, parse_fn=prompt.parse)
  if solver.backend != 'llm':
    raise ValueError(f'config.solver.backend: {solver.backend!r} cannot act in an '
                     f'interactive benchmark; expected one of {ACTION_BACKENDS} (the '
                     'oracle-evidence reader answers HotpotQA questions only)')
  s_cfg, s_params = _llm_weights(solver, tokenizer, solver_params, model_config, mesh)
  return action_solvers.llm_action_solver(tokenizer, s_cfg, s_params, action_prompt,
                                          config=solver.config,
                                          **_llm_decoding(solver, mesh))


def _chat_client(solver: SolverSetup) -> http_chat.ChatClient:
  try:
    solver.chat.check_endpoint()
  except ValueError as e:
    raise ValueError(f'config.{e}') from e
  return solver.chat.client(require_api_key=True, retry_in_client=True)


def _llm_decoding(solver: SolverSetup, mesh: Any) -> dict[str, Any]:
  """The 'llm' solver's generate path: the policy's mesh, batch and prompt buckets."""
  return dict(generate_fn=setup_lib.generate_fn_for(mesh),
              batch_buckets=(solver.batch_size,), prompt_buckets=solver.prompt_buckets)


def _llm_weights(solver: SolverSetup, tokenizer: Any, solver_params: Any,
                 model_config: Any, mesh: Any) -> tuple[Any, Any]:
  """(QwenConfig, params) of the 'llm' solver, its weights in the compute dtype
  (`SolverSetup.dtype`; module docstring)."""
  if solver.hf_checkpoint:
    s_cfg, s_params = hf_io.load_hf_checkpoint(solver.hf_checkpoint,
                                               dtype=solver.dtype, mesh=mesh)
    s_cfg = s_cfg.replace(dtype=solver.dtype)
    setup_lib.check_tokenizer_fits(tokenizer, s_cfg, field=solver.checkpoint_field)
  elif solver_params is not None:
    # A frozen copy: the policy's own parameters change with every update.
    s_cfg = model_config.replace(param_dtype=solver.dtype)
    s_params = jax.tree.map(lambda x: x.astype(solver.dtype), solver_params)
  else:
    raise ValueError('config.solver.hf_checkpoint: the llm task solver needs weights '
                     '(set solver.hf_checkpoint or model.hf_checkpoint), or use '
                     "solver.backend='oracle' (HotpotQA) / 'gold_plan' (benchmarks)")
  return s_cfg, s_params
