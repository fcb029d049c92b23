"""Optimizer pieces shared by the SFT and RL trainers: learning-rate schedules and the
clipped AdamW chain (SPEC §4 SFT recipe, §6 RL).

The paper names AdamW, the peak rates (SFT 2e-5, RL 1e-6), the SFT warmup ratio 0.03 and
the gradient-norm clip 1.0, and nothing else; every other number is a config field
(`sft.*` / `rl.*`: adam_b1, adam_b2, adam_eps, lr_schedule, warmup_ratio) whose default
is a **decision** documented beside it in experiments/configs.

Schedules (`lr_schedule`), as functions of completed optimizer steps k, with W =
ceil(warmup_ratio · total_steps) linear warmup steps (HF `get_warmup_steps`) at
peak·(k + 1)/W — peak/W, 2·peak/W, ..., peak. Unlike HF, whose first step runs at lr 0
and so is wasted, every step has a positive rate (issue 9):
  'linear'    warmup, then linearly to 0 at total_steps (HF
              `get_linear_schedule_with_warmup`);
  'cosine'    warmup, then half a cosine to 0 at total_steps (HF
              `get_cosine_schedule_with_warmup`);
  'constant'  warmup, then the peak rate.
A constant rate without warmup is passed to optax as a number, not a schedule, so the
optimizer state holds no schedule counter (RL checkpoints written before schedules were
selectable restore unchanged). `make_optimizer` is the one builder of SFT and the RL
phases; `learning_rate_fn` is the same rate as a function of the step, for logging.

Checkpoint compatibility: before `make_optimizer` was shared, SFT wrapped that constant
rate in a schedule, so an SFT checkpoint written then with `sft.lr_schedule='constant'`
and `sft.warmup_ratio=0` holds a schedule counter this optimizer does not keep; it is
refused with a CheckpointError naming this (checkpoint_values.no_restorable_error). The
default configs' optimizer states are unchanged (tests/test_optim.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Union

import jax
import optax

LR_SCHEDULES = ('linear', 'cosine', 'constant')


def warmup_steps(warmup_ratio: float, total_steps: int) -> int:
  """ceil(warmup_ratio · total_steps) (HF `get_warmup_steps`)."""
  return int(math.ceil(float(warmup_ratio) * int(total_steps)))


def check_schedule(kind: str, warmup_ratio: float, total_steps: int,
                   where: str) -> None:
  """Raises ValueError naming `where` (e.g. 'sft') for a bad schedule setting."""
  if kind not in LR_SCHEDULES:
    raise ValueError(f'{where}.lr_schedule must be one of {LR_SCHEDULES}, got {kind!r}')
  if not 0.0 <= float(warmup_ratio) < 1.0:
    raise ValueError(f'{where}.warmup_ratio must be in [0, 1), got {warmup_ratio}')
  if int(total_steps) < 1:
    raise ValueError(f'{where}: total optimizer steps must be >= 1, got {total_steps}')


def lr_schedule(kind: str, peak: float, total_steps: int,
                warmup_ratio: float) -> Union[float, optax.Schedule]:
  """The learning rate after `count` completed steps (module docstring); a plain float
  for 'constant' without warmup."""
  check_schedule(kind, warmup_ratio, total_steps, 'optimizer')
  w = warmup_steps(warmup_ratio, total_steps)
  if kind == 'constant' and w == 0:
    return float(peak)
  rest = max(1, int(total_steps) - w)
  if kind == 'linear':
    after = optax.linear_schedule(peak, 0.0, rest)
  elif kind == 'cosine':
    after = optax.cosine_decay_schedule(peak, rest)
  else:
    after = optax.constant_schedule(peak)
  if w == 0:
    return after
  warm = optax.linear_schedule(peak / w, peak, max(1, w - 1))
  return optax.join_schedules([warm, after], [w])


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """clip_by_global_norm -> AdamW under a schedule: the optimizer of SFT (config section
  `sft`, SPEC §4) and of the RL phases (section `rl`, SPEC §6). Hashable: a static jit
  argument.

  Attributes:
    learning_rate: peak AdamW rate (SPEC §4 SFT 2e-5, §6 RL 1e-6).
    total_steps: optimizer steps of the run, for the schedule (>= 1).
    warmup_ratio: share of total_steps with linear warmup (SPEC §4 SFT 0.03; RL:
      decision 0).
    lr_schedule: one of LR_SCHEDULES (module docstring).
    weight_decay: AdamW decoupled weight decay, not on 1-D params (SPEC gives none: 0).
    max_grad_norm: global-norm clip (SPEC §4, §6: 1.0).
    adam_b1, adam_b2, adam_eps: AdamW moments and ε (decision: the PyTorch / HF
      defaults 0.9, 0.999, 1e-8).
    section: the config section the values come from; names the field in errors.
  Raises:
    ValueError: a rate or clip <= 0, a negative weight decay, or a bad schedule,
      naming `<section>.<field>`.
  """
  learning_rate: float
  total_steps: int
  warmup_ratio: float
  lr_schedule: str
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0
  adam_b1: float = 0.9
  adam_b2: float = 0.999
  adam_eps: float = 1e-8
  section: str = 'rl'

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f'{self.section}.learning_rate must be > 0, got '
                       f'{self.learning_rate}')
    if not self.max_grad_norm > 0:
      raise ValueError(f'{self.section}.max_grad_norm must be > 0, got '
                       f'{self.max_grad_norm}')
    if self.weight_decay < 0:
      raise ValueError(f'{self.section}.weight_decay must be >= 0, got '
                       f'{self.weight_decay}')
    check_schedule(self.lr_schedule, self.warmup_ratio, self.total_steps, self.section)

  @property
  def warmup_steps(self) -> int:
    """ceil(warmup_ratio · total_steps) (HF `get_warmup_steps`)."""
    return warmup_steps(self.warmup_ratio, self.total_steps)

  @classmethod
  def from_section(cls, section: Any, *, name: str, total_steps: int) -> 'OptimizerConfig':
    """From config section `name` (`sft` or `rl`; fields of the same names) over
    `total_steps` optimizer steps."""
    return cls(learning_rate=float(section.learning_rate), total_steps=int(total_steps),
               warmup_ratio=float(section.warmup_ratio),
               lr_schedule=str(section.lr_schedule),
               weight_decay=float(section.weight_decay),
               max_grad_norm=float(section.max_grad_norm), adam_b1=float(section.adam_b1),
               adam_b2=float(section.adam_b2), adam_eps=float(section.adam_eps),
               section=name)


def make_optimizer(opt: OptimizerConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) -> AdamW under `opt`'s schedule: the optimizer
  of SFT (SPEC §4) and of the RL phases (SPEC §6).

  The rate is `lr_schedule` (module docstring): a plain number for 'constant' without
  warmup, so that state holds no schedule counter. The state is
  (EmptyState of the clip, (ScaleByAdamState(count, mu, nu), MaskedState of the weight
  decay, ScaleByScheduleState(count) or EmptyState of the rate)).
  """
  return clipped_adamw(
      lr_schedule(opt.lr_schedule, opt.learning_rate, opt.total_steps, opt.warmup_ratio),
      b1=opt.adam_b1, b2=opt.adam_b2, eps=opt.adam_eps, weight_decay=opt.weight_decay,
      max_grad_norm=opt.max_grad_norm)


