"""Products on graphopt's threads (backends/llvm/gemm.py) against the reference's product
(ir/blas.py: each matrix's product on one BLAS thread), bit for bit: cut into pieces or
not, operands as they lie, transposed, batched, views of parameters read where they lie,
layouts the BLAS cannot read (numpy then runs the node), on one thread and on two."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import envvars, ops
from graphopt.backends.llvm import gemm
from graphopt.ir import blas

needs_blas = pytest.mark.skipif(blas.library() is None,
                                reason="numpy's BLAS is not one graphopt drives (not OpenBLAS)")


def same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), \
        f"{np.count_nonzero(got != want)} of {got.size} elements differ"


def both(fn, *args, threads="2"):
    """fn's result jitted with the LLVM backend, the interpreter's, and the LLVM program."""
    with envvars.override(GRAPHOPT_THREADS=threads):
        llvm = go.jit(fn, backend="llvm", cache=False)
        got = np.asarray(llvm(*args)).copy()
        want = np.asarray(go.jit(fn, backend="interpreter")(*args))
        return got, want, llvm.lower(*args).program


def test_the_reference_product_does_not_depend_on_the_blas_threads():
    """numpy's product of these f32 operands differs with OpenBLAS's thread count (its
    threaded driver blocks the 600 terms differently); `matmul` means the one-thread
    product, whatever the BLAS's setting."""
    lib = blas.library()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 600)).astype(np.float32)
    b = rng.standard_normal((600, 512)).astype(np.float32)
    if lib is None:
        pytest.skip("no BLAS graphopt drives")
    saved = lib.threads()
    try:
        with blas.one_thread:
            one = a @ b
        lib.set_threads(2)
        same_bits(blas.matmul(a, b), one)
        assert lib.threads() == 2  # put back
        lib.set_threads(1)
        same_bits(blas.matmul(a, b), one)
        assert lib.threads() == 1
    finally:
        lib.set_threads(saved)


@needs_blas
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_large_product_is_cut_and_gives_the_references_bits(dtype, threads):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((600, 700)).astype(dtype)
    b = rng.standard_normal((700, 500)).astype(dtype)
    got, want, program = both(ops.matmul, a, b, threads=threads)
    same_bits(got, want)
    (p,) = program.products.values()
    assert p.calls == 1
    cut = threads == "2" and p.exact
    assert (p.units > 1) == cut, p.describe()
    assert "on graphopt's threads" in program.listing()


@needs_blas
@settings(max_examples=40, deadline=None)
@given(m=st.integers(2, 700), n=st.integers(2, 700), k=st.integers(2, 600),
       ta=st.booleans(), tb=st.booleans(), f64=st.booleans(), threads=st.sampled_from("12"),
       seed=st.integers(0, 2**32 - 1))
def test_products_of_any_shape_and_layout_are_the_references(m, n, k, ta, tb, f64, threads,
                                                             seed):
    dtype = np.float64 if f64 else np.float32
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)

    def f(x, y):  # a transpose inside the step: read where it lies, as a trans flag
        return ops.matmul(ops.transpose(x) if ta else x, ops.transpose(y) if tb else y)
    got, want, program = both(f, a, b, threads=threads)
    same_bits(got, want)
    assert len(program.products) == 1


@needs_blas
@settings(max_examples=30, deadline=None)
@given(halves=st.integers(1, 12), other=st.integers(2, 383), share=st.floats(1.0, 4.0),
       by_rows=st.booleans(), ta=st.booleans(), tb=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_products_cut_in_the_smallest_pieces_are_the_references(halves, other, share, by_rows,
                                                                ta, tb, seed):
    """Products of f32 whose halves have 1-4x SPLIT_MIN_WORK multiply-adds (a 10-class
    layer's, say): cut in two on two threads where the check allows it, and the
    reference's bits."""
    extent = 2 * gemm.PIECE_ALIGN * halves  # (the rows or columns it is cut along)
    other = min(other, extent - 1)
    k = max(2, int(gemm.SPLIT_MIN_WORK * share) // (extent // 2 * other) + 1)
    m, n = (extent, other) if by_rows else (other, extent)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)

    def f(x, y):
        return ops.matmul(ops.transpose(x) if ta else x, ops.transpose(y) if tb else y)
    got, want, program = both(f, a, b)
    same_bits(got, want)
    (p,) = program.products.values()
    assert p.by_rows == by_rows and (p.units > 1) == p.exact, p.describe()


@needs_blas
@pytest.mark.parametrize("shapes", [((8, 128, 96), (8, 96, 128)), ((8, 128, 96), (96, 64)),
                                    ((128, 96), (8, 96, 64)), ((1, 300, 200), (4, 200, 300))])
def test_batched_products_are_the_references(shapes):
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    got, want, program = both(ops.matmul, a, b)
    same_bits(got, want)
    assert len(program.products) == 1


@needs_blas
def test_a_weights_transpose_is_read_in_the_weight_and_not_made():
    """The backward's x @ W.T: the product reads W where it lies (a trans flag), the
    transpose node is gone from the program, and the weight's update after it changes
    nothing of what the product read."""
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((300, 200)).astype(np.float32)
    x = rng.standard_normal((256, 200)).astype(np.float32)
    results = {}
    for backend in ("llvm", "interpreter"):
        w = go.Parameter(w0, name="w")

        def step(x):
            h = ops.matmul(x, ops.transpose(w))
            go.assign(w, w * 0.5)  # a kernel that stores w in place, after the product
            return h
        fn = go.jit(step, backend=backend, cache=False)
        results[backend] = [np.asarray(fn(x)).copy() for _ in range(2)]
        if backend == "llvm":
            program = fn.lower(x).program
            assert not any(n.op == "transpose" for n in program.nodes)
            (p,) = program.products.values()
            assert p.reads[1].source.name == "w" and p.reads[1].strides == (1, 200)
    for got, want in zip(results["llvm"], results["interpreter"]):
        same_bits(got, want)


@needs_blas
def test_operands_the_blas_cannot_read_run_through_numpy():
    """A strided slice (every other column) and a @ a.T (numpy computes it as a syrk, in
    another order): numpy runs the node, and it gives the reference's bits."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((300, 400)).astype(np.float32)
    b = rng.standard_normal((200, 300)).astype(np.float32)
    for fn, args in [(lambda x, y: ops.matmul(x[:, ::2], y), (a, b)),
                     (lambda x: ops.matmul(x, ops.transpose(x)), (a,))]:
        got, want, program = both(fn, *args)
        same_bits(got, want)
        (p,) = program.products.values()
        assert p._numpy and p.calls == 0


@needs_blas
def test_the_split_check_holds_for_f32_on_this_blas():
    """What the check says for this library is what cutting gives: a product cut in two
    against the uncut one (the check's own probe, here on a larger product)."""
    lib = blas.library()
    exact = gemm.split_is_exact(lib.path, np.dtype(np.float32))
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1000, 700)).astype(np.float32)
    b = rng.standard_normal((700, 900)).astype(np.float32)
    whole = blas.matmul(a, b)
    out = np.empty_like(whole)
    p = gemm.NativeProduct((gemm.Read("a"), gemm.Read("b")), 700, out, lib, True, True, 2)
    assert p.units == 2
    with blas.one_thread:
        p.run_in({"a": a, "b": b})
    assert np.array_equal(out, whole) == exact
