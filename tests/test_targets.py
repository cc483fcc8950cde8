"""Targets and linking: f16/bf16 right at every CPU level, GRAPHOPT_CPU refused when this host
cannot run it, object code loaded only when every symbol resolves, other machines compiled for.
"""
import os
import re
import subprocess
import sys
import textwrap

import llvmlite.binding as llvm
import ml_dtypes
import numpy as np
import pytest

import graphopt as go
from graphopt import envvars, ops
from graphopt.backends.llvm import compileworker, engine, linker
from graphopt.backends.llvm.target import cross, host, selected
from graphopt.errors import LoweringError, TargetError

HALF_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def same_bits_or_both_nan(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    with np.errstate(invalid="ignore"):  # (ml_dtypes warns when it widens a NaN)
        nan = np.isnan(want.astype(np.float64))
        assert np.array_equal(np.isnan(got.astype(np.float64)), nan)
    width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    bad = np.flatnonzero((got.view(width) != want.view(width)) & ~nan)
    assert bad.size == 0, [(want.ravel()[i], got.ravel()[i]) for i in bad[:5]]


def f32_samples():
    """f32 values whose f16 or bf16 rounding is hard: every exponent, the halfway points and
    their neighbours, subnormal and overflow edges, infinities, NaNs, and random bits."""
    rng = np.random.default_rng(0)
    bits = [rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)]
    for drop in (13, 16):  # the bits f16 and bf16 drop from a normal f32
        kept = rng.integers(0, 1 << (32 - drop), 20_000, dtype=np.uint64).astype(np.uint32)
        half = np.uint32(1 << (drop - 1))
        for delta in (0, 1, -1):
            bits.append((kept << np.uint32(drop)) + half + np.uint32(delta % (1 << 32)))
    edges = np.array([0.0, -0.0, 65504, 65519.99, 65520, 65536, 6e-8, 5.96e-8, 2.98e-8,
                      2.99e-8, 6.1e-5, 3.39e38, np.inf, -np.inf, np.nan], np.float32)
    return np.concatenate([np.concatenate(bits).view(np.float32), edges, -edges])


def f64_samples():
    """f64 values on which rounding through f32 first gives another f16 (double rounding)."""
    rng = np.random.default_rng(1)
    halves = HALF_BITS.view(np.float16).astype(np.float64)
    halves = halves[np.isfinite(halves)]
    up = np.nextafter(halves, np.inf)
    mids = (halves[:-1] + np.diff(halves) / 2) if halves.size else halves
    tiny = rng.standard_normal(50_000) * 2.0 ** rng.integers(-30, 17, 50_000)
    return np.concatenate([halves, up, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf),
                           mids + 2.0 ** -40 * np.sign(mids), tiny,
                           [1 + 2 ** -11 + 2 ** -40, 65520.0, 1e300, -1e300, np.nan]])


def cast(x, dtype):
    return go.jit(lambda x: x.astype(dtype), backend="llvm", cache=False)(x)


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_every_half_value_widens_exactly(name):
    x = HALF_BITS.view(DTYPES[name])
    for wide in (np.float32, np.float64):
        with np.errstate(all="ignore"):  # (ml_dtypes warns of NaNs)
            want = x.astype(wide)
        same_bits_or_both_nan(cast(x, wide), want)


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_f32_rounds_to_half_as_numpy_does(name):
    x = f32_samples()
    with np.errstate(all="ignore"):  # (numpy warns of what overflows to infinity)
        want = x.astype(DTYPES[name])
    same_bits_or_both_nan(cast(x, name), want)


@pytest.mark.usefixtures("cpu_level")
def test_f64_rounds_to_f16_once():
    x = f64_samples()
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
        assert not np.array_equal(want, x.astype(np.float32).astype(np.float16))  # it matters
    same_bits_or_both_nan(cast(x, "f16"), want)


@pytest.mark.usefixtures("cpu_level")
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_half_kernels_of_every_form_match_the_interpreter(name, threads, monkeypatch):
    """Elementwise kernels, reductions and their finishers, a multi-tensor kernel over three
    parameters, all in one graph-sink step; big enough to split over two threads."""
    monkeypatch.setenv("GRAPHOPT_THREADS", threads)
    dtype = DTYPES[name]
    rng = np.random.default_rng(3)
    sizes = [300_000, 1000, 7]
    start = [rng.standard_normal(n).astype(dtype) for n in sizes]
    grads = [(rng.standard_normal(n) * 3).astype(dtype) for n in sizes]
    runs = []
    for backend in ("interpreter", "llvm"):
        ps = [go.Parameter(a, name=f"w{i}") for i, a in enumerate(start)]

        def step(gs):
            for p, g in zip(ps, gs):  # one rule over three parameters: hfuse merges them
                go.assign(p, ops.maximum(p - 0.5 * g, -p) * 1.5)
            g = gs[0]
            return (g * g).sum(), ops.abs(g).max(), g.mean(), ops.where(g > 1, g, -g) + 0.25

        fn = go.jit(step, backend=backend, cache=False)
        outs = [fn(grads) for _ in range(2)][-1]
        runs.append((outs, [p.numpy() for p in ps], fn))
    (o1, p1, _), (o2, p2, fn) = runs
    program = fn.lower(grads).program
    assert program.sink and not program.fallbacks
    assert any(len(k.node.attrs["spaces"]) >= 2 for k in program.kernels)  # multi-tensor
    assert any(k.finish_fn for k in program.kernels)  # reductions with finishers
    for a, b in zip(p1, p2):
        same_bits_or_both_nan(b, a)  # elementwise: the same bits
    same_bits_or_both_nan(o2[1], o1[1])
    same_bits_or_both_nan(o2[3], o1[3])
    for a, b in zip(o1[:3:2], o2[:3:2]):  # sums in another order, rounded once to the dtype
        np.testing.assert_allclose(np.float64(b), np.float64(a), rtol=1e-2 if name == "bf16"
                                   else 1e-3)


