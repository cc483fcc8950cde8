"""The LLVM backend's inline f32 exp, log, log1p and tanh (backends/llvm/mathfns.py), and the
ops made of them: within the ulp bounds docs/llvm.md states, exact at the special values, the
same bits at every CPU level, vectorized, and gelu's tanh computed once forward and back."""
import re

import numpy as np
import pytest
from llvmlite import ir

import graphopt as go
from graphopt import envvars, ops
from graphopt.backends.llvm import engine, mathfns
from graphopt.backends.llvm.target import selected

# Max error in ulp of the correctly rounded f32 result, as docs/llvm.md states them (measured:
# one less, over every 61st f32 and the ranges below).
BOUND = {"exp": 2, "log": 2, "log1p": 3, "tanh": 2, "sigmoid": 3, "softplus": 4}
REFERENCE = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "tanh": np.tanh,
             "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "softplus": lambda x: np.logaddexp(0, x)}
F32_MAX, TINY, LEAST = np.finfo(np.float32).max, np.finfo(np.float32).tiny, 2.0 ** -149
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, LEAST, -LEAST,
                    TINY, -TINY, TINY / 2, F32_MAX, -F32_MAX, 88.72283, 88.72284, 89.0, 100.0,
                    -87.33654, -87.33655, -103.97207, -103.97208, -104.0, -1000.0, 1e-30,
                    -1e-30, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -25, 0.625, -0.625, 9.0, 10.0,
                    -10.0, 44.0, 45.0, -0.99999994, -1.0000001, 0.99999994, 1.0000001],
                   np.float32)


def sweep(name: str) -> np.ndarray:
    """Every 4099th f32 (all signs and exponents, NaNs included), the special values, and
    where each function is hardest, every 2^-k step or every f32."""
    every = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    consecutive = lambda lo, hi: np.arange(  # noqa: E731  every f32 in [lo, hi), lo, hi > 0
        np.float32(lo).view(np.uint32), np.float32(hi).view(np.uint32),
        dtype=np.uint32).view(np.float32)
    dense = {
        "exp": [np.arange(-104.0, 89.0, 2.0 ** -12), consecutive(88.0, 88.8)],
        "log": [consecutive(1 - 2.0 ** -8, 1 + 2.0 ** -8), np.arange(2.0 ** -8, 8, 2.0 ** -14),
                consecutive(LEAST, 2.0 ** -140)],
        "log1p": [np.arange(-1.0, 8.0, 2.0 ** -14), np.geomspace(2.0 ** -30, 1, 100000),
                  -np.geomspace(2.0 ** -30, 1, 100000)],
        "tanh": [np.arange(-10.0, 10.0, 2.0 ** -14), consecutive(0.6, 0.65),
                 -consecutive(0.6, 0.65), np.geomspace(2.0 ** -30, 0.625, 100000),
                 -np.geomspace(2.0 ** -30, 0.625, 100000)],
        "sigmoid": [np.arange(-90.0, 20.0, 2.0 ** -12)],
        "softplus": [np.arange(-90.0, 20.0, 2.0 ** -12)],
    }[name]
    return np.concatenate([every, SPECIAL] + [d.astype(np.float32) for d in dense])


def reference(name: str, x: np.ndarray) -> np.ndarray:
    """The correctly rounded f32 result (f64 is accurate enough to round from)."""
    with np.errstate(all="ignore"):
        return REFERENCE[name](x.astype(np.float64)).astype(np.float32)


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """How many f32 apart (NaN and NaN: 0 apart; NaN and a number: very far)."""
    def ordered(a):
        b = a.view(np.int32).astype(np.int64)
        return np.where(b < 0, -0x80000000 - b, b)
    d = np.abs(ordered(got) - ordered(want))
    d[np.isnan(got) & np.isnan(want)] = 0
    d[np.isnan(got) ^ np.isnan(want)] = 1 << 40
    return d


def check(name: str, x: np.ndarray, got: np.ndarray) -> None:
    want = reference(name, x)
    d = ulps(got, want)
    worst = int(np.argmax(d))
    assert d.max() <= BOUND[name], (name, x[worst], got[worst], want[worst], int(d.max()))
    # Exact: a zero or infinite result (its sign too), and any result of +-0 or +-inf.
    exact = (want == 0) | np.isinf(want) | (x == 0) | np.isinf(x)
    np.testing.assert_array_equal(got[exact].view(np.uint32), want[exact].view(np.uint32))
    assert (np.isnan(got) == np.isnan(want)).all()


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid", "softplus"])
def test_compiled_f32_functions_are_within_their_stated_ulp(name):
    x = sweep(name)
    fn = go.jit(getattr(ops, name), backend="llvm", cache=False)
    check(name, x, fn(x))


