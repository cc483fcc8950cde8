"""The Adam family: Adam (amsgrad), AdamW, NAdam, Adamax (torch.optim's formulas).

Each keeps an exponential moving average of the gradient (`exp_avg`, m) and of its square
or its infinity norm, with bias corrections 1 − βᵗ computed in f64 once per group and step.
`state_dtype=bf16` stores those averages in half the bytes (see `Optimizer`).
"""
from __future__ import annotations

from typing import Any

from .. import ops
from .groups import ParamGroup, betas, flag, nonneg
from .optimizer import COMMON_OPTIONS, Hyper, Optimizer, Scalars, Slot
from .rules import decay_scalars, ema_sq, lerp, moment_scalars, weight_decay

ADAM_OPTIONS = {"lr": nonneg(), "betas": betas(), "eps": nonneg(), "weight_decay": nonneg(),
                **COMMON_OPTIONS}


class Moments(Optimizer):
    """What Adam, NAdam and LAMB share: the two moving averages of the gradient,
    `<param>.exp_avg` (m) and `<param>.exp_avg_sq` (v)."""

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        return {"exp_avg": 0.0, "exp_avg_sq": 0.0}

    def moments(self, s: Slot, g: Any, c: Scalars) -> tuple[Any, Any]:
        """m ← m + (1 − β1)·(g − m) and v ← β2·v + (1 − β2)·g², stored; returns (m, v)."""
        m = lerp(self.read_state(s, "exp_avg"), g, c.one_minus_beta1)
        v = ema_sq(self.read_state(s, "exp_avg_sq"), g, c.beta2, c.one_minus_beta2)
        self.write_state(s, "exp_avg", m)
        self.write_state(s, "exp_avg_sq", v)
        return m, v


class Adam(Moments):
    """Adam (torch.optim.Adam, same arguments and defaults).

        g ← g + λ·p                    (or, decoupled_weight_decay: p ← p·(1 − lr·λ))
        m ← m + (1 − β1)·(g − m)
        v ← β2·v + (1 − β2)·g²
        v̂ ← max(v̂, v)                  amsgrad (the denominator uses v̂ instead of v)
        p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + eps)

    t counts steps from 1. State: `<param>.exp_avg`, `.exp_avg_sq`, `.max_exp_avg_sq`
    (amsgrad). Other keyword arguments (name, state_dtype, master_weights): see `Optimizer`.
    """

    options = {**ADAM_OPTIONS, "amsgrad": flag(), "decoupled_weight_decay": flag()}

    def __init__(self, params: Any, lr: Any = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 maximize: bool = False, decoupled_weight_decay: bool = False, **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize,
                                      decoupled_weight_decay=decoupled_weight_decay), **kwargs)

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        return super().init_state(group) | ({"max_exp_avg_sq": 0.0} if group["amsgrad"] else {})

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        # torch: step_size = lr / bias_correction1; bias_correction2 ** 0.5 (pow, as torch).
        return {**moment_scalars(h), **decay_scalars(h, group["decoupled_weight_decay"]),
                "eps": h.eps, "step_size": h.lr / (1 - h.beta1 ** h.t),
                "bias2_sqrt": (1 - h.beta2 ** h.t) ** 0.5}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g = weight_decay(self.read(s), g, c, s.group["decoupled_weight_decay"])
        m, v = self.moments(s, g, c)
        if "max_exp_avg_sq" in s.state:
            v = ops.maximum(self.read_state(s, "max_exp_avg_sq"), v)
            self.write_state(s, "max_exp_avg_sq", v)
        denom = ops.sqrt(v) / c.bias2_sqrt + c.eps
        self.write(s, p - c.step_size * m / denom)


class AdamW(Adam):
    """AdamW (torch.optim.AdamW): Adam with decoupled weight decay, default λ = 0.01.

        p ← p·(1 − lr·λ), then Adam's update without λ in the gradient.

    It is `Adam(..., decoupled_weight_decay=True)`, as in torch.
    """

    def __init__(self, params: Any, lr: Any = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, **kwargs: Any):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True, **kwargs)


class NAdam(Moments):
    """NAdam: Adam with Nesterov momentum (torch.optim.NAdam, same arguments and defaults).

        g ← g + λ·p                    (or, decoupled_weight_decay: p ← p·(1 − lr·λ))
        μₜ = β1·(1 − ½·0.96^(t·ψ)),  μₜ₊₁ likewise,  Πₜ = μ₁···μₜ     momentum_decay ψ
        m ← m + (1 − β1)·(g − m);   v ← β2·v + (1 − β2)·g²
        d = √(v / (1 − β2ᵗ)) + eps
        p ← p − lr·(1 − μₜ)/(1 − Πₜ) · g/d − lr·μₜ₊₁/(1 − Πₜ·μₜ₊₁) · m/d

    State: `<param>.exp_avg`, `.exp_avg_sq`, and Πₜ per group (`<name>.group<i>.mu_product`,
    f64; torch keeps it per parameter, in the default float dtype).
    """

    options = {**ADAM_OPTIONS, "momentum_decay": nonneg(), "decoupled_weight_decay": flag()}

    def __init__(self, params: Any, lr: Any = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, maximize: bool = False,
                 **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay, maximize=maximize,
                                      decoupled_weight_decay=decoupled_weight_decay), **kwargs)

    def init_group_state(self, group: ParamGroup) -> dict[str, float]:
        return {"mu_product": 1.0}

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        b1, psi = h.beta1, h.momentum_decay
        mu = b1 * (1.0 - 0.5 * 0.96 ** (h.t * psi))
        mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((h.t + 1) * psi))
        state = self.group_state[group.index]["mu_product"]
        mu_product = state * mu
        self._write(state, mu_product)
        return {**moment_scalars(h), **decay_scalars(h, group["decoupled_weight_decay"]),
                "eps": h.eps, "bias2": 1 - h.beta2 ** h.t,
                "grad_coef": h.lr * (1.0 - mu) / (1.0 - mu_product),
                "avg_coef": h.lr * mu_next / (1.0 - mu_product * mu_next)}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g = weight_decay(self.read(s), g, c, s.group["decoupled_weight_decay"])
        m, v = self.moments(s, g, c)
        denom = ops.sqrt(v / c.bias2) + c.eps
        self.write(s, p - c.grad_coef * g / denom - c.avg_coef * m / denom)


class Adamax(Optimizer):
    """Adamax: Adam with the infinity norm (torch.optim.Adamax, same arguments and defaults).

        g ← g + λ·p
        m ← m + (1 − β1)·(g − m)
        u ← max(β2·u, |g| + eps)
        p ← p − (lr / (1 − β1ᵗ)) · m / u

    State: `<param>.exp_avg`, `.exp_inf`.
    """

    options = ADAM_OPTIONS

    def __init__(self, params: Any, lr: Any = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, maximize: bool = False,
                 **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize), **kwargs)

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        return {"exp_avg": 0.0, "exp_inf": 0.0}

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        return {"one_minus_beta1": 1 - h.beta1, "beta2": h.beta2, "eps": h.eps,
                **decay_scalars(h, False), "clr": h.lr / (1 - h.beta1 ** h.t)}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g = weight_decay(self.read(s), g, c, decoupled=False)
        m = lerp(self.read_state(s, "exp_avg"), g, c.one_minus_beta1)
        u = ops.maximum(self.read_state(s, "exp_inf") * c.beta2, ops.abs(g) + c.eps)
        self.write_state(s, "exp_avg", m)
        self.write_state(s, "exp_inf", u)
        self.write(s, p - c.clr * m / u)