def test_the_baseline_calls_graphopts_conversion_helpers():
    """At x86-64 (no F16C) every f16 conversion is a call; those calls are the helpers
    linker.py provides (the tests above run them), not a library that may be absent."""
    if not host().is_x86:
        pytest.skip("the baseline of this architecture converts f16 natively")
    with envvars.override(GRAPHOPT_CPU="x86-64"):
        exe = go.jit(lambda x: (x * 3).sum(), backend="llvm", cache=False).lower(
            np.ones(64, np.float16))
        (k,) = exe.kernels
        symbols = linker.symbols(engine.compile_module(k.module, k.target).object_code)[1]
    assert {"__extendhfsf2", "__truncsfhf2", "__truncdfhf2"} <= set(symbols)
    assert llvm.address_of_symbol("__truncsfhf2") is not None  # registered when loaded


def test_the_helpers_call_nothing():
    """A helper that LLVM turned back into a call to a conversion routine would call itself."""
    obj = compileworker.compile_ir(linker.HELPERS_IR, engine.target_machine(engine.baseline()),
                                   optimized=False)[1]
    assert set(linker.symbols(obj)[1]) <= linker.LINKER_SYMBOLS


# -- GRAPHOPT_CPU ---------------------------------------------------------------------------
def a_feature_this_host_lacks() -> str:
    lacking = [f for f, on in llvm.get_host_cpu_features().items() if not on]
    for f in ("avx512f", "avx512fp16", "amx-tile", "sve", "sme", "xop"):
        if f in lacking:
            return f
    pytest.skip("this host has every feature tried")


@pytest.mark.parametrize("cpu, features, message", [
    ("znver99", "", "'znver99' is not a recognized processor"),
    ("host", "+nosuchfeature", "'+nosuchfeature' is not a recognized feature"),
    ("host", "avx2", "is not a feature flag"),
    ("neoverse-n1" if host().is_x86 else "x86-64", "", "is not a recognized processor"),
])
def test_a_target_llvm_does_not_know_is_refused(cpu, features, message):
    with envvars.override(GRAPHOPT_CPU=cpu, GRAPHOPT_CPU_FEATURES=features):
        with pytest.raises(TargetError, match=re.escape(message)):
            selected()


def test_code_this_host_cannot_run_is_refused_before_it_is_loaded():
    feature = a_feature_this_host_lacks()
    w = go.Parameter(np.ones(16, np.float32), name="w")
    step = go.jit(lambda g: go.assign(w, w - g), backend="llvm", cache=False)
    with envvars.override(GRAPHOPT_CPU_FEATURES=f"+{feature}"):
        # (a feature may bring others it implies: +xop needs fma4 and sse4a too)
        with pytest.raises(TargetError, match=rf"cannot run.*lacks [^;]*\b{feature}\b"):
            step(np.ones(16, np.float32))
    assert np.array_equal(w.numpy(), np.ones(16, np.float32))
    step(np.ones(16, np.float32))  # the switch put back: compiled for this host, and run
    assert np.array_equal(w.numpy(), np.zeros(16, np.float32))


