"""Plain-numpy reference implementations of the update rules, written from torch.optim's
single-tensor code paths (torch 2.13: `_single_tensor_adam` and friends) and, for LAMB and
Lion, from their papers' reference implementations. Nothing here imports graphopt.optim.

torch passes hyper-parameters as Python floats; a kernel converts such a scalar to the
tensor's dtype where it meets a tensor. `S(x)` below does that conversion, so an f32
reference rounds where torch rounds. Operations are written in torch's order
(`p.addcdiv_(m, d, value=-s)` is `p + (-s·m)/d`).
"""
from __future__ import annotations

import math

import numpy as np


class Reference:
    """One optimizer over a list of numpy parameters (updated in place by `step`)."""

    def __init__(self, kind: str, params: list[np.ndarray], **options):
        self.kind, self.params = kind, params
        self.o = {**DEFAULTS[kind], **options}
        self.state = [dict() for _ in params]
        self.t = 0
        self.mu_product = 1.0

    def step(self, grads: list[np.ndarray], lr: float | None = None) -> None:
        self.t += 1
        o = dict(self.o) if lr is None else {**self.o, "lr": lr}
        if self.kind == "NAdam":  # shared by the group (torch: per parameter, same value)
            psi, b1 = o["momentum_decay"], o["betas"][0]
            o["mu"] = b1 * (1.0 - 0.5 * 0.96 ** (self.t * psi))
            o["mu_next"] = b1 * (1.0 - 0.5 * 0.96 ** ((self.t + 1) * psi))
            self.mu_product *= o["mu"]
            o["mu_product"] = self.mu_product
        for i, (p, g) in enumerate(zip(self.params, grads)):
            g = -g if o.get("maximize") else g
            self.params[i] = RULES[self.kind](p, g.astype(p.dtype), self.state[i], float(self.t),
                                              o)


def S(x: float, like: np.ndarray):
    return like.dtype.type(x)


def sgd(p, g, st, t, o):
    lr, mom, damp, wd = o["lr"], o["momentum"], o["dampening"], o["weight_decay"]
    g = g + S(wd, p) * p
    if mom != 0:
        if "buf" not in st:
            st["buf"] = g.copy()
        else:
            st["buf"] = st["buf"] * S(mom, p) + S(1 - damp, p) * g
        g = g + S(mom, p) * st["buf"] if o["nesterov"] else st["buf"]
    return p + S(-lr, p) * g


def adagrad(p, g, st, t, o):
    g = g + S(o["weight_decay"], p) * p
    clr = o["lr"] / (1 + (t - 1) * o["lr_decay"])
    st.setdefault("sum", np.full_like(p, o["initial_accumulator_value"]))
    st["sum"] = st["sum"] + g * g
    std = np.sqrt(st["sum"]) + S(o["eps"], p)
    return p + S(-clr, p) * g / std


def rmsprop(p, g, st, t, o):
    alpha = o["alpha"]
    g = g + S(o["weight_decay"], p) * p
    sq = st.get("sq", np.zeros_like(p)) * S(alpha, p) + S(1 - alpha, p) * g * g
    st["sq"] = sq
    if o["centered"]:
        ga = st.get("ga", np.zeros_like(p))
        ga = ga + S(1 - alpha, p) * (g - ga)
        st["ga"] = ga
        avg = np.sqrt(sq + S(-1.0, p) * ga * ga)
    else:
        avg = np.sqrt(sq)
    avg = avg + S(o["eps"], p)
    if o["momentum"] > 0:
        st["buf"] = st.get("buf", np.zeros_like(p)) * S(o["momentum"], p) + g / avg
        return p + S(-o["lr"], p) * st["buf"]
    return p + S(-o["lr"], p) * g / avg


def _moments(p, g, st, o):
    b1, b2 = o["betas"]
    m = st.get("m", np.zeros_like(p))
    st["m"] = m + S(1 - b1, p) * (g - m)  # lerp_(g, 1 - b1)
    st["v"] = st.get("v", np.zeros_like(p)) * S(b2, p) + S(1 - b2, p) * g * g
    return st["m"], st["v"]


def _decay(p, g, o, decoupled):
    if decoupled:
        return p * S(1 - o["lr"] * o["weight_decay"], p), g
    return p, g + S(o["weight_decay"], p) * p


