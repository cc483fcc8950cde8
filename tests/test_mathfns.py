"""The LLVM backend's inline f32 and f64 exp, log, log1p and tanh (backends/llvm/mathfns.py),
and the ops made of them: within the ulp bounds docs/llvm.md states, exact at the special
values, the same bits at every CPU level, vectorized, and gelu's tanh computed once forward
and back."""
import re

import numpy as np
import pytest
from llvmlite import ir

import graphopt as go
from graphopt import envvars, ops
from graphopt.backends.llvm import engine, mathfns
from graphopt.backends.llvm.target import selected

# Max error in ulp of the correctly rounded result, as docs/llvm.md states them (measured:
# one less, over the sweeps below).
BOUND = {np.float32: {"exp": 2, "log": 2, "log1p": 3, "tanh": 2, "sigmoid": 3, "softplus": 4},
         np.float64: {"exp": 2, "log": 2, "log1p": 3, "tanh": 2, "sigmoid": 3, "softplus": 3}}
REFERENCE = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "tanh": np.tanh,
             "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "softplus": lambda x: np.logaddexp(0, x)}
# The reference is computed in the next wider type and rounded: f64 for f32; for f64, x86's
# 80-bit long double (11 more bits; test_the_f64_reference_is_correctly_rounded checks it
# against mpmath).
WIDER = {np.float32: np.float64, np.float64: np.longdouble}
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


def sweep64(name: str) -> np.ndarray:
    """f64: 2^19 random bit patterns (all signs and exponents, NaNs included), the special
    values, and 2^18 to 2^20 random values of each range where the function is hardest."""
    rng = np.random.default_rng(14)
    uniform = lambda lo, hi, n=1 << 20: rng.uniform(lo, hi, n)  # noqa: E731
    geometric = lambda lo, hi, n=1 << 18: np.exp(uniform(np.log(lo), np.log(hi), n))  # noqa: E731
    dense = {
        "exp": [uniform(-746.0, 710.0), uniform(700.0, 709.8), uniform(-746.0, -700.0)],
        "log": [uniform(1 - 2.0 ** -8, 1 + 2.0 ** -8), uniform(2.0 ** -8, 8),
                rng.integers(1, 1 << 52, 1 << 18, dtype=np.uint64).view(np.float64)],
        "log1p": [uniform(-1.0, 8.0), geometric(2.0 ** -60, 1), -geometric(2.0 ** -60, 1)],
        "tanh": [uniform(-20.0, 20.0), uniform(0.6, 0.65), uniform(-0.65, -0.6),
                 geometric(2.0 ** -60, 0.625), -geometric(2.0 ** -60, 0.625)],
        "sigmoid": [uniform(-750.0, 40.0)],
        "softplus": [uniform(-750.0, 40.0)],
    }[name]
    bits = rng.integers(0, 1 << 64, 1 << 19, dtype=np.uint64, endpoint=False).view(np.float64)
    return np.concatenate([bits, SPECIAL64] + dense)


SPECIAL64 = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 5e-324, -5e-324,
                      2.0 ** -1022, -(2.0 ** -1022), 2.0 ** -1023, 1.7976931348623157e308,
                      -1.7976931348623157e308, 709.782712893384, 709.7827128933841, 710.0,
                      1000.0, -708.3964185322641, -708.3964185322642, -745.1332191019411,
                      -745.1332191019412, -746.0, -1000.0, 1e-300, -1e-300, 2.0 ** -53,
                      -(2.0 ** -53), 2.0 ** -54, 0.625, -0.625, 19.0, 20.0, -20.0,
                      1 - 2.0 ** -53, 1 + 2.0 ** -52, -1 + 2.0 ** -53, -1 - 2.0 ** -52])


SWEEP = {np.float32: sweep, np.float64: sweep64}


def reference(name: str, x: np.ndarray) -> np.ndarray:
    """The correctly rounded result, from the next wider type."""
    with np.errstate(all="ignore"):
        return REFERENCE[name](x.astype(WIDER[x.dtype.type])).astype(x.dtype)


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """How many floats apart (NaN and NaN: 0 apart; NaN and a number: very far)."""
    width = got.dtype.itemsize * 8

    def ordered(v):  # the bits as an unsigned number in the floats' order (-0 next to +0)
        u = v.view(f"u{width // 8}").astype(np.uint64)
        negative = u >> np.uint64(width - 1) == 1
        top = np.uint64((1 << width) - 1)
        return np.where(negative, top - u, u + np.uint64(1 << (width - 1)))
    g, w = ordered(got), ordered(want)
    d = np.where(g > w, g - w, w - g).astype(np.float64)
    d[np.isnan(got) & np.isnan(want)] = 0
    d[np.isnan(got) ^ np.isnan(want)] = 2.0 ** 62
    return d


