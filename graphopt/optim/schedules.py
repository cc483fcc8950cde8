"""Learning-rate schedules computed inside the step, from the optimizer's step counter.

A schedule is called with the number of steps already taken, an f64 scalar tensor (0 on the
first step), and builds the lr from it with graphopt ops, as an f64 scalar. Pass one as
`lr=` (MindSpore's style: `AdamW(params, lr=WarmupCosine(1e-3, 100, 1000))`): every step
computes its lr in the graph, so nothing is recomputed in Python and nothing retraces.

Numbering: the k-th call of `opt.step` (k = 0, 1, ...) uses lr(k). This is torch's order
(`optimizer.step()` then `scheduler.step()`) and MindSpore's (a learning-rate cell reads
`global_step` before the optimizer increments it). Steps skipped with `where=` (an overflow,
a micro-batch) do not count.

`schedule.value(k)` runs the same code in eager mode and returns lr(k) as a float.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ops
from ..errors import OptimizerError
from ..frontend.tensor import Tensor
from ..ir.types import f64, i64
from .arguments import CheckedArguments


class Schedule(metaclass=CheckedArguments):
    """Base class: `__call__(k) -> lr`, both f64 scalar tensors; k is the number of steps
    already taken (0 on the first step)."""

    def __call__(self, step: Any) -> Tensor:
        raise NotImplementedError

    def value(self, step: int) -> float:
        """lr(step) as a Python float (the graph's code, run eagerly)."""
        return float(self(np.float64(step)))


def _floor(x: Any) -> Tensor:
    # floor of a non-negative f64: the cast to an integer truncates toward zero.
    return ops.cast(ops.cast(x, i64), f64)


def _check(owner: str, **values: Any) -> None:
    """Every value must be a finite number >= 0; *_steps and step_size must be ints >= 1."""
    for key, v in values.items():
        counts = key.endswith("steps") or key == "step_size"
        ok = isinstance(v, (int, np.integer)) and v >= 1 if counts else \
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
            and math.isfinite(v) and v >= 0
        if not ok:
            rule = "an integer >= 1" if counts else "a finite number >= 0"
            raise OptimizerError(f"{owner}: {key} must be {rule}, got {v!r}")


@dataclass(frozen=True)
class Constant(Schedule):
    """lr(k) = lr."""

    lr: float

    def __post_init__(self) -> None:
        _check("Constant", lr=self.lr)

    def __call__(self, step: Any) -> Tensor:
        return ops.full((), self.lr, f64)


@dataclass(frozen=True)
class ExponentialDecay(Schedule):
    """lr(k) = base_lr · gamma^(k / decay_steps), the exponent floored when staircase.

    torch: ExponentialLR(gamma) (decay_steps=1). MindSpore: ExponentialDecayLR(learning_rate,
    decay_rate=gamma, decay_steps, is_stair=staircase)."""

    base_lr: float
    gamma: float
    decay_steps: int = 1
    staircase: bool = False

    def __post_init__(self) -> None:
        _check(type(self).__name__, base_lr=self.base_lr, gamma=self.gamma,
               decay_steps=self.decay_steps)

    def __call__(self, step: Any) -> Tensor:
        p = step / float(self.decay_steps)
        return self.base_lr * self.gamma ** (_floor(p) if self.staircase else p)


class StepDecay(ExponentialDecay):
    """lr(k) = base_lr · gamma^⌊k / step_size⌋. torch: StepLR(step_size, gamma=0.1)."""

    def __init__(self, base_lr: float, step_size: int, gamma: float = 0.1):
        super().__init__(base_lr, gamma, step_size, staircase=True)

    def __repr__(self) -> str:
        return f"StepDecay(base_lr={self.base_lr}, step_size={self.decay_steps}, " \
               f"gamma={self.gamma})"


@dataclass(frozen=True)
class LinearWarmup(Schedule):
    """lr(k) = base_lr · (s + (e − s) · min(k, warmup_steps) / warmup_steps), s and e the
    start and end factors; then constant at base_lr · e.

    torch: LinearLR(start_factor, end_factor, total_iters=warmup_steps). MindSpore:
    WarmUpLR(learning_rate, warmup_steps) (start_factor=0, the default here)."""

    base_lr: float
    warmup_steps: int
    start_factor: float = 0.0
    end_factor: float = 1.0

    def __post_init__(self) -> None:
        _check("LinearWarmup", base_lr=self.base_lr, warmup_steps=self.warmup_steps,
               start_factor=self.start_factor, end_factor=self.end_factor)

    def __call__(self, step: Any) -> Tensor:
        s, e = self.start_factor, self.end_factor
        progress = ops.minimum(step, float(self.warmup_steps)) / float(self.warmup_steps)
        return self.base_lr * (s + (e - s) * progress)


@dataclass(frozen=True)
class CosineDecay(Schedule):
    """lr(k) = min_lr + (base_lr − min_lr) · (1 + cos(π · min(k, T) / T)) / 2, T the
    decay_steps; min_lr after T.

    torch: CosineAnnealingLR(T_max=T, eta_min=min_lr) (its closed form, up to T). MindSpore:
    CosineDecayLR(min_lr, max_lr=base_lr, decay_steps=T)."""

    base_lr: float
    decay_steps: int
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        _check("CosineDecay", base_lr=self.base_lr, decay_steps=self.decay_steps,
               min_lr=self.min_lr)

    def __call__(self, step: Any) -> Tensor:
        t = float(self.decay_steps)
        progress = ops.minimum(step, t) / t
        cosine = (1 + ops.cos(math.pi * progress)) / 2
        return self.min_lr + (self.base_lr - self.min_lr) * cosine


@dataclass(frozen=True)
class WarmupCosine(Schedule):
    """Linear warmup from 0 to base_lr over warmup_steps, then cosine decay to min_lr at
    total_steps (and min_lr after):

        lr(k) = base_lr · k / W                                          k < W
        lr(k) = min_lr + (base_lr − min_lr) · (1 + cos(π · p)) / 2,      p = min(k − W, T − W) / (T − W)

    torch: SequentialLR([LinearLR(start_factor≈0, total_iters=W), CosineAnnealingLR(T_max=
    T − W, eta_min=min_lr)], milestones=[W]), or transformers' cosine schedule with warmup
    (min_lr = 0). MindSpore: WarmUpLR then CosineDecayLR."""

    base_lr: float
    warmup_steps: int
    total_steps: int
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        _check("WarmupCosine", base_lr=self.base_lr, total_steps=self.total_steps,
               min_lr=self.min_lr)
        if not isinstance(self.warmup_steps, (int, np.integer)) or \
                not 0 <= self.warmup_steps < self.total_steps:
            raise OptimizerError(f"WarmupCosine: warmup_steps must be an integer in [0, "
                                 f"total_steps={self.total_steps}), got {self.warmup_steps!r}")

    def __call__(self, step: Any) -> Tensor:
        w = self.warmup_steps
        decay = CosineDecay(self.base_lr, self.total_steps - w, self.min_lr)
        if w == 0:
            return decay(step)
        warmup = LinearWarmup(self.base_lr, w)
        return ops.where(step < float(w), warmup(step), decay(step - float(w)))


__all__ = ["Schedule", "Constant", "ExponentialDecay", "StepDecay", "LinearWarmup",
           "CosineDecay", "WarmupCosine"]
