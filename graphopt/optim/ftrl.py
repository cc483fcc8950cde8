"""FTRL-proximal (McMahan et al. 2013), as Keras 3's `Ftrl` and TF's `ApplyFtrlV2` compute
it, for dense gradients and row gradients (the touched rows only)."""
from __future__ import annotations

from typing import Any

from .. import ops
from .groups import INIT, Option, ParamGroup, nonneg
from .optimizer import COMMON_OPTIONS, DENSE, ROWS, Hyper, Optimizer, Scalars, Slot


class FTRL(Optimizer):
    """FTRL-proximal: Keras 3's `Ftrl` (learning_rate, learning_rate_power,
    initial_accumulator_value, l1/l2/l2_shrinkage_regularization_strength, beta) under
    shorter names. Per element, with the accumulator n and the linear term z:

        g̃ = g + 2·l2_shrinkage·w
        n' = n + g²
        z ← z + g̃ − (n'^−lr_power − n^−lr_power)/lr · w
        w ← (clip(z, −l1, l1) − z) / (n'^−lr_power/lr + 2·l2 + beta/lr)
        n ← n'

    A row gradient updates the touched rows' n, z and w only (Keras makes it dense, which
    sets every untouched row's w to its z's value). State: `<param>.accumulator` (starts at
    initial_accumulator_value), `.linear` (starts at 0). Other keyword arguments: see
    `Optimizer`.
    """

    options = {"lr": nonneg(), "lr_power": Option(rule="<= 0", check=lambda x: x <= 0),
               "initial_accumulator_value": Option(kind=INIT), "l1": nonneg(),
               "l2": nonneg(), "l2_shrinkage": nonneg(), "beta": nonneg(), **COMMON_OPTIONS}
    gradient_kinds = (DENSE, ROWS)

    def __init__(self, params: Any, lr: Any = 1e-3, lr_power: float = -0.5,
                 initial_accumulator_value: float = 0.1, l1: float = 0.0, l2: float = 0.0,
                 l2_shrinkage: float = 0.0, beta: float = 0.0, *, maximize: bool = False,
                 **kwargs: Any):
        super().__init__(params, dict(lr=lr, lr_power=lr_power,
                                      initial_accumulator_value=initial_accumulator_value,
                                      l1=l1, l2=l2, l2_shrinkage=l2_shrinkage, beta=beta,
                                      maximize=maximize), **kwargs)

    def init_state(self, group: ParamGroup) -> dict[str, float]:
        return {"accumulator": group["initial_accumulator_value"], "linear": 0.0}

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        # Keras: l2 + beta / (2 lr), doubled in the quadratic term
        return {"lr": h.lr, "neg_lr_power": -h.lr_power, "l1": h.l1, "neg_l1": -h.l1,
                "two_l2_shrinkage": 2 * h.l2_shrinkage, "two_l2": 2 * (h.l2 + h.beta / (2 * h.lr))}

    def update(self, s: Slot, g: Any, c: Scalars) -> None:
        w = self.read(s)
        n, z = self.read_state(s, "accumulator"), self.read_state(s, "linear")
        shrunk = g + c.two_l2_shrinkage * w
        n_new = n + g * g
        power_new = ops.power(n_new, c.neg_lr_power)
        z = z + (shrunk - (power_new - ops.power(n, c.neg_lr_power)) / c.lr * w)
        quadratic = power_new / c.lr + c.two_l2
        self.write_state(s, "accumulator", n_new)
        self.write_state(s, "linear", z)
        self.write(s, (ops.minimum(ops.maximum(z, c.neg_l1), c.l1) - z) / quadratic)

    update_rows = update  # one rule: on rows, read and write touch only the gradient's rows