def test_a_level_the_host_cannot_run_fails_cleanly_in_a_new_process(tmp_path):
    """From the environment, as a user sets it: an error message, never a SIGILL."""
    feature = a_feature_this_host_lacks()
    script = "import numpy as np, graphopt as go\nprint(go.jit(lambda x: x * 2)(np.ones(4)))\n"
    env = dict(os.environ, GRAPHOPT_CPU_FEATURES=f"+{feature}",
               GRAPHOPT_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "TargetError" in r.stderr and feature in r.stderr, r.stderr


def test_a_step_compiled_for_one_level_is_compiled_again_for_another():
    fn = go.jit(lambda x: x * 2 + 1, backend="llvm", cache=False)
    x = np.arange(8, dtype=np.float32)
    seen = []
    for level in ("x86-64" if host().is_x86 else "generic", "host"):
        with envvars.override(GRAPHOPT_CPU=level):
            np.testing.assert_array_equal(fn(x), x * 2 + 1)
            np.testing.assert_array_equal(fn(x), x * 2 + 1)  # the repeated-call path too
            seen.append(fn.lower(x).kernels[0].key_parts["cpu"])
    assert seen[0] != seen[1] and fn.cache_info().compiles == 2


# -- linking ---------------------------------------------------------------------------------
def test_an_unresolved_symbol_is_an_error_not_a_jump_to_zero():
    """Run in a child process: if the check failed, the child would die of a signal."""
    script = textwrap.dedent("""
        import numpy as np, graphopt as go
        from graphopt.backends.llvm import emitter
        from graphopt.errors import LoweringError
        from llvmlite import ir
        def missing(self, x):  # tanh calls a function nothing defines
            t = ir.FunctionType(x.type, [x.type])
            return self.b.call(ir.Function(self.module, t, "graphopt_no_such_tanhf"), [x])
        emitter.Emitter.tanh = missing
        fn = go.jit(lambda x: go.ops.tanh(x) * 2, backend="llvm", cache=False)
        x = np.linspace(-2, 2, 64, dtype=np.float32)
        exe = fn.lower(x)
        (fallback,) = exe.program.fallbacks  # the kernel runs through numpy instead
        print("REASON", fallback.reason)
        assert np.allclose(fn(x), np.tanh(x) * 2)
        from graphopt.backends.llvm.runtime import compile_kernel
        try:
            compile_kernel(fallback.node, False, False)
        except LoweringError as e:
            print("RAISED", e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    for line in ("REASON", "RAISED"):
        text = next(t for t in r.stdout.splitlines() if t.startswith(line))
        assert "graphopt_no_such_tanhf" in text and "kernel kernel_" in text \
            and "not loaded" in text


def test_objects_of_another_format_are_not_loaded():
    with pytest.raises(LoweringError, match="unknown format"):
        linker.check(b"MZ\x90\x00not an object", "kernel_x")


# -- other machines: compiled for, never run ------------------------------------------------
CROSS = [("aarch64-unknown-linux-gnu", "neoverse-n1", b"\x7fELF"),
         ("x86_64-apple-darwin", "x86-64", b"\xcf\xfa\xed\xfe")]


def kernels_of_the_test_programs():
    """The kernel nodes of the programs the LLVM tests run: every dtype, every optimizer,
    reductions, broadcasting, a multi-tensor step."""
    from test_llvm import OPTIMIZERS
    graphs = []
    for name in ("f16", "bf16", "f32", "f64", "i32", "i64"):
        d = go.ir.to_dtype(name).np_dtype
        x, y = np.ones((4, 6), d), np.ones(6, d)
        graphs.append(go.jit(lambda x, y: (ops.maximum(x, y) - x * 2, (x * y).sum(), x.max(),
                                           (x > y) | (x == y)), backend="interpreter")
                      .lower(x, y).graph)
    for name, options in OPTIMIZERS.items():
        ps = [go.Parameter(np.ones(s, np.float32), name=f"{name}{i}")
              for i, s in enumerate([(40, 30), (30,)])]
        opt = getattr(go.optim, name)(ps, **options)
        graphs.append(go.jit(lambda g: opt.step(g), backend="interpreter")
                      .lower([np.ones(p.shape, np.float32) for p in ps]).graph)
    x = np.ones((6, 5, 4))
    graphs.append(go.jit(lambda x, r: (ops.exp(x * r).mean(), ops.tanh(x) + ops.log(r + 2)),
                         backend="interpreter").lower(x, np.ones(4)).graph)
    return [n for g in graphs for n in g.nodes if n.body is not None]


@pytest.mark.parametrize("triple, cpu, magic", CROSS)
def test_every_kernel_compiles_for_other_machines(triple, cpu, magic):
    from graphopt.backends.llvm.codegen import generate
    target = cross(triple, cpu)
    nodes = kernels_of_the_test_programs()
    assert len(nodes) > 15
    for node in nodes:
        module, abi = generate(node)
        obj = engine.compile_module(module, target).object_code
        assert obj[:4] == magic
        for symbol in linker.symbols(obj)[1]:  # C library functions, or the helpers
            assert symbol in linker.HELPERS or symbol in linker.LINKER_SYMBOLS or \
                llvm.address_of_symbol(symbol), (triple, abi.name, symbol)
        text = engine.assembly(module, target)
        assert abi.name in text


def test_the_first_kernel_of_a_process_may_call_the_c_library():
    """The process's own symbols are searched from the first check on, not only once an
    engine exists: a fresh process whose first kernel calls expf and powf compiles it."""
    script = textwrap.dedent("""
        import numpy as np, graphopt as go
        fn = go.jit(lambda x: go.ops.exp(x) + x ** 1.5, backend="llvm", cache=False)
        x = np.linspace(0, 1, 32, dtype=np.float32)
        program = fn.lower(x).program
        print("FALLBACKS", len(program.fallbacks), len(program.kernels))
        print("OK" if np.allclose(fn(x), np.exp(x) + x ** 1.5, rtol=1e-6) else "WRONG")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "FALLBACKS 0 1" in r.stdout and "OK" in r.stdout, r.stdout
