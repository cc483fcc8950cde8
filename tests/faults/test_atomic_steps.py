"""Family 3: a step that fails after a kernel stored in place leaves every Parameter as it
was: what can fail runs before the first in-place store where the graph allows it, the
parameters stored before a node that could still fail are backed up, and a Ctrl-C waits for
the step to be whole. MemoryError comes from a real memory limit, in a child process."""
import numpy as np
import pytest

import graphopt as go
from graphopt import ops, optim
from graphopt.errors import CollectiveError, ExecutionError

# A step that updates w in place, then computes m, an N x N matmul of the new w (so numpy
# runs after the store), and returns what TAIL makes of m.
STEP = """
    import os, resource, signal, threading, time, numpy as np, graphopt as go
    from graphopt import ops
    N = {n}
    w = go.Parameter(np.ones(N, np.float32), name="w")

    @go.jit(backend="{backend}", cache=False)
    def step(g):
        go.assign(w, w - g)
        m = ops.matmul(ops.reshape(w, (N, 1)), ops.reshape(w, (1, N)))
        for _ in range({tail}):
            m = ops.matmul(m, m) * 1e-4
        return m.sum()
"""

# The matmul writes into the memory plan's arena, made with the program; the log_softmax of
# its result is an op numpy allocates for each step: under the limit, that is what fails. (Over
# axis 0: one over the last axis is decomposed and fused into a kernel that allocates nothing.)
MATMUL_AFTER_STORE = STEP.replace("{n}", "4000").replace("{tail}", "0").replace(
    "return m.sum()", "return ops.log_softmax(m, axis=0).sum()") + """

    g = np.full(N, 0.5, np.float32)
    step(g)
    before = w.numpy().copy()
    pages = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (pages + 32 * 2**20, resource.RLIM_INFINITY))
    try:
        step(g)
        print("NO ERROR")
    except go.errors.ExecutionError as e:
        print("ERROR", e)
    print("SAME" if np.array_equal(w.numpy(), before) else "CHANGED")
"""


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_a_memory_error_after_the_store_changes_nothing(backend, child):
    r = child.run(MATMUL_AFTER_STORE.replace("{backend}", backend))  # (64 MB a value)
    assert r.returncode == 0, r.stderr
    assert "ERROR" in r.stdout and "allocate" in r.stdout and "SAME" in r.stdout, r.stdout


CTRL_C = STEP.replace("{n}", "800").replace("{tail}", "20") + """
    g = np.full(N, 0.25, np.float32)
    step(g)
    start = time.perf_counter(); step(g); took = time.perf_counter() - start
    threading.Timer(took / 3, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        step(g)
        print("NOT INTERRUPTED")
    except KeyboardInterrupt:
        print("INTERRUPTED")
    print("W", float(w.numpy()[0]))
"""


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_ctrl_c_during_a_step_takes_effect_when_it_is_whole(backend, child):
    r = child.run(CTRL_C.replace("{backend}", backend))
    assert r.returncode == 0, r.stderr
    assert "INTERRUPTED" in r.stdout.split() and "W 0.25" in r.stdout, r.stdout  # 1 - 3 x 0.25


def test_what_can_fail_runs_before_the_store():
    """The failing power does not need the update: it runs first, and no backup is made."""
    w = go.Parameter(np.ones(4, np.float32), name="w")
    k = go.Parameter(np.array([2, 3], np.int64), name="k")

    def step(g, e):
        go.assign(w, w - 0.5 * g)
        return k ** e, ops.sqrt(w)

    fn = go.jit(step, backend="llvm", cache=False)
    program = fn.lower(np.ones(4, np.float32), np.array([1, 1])).program
    assert not program.needs_backup
    assert program.nodes[-1].body is not None  # the storing kernel is last
    with pytest.raises(ExecutionError):
        fn(np.ones(4, np.float32), np.array([-1, 2]))
    np.testing.assert_array_equal(w.numpy(), np.ones(4, np.float32))


def test_only_what_is_stored_before_a_node_that_can_fail_is_backed_up():
    w = go.Parameter(np.ones(8, np.float32), name="w")
    v = go.Parameter(np.ones((8, 8), np.float32), name="v")

    def step(g):
        go.assign(w, w - g)
        t = ops.matmul(ops.reshape(w, (8, 1)), ops.reshape(w, (1, 8)))  # numpy, needs the new w
        go.assign(v, v + t)
        return t.sum()

    fn = go.jit(step, backend="llvm", cache=False)
    program = fn.lower(np.ones(8, np.float32)).program
    assert [p.name for p in program.backed_up] == ["w"]
    fn(np.full(8, 0.5, np.float32))
    np.testing.assert_allclose(v.numpy(), 1.25)


def test_a_kernel_that_writes_into_planned_buffers_needs_no_backup():
    """An Adam step whose last kernel stores the step count and returns the loss (into the
    memory plan's buffer: it allocates nothing, so it cannot fail) backs up nothing; before,
    every parameter and moment was copied at each step for it. The step still trains."""
    ps = [go.Parameter(np.ones(s, np.float32), name=f"p{i}") for i, s in enumerate([(8, 4), (4,)])]
    opt = optim.Adam(ps, lr=0.1)
    grad = go.value_and_grad(lambda xs: ops.sum(ps[0] * xs[0]) + ops.sum(ps[1] * xs[1]),
                             wrt=ps)

    def step(xs):
        loss, g = grad(xs)
        opt.step(g)
        return loss

    fn = go.jit(step, backend="llvm", cache=False)
    xs = [np.ones((8, 4), np.float32), np.ones(4, np.float32)]
    program = fn.lower(xs).program
    assert sum(n.body is not None for n in program.nodes) >= 2 and not program.sink
    assert not program.needs_backup, [p.name for p in program.backed_up]
    assert float(fn(xs)) == 36.0 and float(fn(xs)) < 36.0  # (Adam's first step: lr down)


class _Unreachable:
    """A group of 2 whose other rank never answers: every collective raises, as a runtime
    raises CollectiveError (a timeout, a lost rank)."""

    rank, size = 0, 2

    def all_reduce(self, x, reduce):
        raise CollectiveError("rank 1 did not arrive (test)")

    reduce_scatter = all_gather = broadcast = all_reduce


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_a_collective_that_fails_after_the_store_changes_nothing(backend, monkeypatch):
    """The all_reduce needs the new w, so it runs after the kernel that stores w in place
    (llvm): the failure puts w back; m, assigned through numpy, is never committed."""
    from graphopt import comm
    monkeypatch.setitem(comm._GROUPS, "unreachable", _Unreachable())
    w = go.Parameter(np.ones(4, np.float32), name="w")
    m = go.Parameter(np.zeros((), np.float32), name="m")

    def step(g):
        go.assign(w, w - 0.5 * g)
        total = ops.all_reduce(ops.sum(w * w), group="unreachable")
        go.assign(m, total)
        return total

    fn = go.jit(step, backend=backend, cache=False)
    if backend == "llvm":
        assert fn.lower(np.ones(4, np.float32)).program.needs_backup
    with pytest.raises(CollectiveError, match="rank 1 did not arrive"):
        fn(np.full(4, 0.5, np.float32))
    np.testing.assert_array_equal(w.numpy(), np.ones(4, np.float32))
    assert m.numpy() == 0
