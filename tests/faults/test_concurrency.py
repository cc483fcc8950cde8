"""Family 1: one compiled step called from several threads, and steps that share a Parameter:
calls that touch the same parameters take turns (graphopt/compile/exclusion.py), so no call
sees another's half-written tables or buffers and no update is lost."""
import threading

import numpy as np
import pytest

import graphopt as go

THREADS, CALLS = 4, 300


def run_threads(work):
    errors = []

    def guarded(*args):
        try:
            work(*args)
        except BaseException as e:  # a thread's exception is reported below
            errors.append(e)
    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
@pytest.mark.parametrize("size", [1, 1000, 300_000])
def test_one_step_from_four_threads_loses_no_update(backend, size):
    w = go.Parameter(np.zeros(size, np.float32), name="w")

    @go.jit(backend=backend, cache=False)
    def step(x):
        go.assign(w, w + x)
        return x * 2.0

    x = np.ones(size, np.float32)

    def work(t):
        for _ in range(CALLS):
            out = step(x)
            assert out.shape == (size,) and out[0] == 2.0
    run_threads(work)
    assert np.all(w.numpy() == THREADS * CALLS)


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_steps_that_share_a_parameter_take_turns(backend):
    """Two steps share w, a third shares v with the second (their domains merge), a fourth
    touches nothing of theirs; each thread calls one."""
    w = go.Parameter(np.zeros(5000, np.float32), name="w")
    v = go.Parameter(np.zeros(5000, np.float32), name="v")
    u = go.Parameter(np.zeros(5000, np.float32), name="u")
    jit = go.jit(backend=backend, cache=False)
    steps = [jit(lambda x: go.assign(w, w + x)),
             jit(lambda x: (go.assign(w, w + 2 * x), go.assign(v, v + x))),
             jit(lambda x: go.assign(v, v * 1.0 + 3 * x)),
             jit(lambda x: go.assign(u, u + x))]
    x = np.ones(5000, np.float32)
    run_threads(lambda t: [steps[t](x) for _ in range(CALLS)])
    assert np.all(w.numpy() == 3 * CALLS) and np.all(v.numpy() == 4 * CALLS)
    assert np.all(u.numpy() == CALLS)


def test_an_optimizer_step_from_four_threads_matches_one_thread():
    """Adam through the graph sink, its pool shared: every call sees the state the previous
    one left, whichever thread made it."""
    def trained(threads):
        ps = [go.Parameter(np.linspace(-1, 1, n, dtype=np.float32), name=f"w{i}")
              for i, n in enumerate([200_000, 33])]
        opt = go.optim.SGD(ps, lr=0.1, momentum=0.9)
        step = go.jit(opt.step, cache=False)
        grads = [np.ones(p.shape, np.float32) for p in ps]
        if threads == 1:
            for _ in range(THREADS * 40):
                step(grads)
        else:
            run_threads(lambda t: [step(grads) for _ in range(40)])
        return [p.numpy() for p in ps]
    for a, b in zip(trained(1), trained(THREADS)):
        assert a.tobytes() == b.tobytes()


def test_a_step_traced_on_one_thread_does_not_capture_another_threads_call():
    """The trace under way is per thread: a compiled step called while another thread traces
    runs compiled, and the trace gets none of its ops."""
    started, release = threading.Event(), threading.Event()
    fast = go.jit(lambda x: x + 1, backend="llvm", cache=False)
    x = np.ones(8, np.float32)
    fast(x)

    def slow(x):
        y = x * 2
        started.set()
        assert release.wait(30)
        return y
    traced = {}

    def trace_it(t):
        if t == 0:
            traced["graph"] = go.jit(slow, backend="llvm", cache=False).lower(x).traced_graph
        elif t == 1:
            assert started.wait(30)
            try:
                np.testing.assert_array_equal(fast(x), x + 1)
            finally:
                release.set()
    run_threads(trace_it)
    assert [n.op for n in traced["graph"].nodes if n.op != "constant"] == ["multiply"]
    assert fast.cache_info().hits >= 1 and fast.cache_info().compiles == 1


def test_domains_follow_the_parameters_and_forget_the_dead():
    """A step's new Parameters join its domain; a step that shares one of them is in the
    same domain; one that shares nothing is not; the entry of a Parameter that died goes."""
    import gc

    from graphopt.compile import exclusion
    a, b, c = (go.Parameter(np.zeros(4, np.float32), name=n) for n in "abc")
    jit = go.jit(backend="interpreter", cache=False)
    s1 = jit(lambda x: go.assign(a, a + x)).lower(np.ones(4, np.float32))
    s2 = jit(lambda x: go.assign(b, b + x)).lower(np.ones(4, np.float32))
    assert s1._domain.root() is not s2._domain.root()
    s3 = jit(lambda x: (go.assign(a, a + x), go.assign(b, b + x), go.assign(c, c + x))
             ).lower(np.ones(4, np.float32))
    assert s1._domain.root() is s2._domain.root() is s3._domain.root()
    assert exclusion._of[id(c)].domain.root() is s3._domain.root()
    key = id(c)
    del s3, c
    gc.collect()
    assert key not in exclusion._of
