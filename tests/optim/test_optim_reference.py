"""Every optimizer and option set, 50 steps, against the plain-numpy reference of torch's
formula (optim_reference.py): f64 to 1e-12 under jit (interpreter and LLVM backends) and in
eager mode, f32 under jit."""
import numpy as np
import pytest

import graphopt as go
from graphopt import optim
from optim_reference import Reference, problem

CASES = [
    ("SGD", {}),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.5, maximize=True)),
    ("Adagrad", {}),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1,
                     eps=1e-6)),
    ("RMSprop", {}),
    ("RMSprop", dict(centered=True)),
    ("RMSprop", dict(momentum=0.5)),
    ("RMSprop", dict(alpha=0.9, momentum=0.9, centered=True, weight_decay=0.01)),
    ("Adam", {}),
    ("Adam", dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.01, amsgrad=True)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)),
    ("AdamW", {}),
    ("AdamW", dict(lr=1e-2, weight_decay=0.1, amsgrad=True, maximize=True)),
    ("NAdam", {}),
    ("NAdam", dict(weight_decay=0.01, momentum_decay=0.01)),
    ("NAdam", dict(weight_decay=0.01, decoupled_weight_decay=True)),
    ("Adamax", {}),
    ("Adamax", dict(weight_decay=0.01, betas=(0.8, 0.9))),
    ("LAMB", {}),
    ("LAMB", dict(lr=1e-2, weight_decay=0.01)),
    ("Lion", {}),
    ("Lion", dict(lr=1e-3, betas=(0.95, 0.98), weight_decay=0.1)),
]
IDS = [f"{k}-{i}" for i, (k, _) in enumerate(CASES)]

# f32: the largest |graphopt - reference| / max|reference| after 50 steps.
F32_RTOL = 1e-6


def run_graphopt(kind, options, params0, grads, mode):
    """mode: "jit" (interpreter), "llvm" (jit, compiled kernels) or "eager"."""
    params = [go.Parameter(p, name=f"layer.p{i}") for i, p in enumerate(params0)]
    opt = getattr(optim, kind)(params, **options)
    if mode == "eager":
        step = opt.step
    else:
        step = go.jit(opt.step, **({"backend": "llvm", "cache": False} if mode == "llvm" else {}))
    for gs in grads:
        step(gs)
    if mode != "eager":
        assert step.cache_info().traces == 1
    return [p.numpy() for p in params]


def run_reference(kind, options, params0, grads):
    ref = Reference(kind, [p.copy() for p in params0], **options)
    for gs in grads:
        ref.step(gs)
    return ref.params


@pytest.mark.parametrize("kind, options", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["jit", "eager", "llvm"])
def test_f64_matches_reference(kind, options, mode):
    params0, grads = problem(1, np.float64)
    got = run_graphopt(kind, options, params0, grads, mode)
    want = run_reference(kind, options, params0, grads)
    for g, w in zip(got, want):
        assert not np.array_equal(w, params0[0]) and np.isfinite(w).all()
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind, options", CASES, ids=IDS)
def test_f32_matches_reference(kind, options):
    params0, grads = problem(2, np.float32)
    got = run_graphopt(kind, options, params0, grads, "jit")
    want = run_reference(kind, options, params0, grads)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        assert np.abs(g - w).max() <= F32_RTOL * np.abs(w).max()
