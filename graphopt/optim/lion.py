"""Lion: the sign of an interpolated momentum (beyond torch.optim)."""
from __future__ import annotations

from typing import Any

from .. import ops
from .groups import ParamGroup, betas, nonneg
from .optimizer import COMMON_OPTIONS, Hyper, Optimizer, Scalars, Slot
from .rules import decay_scalars, ema, moment_scalars, weight_decay


class Lion(Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), as the
    reference implementation (lucidrains/lion-pytorch) computes it.

        p ← p·(1 − lr·λ)                            decoupled weight decay λ
        p ← p − lr · sign(β1·m + (1 − β1)·g)
        m ← β2·m + (1 − β2)·g

    Defaults lr=1e-4, betas=(0.9, 0.99), weight_decay=0. One state tensor, `<param>.exp_avg`,
    so with `state_dtype=bf16` a step moves the fewest bytes of any adaptive optimizer here.
    """

    options = {"lr": nonneg(), "betas": betas(), "weight_decay": nonneg(), **COMMON_OPTIONS}

    def __init__(self, params: Any, lr: Any = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, maximize: bool = False, **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay,
                                      maximize=maximize), **kwargs)

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        return {"exp_avg": 0.0}

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        return {**moment_scalars(h), **decay_scalars(h, True), "lr": h.lr}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, _ = weight_decay(self.read(s), g, c, decoupled=True)
        m = self.read_state(s, "exp_avg")
        direction = ops.sign(ema(m, g, c.beta1, c.one_minus_beta1))
        self.write(s, p - c.lr * direction)
        self.write_state(s, "exp_avg", ema(m, g, c.beta2, c.one_minus_beta2))
