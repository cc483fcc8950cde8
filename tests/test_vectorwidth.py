"""The vector width explain and the listing show (backends/llvm/vectorwidth.py) is the one
LLVM's vectorizer gives the kernel's loop: checked against the optimised IR at each CPU level
(not for f16, where LLVM may take more lanes on its own, as vectorwidth.py says)."""
import io
import re

import numpy as np
import pytest

import graphopt as go
from graphopt import ops
from graphopt.backends.llvm.target import selected
from graphopt.backends.llvm.vectorwidth import kernel_vector_width

LLVM_NAMES = {"f32": "float", "f64": "double", "i32": "i32", "i64": "i64"}
CASES = {  # a step, its argument's dtype
    "f32 map": (lambda x: ops.exp(x) * 2 + 1, np.float32),
    "f64 map": (lambda x: ops.tanh(x) * x, np.float64),
    "f32 bias gradient (adds in f64)": (lambda x: x.reshape(64, 64).sum(axis=0), np.float32),
    "f32 sum": (lambda x: (x * x).sum(), np.float32),
    "i32 map": (lambda x: x * 3 + 1, np.int32),
}


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_predicted_width_is_the_compiled_one(case):
    fn, dtype = CASES[case]
    exe = go.jit(fn, backend="llvm", cache=False).lower(np.ones(4096, dtype))
    (kernel,) = exe.program.kernels
    width = kernel_vector_width(kernel.node)
    assert width.target == str(selected())
    vector = f"<{width.lanes} x {LLVM_NAMES[width.element]}>"
    assert re.search(rf"= \w+ (nsw |nuw |reassoc )*{vector}", kernel.optimized()), (case, vector)
    assert f"vector width {width}" in exe.program.listing("llvm").splitlines()[1]  # (after the target's)


def test_widths_follow_the_target_and_the_widest_type():
    from graphopt import envvars
    from graphopt.errors import TargetError
    exe = go.jit(CASES["f32 bias gradient (adds in f64)"][0], backend="llvm", cache=False).lower(
        np.ones(4096, np.float32))
    (kernel,) = exe.program.kernels
    with envvars.override(GRAPHOPT_CPU="x86-64"):
        try:
            assert str(kernel_vector_width(kernel.node)) == "2 x f64 at x86-64"
        except TargetError as e:
            pytest.skip(str(e))
    with envvars.override(GRAPHOPT_CPU="x86-64-v3"):
        try:
            assert str(kernel_vector_width(kernel.node)) == "4 x f64 at x86-64-v3"
        except TargetError as e:
            pytest.skip(str(e))


def test_explain_shows_each_kernels_vector_width_without_compiling():
    from graphopt import envvars
    from graphopt.errors import TargetError
    out = io.StringIO()
    with envvars.override(GRAPHOPT_CPU="x86-64-v3"):
        try:
            selected()
        except TargetError as e:
            pytest.skip(str(e))
        go.explain(lambda x: ops.exp(x) * 2, np.ones(16, np.float32), out=out)
    text = out.getvalue()
    # the kernel as the printed result names it (it keeps the name of what it fused)
    name = re.search(r"(%\w+) = kernel", text.split("=== result")[1]).group(1)
    assert f"=== vector width of {name} = kernel: 8 x f32 at x86-64-v3" in text