def check(name: str, x: np.ndarray, got: np.ndarray) -> None:
    want = reference(name, x)
    d = ulps(got, want)
    worst = int(np.argmax(d))
    assert d.max() <= BOUND[x.dtype.type][name], (name, x[worst], got[worst], want[worst],
                                                  d.max())
    # Exact: a zero or infinite result (its sign too), and any result of +-0 or +-inf that is
    # a number (a NaN's sign is no part of it: log(-inf) is the CPU's default NaN in numpy's
    # SIMD code on AVX-512, sign bit set, and a positive NaN in ours; isnan is checked below).
    exact = ((want == 0) | np.isinf(want) | (x == 0) | np.isinf(x)) & ~np.isnan(want)
    unsigned = {4: np.uint32, 8: np.uint64}[x.dtype.itemsize]
    np.testing.assert_array_equal(got[exact].view(unsigned), want[exact].view(unsigned))
    assert (np.isnan(got) == np.isnan(want)).all()


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid", "softplus"])
def test_compiled_functions_are_within_their_stated_ulp(name, dtype):
    x = SWEEP[dtype](name)
    fn = go.jit(getattr(ops, name), backend="llvm", cache=False)
    check(name, x, fn(x))


def compiled_mathfn(name: str, dtype=np.float32):
    """A native loop y[i] = mathfns.<name>(x[i]) of dtype (log1p has no op of its own:
    softplus uses it), compiled for the selected target."""
    import ctypes
    t = {np.float32: mathfns.F32, np.float64: mathfns.F64}[dtype]
    module = ir.Module(name=f"mathfn_{name}")
    ptr, i64 = ir.PointerType(), ir.IntType(64)
    symbol = f"graphopt_test_{name}_{t}"
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), symbol)
    x, y, n = fn.args
    entry, body, done = (fn.append_basic_block(s) for s in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    v = b.load(b.gep(x, [i], source_etype=t), typ=t)
    b.store(mathfns.FUNCTIONS[name](b, v), b.gep(y, [i], source_etype=t))
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
        a = np.ascontiguousarray(a, dtype)
        out = np.empty_like(a)
        native(a.ctypes.data, out.ctypes.data, a.size)
        return out
    return apply


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(mathfns.FUNCTIONS))
def test_each_inline_function_is_within_its_stated_ulp(name, dtype):
    x = SWEEP[dtype](name)
    check(name, x, compiled_mathfn(name, dtype)(x))


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_f64_reference_is_correctly_rounded(name):
    """The long double reference rounds to mpmath's correctly rounded f64 at 3000 points of
    the sweep (it may be one off where its own rounding and f64's make a double rounding)."""
    mpmath = pytest.importorskip("mpmath", reason="mpmath checks the long double reference")
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("long double is no wider than f64 here: the f64 reference would be wrong")
    mpmath.mp.prec = 200
    exact = {"exp": mpmath.exp, "log": mpmath.log, "log1p": mpmath.log1p, "tanh": mpmath.tanh,
             "sigmoid": lambda v: 1 / (1 + mpmath.exp(-v)),
             "softplus": lambda v: mpmath.log1p(mpmath.exp(v))}[name]
    x = np.random.default_rng(3).choice(sweep64(name), 3000)
    x = x[np.isfinite(x) & (x > (-1 if name == "log1p" else 0 if name == "log" else -np.inf))]
    want = np.array([float(exact(mpmath.mpf(float(v)))) for v in x])
    assert ulps(reference(name, x), want).max() <= 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_same_bits_at_every_cpu_level(dtype):
    """Plain IEEE instructions, no fused multiply-add: the level changes the vector width only."""
    from support import CPU_LEVELS
    from graphopt.errors import TargetError
    x = np.concatenate([SWEEP[dtype](n) for n in ("exp", "log", "tanh")])
    fn = go.jit(lambda x: ops.tanh(x) + ops.exp(x) * ops.log(x), backend="llvm", cache=False)
    results = []
    for level in CPU_LEVELS:
        with envvars.override(GRAPHOPT_CPU=level):
            try:
                selected()
            except TargetError:
                continue
            with np.errstate(all="ignore"):
                results.append(fn(x).view(f"u{x.itemsize}"))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


@pytest.mark.parametrize("dtype, vector", [(np.float32, "<8 x float>"),
                                           (np.float64, "<4 x double>")])
@pytest.mark.parametrize("op", ["exp", "log", "tanh", "sigmoid", "softplus", "gelu"])
def test_transcendental_kernels_vectorize_with_no_calls(op, dtype, vector):
    """At x86-64-v3 (AVX2): <8 x float> or <4 x double> arithmetic, and no call to the C
    library in the loop."""
    with envvars.override(GRAPHOPT_CPU="x86-64-v3"):
        try:
            selected()
        except go.errors.TargetError as e:
            pytest.skip(str(e))
        exe = go.jit(getattr(ops, op), cache=False).lower(np.ones(4096, dtype))
        text = exe.llvm_ir()
        listing = exe.program.listing("llvm")
    assert re.search(rf"= f(mul|add|sub|div) {vector}", text)
    calls = set(re.findall(r"call [^@]*@([\w.]+)", text))
    assert all(c.startswith("llvm.") for c in calls), calls
    assert f"widest vector {vector}" in listing.splitlines()[1]  # (after the target's line)


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