def adam(p, g, st, t, o):
    p, g = _decay(p, g, o, o["decoupled_weight_decay"])
    m, v = _moments(p, g, st, o)
    b1, b2 = o["betas"]
    step_size = o["lr"] / (1 - b1 ** t)
    bc2_sqrt = (1 - b2 ** t) ** 0.5
    if o["amsgrad"]:
        st["vmax"] = np.maximum(st.get("vmax", np.zeros_like(p)), v)
        v = st["vmax"]
    denom = np.sqrt(v) / S(bc2_sqrt, p) + S(o["eps"], p)
    return p + S(-step_size, p) * m / denom


def adamw(p, g, st, t, o):
    return adam(p, g, st, t, {**o, "decoupled_weight_decay": True})


def nadam(p, g, st, t, o):
    p, g = _decay(p, g, o, o["decoupled_weight_decay"])
    m, v = _moments(p, g, st, o)
    bc2 = 1 - o["betas"][1] ** t
    denom = np.sqrt(v / S(bc2, p)) + S(o["eps"], p)
    lr, mu, mu_next, prod = o["lr"], o["mu"], o["mu_next"], o["mu_product"]
    p = p + S(-lr * (1.0 - mu) / (1.0 - prod), p) * g / denom
    return p + S((-lr * mu_next) / (1.0 - prod * mu_next), p) * m / denom


def adamax(p, g, st, t, o):
    b1, b2 = o["betas"]
    g = g + S(o["weight_decay"], p) * p
    m = st.get("m", np.zeros_like(p))
    st["m"] = m + S(1 - b1, p) * (g - m)
    st["u"] = np.maximum(st.get("u", np.zeros_like(p)) * S(b2, p), np.abs(g) + S(o["eps"], p))
    clr = o["lr"] / (1 - b1 ** t)
    return p + S(-clr, p) * st["m"] / st["u"]


def lamb(p, g, st, t, o):
    b1, b2 = o["betas"]
    m, v = _moments(p, g, st, o)
    r = (m / S(1 - b1 ** t, p)) / (np.sqrt(v / S(1 - b2 ** t, p)) + S(o["eps"], p))
    r = r + S(o["weight_decay"], p) * p
    wn, rn = np.sqrt(np.sum(p * p)), np.sqrt(np.sum(r * r))
    trust = wn / rn if wn > 0 and rn > 0 else S(1.0, p)
    return p - S(o["lr"], p) * trust * r


def lion(p, g, st, t, o):
    b1, b2 = o["betas"]
    p = p * S(1 - o["lr"] * o["weight_decay"], p)
    m = st.get("m", np.zeros_like(p))
    update = np.sign(m * S(b1, p) + S(1 - b1, p) * g)
    st["m"] = m * S(b2, p) + S(1 - b2, p) * g
    return p + S(-o["lr"], p) * update


RULES = {"SGD": sgd, "Adagrad": adagrad, "RMSprop": rmsprop, "Adam": adam, "AdamW": adamw,
         "NAdam": nadam, "Adamax": adamax, "LAMB": lamb, "Lion": lion}

DEFAULTS = {
    "SGD": dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    "Adagrad": dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
                    eps=1e-10),
    "RMSprop": dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                    centered=False),
    "Adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
                 decoupled_weight_decay=False),
    "AdamW": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False),
    "NAdam": dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                  momentum_decay=4e-3, decoupled_weight_decay=False),
    "Adamax": dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    "LAMB": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0),
    "Lion": dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0),
}


# -- schedules: lr(k) for the k-th step (k = 0, 1, ...), the textbook formulas -------------
def warmup_cosine(k: int, base: float, warmup: int, total: int, lo: float = 0.0) -> float:
    if k < warmup:
        return base * k / warmup
    progress = min(k - warmup, total - warmup) / (total - warmup)
    return lo + (base - lo) * (1 + math.cos(math.pi * progress)) / 2


# -- problems: parameters and a sequence of gradients --------------------------------------
SHAPES = [(4, 3), (3,)]


def problem(seed: int, dtype, steps: int = 50):
    """Initial parameters and `steps` gradient lists, of varying scale (so amsgrad's max and
    Adamax's infinity norm matter), in dtype."""
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    grads = [[(rng.standard_normal(s) * (1.5 + math.sin(k))).astype(dtype) for s in SHAPES]
             for k in range(steps)]
    return params, grads
