"""Adam for embedding tables: SparseAdam (torch.optim.SparseAdam) and LazyAdam (MindSpore's
nn.LazyAdam), which update only the rows a row gradient touches.

Both keep Adam's two moving averages, written as torch's SparseAdam writes them, and add ε
to √v before the bias correction (TF's and MindSpore's Adam; torch.optim.Adam adds it
after):

    m ← m + (1 − β1)·(g − m)
    v ← v + (1 − β2)·(g² − v)
    p ← p − lr·√(1 − β2ᵗ)/(1 − β1ᵗ) · m/(√v + ε)

on the rows of the coalesced gradient only: an untouched row keeps its m, v and p bit for
bit, so a row's moments lag by the steps it was not seen ("lazy").
"""
from __future__ import annotations

from typing import Any

from .. import ops
from .adam import ADAM_OPTIONS, Moments
from .groups import ParamGroup, betas, flag, nonneg
from .optimizer import COMMON_OPTIONS, DENSE, ROWS, Hyper, Scalars, Slot
from .rules import moment_scalars, weight_decay


def _scalars(h: Hyper) -> dict[str, Any]:
    """β's, ε and the step size lr·√(1 − β2ᵗ)/(1 − β1ᵗ), in f64 as torch's Python floats."""
    return {**moment_scalars(h), "eps": h.eps,
            "step_size": h.lr * ops.sqrt(1 - h.beta2 ** h.t) / (1 - h.beta1 ** h.t)}


def _moments(opt: Moments, s: Slot, g: Any, c: Scalars) -> tuple[Any, Any]:
    """m and v updated as torch's SparseAdam computes them (an update added to the old
    value), stored; returns (m, v)."""
    m0, v0 = opt.read_state(s, "exp_avg"), opt.read_state(s, "exp_avg_sq")
    m = m0 + (g - m0) * c.one_minus_beta1
    v = v0 + (g * g - v0) * c.one_minus_beta2
    opt.write_state(s, "exp_avg", m)
    opt.write_state(s, "exp_avg_sq", v)
    return m, v


class SparseAdam(Moments):
    """SparseAdam (torch.optim.SparseAdam, same arguments and defaults): Adam on the rows a
    row gradient touches; dense gradients are refused, as torch refuses them.

        m ← m + (1 − β1)·(g − m),   v ← v + (1 − β2)·(g² − v)        touched rows only
        p ← p − lr·√(1 − β2ᵗ)/(1 − β1ᵗ) · m/(√v + ε)

    g is the coalesced gradient (repeated rows summed). t counts the optimizer's steps, which
    is torch's count per parameter: every parameter gets a gradient at every step. State:
    `<param>.exp_avg`, `.exp_avg_sq`. Other keyword arguments: see `Optimizer`.
    """

    options = {"lr": nonneg(), "betas": betas(), "eps": nonneg(), **COMMON_OPTIONS}
    gradient_kinds = (ROWS,)

    def __init__(self, params: Any, lr: Any = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, *, maximize: bool = False, **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize), **kwargs)

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        return _scalars(h)

    def update_rows(self, s: Slot, g: Any, c: Scalars) -> None:
        p = self.read(s)
        m, v = _moments(self, s, g, c)
        self.write(s, p - c.step_size * (m / (ops.sqrt(v) + c.eps)))


class LazyAdam(Moments):
    """LazyAdam (MindSpore's nn.LazyAdam): SparseAdam's update, with Nesterov momentum and
    weight decay, for row gradients (touched rows only) and dense ones (every element: Adam
    as MindSpore's and TF's Adam compute it).

        g ← g + λ·p                                   weight_decay λ, touched rows only
        m ← m + (1 − β1)·(g − m),   v ← v + (1 − β2)·(g² − v)
        d ← β1·m + (1 − β1)·g  if use_nesterov,  else  m
        p ← p − lr·√(1 − β2ᵗ)/(1 − β1ᵗ) · d/(√v + ε)

    With row gradients, λ·p is added once per touched row, after repeated rows are summed
    (MindSpore adds it to each repeated row before). State: `<param>.exp_avg`,
    `.exp_avg_sq`. Other keyword arguments: see `Optimizer`.
    """

    options = {**ADAM_OPTIONS, "use_nesterov": flag()}
    gradient_kinds = (DENSE, ROWS)

    def __init__(self, params: Any, lr: Any = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, use_nesterov: bool = False, *,
                 maximize: bool = False, **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      use_nesterov=use_nesterov, maximize=maximize), **kwargs)

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        return {**_scalars(h), "weight_decay": h.weight_decay}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g = weight_decay(self.read(s), g, c, decoupled=False)
        m, v = _moments(self, s, g, c)
        d = m * c.beta1 + c.one_minus_beta1 * g if s.group.flag("use_nesterov") else m
        self.write(s, p - c.step_size * (d / (ops.sqrt(v) + c.eps)))

    update_rows = update  # one rule: on rows, read and write touch only the gradient's rows
