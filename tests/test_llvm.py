"""The LLVM backend against the numpy interpreter (the reference), and its runtime's rules."""
import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import envvars, ops
from graphopt.backends.llvm import graphsink
from graphopt.backends.llvm.lowering import LOWERING
from graphopt.errors import ExecutionError, GraphoptError, SignatureError
from graphopt.ir import REGISTRY
from graphopt.ir.registry import ELEMENTWISE
from support import run_program

TOL = {np.float64: (1e-12, 1e-12), np.float32: (2e-5, 1e-6), np.float16: (4e-3, 1e-3)}


def twin_params(arrays):
    """Two independent sets of Parameters with the same names and values."""
    make = lambda: [go.Parameter(a, name=f"p{i}") for i, a in enumerate(arrays)]  # noqa: E731
    return make(), make()


def run_both(build, arrays, calls, **jit_options):
    """Run a step built over Parameters on both backends; return both runs' results."""
    results = []
    for backend, params in zip(("interpreter", "llvm"), twin_params(arrays)):
        fn = go.jit(build(params), backend=backend, cache=False, **jit_options)
        outs = [fn(*args) for args in calls]
        results.append((outs, [p.numpy() for p in params], fn))
    return results


def assert_close(a, b, dtype=np.float32):
    rtol, atol = TOL.get(dtype, (0, 0))
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.kind in "fc" or a.dtype.name == "bfloat16":
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol,
                                   atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(a, b)


# -- optimizer kernels --------------------------------------------------------------------------
def adam(params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
    n = len(params) // 3
    ws, ms, vs = params[:n], params[n:2 * n], params[2 * n:3 * n]
    t = go.Parameter(np.zeros((), ws[0].dtype.np_dtype), name="t")

    def step(grads):
        go.assign(t, t + 1)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        for w, m, v, g in zip(ws, ms, vs, grads):
            if wd:
                go.assign(w, w * (1 - lr * wd))  # AdamW: decoupled decay, read again below
            go.assign(m, b1 * m + (1 - b1) * g)
            go.assign(v, b2 * v + (1 - b2) * g * g)
            go.assign(w, w - lr * (m / bc1) / (ops.sqrt(v / bc2) + eps))
        return ops.sqrt(sum((g * g).sum() for g in grads))
    return step


def sgd_momentum(params, lr=0.1, momentum=0.9, nesterov=True):
    n = len(params) // 2
    ws, bufs = params[:n], params[n:]

    def step(grads):
        for w, buf, g in zip(ws, bufs, grads):
            go.assign(buf, momentum * buf + g)
            go.assign(w, w - lr * ((g + momentum * buf) if nesterov else buf))
    return step


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", ["adam", "adamw", "sgd"])
def test_optimizer_kernels_match_the_interpreter(rule, dtype):
    rng = np.random.default_rng(1)
    shapes = [(64, 33), (33,), (7, 5, 3), (), (1000,)]
    weights = [rng.standard_normal(s).astype(dtype) for s in shapes]
    state = [np.zeros(s, dtype) for s in shapes] * (2 if rule != "sgd" else 1)
    build = {"adam": adam, "adamw": lambda p: adam(p, wd=0.01), "sgd": sgd_momentum}[rule]
    calls = [([rng.standard_normal(s).astype(dtype) for s in shapes],) for _ in range(10)]
    (o1, p1, _), (o2, p2, fn) = run_both(build, weights + state, calls)
    for a, b in zip(p1, p2):
        assert_close(a, b, dtype)
    for a, b in zip(o1, o2):
        assert_close(a, b, dtype)
    kernels = fn.lower(*calls[0]).kernels
    assert kernels and all(k.calls == 10 for k in kernels)


# -- random elementwise programs -------------------------------------------------------------
SPACE = (5, 7)
SHAPES = [(), (7,), (5, 1), SPACE]
SAFE_UNARY = [ops.negative, ops.abs, lambda x: ops.sqrt(ops.abs(x)), lambda x: ops.exp(-ops.abs(x)),
              lambda x: x * x, ops.sign, lambda x: x.astype(go.f64).astype(x.dtype)]
SAFE_BINARY = [ops.add, ops.subtract, ops.multiply, lambda x, y: x / (ops.abs(y) + 1),
               ops.maximum, ops.minimum]
programs = st.lists(st.tuples(st.sampled_from(["unary", "binary", "where", "sum", "max", "mean",
                                               "assign", "const", "partial_sum", "partial_max",
                                               "partial_mean"]),
                              st.integers(0, 99), st.integers(0, 99),
                              st.sampled_from([0.5, -2.0, 3.0, 0.0])),
                    min_size=1, max_size=12)


def random_step(prog):
    def build(params):
        return lambda a, b, c, d: run_program(prog, params, [a, b, c, d], SAFE_UNARY,
                                              SAFE_BINARY)
    return build


@pytest.mark.usefixtures("cpu_level")
@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # (the level is per test)
@given(prog=programs, seed=st.integers(0, 2**16), dtype=st.sampled_from([np.float32, np.float64]))
def test_random_programs_match_the_interpreter(prog, seed, dtype):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    calls = [tuple(rng.standard_normal(s).astype(dtype) for s in SHAPES) for _ in range(2)]
    (o1, p1, _), (o2, p2, _) = run_both(random_step(prog), params, calls)
    for r1, r2 in zip(o1, o2):
        for a, b in zip(r1, r2):
            assert_close(a, b, dtype)
    for a, b in zip(p1, p2):
        assert_close(a, b, dtype)


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64", "i32", "i64"])
def test_every_dtype_compiles_and_matches(dtype):
    d = go.ir.to_dtype(dtype)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 6)) * 8).astype(d.np_dtype)
    y = (rng.standard_normal((6,)) * 8 + 20).astype(d.np_dtype)

    def build(params):
        def step(x, y):
            z = ops.maximum(x, y) - x * 2 + ops.abs(y)
            flags = (z > 3) & ops.isfinite(z) | (x == y)
            go.assign(params[0], z)
            return z, ops.where(flags, z, x), z.sum(), z.max(), flags
        return step

    (o1, p1, _), (o2, p2, fn) = run_both(build, [np.zeros((4, 6), d.np_dtype)], [(x, y)])
    tol = {"f16": np.float16, "f32": np.float32, "f64": np.float64}.get(dtype)
    for a, b in zip(o1[0], o2[0]):
        if dtype == "bf16":
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                       rtol=2e-2, atol=0.5)
        else:
            assert_close(a, b, tol)
    assert fn.lower(x, y).kernels  # it really was compiled


