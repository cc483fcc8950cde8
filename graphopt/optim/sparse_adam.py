"""Adam for embedding tables: SparseAdam (torch.optim.SparseAdam) and LazyAdam (MindSpore's
nn.LazyAdam), which update only the rows a row gradient touches.

Both keep Adam's two moving averages, written as torch's SparseAdam writes them, and add ε
to √v before the bias correction (TF's and MindSpore's Adam; torch.optim.Adam adds it
after):

    m ← m + (1 − β1)·(g − m)
    v ← v + (1 − β2)·(g² − v)
    p ← p − lr·√(1 − β2ᵗ)/(1 − β1ᵗ) · m/(√v + ε)

on the rows of the coalesced gradient only: an untouched row keeps its m, v and p bit for
bit, so a row's moments lag by the steps it was not seen ("lazy"). With `per_row_step=True`
the bias corrections use each row's own count of updates instead of the optimizer's step
count t (the fix proposed for LazyAdam's slower convergence on rare rows): a state
`<param>.row_step` holds it, and the step size is computed per element, in the compute dtype.
"""
from __future__ import annotations

from typing import Any

from .. import ops
from ..errors import OptimizerError
from .adam import ADAM_OPTIONS, Moments
from .groups import ParamGroup, betas, flag, nonneg
from .optimizer import COMMON_OPTIONS, DENSE, ROWS, Hyper, Scalars, Slot
from .rules import moment_scalars, weight_decay


class _RowSteps(Moments):
    """What SparseAdam and LazyAdam share: their scalars, and per_row_step's count."""

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        return super().init_state(group) | ({"row_step": 0.0} if group["per_row_step"] else {})

    def check_group(self, group: ParamGroup, new: dict[str, Any],
                    old: dict[str, Any] | None) -> None:
        if new["per_row_step"] and self.state_dtype is not None and \
                self.state_dtype.itemsize < 4:
            raise OptimizerError(f"{group.label}: per_row_step counts in the state dtype, "
                                 f"{self.state_dtype}, which holds only small integers "
                                 f"exactly: use state_dtype f32 or f64")

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        """β's, ε and the step size lr·√(1 − β2ᵗ)/(1 − β1ᵗ), in f64 as torch's Python
        floats; lr, for per_row_step's per-row step size."""
        return {**moment_scalars(h), "eps": h.eps, "lr": h.lr,
                "step_size": h.lr * ops.sqrt(1 - h.beta2 ** h.t) / (1 - h.beta1 ** h.t)}

    def step_size(self, s: Slot, c: Scalars) -> Any:
        """The step size: the group's, or, with per_row_step, from each row's count."""
        if "row_step" not in s.state:
            return c.step_size
        t = self.read_state(s, "row_step") + 1
        self.write_state(s, "row_step", t)
        return c.lr * ops.sqrt(1 - c.beta2 ** t) / (1 - c.beta1 ** t)


def _moments(opt: Moments, s: Slot, g: Any, c: Scalars) -> tuple[Any, Any]:
    """m and v updated as torch's SparseAdam computes them (an update added to the old
    value), stored; returns (m, v)."""
    m0, v0 = opt.read_state(s, "exp_avg"), opt.read_state(s, "exp_avg_sq")
    m = m0 + (g - m0) * c.one_minus_beta1
    v = v0 + (g * g - v0) * c.one_minus_beta2
    opt.write_state(s, "exp_avg", m)
    opt.write_state(s, "exp_avg_sq", v)
    return m, v


class SparseAdam(_RowSteps):
    """SparseAdam (torch.optim.SparseAdam, same arguments and defaults): Adam on the rows a
    row gradient touches; dense gradients are refused, as torch refuses them.

        m ← m + (1 − β1)·(g − m),   v ← v + (1 − β2)·(g² − v)        touched rows only
        p ← p − lr·√(1 − β2ᵗ)/(1 − β1ᵗ) · m/(√v + ε)

    g is the coalesced gradient (repeated rows summed). t counts the optimizer's steps, which
    is torch's count per parameter: every parameter gets a gradient at every step;
    `per_row_step=True` counts each row's updates instead (the module's docstring). State:
    `<param>.exp_avg`, `.exp_avg_sq` (and `.row_step`). Other keyword arguments: see
    `Optimizer`.
    """

    options = {"lr": nonneg(), "betas": betas(), "eps": nonneg(), "per_row_step": flag(),
               **COMMON_OPTIONS}
    gradient_kinds = (ROWS,)

    def __init__(self, params: Any, lr: Any = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, *, maximize: bool = False, per_row_step: bool = False,
                 **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize,
                                      per_row_step=per_row_step), **kwargs)

    def update_rows(self, s: Slot, g: Any, c: Scalars) -> None:
        p = self.read(s)
        m, v = _moments(self, s, g, c)
        self.write(s, p - self.step_size(s, c) * (m / (ops.sqrt(v) + c.eps)))


class LazyAdam(_RowSteps):
    """LazyAdam (MindSpore's nn.LazyAdam): SparseAdam's update, with Nesterov momentum and
    weight decay, for row gradients (touched rows only) and dense ones (every element: Adam
    as MindSpore's and TF's Adam compute it).

        g ← g + λ·p                                   weight_decay λ, touched rows only
        m ← m + (1 − β1)·(g − m),   v ← v + (1 − β2)·(g² − v)
        d ← β1·m + (1 − β1)·g  if use_nesterov,  else  m
        p ← p − lr·√(1 − β2ᵗ)/(1 − β1ᵗ) · d/(√v + ε)

    With row gradients, λ·p is added once per touched row, after repeated rows are summed
    (MindSpore adds it to each repeated row before). `per_row_step=True`: as SparseAdam's.
    State: `<param>.exp_avg`, `.exp_avg_sq` (and `.row_step`). Other keyword arguments: see
    `Optimizer`.
    """

    options = {**ADAM_OPTIONS, "use_nesterov": flag(), "per_row_step": flag()}
    gradient_kinds = (DENSE, ROWS)

    def __init__(self, params: Any, lr: Any = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, use_nesterov: bool = False, *,
                 maximize: bool = False, per_row_step: bool = False, **kwargs: Any):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      use_nesterov=use_nesterov, maximize=maximize,
                                      per_row_step=per_row_step), **kwargs)

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        return {**super().scalars(group, h), "weight_decay": h.weight_decay}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        p, g = weight_decay(self.read(s), g, c, decoupled=False)
        m, v = _moments(self, s, g, c)
        d = m * c.beta1 + c.one_minus_beta1 * g if s.group.flag("use_nesterov") else m
        self.write(s, p - self.step_size(s, c) * (d / (ops.sqrt(v) + c.eps)))

    update_rows = update  # one rule: on rows, read and write touch only the gradient's rows
