"""Adagrad and RMSprop: per-element step sizes from accumulated squared gradients
(torch.optim.Adagrad, torch.optim.RMSprop)."""
from __future__ import annotations

from typing import Any

from .. import ops
from .groups import INIT, Option, ParamGroup, flag, nonneg
from .optimizer import COMMON_OPTIONS, DENSE, ROWS, Hyper, Optimizer, Scalars, Slot
from .rules import decay_scalars, ema_sq, lerp, weight_decay
from .sgd import check_momentum_structure


class Adagrad(Optimizer):
    """Adagrad (torch.optim.Adagrad, same arguments and defaults).

        g ← g + λ·p                          weight_decay λ
        s ← s + g²                           s starts at initial_accumulator_value
        p ← p − lr_t · g / (√s + eps),       lr_t = lr / (1 + (t − 1)·lr_decay)

    A row gradient updates the rows it touches, as torch's sparse Adagrad does
    (p ← p − lr_t · (g / (√s + eps)), g coalesced); torch refuses weight decay there, graphopt
    adds λ·p on the touched rows. State: `<param>.sum`. Other keyword arguments: see
    `Optimizer`.
    """

    options = {"lr": nonneg(), "lr_decay": nonneg(), "weight_decay": nonneg(),
               "initial_accumulator_value": Option(kind=INIT), "eps": nonneg(),
               **COMMON_OPTIONS}
    gradient_kinds = (DENSE, ROWS)

    def __init__(self, params: Any, lr: Any = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, *, maximize: bool = False, **kwargs: Any):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps, maximize=maximize), **kwargs)

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        return {"sum": group["initial_accumulator_value"]}

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        return {"clr": h.lr / (1 + (h.t - 1) * h.lr_decay), "eps": h.eps,
                **decay_scalars(h, False)}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g, std = self._accumulate(s, g, c)
        self.write(s, p - c.clr * g / std)

    def update_rows(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g, std = self._accumulate(s, g, c)
        self.write(s, p - c.clr * (g / std))  # torch's sparse branch divides first

    def _accumulate(self, s: Slot, g: Any, c: Scalars) -> tuple[Any, Any, Any]:
        """(p, g, √s + eps) after weight decay and s ← s + g² (stored)."""
        p, g = weight_decay(self.read(s), g, c, decoupled=False)
        total = self.read_state(s, "sum") + g * g
        self.write_state(s, "sum", total)
        return p, g, ops.sqrt(total) + c.eps


class RMSprop(Optimizer):
    """RMSprop (torch.optim.RMSprop, same arguments and defaults).

        g ← g + λ·p                                  weight_decay λ
        v ← α·v + (1 − α)·g²
        a ← a + (1 − α)·(g − a);   d ← √(v − a²) + eps    centered
        d ← √v + eps                                  otherwise
        b ← μ·b + g / d;       p ← p − lr·b           momentum μ > 0
        p ← p − lr · g / d                            otherwise

    State: `<param>.square_avg`, `.grad_avg` (centered), `.momentum_buffer` (momentum > 0 at
    construction). Other keyword arguments: see `Optimizer`.
    """

    options = {"lr": nonneg(), "alpha": nonneg(), "eps": nonneg(), "weight_decay": nonneg(),
               "momentum": nonneg(), "centered": flag(), **COMMON_OPTIONS}

    def __init__(self, params: Any, lr: Any = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 *, maximize: bool = False, **kwargs: Any):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered,
                                      maximize=maximize), **kwargs)

    def check_group(self, group: ParamGroup, new: dict[str, Any],
                    old: dict[str, Any] | None) -> None:
        check_momentum_structure(group, new, old)

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        state = {"square_avg": 0.0}
        if group["centered"]:
            state["grad_avg"] = 0.0
        if group["momentum"] != 0:
            state["momentum_buffer"] = 0.0
        return state

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        return {"lr": h.lr, "alpha": h.alpha, "one_minus_alpha": 1 - h.alpha, "eps": h.eps,
                "momentum": h.momentum, **decay_scalars(h, False)}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g = weight_decay(self.read(s), g, c, decoupled=False)
        v = ema_sq(self.read_state(s, "square_avg"), g, c.alpha, c.one_minus_alpha)
        self.write_state(s, "square_avg", v)
        if "grad_avg" in s.state:
            a = lerp(self.read_state(s, "grad_avg"), g, c.one_minus_alpha)
            self.write_state(s, "grad_avg", a)
            v = v - a * a
        denom = ops.sqrt(v) + c.eps
        if "momentum_buffer" in s.state:
            buf = self.read_state(s, "momentum_buffer") * c.momentum + g / denom
            self.write_state(s, "momentum_buffer", buf)
            self.write(s, p - c.lr * buf)
        else:
            self.write(s, p - c.lr * g / denom)