def learning_rate_fn(opt: OptimizerConfig) -> optax.Schedule:
  """The rate `make_optimizer(opt)` applies at its k-th update (0-based) as a function
  of k, also for a constant rate (for logging; not an optimizer)."""
  rate = lr_schedule(opt.lr_schedule, opt.learning_rate, opt.total_steps,
                     opt.warmup_ratio)
  return rate if callable(rate) else optax.constant_schedule(rate)


@functools.partial(jax.jit, static_argnames=('opt',))
def init_optimizer(params: Any, *, opt: OptimizerConfig) -> Any:
  """`make_optimizer(opt).init(params)` as one compiled program (eager init compiles
  every small op separately); the state is placed like `params`."""
  return make_optimizer(opt).init(params)


def _decay_mask(params):
  return jax.tree.map(lambda p: p.ndim > 1, params)


def clipped_adamw(learning_rate: Union[float, optax.Schedule], *, b1: float, b2: float,
                  eps: float, weight_decay: float,
                  max_grad_norm: float) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) -> AdamW(learning_rate, b1, b2, eps), decoupled
  weight decay on parameters with more than one dimension only (no decay on norms and
  biases, as HF Trainer)."""
  if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
    raise ValueError(f'adam_b1 and adam_b2 must be in [0, 1), got {b1} and {b2}')
  if not eps > 0:
    raise ValueError(f'adam_eps must be > 0, got {eps}')
  return optax.chain(
      optax.clip_by_global_norm(max_grad_norm),
      optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                  mask=_decay_mask))
