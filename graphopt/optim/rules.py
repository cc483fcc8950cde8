"""Pieces of update rules that several optimizers share, written as torch writes them.

The order of operations follows torch's kernels, so an f32 run rounds where torch rounds:
`exp_avg.lerp_(g, w)` is `m + w·(g − m)`, `v.mul_(β).addcmul_(g, g, value=1−β)` is
`v·β + ((1−β)·g)·g`, `p.add_(g, alpha=λ)` is `p + λ·g`.
"""
from __future__ import annotations

from typing import Any

from .. import ops
from ..frontend.tensor import Tensor


def lerp(avg: Tensor, x: Tensor, weight: Any) -> Tensor:
    """avg + weight·(x − avg): torch's `avg.lerp_(x, weight)` (for weights below 0.5, the
    case of 1 − β1), the exponential moving average of Adam's first moment."""
    return avg + weight * (x - avg)


def ema(avg: Tensor, x: Tensor, beta: Any, one_minus_beta: Any) -> Tensor:
    """avg·β + (1 − β)·x: torch's `avg.mul_(β).add_(x, alpha=1 − β)`."""
    return avg * beta + one_minus_beta * x


def ema_sq(avg: Tensor, g: Tensor, beta: Any, one_minus_beta: Any) -> Tensor:
    """avg·β + (1 − β)·g²: torch's `avg.mul_(β).addcmul_(g, g, value=1 − β)`."""
    return avg * beta + one_minus_beta * g * g


def l2_norm(x: Tensor) -> Tensor:
    """‖x‖₂ over every element, a scalar of x's dtype."""
    return ops.sqrt(ops.sum(x * x))


def moment_scalars(h: Any) -> dict[str, Any]:
    """β1, β2, 1 − β1 and 1 − β2 of a group (f64), for the moving averages."""
    return {"beta1": h.beta1, "beta2": h.beta2, "one_minus_beta1": 1 - h.beta1,
            "one_minus_beta2": 1 - h.beta2}


def decay_scalars(h: Any, decoupled: bool) -> dict[str, Any]:
    """What `weight_decay` reads: λ, or the decoupled factor 1 − lr·λ (AdamW's
    `p.mul_(1 - lr * weight_decay)`, computed in f64 as torch computes it in Python)."""
    if decoupled:
        return {"decay_factor": 1 - h.lr * h.weight_decay}
    return {"weight_decay": h.weight_decay}


def weight_decay(p: Tensor, g: Tensor, c: Any, decoupled: bool) -> tuple[Tensor, Tensor]:
    """(p, g) after weight decay λ: decoupled (AdamW) shrinks the parameter,
    p ← p·(1 − lr·λ); coupled (torch's default) adds λ·p to the gradient, g ← g + λ·p."""
    if decoupled:
        return p * c.decay_factor, g
    return p, g + c.weight_decay * p
