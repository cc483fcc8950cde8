"""The compile helper (graphopt/backends/llvm/compileworker.py): a second process compiles
some of a cold step's kernels. Its object code is this process's, byte for byte; a helper
that dies, hangs, answers garbage or is busy costs nothing but time: the modules are
compiled here."""
import subprocess
import sys
import time

import numpy as np
import pytest

import graphopt as go
from graphopt.backends.llvm import compileworker, engine
from graphopt.backends.llvm.compileworker import Helper
from graphopt.backends.llvm.target import selected


def modules():
    """The LLVM modules of a step with several different kernels."""
    w = go.Parameter(np.ones((64, 32), np.float32), name="w")

    def step(x):
        h = go.ops.tanh(x @ w)
        go.assign(w, w - 0.1 * (x.T @ (1 - h * h)))
        return (h * h).sum() + go.ops.exp(x).mean()
    exe = go.jit(step, backend="llvm", cache=False).lower(np.ones((8, 64), np.float32))
    mods = [k.module for k in exe.kernels]
    assert len(mods) >= 3
    return mods


@pytest.fixture
def fresh_helper(monkeypatch):
    """Helper state of its own for the test (the process's helper, if any, is left alone)."""
    monkeypatch.setattr(Helper, "_process", None)
    monkeypatch.setattr(Helper, "_pid", 0)
    monkeypatch.setattr(Helper, "_broken", False)
    yield
    process = Helper._process
    if process is not None:
        process.kill()
        process.wait()


def test_the_helper_makes_this_process_object_code(fresh_helper):
    target = selected()
    tm = engine.target_machine(target)
    process = Helper.get()
    assert process is not None
    Helper.wait_ready(process)
    for m in modules():
        compileworker._send(process.stdin, {"ir": str(m), "triple": target.triple,
                                            "cpu": target.cpu, "features": target.features})
        reply = compileworker._receive(process.stdout.fileno(), time.monotonic() + 60)
        optimized, obj = compileworker.compile_ir(str(m), tm)
        assert bytes.fromhex(reply["object"]) == obj and reply["optimized"] == optimized
    # a module LLVM refuses is an error reply, and the helper goes on
    compileworker._send(process.stdin, {"ir": "this is not IR", "triple": target.triple,
                                        "cpu": target.cpu, "features": target.features})
    assert "error" in compileworker._receive(process.stdout.fileno(), time.monotonic() + 60)
    assert process.poll() is None


def test_a_batch_gives_the_same_code_with_or_without_the_helper(fresh_helper):
    mods = modules()
    alone = engine.compile_modules(mods, helper=False)
    shared = engine.compile_modules(mods, helper=True)
    assert [c.object_code for c in shared] == [c.object_code for c in alone]
    assert Helper._process is not None and not Helper._broken


def fake(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)


READY = "import sys; sys.stdout.buffer.write(b'\\x0f\\x00\\x00\\x00{\"ready\": true}'); "


@pytest.mark.parametrize("script", [
    "pass",                                                   # gone at once
    "import time; time.sleep(60)",                            # never ready
    "import sys; sys.stdout.buffer.write(b'\\x05\\x00\\x00\\x00hello'); sys.stdout.flush()"
    "; import time; time.sleep(60)",                          # garbage for a greeting
    READY + "sys.stdout.flush(); sys.stdin.buffer.read(4)",    # ready, then gone
    READY + "sys.stdout.flush(); import time; time.sleep(60)",  # ready, then silent
    READY + "sys.stdout.buffer.write(b'\\x05\\x00\\x00\\x00hello'); sys.stdout.flush()"
    "; import time; time.sleep(60)",                          # ready, then garbage
    READY + "sys.stdout.buffer.write(b'\\x02\\x00\\x00\\x00{}'); sys.stdout.flush()"
    "; import time; time.sleep(60)",                          # a reply without the code
])
def test_a_failing_helper_costs_only_time(fresh_helper, monkeypatch, script):
    monkeypatch.setattr(compileworker, "HELPER_TIMEOUT", 1.0)
    target = selected()
    tm = engine.target_machine(target)
    irs = [str(m) for m in modules()]
    alone = [compileworker.compile_ir(ir, tm)[1] for ir in irs]
    monkeypatch.setattr(Helper, "_process", fake(script))
    monkeypatch.setattr(Helper, "_pid", compileworker.os.getpid())
    jobs = [compileworker.Job(ir, target.triple, target.cpu, target.features) for ir in irs]

    def slowly_here(job):  # (the helper has time to take a job)
        time.sleep(0.3)
        job.object_code = compileworker.compile_ir(job.ir, tm)[1]
    start = time.monotonic()
    compileworker.compile_jobs(jobs, slowly_here)
    assert time.monotonic() - start < 30
    assert [j.object_code for j in jobs] == alone
    assert Helper._broken and Helper._process is None  # dropped (killed), not used again


def test_a_busy_helper_is_not_waited_for(fresh_helper, monkeypatch):
    """Another compile talking to the helper: this one compiles its modules itself."""
    mods = modules()
    sent = []
    monkeypatch.setattr(compileworker, "_send", lambda *a: sent.append(a))
    with Helper.busy:
        shared = engine.compile_modules(mods, helper=True)
    assert not sent
    assert [c.object_code for c in shared] == \
        [c.object_code for c in engine.compile_modules(mods, helper=False)]


def make_step():
    w = go.Parameter(np.linspace(-1, 1, 512, dtype=np.float32).reshape(32, 16), name="w")

    def step(x):
        h = go.ops.tanh(x @ w)
        go.assign(w, w - 0.1 * (x.T @ (1 - h * h)))
        return (h * h).sum() + go.ops.exp(x).mean()
    return step, w


def test_a_cold_step_compiles_in_both_processes_and_runs(fresh_helper, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GRAPHOPT_THREADS", "2")
    here = []
    real = compileworker.compile_jobs
    monkeypatch.setattr(compileworker, "compile_jobs", lambda jobs, compile_here: real(
        jobs, lambda job: (here.append(job), time.sleep(0.2), compile_here(job))))
    # (slowed down here, so that the helper surely takes a module however loaded the machine)
    Helper.wait_ready(Helper.get())  # (a new helper would start after these few compiles)
    x = np.linspace(0, 1, 64, dtype=np.float32).reshape(2, 32)
    step, w = make_step()
    exe = go.jit(step, backend="llvm").lower(x)
    compiled = [k for k in exe.kernels if not k.cache_hit]
    assert len(compiled) >= 3 and Helper._process is not None
    assert 1 <= len(here) < len(compiled)  # the helper compiled the others
    helper = Helper._process
    monkeypatch.setattr(Helper, "_broken", True)  # the same step compiled here alone
    monkeypatch.setattr(Helper, "_process", None)
    helper.kill()
    helper.wait()
    reference, w_ref = make_step()
    alone = go.jit(reference, backend="llvm", cache=False).lower(x)
    assert not any(k.cache_hit for k in alone.kernels)
    for _ in range(3):
        assert np.array_equal(exe(x), alone(x))
        assert np.array_equal(w.numpy(), w_ref.numpy())


def test_no_helper_where_the_executable_is_no_python(fresh_helper, monkeypatch):
    """An embedding program's sys.executable is its own binary: it is not started."""
    with Helper.busy:  # (compiled here: no helper started yet)
        mods = modules()
    assert Helper._process is None
    monkeypatch.setattr(sys, "executable", "/usr/bin/some-embedding-app")
    assert Helper.get() is None and Helper._broken
    assert [c.object_code for c in engine.compile_modules(mods, helper=True)] == \
        [c.object_code for c in engine.compile_modules(mods, helper=False)]