def compiled_mathfn(name: str):
    """A native loop y[i] = mathfns.<name>(x[i]) (log1p has no op of its own: softplus
    uses it), compiled for the selected target."""
    import ctypes
    module = ir.Module(name=f"mathfn_{name}")
    ptr, i64 = ir.PointerType(), ir.IntType(64)
    symbol = f"graphopt_test_{name}"
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), symbol)
    x, y, n = fn.args
    entry, body, done = (fn.append_basic_block(s) for s in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    v = b.load(b.gep(x, [i], source_etype=mathfns.F32), typ=mathfns.F32)
    b.store(mathfns.FUNCTIONS[name](b, v), b.gep(y, [i], source_etype=mathfns.F32))
    step = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(step, body)
    b.cbranch(b.icmp_signed("<", step, n), body, done)
    b.position_at_end(done)
    b.ret_void()
    target = selected()
    (address,) = engine.load(engine.compile_module(module, target).object_code, (symbol,),
                             target)
    native = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)

    def apply(a: np.ndarray) -> np.ndarray:
        a = np.ascontiguousarray(a, np.float32)
        out = np.empty_like(a)
        native(a.ctypes.data, out.ctypes.data, a.size)
        return out
    return apply


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("name", sorted(mathfns.FUNCTIONS))
def test_each_inline_function_is_within_its_stated_ulp(name):
    x = sweep(name)
    check(name, x, compiled_mathfn(name)(x))


def test_the_same_bits_at_every_cpu_level():
    """Plain IEEE instructions, no fused multiply-add: the level changes the vector width only."""
    from support import CPU_LEVELS
    from graphopt.errors import TargetError
    x = np.concatenate([sweep("exp"), sweep("log"), sweep("tanh")])
    fn = go.jit(lambda x: ops.tanh(x) + ops.exp(x) * ops.log(x), backend="llvm", cache=False)
    results = []
    for level in CPU_LEVELS:
        with envvars.override(GRAPHOPT_CPU=level):
            try:
                selected()
            except TargetError:
                continue
            with np.errstate(all="ignore"):
                results.append(fn(x).view(np.uint32))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


@pytest.mark.parametrize("op", ["exp", "log", "tanh", "sigmoid", "softplus", "gelu"])
def test_transcendental_kernels_vectorize_with_no_calls(op):
    """At x86-64-v3 (AVX2): <8 x float> arithmetic, and no call to the C library in the loop."""
    with envvars.override(GRAPHOPT_CPU="x86-64-v3"):
        try:
            selected()
        except go.errors.TargetError as e:
            pytest.skip(str(e))
        exe = go.jit(getattr(ops, op), cache=False).lower(np.ones(4096, np.float32))
        text = exe.llvm_ir()
        listing = exe.program.listing("llvm")
    assert re.search(r"= f(mul|add|sub|div) <8 x float>", text)
    calls = set(re.findall(r"call [^@]*@([\w.]+)", text))
    assert all(c.startswith("llvm.") for c in calls), calls
    assert "widest vector <8 x float>" in listing.splitlines()[0]


def test_gelu_forward_and_backward_compute_tanh_once():
    """The VJP builds tanh's argument op for op as the forward does (opdefs.gelu_inner): the
    kernel's body holds one tanh node besides gelu, and LLVM merges it with gelu's own, so the
    optimised kernel has as many divisions (tanh has one, nothing else in gelu's or its
    gradient's formula any) as the forward alone."""
    x = np.linspace(-4, 4, 4096, dtype=np.float32)
    both = go.jit(go.value_and_grad(lambda x: ops.gelu(x).sum()), cache=False).lower(x)
    (kernel,) = [n for n in both.graph.nodes if n.op == "kernel"]
    ops_in_body = [n.op for n in kernel.body.nodes]
    assert ops_in_body.count("tanh") == 1 and ops_in_body.count("gelu") == 1
    forward = go.jit(lambda x: ops.gelu(x).sum(), cache=False).lower(x)
    divisions = lambda exe: len(re.findall(r"= fdiv ", exe.llvm_ir()))  # noqa: E731
    assert divisions(both) == divisions(forward) > 0