@pytest.mark.usefixtures("cpu_level")
def test_broadcast_operands_take_strided_loops():
    rng = np.random.default_rng(3)
    x, row, col = (rng.standard_normal(s) for s in [(6, 5, 4), (4,), (5, 1)])

    def build(params):
        return lambda x, row, col: (x * row + col - 1.5, (x + row).sum())

    (o1, _, _), (o2, _, fn) = run_both(build, [np.zeros(1)], [(x, row, col)])
    for a, b in zip(o1[0], o2[0]):
        assert_close(a, b, np.float64)
    (k, *_) = fn.lower(x, row, col).kernels
    assert len(k.abi.instances[0].dims) >= 2  # a real nest: the operands broadcast


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("n", [1, 63, 64, 65, 1089, 300_001])
def test_flat_loops_prefetch_and_compute_every_unit_once(n, monkeypatch):
    """A flat loop runs in chunks of PREFETCH_CHUNK units, each prefetching its contiguous
    operands' lines PREFETCH_AHEAD units on (codegen.stream, past the end too): every unit is
    updated once however the sink's threads cut the units (claims of 997 units here, which
    no chunk divides), and a loop nest (an operand broadcast) is left unchunked."""
    from graphopt.backends.llvm import runtime
    monkeypatch.setenv("GRAPHOPT_THREADS", "2")
    monkeypatch.setattr(runtime, "CHUNK_ELEMENTS", 997)
    rng = np.random.default_rng(n)
    p0 = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float16)
    w = go.Parameter(p0.copy(), name="w")

    def step(g):
        go.assign(w, w * 0.5 + g.astype(np.float32))  # one rounding, as numpy makes it
        return (w * 2).sum()

    fn = go.jit(step, backend="llvm", cache=False)
    total = fn(g)
    expected = p0 * np.float32(0.5) + g.astype(np.float32)
    np.testing.assert_array_equal(w.numpy(), expected)  # a unit run twice: updated twice
    np.testing.assert_allclose(float(total), 2 * expected.astype(np.float64).sum(), rtol=1e-6)
    (k,) = fn.lower(g).kernels
    assert ("call void @llvm.prefetch" in k.optimized()) == (n > 1)  # one element: no loop
    row = np.ones(4, np.float32)
    (nest,) = go.jit(lambda x: x * row, backend="llvm", cache=False).lower(
        np.ones((8, 3, 4), np.float32)).kernels
    assert len(nest.abi.instances[0].dims) >= 2 and "llvm.prefetch" not in nest.optimized()


def _blocks_calling(ir_text: str, callee: str) -> list[str]:
    """The labels of the basic blocks of LLVM IR text that call `callee`, one per call."""
    found, block = [], None
    for line in ir_text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            block = line[:-1]
        elif f'call double @"{callee}"' in line:
            found.append(block)
    return found


