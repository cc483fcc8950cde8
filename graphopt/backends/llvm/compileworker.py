"""LLVM IR text to object code, here or in a helper process that compiles beside this one.

llvmlite serialises every call into LLVM on one process-wide lock, so threads cannot compile
two modules at once. A step with many kernels to compile (a cold cache) compiles them in two
processes instead: this one, and a helper started with this file as its script (it imports
nothing of graphopt, so it is ready in about a tenth of a second) and kept for the life of
the process. Both compile with the functions below, so the helper's object code is the code
this process would have made; it is checked like any other before it is loaded
(linker.check). The jobs are one queue, largest first: this process and the thread that
feeds the helper each take the next, the helper once it has said it is ready. A helper that
fails, dies or is silent for HELPER_TIMEOUT seconds is dropped, and its job goes back to the
queue (torch's inductor also compiles in a pool of processes).

Protocol: messages are length-prefixed JSON (a 4-byte little-endian length, then UTF-8). The
helper first says {"ready"}; then it answers each request {"ir", "triple", "cpu",
"features"} (a module to optimise and compile) with {"optimized", "object" (hex),
"seconds"} or {"error"}.
"""
from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import llvmlite
import llvmlite.binding as llvm

HELPER_TIMEOUT = 30.0  # seconds a helper may take for one module before it is dropped
HELPER_MIN_JOBS = 3  # fewer modules compile here before a new helper would be ready


def initialize() -> None:
    """LLVM's targets, once per process (idempotent in LLVM)."""
    llvm.initialize_all_targets()  # other triples are compiled for (never run) in tests
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()  # the sink's inline `pause`


def machine(triple: str, cpu: str, features: str) -> llvm.TargetMachine:
    """A new target machine for this CPU (an MCJIT engine owns the one it is given)."""
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="pic", jit=True)


