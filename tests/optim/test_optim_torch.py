"""The same runs as test_optim_reference.py, against torch.optim itself (CPU, single-tensor
code path). Skipped when torch is not installed (`pip install torch==2.13.0`)."""
import numpy as np
import pytest

from optim_reference import problem
from test_optim_reference import CASES, IDS, run_graphopt

torch = pytest.importorskip("torch")

TORCH_CASES = [(k, o) for k, o in CASES if k not in ("LAMB", "Lion")]  # not in torch.optim
TORCH_IDS = [i for i, (k, _) in zip(IDS, CASES) if k not in ("LAMB", "Lion")]
# The largest |graphopt - torch| / max|torch| after 50 steps, per dtype. f64 differs from
# torch only by the rounding of a few f64 scalars (pow, division order); f32 by the same,
# plus NAdam's mu_product, which torch keeps in f32 (graphopt: f64).
RTOL = {np.float64: 1e-12, np.float32: 1e-6}


def run_torch(kind, options, params0, grads, dtype):
    default = torch.get_default_dtype()
    # torch keeps scalar state (step, NAdam's mu_product) in the default dtype.
    torch.set_default_dtype(torch.float64 if dtype == np.float64 else torch.float32)
    try:
        params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params0]
        opt = getattr(torch.optim, kind)(params, foreach=False, **options)
        for gs in grads:
            for p, g in zip(params, gs):
                p.grad = torch.from_numpy(g.copy())
            opt.step()
    finally:
        torch.set_default_dtype(default)
    return [p.detach().numpy() for p in params]


@pytest.mark.parametrize("kind, options", TORCH_CASES, ids=TORCH_IDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_matches_torch(kind, options, dtype):
    params0, grads = problem(3, dtype)
    got = run_graphopt(kind, options, params0, grads, "jit")
    want = run_torch(kind, options, params0, grads, dtype)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert np.abs(g - w).max() <= RTOL[dtype] * np.abs(w).max()