def test_what_only_scalars_compute_is_computed_once_per_instance():
    """A multi-tensor Adam with bf16 state computes its bias corrections (pow of the step
    count and the betas: scalar operands) in its kernel. They are computed in each
    instance's prologue, before its chunked loop over units, not at every element (LLVM did
    not hoist the calls out of the chunks: one pair per 64 elements); the step is the
    interpreter's, bit for bit."""
    rng = np.random.default_rng(7)
    shapes = [(3000,), (200, 70), (5,)]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = {}
    for backend in ("llvm", "interpreter"):
        params = [go.Parameter(v, name=f"p{i}") for i, v in enumerate(values)]
        opt = go.optim.Adam(params, lr=1e-2, state_dtype="bf16")
        fn = go.jit(lambda g: opt.step(g), backend=backend, cache=False)
        for _ in range(3):
            fn(grads)
        got[backend] = [p.numpy() for p in params]
        if backend == "llvm":
            (update,) = [k for k in fn.lower(grads).kernels if len(k.abi.instances) == 3]
            assert _blocks_calling(update.ir_text, "pow") == ["instance", "instance"]
    for a, b in zip(got["llvm"], got["interpreter"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.usefixtures("cpu_level")
def test_reductions_are_deterministic_across_threads(monkeypatch):
    x = np.random.default_rng(4).standard_normal(3_000_000).astype(np.float32)
    step = lambda x: ((x * x).sum(), x.max(), (x * 0.5).mean())  # noqa: E731
    results = []
    for n in ("1", "2", "2"):
        monkeypatch.setenv("GRAPHOPT_THREADS", n)
        results.append([np.asarray(r) for r in go.jit(step, backend="llvm", cache=False)(x)])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert a.tobytes() == b.tobytes()  # the same bits, on any number of threads
    ref = [np.sum(x.astype(np.float64) ** 2), x.max(), np.mean(x.astype(np.float64) * 0.5)]
    np.testing.assert_allclose([float(r) for r in results[0]], ref, rtol=1e-5)


def masked_reductions(h, mask, axes):
    """A bias gradient's kernel: the masked cotangent (written too) and its sum, max and mean
    over the leading axes ("sum@k", "max@k", "mean@k" outputs of one kernel)."""
    g = ops.where(mask, h, h * 0)
    means = [g.mean(axis=axes)] if g.dtype.is_float else []  # (a float op)
    return (g * 2, g.sum(axis=axes), g.max(axis=axes), *means)


# Not multiples of any vector width; (4000, 67) is cut between two threads, (300, 67) is
# three blocks of rows; (1, 33): the reduced axis is of size 1; (3, 5, 129): two axes reduced.
LEADING_CASES = [((300, 67), (0,)), ((4000, 67), (0,)), ((3, 5, 129), (0, 1)), ((1, 33), (0,)),
                 ((7, 1), (0,)), ((2, 3, 4), (0,))]
# How far a sum over leading axes may be from the interpreter's, relative to the sum of |x|:
# the interpreter adds rows in the dtype (f16: in f32), the kernel in f64.
LEADING_TOL = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 2e-3}


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64])
def test_leading_axes_reductions_match_the_interpreter(dtype, threads, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_THREADS", threads)
    rng = np.random.default_rng(5)
    for shape, axes in LEADING_CASES:
        h = (rng.standard_normal(shape) * 4).astype(dtype)
        mask = rng.random(shape) < 0.6
        step = lambda h, m, axes=axes: masked_reductions(h, m, axes)  # noqa: E731
        ref = go.jit(step, backend="interpreter", cache=False)(h, mask)
        fn = go.jit(step, backend="llvm", cache=False)
        got = fn(h, mask)
        (k,) = fn.lower(h, mask).kernels  # one kernel computes all four
        assert sorted(k.node.attrs["outputs"]) == sorted(
            ["map"] + [f"{op}@{len(axes)}" for op in ("sum", "max", "mean")[:len(ref) - 1]])
        assert all(np.asarray(r).dtype == np.asarray(o).dtype and np.shape(r) == np.shape(o)
                   for r, o in zip(ref, got))
        assert np.asarray(ref[0]).tobytes() == np.asarray(got[0]).tobytes()  # the map
        assert np.asarray(ref[2]).tobytes() == np.asarray(got[2]).tobytes()  # max: exact
        if np.dtype(dtype).kind == "i":
            assert np.asarray(ref[1]).tobytes() == np.asarray(got[1]).tobytes()
            continue
        g = np.where(mask, h, 0).astype(np.float64)
        scale = np.abs(g).sum(axis=axes)
        count = np.prod([shape[a] for a in axes])
        for r, o, s in ((ref[1], got[1], scale), (ref[3], got[3], scale / count)):
            err = np.abs(np.asarray(r, np.float64) - np.asarray(o, np.float64))
            assert np.all(err <= LEADING_TOL[dtype] * s + np.finfo(dtype).tiny), (shape, err)
        if dtype == np.float64:
            continue
        # A 16/32-bit kernel's sum is the exact one rounded once (f64 adds these exactly
        # enough).
        exact = g.sum(axis=axes)
        np.testing.assert_allclose(np.asarray(got[1], np.float64), exact,
                                   rtol=np.finfo(dtype).eps, atol=np.finfo(dtype).tiny)


@pytest.mark.usefixtures("cpu_level")
def test_leading_axes_reductions_are_deterministic_across_threads(monkeypatch):
    """The blocks of rows are fixed (abi.BLOCK_ROWS at least): the same bits on one thread or
    two, run after run."""
    rng = np.random.default_rng(6)
    h = rng.standard_normal((6001, 77)).astype(np.float32)
    mask = rng.random(h.shape) < 0.5
    step = lambda h, m: masked_reductions(h, m, (0,))[1:]  # noqa: E731
    results = []
    for n in ("1", "2", "2"):
        monkeypatch.setenv("GRAPHOPT_THREADS", n)
        fn = go.jit(step, backend="llvm", cache=False)
        results.append([np.asarray(r).tobytes() for r in fn(h, mask)])
        if n == "2":
            assert len(fn.lower(h, mask).kernels[0].splits()) == 2
    assert results[0] == results[1] == results[2]


# -- the runtime's rules --------------------------------------------------------------------
def sgd_step(w):
    def step(g):
        go.assign(w, w - 0.1 * g)
    return step


@pytest.mark.parametrize("bad", ["shape", "dtype", "noncontiguous", "misaligned"])
def test_bad_arrays_never_reach_native_code(bad):
    w = go.Parameter(np.ones((8, 4), np.float32), name="w")
    exe = go.jit(sgd_step(w), backend="llvm", cache=False).lower(np.ones((8, 4), np.float32))
    before = w.numpy()
    if bad == "shape":
        g = np.ones((4, 8), np.float32)
    elif bad == "dtype":
        g = np.ones((8, 4), np.float64)
    elif bad == "noncontiguous":
        g = np.ones((4, 8), np.float32).T
    else:
        raw = np.zeros(8 * 4 * 4 + 1, np.uint8)
        g = raw[1:].view(np.float32).reshape(8, 4)
    with pytest.raises(SignatureError, match="argument 'g'"):
        exe(g)
    assert w.numpy().tobytes() == before.tobytes()


@pytest.mark.parametrize("bad", ["shape", "reshaped in place", "dtype", "noncontiguous",
                                 "misaligned"])
def test_a_repeated_call_is_checked_as_thoroughly(bad):
    """jit recognises a call that repeats the last one's arrays (same structure, shapes,
    dtypes, layout) in a few C loops; an array that differs in any of these still gets the
    full check and its error, and changes nothing."""
    ws = [go.Parameter(np.ones((8, 4), np.float32), name=f"w{i}") for i in range(3)]
    opt = go.optim.SGD(ws, lr=0.1)
    fn = go.jit(opt.step, backend="llvm", cache=False)
    grads = [np.ones((8, 4), np.float32) for _ in ws]
    for _ in range(3):
        fn(grads)
    assert fn.cache_info().hits == 2 and fn._lookup((grads,), {})[3]  # the quick check took it
    before = [w.numpy() for w in ws]
    g = np.ones((8, 4), np.float32)
    if bad == "shape":
        g = np.ones((4, 8), np.float32)
    elif bad == "reshaped in place":
        g.shape = (4, 8)
    elif bad == "dtype":
        g = g.astype(np.float64)
    elif bad == "noncontiguous":
        g = np.ones((4, 8), np.float32).T
    else:
        raw = np.zeros(8 * 4 * 4 + 1, np.uint8)
        g = raw[1:].view(np.float32).reshape(8, 4)
    # Layout: the runtime's check; shape or dtype: another signature, whose trace the
    # optimizer's own gradient check stops.
    error = SignatureError if bad in ("noncontiguous", "misaligned") else GraphoptError
    with pytest.raises(error):
        fn(grads[:2] + [g])
    assert all(w.numpy().tobytes() == b.tobytes() for w, b in zip(ws, before))
    fn(grads)  # and the step still runs
    np.testing.assert_allclose(ws[0].numpy(), before[0] - 0.1, rtol=1e-6)


def test_a_failure_after_an_in_place_store_changes_nothing():
    w = go.Parameter(np.ones(4, np.float32), name="w")
    k = go.Parameter(np.array([2, 3], np.int64), name="k")

    def step(g, e):
        go.assign(w, w - 0.5 * g)  # a kernel updates @w in place ...
        return k ** e  # ... then numpy fails: an integer to a negative power

    fn = go.jit(step, backend="llvm", cache=False)
    exe = fn.lower(np.ones(4, np.float32), np.array([1, 1]))
    assert not exe.program.needs_backup  # the power does not need the store: it runs first
    with pytest.raises(ExecutionError):
        fn(np.ones(4, np.float32), np.array([-1, 2]))
    np.testing.assert_array_equal(w.numpy(), np.ones(4, np.float32))


def test_a_view_of_a_parameter_keeps_the_value_it_was_made_from():
    w = go.Parameter(np.arange(6, dtype=np.float64).reshape(2, 3), name="w")

    def step(g):
        old = w.T  # a view of @w's buffer, read before the update
        go.assign(w, w + g)
        return old, w  # w read after its assign is the new value

    fn = go.jit(step, backend="llvm", cache=False)
    old, new = fn(np.ones((2, 3)))
    np.testing.assert_array_equal(old, np.arange(6.0).reshape(2, 3).T)
    np.testing.assert_array_equal(new, np.arange(6.0).reshape(2, 3) + 1)
    np.testing.assert_array_equal(w.numpy(), np.arange(6.0).reshape(2, 3) + 1)


def test_a_view_of_a_parameter_read_only_before_its_store_is_not_copied():
    """A weight's transpose that only matmuls before the update read (the backward's
    `dy @ w.T`) is read where it lies; one read after the store is copied, and the program
    says which and why (memory_report)."""
    w = go.Parameter(np.arange(6, dtype=np.float64).reshape(2, 3), name="w")
    u = go.Parameter(np.arange(6, dtype=np.float64).reshape(3, 2), name="u")

    def step(x, g):
        y = x @ w.T  # read before w's update: no copy needed
        old_u_t = u.T  # returned, so read after u's store: it keeps the old value
        go.assign(w, w - g)
        go.assign(u, u - g.T)
        return y, old_u_t

    fn = go.jit(step, backend="llvm", cache=False)
    x, g = np.ones((4, 3)), np.full((2, 3), 0.5)
    exe = fn.lower(x, g)
    copied = [(v.node.op, p.name) for v, p in exe.program.copies]
    assert copied == [("transpose", "u")], copied
    y, old_u_t = fn(x, g)
    np.testing.assert_array_equal(y, np.ones((4, 3)) @ np.arange(6.0).reshape(2, 3).T)
    np.testing.assert_array_equal(old_u_t, np.arange(6.0).reshape(3, 2).T)
    np.testing.assert_array_equal(w.numpy(), np.arange(6.0).reshape(2, 3) - 0.5)
    report = str(exe.memory_report())
    assert "copied when made" in report and "@u" in report


def test_introspection_shows_llvm_ir_asm_and_keys():
    w = go.Parameter(np.ones(1024, np.float32), name="w")
    exe = go.jit(sgd_step(w), backend="llvm", cache=False).lower(np.ones(1024, np.float32))
    (k,) = exe.kernels
    assert re.search(r'define void @"?kernel_', exe.llvm_ir(optimized=False))
    optimized = exe.llvm_ir()
    assert "<8 x float>" in optimized or "<16 x float>" in optimized  # vectorized
    assert "ret void" in exe.asm() or "ret" in exe.asm()
    assert len(k.key) == 64 and {"kernel", "cpu", "features", "llvm", "flags"} <= set(k.key_parts)
    assert k.compile_seconds > 0 and not k.cache_hit


def test_a_second_process_loads_kernels_from_the_disk_cache(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, graphopt as go
        w = go.Parameter(np.ones(100, np.float32), name="w")
        def step(g):
            go.assign(w, w - 0.1 * g)
            return (g * g).sum()
        fn = go.jit(step, backend="llvm")
        print(fn(np.ones(100, np.float32)), [k.cache_hit for k in fn.lower(np.ones(100, np.float32)).kernels])
    """)
    env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("GRAPHOPT_CACHE", None)
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=120) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.split()[0] == runs[1].stdout.split()[0] == "100.0"
    assert "False" in runs[0].stdout and "False" not in runs[1].stdout  # compiled, then loaded


# -- graphopt.optim on the llvm backend --------------------------------------------------------
OPTIMIZERS = {
    "SGD": dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "Adagrad": dict(lr=0.05, lr_decay=1e-3),
    "RMSprop": dict(lr=1e-3, momentum=0.5, centered=True),
    "Adam": dict(lr=1e-3, amsgrad=True),
    "AdamW": dict(lr=1e-3, weight_decay=0.01),
    "NAdam": dict(lr=1e-3),
    "Adamax": dict(lr=1e-3),
    "LAMB": dict(lr=1e-3, weight_decay=0.01),
    "Lion": dict(lr=1e-4, weight_decay=0.01),
}


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_optimizer_on_llvm_matches_the_interpreter(name, dtype):
    shapes = [(40, 30), (30,), (5, 4, 3)]
    rng = np.random.default_rng(7)
    start = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(8)]
    finals = []
    for backend in ("interpreter", "llvm"):
        params = [go.Parameter(a, name=f"w{i}") for i, a in enumerate(start)]
        opt = getattr(go.optim, name)(params, **OPTIMIZERS[name])
        step = go.jit(lambda g: opt.step(g), backend=backend, cache=False)
        for g in grads:
            step(g)
        finals.append([p.numpy() for p in params])
    # Lion's update is a sign: an element whose update is ~0 may flip it; compare loosely.
    tol = (1e-12, 1e-12) if dtype == np.float64 else (2e-5, 1e-5 if name == "Lion" else 1e-6)
    for a, b in zip(*finals):
        np.testing.assert_allclose(a, b, rtol=tol[0], atol=tol[1])


def test_llvm_is_the_default_backend(monkeypatch):
    monkeypatch.delenv("GRAPHOPT_BACKEND", raising=False)
    exe = go.jit(lambda x: x * 2).lower(np.ones(3))
    assert exe.backend_name == "llvm" and exe.kernels
    monkeypatch.setenv("GRAPHOPT_BACKEND", "interpreter")
    assert go.jit(lambda x: x * 2).lower(np.ones(3)).backend_name == "interpreter"


@pytest.mark.usefixtures("cpu_level")
def test_float_to_int_casts_match_numpy():
    x = np.array([0.0, -0.0, 1.9, -1.9, 2.5e9, -2.5e9, np.inf, -np.inf, np.nan, 3e38],
                 np.float32)
    step = lambda x: (x.astype("i32"), x.astype("i64"), x.astype("bool"))  # noqa: E731
    want = go.jit(step, backend="interpreter")(x)
    got = go.jit(step, backend="llvm", cache=False)(x)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_cli_emits_llvm_ir_and_assembly(tmp_path, capsys):
    from graphopt.cli import main
    src = tmp_path / "g.gir"
    src.write_text("graph g {\n  arg %x: f32[64]\n  %0 = exp %x : f32[64]\n  return %0\n}\n")
    assert main(["opt", str(src), "--passes", "fuse", "--emit", "llvm"]) == 0
    assert "define void @kernel_" in capsys.readouterr().out
    assert main(["opt", str(src), "--passes", "fuse", "--emit", "asm"]) == 0
    assert ".globl\tkernel_" in capsys.readouterr().out


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_fully_fused_step_is_one_native_call_per_thread(threads, monkeypatch):
    """The graph sink: every kernel of the step in one call per thread, with a barrier
    between kernels; the same bits as calling the kernels one by one."""
    monkeypatch.setenv("GRAPHOPT_THREADS", threads)
    sizes = [300_000, 200_000, 7, 1000]
    runs = []
    for sink in (True, False):
        ps = [go.Parameter(np.linspace(-1, 1, n, dtype=np.float32), name=f"w{i}")
              for i, n in enumerate(sizes)]
        opt = go.optim.Adam(ps, lr=1e-3)
        grads = [np.cos(np.arange(n, dtype=np.float32)) for n in sizes]
        fn = go.jit(opt.step, cache=False)
        program = fn.lower(grads).program
        assert program.sink and len(program.kernels) == 2 and program.native_calls == 1
        program.sink = sink  # the same kernels, called one by one
        for _ in range(4):
            fn(grads)
        runs.append([p.numpy() for p in ps])
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("threads", ["1", "2"])
def test_reductions_between_kernels_are_combined_inside_the_sink(threads, monkeypatch):
    """Clipping: the gradient norm is a reduction the update reads. Its blocks' partial
    results are combined by native code the sink runs between the kernels, so the step is
    still one call per thread, with the same bits as kernel by kernel."""
    monkeypatch.setenv("GRAPHOPT_THREADS", threads)
    sizes = [300_000, 5, 70_000]
    runs = []
    for sink in (True, False):
        ps = [go.Parameter(np.linspace(-1, 1, n, dtype=np.float32), name=f"w{i}")
              for i, n in enumerate(sizes)]
        opt = go.optim.Adam(ps, lr=1e-3)

        def step(g):
            clipped, norm = go.optim.clip_grad_norm(g, 1.0)
            opt.step(clipped)
            return norm

        grads = [np.cos(np.arange(n, dtype=np.float32)) for n in sizes]
        fn = go.jit(step, cache=False)
        program = fn.lower(grads).program
        assert program.sink and program.native_calls == 1 and len(program.kernels) == 3
        program.sink = sink
        norms = [float(fn(grads)) for _ in range(3)]
        runs.append(([p.numpy() for p in ps], norms))
    (p1, n1), (p2, n2) = runs
    assert n1 == n2
    np.testing.assert_allclose(n1[0], np.sqrt(sum((np.cos(np.arange(n)) ** 2).sum()
                                                  for n in sizes)), rtol=1e-5)
    for a, b in zip(p1, p2):
        assert a.tobytes() == b.tobytes()


def _adam_sink_step(sizes, name="w"):
    ps = [go.Parameter(np.linspace(-1, 1, n, dtype=np.float32), name=f"{name}{i}")
          for i, n in enumerate(sizes)]
    opt = go.optim.Adam(ps, lr=1e-3, name=f"{name}opt")
    grads = [np.cos(np.arange(n, dtype=np.float32)) for n in sizes]
    fn = go.jit(opt.step, cache=False)
    return fn, grads, ps


def _reference(sizes, steps):
    """The same steps, one kernel at a time on one thread."""
    fn, grads, ps = _adam_sink_step(sizes, "r")
    fn.lower(grads).program.sink = False
    for _ in range(steps):
        fn(grads)
    return [p.numpy() for p in ps]


def test_the_sink_pool_serves_steps_after_it_slept_and_from_two_threads(monkeypatch):
    """The pool's threads poll for the next step, then sleep (graphsink.py): steps far apart
    wake them, and steps from two Python threads at once take turns; every result is the
    one-thread, kernel-by-kernel one."""
    monkeypatch.setenv("GRAPHOPT_THREADS", "2")
    sizes = [300_000, 1000]
    fn, grads, ps = _adam_sink_step(sizes)
    assert fn.lower(grads).program.sink
    for _ in range(3):
        fn(grads)
        time.sleep(graphsink.SPIN_SECONDS * 5)  # the pool's threads are asleep by now
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip((p.numpy() for p in ps), _reference(sizes, 3)))
    other = _adam_sink_step(sizes, "v")
    errors = []

    def steps(fn, grads):
        try:
            for _ in range(20):
                fn(grads)
        except BaseException as e:  # reported below: a thread's exception is not raised
            errors.append(e)
    threads = [threading.Thread(target=steps, args=(f, g)) for f, g in (other[:2], (fn, grads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    want = _reference(sizes, 20)
    assert all(a.tobytes() == b.tobytes() for a, b in zip((p.numpy() for p in other[2]), want))


def test_the_sink_cuts_large_kernels_into_chunks_that_tile_their_units(monkeypatch):
    """The graph sink's threads claim chunks of a kernel (runtime.CHUNK_ELEMENTS each), not
    fixed halves; the chunks tile the units in order, and a kernel too small to split is
    one chunk."""
    monkeypatch.setenv("GRAPHOPT_THREADS", "2")
    from graphopt.backends.llvm.runtime import CHUNK_ELEMENTS
    fn, grads, _ = _adam_sink_step([700_000, 1000])
    program = fn.lower(grads).program
    fn(grads)
    for k in program.kernels:
        edges = k.chunks()
        assert edges[0] == 0 and edges[-1] == k.abi.total_units
        assert edges == sorted(set(edges))  # strictly increasing
        assert len(edges) - 1 == (1 if len(k.splits()) == 1 else k._elements // CHUNK_ELEMENTS)
    assert max(len(k.chunks()) for k in program.kernels) - 1 == 700_000 // CHUNK_ELEMENTS


def test_a_sink_step_ends_on_the_caller_alone_when_another_thread_never_comes(monkeypatch):
    """A step the table splits over 2 threads, run by the calling thread alone (as if the
    pool's thread were never scheduled): it claims every chunk itself, never waits for the
    absent thread, and the result is the one-thread, kernel-by-kernel one."""
    monkeypatch.setenv("GRAPHOPT_THREADS", "2")
    sizes = [300_000, 1000]
    fn, grads, ps = _adam_sink_step(sizes)
    program = fn.lower(grads).program
    fn(grads)  # step 1, through the pool; it prepares the table
    table = program._sink_table()
    assert table.threads == 2
    table.counters.fill(0)
    done = threading.Event()

    def alone():  # step 2: the same kernel table, on 2 threads, but no pool thread
        program._sink.run(len(table.rows), table.address, 2, table.rows.shape[1],
                          table.counters_address)
        done.set()
    threading.Thread(target=alone, daemon=True).start()
    assert done.wait(60), "the caller waited for a thread that never came"
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip((p.numpy() for p in ps), _reference(sizes, 2)))


def test_a_pool_thread_that_comes_after_the_step_closed_does_not_run_it(monkeypatch):
    """The caller closes a step once its own work is done and waits only for the pool
    threads that joined it: a step whose pool thread never came ends, and that thread,
    coming late, sees the step closed and runs nothing."""
    monkeypatch.setenv("GRAPHOPT_THREADS", "2")
    monkeypatch.setattr(graphsink.SinkPool, "_serve", lambda self, thread: None)
    sizes = [300_000, 1000]
    fn, grads, ps = _adam_sink_step(sizes)
    program = fn.lower(grads).program
    fn(grads)  # step 1, through the process's pool; it prepares the table
    table = program._sink_table()
    late = graphsink.SinkPool(program._sink, 1)  # its thread returned at once: never joins
    seen = int(late.mailbox[0])
    table.counters.fill(0)
    ended = threading.Event()
    threading.Thread(target=lambda: (late.run(table), ended.set()),
                     daemon=True).start()  # step 2, the caller alone
    assert ended.wait(60), "the caller waited for a pool thread that never joined"
    after = [p.numpy().tobytes() for p in ps]
    assert after == [a.tobytes() for a in _reference(sizes, 2)]
    assert late.mailbox[_mailbox("left")] == 0 and late.mailbox[_mailbox("state")] & graphsink._TAG_BITS == 0
    assert late.sink.worker(late._address, 1, seen, 64) == seen + 1  # saw the step, did not run it
    assert [p.numpy().tobytes() for p in ps] == after and late.mailbox[_mailbox("left")] == 0


def _mailbox(word):
    return graphsink._MAILBOX.index(word)


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("threads", ["1", "2"])
def test_bf16_state_adam_gives_the_interpreters_bits_and_rounds_each_moment_once(
        threads, monkeypatch):
    """Adam with bf16 moments: the interpreter's bits (NaN and infinity in the gradient
    too), on 1 and 2 threads at every CPU level. A moment is rounded to bf16 once: the
    cast's rounding is not emitted again for the op's result, nor when it is stored."""
    monkeypatch.setenv("GRAPHOPT_THREADS", threads)
    n = 300_000
    rng = np.random.default_rng(7)
    g = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    g[::9973], g[5::10007], g[7::10009] = np.nan, np.inf, -np.inf
    runs = []
    for backend in ("interpreter", "llvm"):
        p = go.Parameter(np.linspace(-1, 1, n, dtype=np.float32), name="w")
        opt = go.optim.Adam([p], lr=1e-2, state_dtype="bf16")
        fn = go.jit(opt.step, backend=backend, cache=False)
        for _ in range(3):
            fn([g])
        runs.append([p.numpy()] + [s.numpy() for s in opt.state["w"].values()])
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()
    (kernel,) = [k for k in fn.lower([g]).kernels if k._elements == n]
    assert kernel.ir_text.count("fcmp uno") == 2  # one rounding for each bf16 moment


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
@pytest.mark.parametrize("sink", [True, False])
def test_a_forked_child_gets_threads_of_its_own(sink, monkeypatch):
    """A child made by fork has none of its parent's threads: its 2-thread steps (through
    the graph sink's pool, or kernel by kernel through the other) must not wait for them."""
    monkeypatch.setenv("GRAPHOPT_THREADS", "2")
    sizes = [300_000]
    fn, grads, ps = _adam_sink_step(sizes)
    fn.lower(grads).program.sink = sink
    fn(grads)  # the parent's threads exist now
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        fn(grads)
        send.send(ps[0].numpy())
    proc = ctx.Process(target=child)
    proc.start()
    got = receive.recv() if receive.poll(60) else None
    proc.join(10)
    if proc.is_alive():
        proc.kill()
    want = _reference(sizes, 2)  # the parent's step, then the child's
    assert got is not None and got.tobytes() == want[0].tobytes()


def test_more_threads_than_cores_are_capped(monkeypatch):
    """Every thread of a step waits for the others, so a step on more threads than cores
    could never finish: GRAPHOPT_THREADS is capped at the core count."""
    monkeypatch.setenv("GRAPHOPT_THREADS", str((os.cpu_count() or 1) + 3))
    assert envvars.threads() == (os.cpu_count() or 1)
    fn, grads, ps = _adam_sink_step([300_000])
    fn(grads)
    assert ps[0].numpy().tobytes() == _reference([300_000], 1)[0].tobytes()


def test_every_elementwise_op_has_a_lowering_and_nothing_else_does():
    elementwise = {name for name, op in REGISTRY.items() if op.category == ELEMENTWISE}
    assert elementwise - set(LOWERING) == set(), "add a lowering to backends/llvm/lowering.py"
    assert set(LOWERING) - elementwise == set(), "a lowering of an op that is not elementwise"


# -- the memory plan ------------------------------------------------------------------------------
def mlp_step(sizes=(64, 128, 128, 8), batch=32):
    """A step of matmuls, relu kernels, bias-gradient sums, a squared-error loss kernel and
    an AdamW update: every node writes into a buffer of the plan."""
    from graphopt.optim import AdamW
    rng = np.random.default_rng(0)
    params = {}
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        params[f"w{i}"] = go.Parameter(rng.standard_normal((a, b)).astype(np.float32) * 0.1,
                                       name=f"w{i}")
        params[f"b{i}"] = go.Parameter(np.zeros(b, np.float32), name=f"b{i}")

    def loss_fn(x, t):
        h = x
        for i in range(len(sizes) - 1):
            h = h @ params[f"w{i}"] + params[f"b{i}"]
            h = ops.relu(h) if i < len(sizes) - 2 else h
        return ops.mean((h - t) * (h - t))

    grad_fn = go.value_and_grad(loss_fn, wrt=params)
    opt = AdamW(params, lr=1e-3, weight_decay=1e-2)

    def step(x, t):
        loss, grads = grad_fn(x, t)
        opt.step(grads)
        return loss

    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    t = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    return step, params, x, t


def test_the_memory_plan_shares_buffers_and_no_two_live_values_overlap():
    from graphopt.backends.llvm import memplan
    step, _, x, t = mlp_step()
    exe = go.jit(step, backend="llvm", cache=False).lower(x, t)
    plan = exe.program.plan
    assert plan.buffers and not plan.unplanned, plan.unplanned
    assert memplan.overlapping(plan) == []
    assert plan.arena_bytes < plan.value_bytes  # values whose lives do not meet share bytes


def test_a_planned_step_allocates_nothing_after_the_first_and_computes_the_same():
    import tracemalloc
    step, params, x, t = mlp_step()
    planned = go.jit(step, backend="llvm", cache=False)
    losses = [float(planned(x, t)) for _ in range(3)]
    after = {k: p.numpy() for k, p in params.items()}
    # The same steps on the interpreter, from the same start: the plan changes no number
    # numpy computes (matmul and sums into given arrays), and the kernels are the same code.
    step2, params2, _, _ = mlp_step()
    reference = go.jit(step2, backend="interpreter")
    expected = [float(reference(x, t)) for _ in range(3)]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    for k, p in params2.items():
        np.testing.assert_allclose(after[k], p.numpy(), rtol=1e-4, atol=1e-6)
    # What a step allocates while it runs (Python's small objects too) stays far below one
    # intermediate: the tensors live in the plan's arena, made when the program was.
    largest = max(b.nbytes for b in planned.lower(x, t).program.plan.buffers.values())
    tracemalloc.start()
    try:
        planned(x, t)
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        planned(x, t)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - start < largest // 4, (peak - start, largest)


def test_node_times_runs_each_node_once_and_commits_nothing():
    step, params, x, t = mlp_step()
    exe = go.jit(step, backend="llvm", cache=False).lower(x, t)
    before = {k: p.numpy() for k, p in params.items()}
    inputs = {v: p._value.copy() for v, p in exe.param_inputs}
    inputs.update(zip(exe.graph.args, (x, t)))
    times = exe.program.node_times(inputs)
    assert len(times) == len(exe.program.nodes) and all(s >= 0 for s in times)
    assert all(np.array_equal(p.numpy(), before[k]) for k, p in params.items())
    w0 = next(v for v in inputs if v.name == "w0")
    assert not np.array_equal(inputs[w0], before["w0"])  # the copies were updated in place


def test_an_assigned_view_of_a_parameter_stored_in_place_keeps_its_value():
    """`assign(u, w.T)` with w updated in place by a kernel: the transpose is committed after
    the step, so it is read after w's store and must be the old w."""
    w = go.Parameter(np.arange(6, dtype=np.float64).reshape(2, 3), name="w")
    u = go.Parameter(np.zeros((3, 2)), name="u")

    def step(g):
        go.assign(u, w.T)
        go.assign(w, w - g)

    go.jit(step, backend="llvm", cache=False)(np.ones((2, 3)))
    np.testing.assert_array_equal(u.numpy(), np.arange(6.0).reshape(2, 3).T)
    np.testing.assert_array_equal(w.numpy(), np.arange(6.0).reshape(2, 3) - 1)


def test_a_kernel_that_reads_a_view_waits_for_what_it_views():
    """The program runs what needs no in-place store first. A kernel that reads, in place,
    a view of a value made after a store (here a reshape of a matmul of the stored weight)
    must wait for that value too, though the view's own node is gone from the schedule."""
    def step(w, x):
        go.assign(w, w * 2.0)  # fused: a kernel that stores @w in place
        return ops.exp(ops.reshape(w @ x, (16,)))  # a kernel reading a view of the matmul

    x = np.linspace(-1, 1, 16).reshape(4, 4).astype(np.float32)
    results = {}
    for backend in ("interpreter", "llvm"):
        w = go.Parameter(np.eye(4, dtype=np.float32), name="w")
        results[backend] = go.jit(lambda x: step(w, x), backend=backend)(x), w.numpy()
    np.testing.assert_allclose(results["llvm"][0], results["interpreter"][0], rtol=1e-6)
    np.testing.assert_array_equal(results["llvm"][1], results["interpreter"][1])
