"""SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD)."""
from __future__ import annotations

from typing import Any

from .. import ops
from ..errors import OptimizerError
from .groups import ParamGroup, flag, nonneg, real
from .optimizer import COMMON_OPTIONS, DENSE, ROWS, Hyper, Optimizer, Scalars, Slot
from .rules import decay_scalars, weight_decay


def check_momentum_structure(group: ParamGroup, new: dict[str, Any],
                             old: dict[str, Any] | None) -> None:
    """momentum = 0 means "no momentum buffer" (torch's rule), so it may not cross zero
    once the optimizer is built: the buffer exists or not in the compiled step."""
    if old is not None and (old["momentum"] == 0) != (new["momentum"] == 0):
        raise OptimizerError(f"{group.label}: momentum cannot change from {old['momentum']} "
                             f"to {new['momentum']}: whether it is 0 decides if a momentum "
                             f"buffer exists; build a new optimizer")


class SGD(Optimizer):
    """Stochastic gradient descent (torch.optim.SGD, same arguments and defaults).

        g ← g + λ·p                                   weight_decay λ
        b ← g  on the first step,  else  μ·b + (1 − τ)·g     momentum μ, dampening τ
        g ← g + μ·b  if nesterov,  else  b            (only when μ ≠ 0)
        p ← p − lr·g

    State: `<param>.momentum_buffer` when momentum ≠ 0 (at construction).
    Other keyword arguments (name, state_dtype, master_weights): see `Optimizer`.

    A row gradient, without momentum, updates the rows it touches (coalesced; torch adds
    repeated rows one by one, and refuses weight decay, which graphopt adds on those rows).
    With momentum it is made dense first: the buffer moves every row it ever saw at every
    step, as torch's sparse buffer does, so the step reads and writes the whole table.
    """

    options = {"lr": nonneg(), "momentum": nonneg(), "dampening": real(),
               "weight_decay": nonneg(), "nesterov": flag(), **COMMON_OPTIONS}
    gradient_kinds = (DENSE, ROWS)

    def __init__(self, params: Any, lr: Any = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 *, maximize: bool = False, **kwargs: Any):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize), **kwargs)

    def check_group(self, group: ParamGroup, new: dict[str, Any],
                    old: dict[str, Any] | None) -> None:
        if new["nesterov"] and (new["momentum"] <= 0 or new["dampening"] != 0):
            raise OptimizerError(f"{group.label}: Nesterov momentum requires a momentum "
                                 f"and zero dampening")
        check_momentum_structure(group, new, old)

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        return {"momentum_buffer": 0.0} if group["momentum"] != 0 else {}

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        c = {"lr": h.lr, **decay_scalars(h, False)}
        if group["momentum"] != 0:
            c.update(momentum=h.momentum, one_minus_dampening=1 - h.dampening, first=h.t == 1)
        return c

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g = weight_decay(self.read(s), g, c, decoupled=False)
        if "momentum_buffer" in s.state:
            # torch starts the buffer as a copy of the first gradient, not from zero.
            buf = self.read_state(s, "momentum_buffer")
            buf = ops.where(c.first, g, buf * c.momentum + c.one_minus_dampening * g)
            self.write_state(s, "momentum_buffer", buf)
            g = g + c.momentum * buf if s.group.flag("nesterov") else buf
        self.write(s, p - c.lr * g)

    update_rows = update  # (without momentum: densifies_rows holds with one)

    def densifies_rows(self, slot: Slot) -> bool:
        return "momentum_buffer" in slot.state
