"""Loss scaling for f16/bf16 training: scale the loss, unscale the gradients, skip a step
whose gradients overflowed, and adapt the scale, all inside one compiled step.

    scaler = graphopt.amp.DynamicLossScaler()          # torch.amp.GradScaler's defaults

    @graphopt.jit
    def train_step(x, y):
        loss, grads = value_and_grad(lambda: scaler.scale(loss_fn(x, y)), params)
        scaler.step(opt, grads)                         # unscale, check, update or skip
        return loss

`scaler.step(opt, grads)` is `unscale` (gradients × 1/scale, in f32 for f16/bf16
gradients, and whether all are finite), then `opt.step(grads, where=finite)` (a skipped step
leaves parameters and optimizer state bit-identical: every write is `where(finite, new,
old)`), then `update(finite)`. No Python branch looks at a traced value, so overflow and
normal steps run the same graph. Call `unscale` and `update` yourself to clip in between.

Under data parallelism (`jit(..., parallel=DataParallel(...))`) the decision is global:
`unscale` all_reduces (max) "some gradient is not finite", so a NaN on one rank skips the
step on every rank and backs every rank's scale off alike. The gradients are reduced first
(scaled, as value_and_grad returns them) and unscaled after: the scale is a power of two
and the same on every rank, so multiplying by 1/scale commutes exactly with the average,
and the numbers are those of one process. Each skipped step is counted, in the Parameter
`<name>.skipped` (`skipped_steps`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from . import ops
from .errors import OptimizerError
from .frontend import Parameter, assign
from .frontend.tensor import Tensor
from .frontend.traces import current_trace
from .ir.types import f32, i64
from .optim.arguments import CheckedArguments
from .optim.optimizer import as_dtype, check_count, dtype_of

Grads = Sequence[Any] | Mapping[str, Any]


class LossScaler(metaclass=CheckedArguments):
    """What static and dynamic scaling share: the scale is an f32 Parameter (`<name>`), and
    the count of skipped steps an i64 one (`<name>.skipped`)."""

    def __init__(self, scale: float, name: str):
        self.name = name
        self.loss_scale = Parameter(check_scale(scale, type(self).__name__), name=name)
        self.skipped = Parameter(np.int64(0), name=f"{name}.skipped")

    @property
    def scale_value(self) -> float:
        """The current scale, as a Python float."""
        return float(self.loss_scale.numpy())

    @property
    def skipped_steps(self) -> int:
        """How many steps `step` has skipped because a gradient was inf or NaN (on any rank,
        under data parallelism), since this scaler was made."""
        return int(self.skipped.numpy())

    def scale(self, loss: Any) -> Tensor:
        """loss × scale (in the loss's dtype): differentiate this, not the loss."""
        return loss * as_dtype(self.loss_scale, dtype_of(loss))

    def unscale(self, grads: Grads) -> tuple[Any, Tensor]:
        """(gradients × 1/scale, all finite), as torch's
        `_amp_foreach_non_finite_check_and_unscale_`. 1/scale is taken in f64 and rounded to
        f32 (GradScaler's inv_scale); f16/bf16 gradients are unscaled into f32, where small
        values do not underflow."""
        inv = ops.cast(1.0 / ops.cast(self.loss_scale, "f64"), f32)
        leaves = list(grads.values()) if isinstance(grads, Mapping) else list(grads)
        finite = None
        out = []
        for g in leaves:
            ok = ops.sum(ops.cast(~ops.isfinite(g), i64)) == 0  # no inf or NaN element
            finite = ok if finite is None else finite & ok
            g = as_dtype(g, f32) if dtype_of(g).itemsize < 4 else g
            out.append(g * as_dtype(inv, dtype_of(g)))
        if finite is None:
            raise OptimizerError(f"{type(self).__name__}.unscale: no gradients")
        parallel = getattr(current_trace(), "parallel", None)
        if parallel is not None:  # one decision for every rank, which sees only its own
            finite = parallel.agree(finite)  # gradients under zero=2 or an Accumulate
        if isinstance(grads, Mapping):
            return dict(zip(grads.keys(), out)), finite
        return out, finite

    def update(self, finite: Any) -> None:
        """Adapt the scale after a step (nothing, for a static scale)."""

    def skip_nonfinite(self) -> bool:
        """Whether `step` leaves everything unchanged when a gradient is inf or NaN (always,
        for a dynamic scale)."""
        return True

    def step(self, opt: Any, grads: Grads) -> Tensor:
        """Unscale, step the optimizer where every gradient is finite, update the scale.
        Returns the bool scalar "the step was applied". `opt` may be an optimizer or an
        `Accumulate`."""
        grads, finite = self.unscale(grads)
        skip = self.skip_nonfinite()
        opt.step(grads, where=finite if skip else None)
        if skip:
            assign(self.skipped, ops.where(finite, self.skipped, self.skipped + 1))
        self.update(finite)
        return finite

    def parameters(self) -> list[Parameter]:
        """The Parameters to checkpoint."""
        return [self.loss_scale]

    def check_loaded(self, values: Mapping[str, np.ndarray]) -> None:
        """Values a checkpoint would load (by name), checked as the constructor checks them."""
        check_scale(np.asarray(values[self.loss_scale.name]).item(),
                    f"'{self.loss_scale.name}' ({type(self).__name__})")


class StaticLossScaler(LossScaler):
    """A fixed scale (MindSpore's FixedLossScaleManager: loss_scale=128.0,
    drop_overflow_update=True). The scale is data: `scaler.set_scale(s)` between steps."""

    def __init__(self, scale: float = 128.0, drop_overflow_update: bool = True, *,
                 name: str = "loss_scale"):
        super().__init__(scale, name)
        self.drop_overflow_update = bool(drop_overflow_update)

    def skip_nonfinite(self) -> bool:
        """`drop_overflow_update`: False applies a step even when a gradient is inf or NaN."""
        return self.drop_overflow_update

    def set_scale(self, scale: float) -> None:
        """Store a new scale, read by the steps that follow (call it between steps).

        Raises:
            OptimizerError: the scale is not a finite number > 0 in f32.
        """
        assign(self.loss_scale, check_scale(scale, "StaticLossScaler"))


class DynamicLossScaler(LossScaler):
    """torch.amp.GradScaler's dynamic scale (same arguments and defaults):

        not all finite:  scale ← scale·backoff_factor,  tracker ← 0    (the step is skipped)
        all finite:      tracker ← tracker + 1; when it reaches growth_interval:
                         scale ← scale·growth_factor (if that is finite),  tracker ← 0

    State: the scale (f32, `<name>`) and the growth tracker (`<name>.growth_tracker`).
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, *,
                 name: str = "loss_scale"):
        super().__init__(init_scale, name)
        if not growth_factor > 1.0:
            raise OptimizerError(f"DynamicLossScaler: growth_factor must be > 1, got "
                                 f"{growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise OptimizerError(f"DynamicLossScaler: backoff_factor must be in (0, 1), got "
                                 f"{backoff_factor!r}")
        if not isinstance(growth_interval, (int, np.integer)) or growth_interval < 1:
            raise OptimizerError(f"DynamicLossScaler: growth_interval must be an integer "
                                 f">= 1, got {growth_interval!r}")
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.growth_tracker = Parameter(np.int64(0), name=f"{name}.growth_tracker")

    def update(self, finite: Any) -> None:
        """torch's `_amp_update_scale_`, with `where` for its branches."""
        scale, tracker = self.loss_scale, self.growth_tracker
        successful = tracker + 1
        grow = successful == self.growth_interval
        grown = scale * self.growth_factor
        grown = ops.where(ops.isfinite(grown), grown, scale)
        new_scale = ops.where(finite, ops.where(grow, grown, scale),
                              scale * self.backoff_factor)
        new_tracker = ops.where(finite & ~grow, successful, 0)
        assign(scale, new_scale)
        assign(tracker, new_tracker)

    def parameters(self) -> list[Parameter]:
        """The Parameters to checkpoint: the scale and the growth tracker."""
        return [self.loss_scale, self.growth_tracker]

    def check_loaded(self, values: Mapping[str, np.ndarray]) -> None:
        """Values a checkpoint would load (by name): a scale finite and > 0, and a growth
        tracker in [0, growth_interval). Raises OptimizerError naming the entry."""
        super().check_loaded(values)
        check_count(values, self.growth_tracker, below=self.growth_interval)


def check_scale(scale: Any, what: str) -> np.float32:
    """A loss scale as its f32 Parameter holds it: a number, finite and > 0 once rounded to f32
    (1e39 would be inf, 1e-46 zero)."""
    s = None
    if isinstance(scale, (int, float, np.integer, np.floating)) and \
            not isinstance(scale, (bool, np.bool_)):
        with np.errstate(over="ignore"):
            s = np.float32(scale)
    if s is None or not 0 < s < np.inf:
        raise OptimizerError(f"{what}: the scale must be a finite number > 0 (in f32), got "
                             f"{scale!r}")
    return s


__all__ = ["LossScaler", "StaticLossScaler", "DynamicLossScaler"]
