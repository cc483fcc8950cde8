"""Gradient accumulation in the graph: k micro-batches, one optimizer update.

    acc ← acc + g                           every call, per parameter
    every k-th call:  opt.step(acc / k),  acc ← 0

"Every k-th call" is a comparison of a counter Parameter, and the update and the reset are
`where`s on it, so every call runs the same compiled step: nothing retraces at the k-th.

Under data parallelism (DataParallel) the synchronisation is deferred: value_and_grad
leaves the gradients of the Parameters an Accumulate sums unreduced (`accumulating`), each
rank sums its own, and the sum is averaged over the ranks once per update, by an
`all_reduce_when` on the k-th call's predicate (the counter is a Parameter, equal on every
rank, so the ranks communicate on the same calls):

    acc ← acc + g                                    this rank's own, every call
    every k-th call:  opt.step(mean over the ranks of (acc + g) / k),  acc ← 0
"""
from __future__ import annotations

import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from .. import memory, ops
from ..errors import OptimizerError
from ..frontend import Parameter, assign
from ..frontend.rows import Rows
from ..frontend.tensor import Tensor
from ..frontend.traces import current_trace
from .arguments import CheckedArguments
from .optimizer import Optimizer, as_dtype, check_condition, check_count


class Accumulate(metaclass=CheckedArguments):
    """Wrap an optimizer: `Accumulate(opt, steps=4).step(grads)` accumulates the gradients
    of 4 calls in Parameters (`<param>.grad_accum`, in the compute dtype) and applies the
    optimizer to their mean on the 4th; a counter (`<opt>.accum_count`) says which call it
    is. The optimizer's step count and lr schedule advance once per update. Row gradients are
refused (a dense sum would touch every row): accumulate their dense gradient instead.

    `step(grads, where=cond)`: a call with cond false changes nothing (the micro-batch is
    dropped, the counter does not move); graphopt.amp uses it to drop an overflowed one.
    """

    def __init__(self, opt: Optimizer, steps: int):
        if not isinstance(opt, Optimizer):
            raise OptimizerError(f"Accumulate wraps a graphopt optimizer, got "
                                 f"{type(opt).__name__}")
        if not isinstance(steps, (int, np.integer)) or steps < 1:
            raise OptimizerError(f"Accumulate: steps must be an integer >= 1, got {steps!r}")
        self.opt, self.steps = opt, int(steps)
        self.count = Parameter(np.int64(0), name=f"{opt.name}.accum_count")
        self.accum = [Parameter.full(s.param.shape, 0, s.compute, name=f"{s.param.name}.grad_accum",
                                     offset=memory.offset_after(s.param._value,
                                                                len(s.state) + 1))
                      for s in opt._slots]
        _SUMMED.update((id(p), self) for p in opt.params)

    @property
    def params(self) -> list[Parameter]:
        """The wrapped optimizer's parameters: the order of a gradient sequence."""
        return self.opt.params

    @property
    def param_groups(self) -> list[Any]:
        """The wrapped optimizer's parameter groups."""
        return self.opt.param_groups

    def step(self, grads: Sequence[Any] | Mapping[str, Any], where: Any = None) -> Tensor:
        """Accumulate one micro-batch; update on the k-th. Returns the bool scalar "the
        optimizer updated the parameters on this call"."""
        grads = self.opt.check_grads(grads)
        for s, g in zip(self.opt._slots, grads):
            if isinstance(g, Rows):  # a dense sum of rows would update every row
                raise OptimizerError(
                    f"Accumulate.step: the gradient of '{s.param.name}' is a row gradient; "
                    f"Accumulate keeps a dense sum per parameter, which would make the update "
                    f"touch every row. Accumulate its dense gradient (g.dense()), or step the "
                    f"optimizer on each micro-batch's rows")
        where = check_condition(where, "Accumulate.step")
        count = self.count + 1
        ready = count == self.steps
        if where is not None:
            ready = ready & where
        sums = [acc + as_dtype(g, acc.dtype) for acc, g in zip(self.accum, grads)]
        parallel = getattr(current_trace(), "parallel", None)
        if parallel is None:
            totals = sums
        else:  # each rank summed its own gradients: their average, on the k-th call only
            totals = [parallel.reduce(total, when=ready, every=self.steps) for total in sums]
            parallel.summed(self)
        self.opt.step([total / float(self.steps) for total in totals], where=ready)
        for acc, total in zip(self.accum, sums):
            assign(acc, _unless_dropped(where, ops.where(ready, 0.0, total), acc))
        assign(self.count, _unless_dropped(where, ops.where(ready, 0, count), self.count))
        return ready

    def parameters(self) -> list[Parameter]:
        """Every Parameter to checkpoint: the optimizer's, the counter and the sums."""
        return self.opt.parameters() + [self.count] + self.accum

    def check_loaded(self, values: Mapping[str, np.ndarray]) -> None:
        """Values a checkpoint would load (by name): the optimizer's, and a counter in
        [0, steps)."""
        self.opt.check_loaded(values)
        check_count(values, self.count, below=self.steps)


# id of a Parameter -> the Accumulate that sums its gradients (which keeps it alive).
_SUMMED: weakref.WeakValueDictionary[int, Accumulate] = weakref.WeakValueDictionary()


def accumulating(param: Any) -> Accumulate | None:
    """The Accumulate that sums `param`'s gradients, if one does: under data parallelism
    they are reduced by it, once per update, not by value_and_grad."""
    return _SUMMED.get(id(param))


def _unless_dropped(where: Any, new: Any, old: Parameter) -> Any:
    return new if where is None else ops.where(where, new, old)

