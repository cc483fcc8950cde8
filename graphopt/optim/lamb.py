"""LAMB: Adam's direction, scaled per tensor by a trust ratio (beyond torch.optim)."""
from __future__ import annotations

from typing import Any

from .. import ops
from .adam import ADAM_OPTIONS, Moments
from .groups import ParamGroup
from .optimizer import Hyper, Scalars, Slot
from .rules import moment_scalars


class LAMB(Moments):
    """LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2), as
    MindSpore's nn.Lamb computes it, without its clip of the trust ratio to [0, 10].

        m ← m + (1 − β1)·(g − m);   v ← β2·v + (1 − β2)·g²
        r = (m / (1 − β1ᵗ)) / (√(v / (1 − β2ᵗ)) + eps) + λ·p
        q = ‖p‖ / ‖r‖  if both norms are > 0, else 1        (per tensor: the trust ratio)
        p ← p − lr·q·r

    No torch.optim counterpart (apex's FusedLAMB and timm's Lamb are close relatives).
    State: `<param>.exp_avg`, `.exp_avg_sq`. Other keyword arguments: see `Optimizer`.
    """

    options = ADAM_OPTIONS

    def __init__(self, params: Any, lr: Any = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, *, maximize: bool = False,
                 **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize), **kwargs)

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        return {**moment_scalars(h), "lr": h.lr, "eps": h.eps, "weight_decay": h.weight_decay,
                "bias1": 1 - h.beta1 ** h.t, "bias2": 1 - h.beta2 ** h.t}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p = self.read(s)
        m, v = self.moments(s, g, c)
        r = (m / c.bias1) / (ops.sqrt(v / c.bias2) + c.eps) + c.weight_decay * p
        p_norm, r_norm = s.norm(p), s.norm(r)
        trust = ops.where((p_norm > 0) & (r_norm > 0), p_norm / r_norm, 1.0)
        self.write(s, p - c.lr * trust * r)