def parse(text: str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    return mod


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    """O3 with loop and SLP vectorization and unrolling, in place."""
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def compile_ir(text: str, tm: llvm.TargetMachine, optimized: bool = True) -> tuple[str, bytes]:
    """(the optimised IR, or "" when not optimised; the object code) of a module's text."""
    mod = parse(text, tm)
    if not optimized:
        return "", tm.emit_object(mod)
    optimize(mod, tm)
    return str(mod), tm.emit_object(mod)


# -- the helper process ---------------------------------------------------------------------

def _send(stream, message: dict) -> None:
    data = json.dumps(message).encode()
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes:
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("the compile helper did not answer in time")
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("the compile helper closed its pipe")
        out += chunk
    return bytes(out)


def _receive(fd: int, deadline: float | None = None) -> dict:
    (n,) = struct.unpack("<I", _read_exactly(fd, 4, deadline))
    return json.loads(_read_exactly(fd, n, deadline))


def main() -> None:
    """The helper: compile what comes on stdin until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle
    initialize()
    machines: dict[tuple[str, str, str], llvm.TargetMachine] = {}
    out = sys.stdout.buffer
    _send(out, {"ready": True})
    while True:
        try:
            job = _receive(sys.stdin.fileno())
        except EOFError:
            return
        try:
            start = time.perf_counter()
            which = (job["triple"], job["cpu"], job["features"])
            if which not in machines:
                machines[which] = machine(*which)
            optimized, obj = compile_ir(job["ir"], machines[which])
            _send(out, {"optimized": optimized, "object": obj.hex(),
                        "seconds": time.perf_counter() - start})
        except Exception as e:  # (the parent compiles the module itself and reports)
            _send(out, {"error": f"{type(e).__name__}: {e}"})


@dataclass
class Job:
    """A module to compile for a target; its result once compiled (here or in the helper)."""

    ir: str
    triple: str
    cpu: str
    features: str
    optimized: str = ""
    object_code: bytes | None = None
    seconds: float = 0.0


class Helper:
    """The helper process of this process, started on first use and kept; after one failure
    none is started again. One compile at a time talks to it (`busy`): a compile that finds
    it busy does its modules itself."""

    busy = threading.Lock()
    _process: subprocess.Popen | None = None
    _ready = False  # it said so (it takes ~0.1 s to start)
    _pid = 0  # the process that started it (a fork's child starts its own)
    _broken = False

    @classmethod
    def get(cls) -> subprocess.Popen | None:
        """The helper (the caller holds `busy`), or None."""
        if cls._pid != os.getpid():
            cls._process, cls._pid, cls._ready = None, os.getpid(), False
        if cls._process is None and not cls._broken:
            if "python" not in os.path.basename(sys.executable or ""):
                cls._broken = True  # (an embedding program's binary, not an interpreter)
                return None
            cls._ready = False
            try:
                root = os.path.dirname(os.path.dirname(llvmlite.__file__))
                cls._process = subprocess.Popen(
                    [sys.executable, "-S", "-c",
                     f"import sys; sys.path[:0] = [{root!r}, {os.path.dirname(__file__)!r}]"
                     f"; import compileworker; compileworker.main()"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, close_fds=True)
            except OSError:
                cls._broken = True
        return cls._process

    @classmethod
    def wait_ready(cls, process: subprocess.Popen) -> None:
        """Wait for a new helper to say it is ready (raises if it does not)."""
        if not cls._ready:
            if "ready" not in _receive(process.stdout.fileno(),
                                       time.monotonic() + HELPER_TIMEOUT):
                raise ValueError("the compile helper did not start")
            cls._ready = True

    @classmethod
    def drop(cls) -> None:
        """Stop using the helper (it failed): kill it; compile in this process from now on."""
        process, cls._process, cls._broken = cls._process, None, True
        if process is not None:
            process.kill()
            process.wait()


def compile_jobs(jobs: list[Job], here: Callable[[Job], None]) -> None:
    """Compile every job: `here(job)` compiles one in this process; when there are at least
    HELPER_MIN_JOBS, the helper takes jobs from the same queue once it is ready (see the
    module's doc). This process waits only for a job the helper has taken: a short compile
    is over before a new helper is ready, which is then ready for the next one."""
    queue = sorted(jobs, key=lambda j: -len(j.ir))
    lock = threading.Condition()
    taken = [0]  # jobs the helper has and has not answered

    def take(by_helper: bool = False) -> Job | None:
        with lock:
            if not queue:
                return None
            taken[0] += by_helper
            return queue.pop(0)

    def answered(job: Job, done: tuple | None) -> None:
        with lock:
            if done:
                job.optimized, job.object_code, job.seconds = done
            else:  # compiled here instead, which reports any error LLVM finds
                queue.append(job)
            taken[0] -= 1
            lock.notify_all()

    def feed() -> None:
        if not Helper.busy.acquire(blocking=False):
            return
        try:
            talk()
        finally:
            Helper.busy.release()

    def talk() -> None:
        process = Helper.get()
        try:
            if process is not None and queue:
                Helper.wait_ready(process)
        except Exception:
            Helper.drop()
            return
        while process is not None and (job := take(by_helper=True)) is not None:
            try:
                _send(process.stdin, {"ir": job.ir, "triple": job.triple, "cpu": job.cpu,
                                      "features": job.features})
                reply = _receive(process.stdout.fileno(), time.monotonic() + HELPER_TIMEOUT)
                done = None if "error" in reply else \
                    (str(reply["optimized"]), bytes.fromhex(reply["object"]),
                     float(reply["seconds"]))
            except Exception:  # (a reply is checked, and the object code before it is loaded)
                Helper.drop()
                process, done = None, None
            answered(job, done)

    if len(queue) >= HELPER_MIN_JOBS:
        threading.Thread(target=feed, daemon=True).start()
    while True:
        while (job := take()) is not None:
            here(job)
        with lock:
            if not queue and not taken[0]:
                return
            lock.wait(0.05)  # for the helper's answer (or its job back in the queue)
