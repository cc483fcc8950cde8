"""The graph sink: a whole step of kernels in one native call per thread, and the threads that
run it with the caller.

A thread woken from sleep starts late: a futex wake-up, then the GIL hand-off, cost 0.1-0.2 ms
on a 2-core VM, a third of a 1M-element Adam step there. So the pool's threads wait for work
in native code: after each step they poll a mailbox (SINK_IR's worker loop) for SPIN_SECONDS
before they sleep in Python, and back-to-back steps find them awake. The caller publishes a
step (its kernel table and thread count) by bumping the mailbox's generation, runs the step
itself, then closes it and waits, in native code too, for the pool's threads that joined it
to count themselves done (one that had not joined by then no longer can: see the worker).

The threads share each kernel's work by claiming chunks of it (runtime.py cuts them), not in
fixed halves: a step split in fixed shares is as quick as its slowest share, and on a machine
whose cores other processes use too, a share whose thread the OS is not running stalled the
whole step (a 1M-element Adam step: 1.9 ms at best, a median of 16 ms on 2 threads with
other work on the cores, 3.3 ms on 1 thread).
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from .engine import runtime_functions
from .target import baseline

SinkFn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_void_p)
SINK_NAME, WORKER_NAME, PUBLISH_NAME, CLOSE_NAME, WAIT_NAME, CALL_NAME, SINK_CALL_NAME = (
    "graphopt_sink_v2", "graphopt_worker_v2", "graphopt_publish_v2", "graphopt_close_v2",
    "graphopt_wait_v2", "graphopt_call_v2", "graphopt_sink_call_v2")
YIELD_POLLS = 256  # polls of a counter before a waiting thread starts yielding its core

# void sink(i64 count, i64* entries, i64 threads, i64 stride, i64* counters)
#
# Runs `count` kernels in order. Entry k (a row of `stride` i64) holds the kernel's function
# address, its pointer table, its partials, its number of chunks n, then the n + 1 edges of
# its chunks (in units). Threads claim the chunks of kernel k one at a time (counters[2k]
# counts the claims) and count each one done (counters[2k+1]); a thread that finds none left
# waits until all n are done, then goes on to kernel k+1: MindSpore's "graph sink", one
# native call per thread for the step instead of one per kernel. The work is not split
# in fixed shares: on a machine whose cores other processes also use, a thread that is not
# running holds up at most the chunk it claimed, not half of the step, and a pool thread
# that wakes late finds the work done (counters start at zero each step). Written as text:
# an indirect call through an opaque pointer is one line here, and llvmlite's builder has no
# way to say it.
SINK_IR = """
define void @graphopt_sink_v2(i64 %count, ptr %entries, i64 %threads, i64 %stride,
                              ptr %counters) {
entry:
  br label %head
head:
  %k = phi i64 [ 0, %entry ], [ %k1, %next ]
  %more = icmp slt i64 %k, %count
  br i1 %more, label %kernel, label %done
kernel:
  %row = mul i64 %k, %stride
  %fn.p = getelementptr i64, ptr %entries, i64 %row
  %fn.a = load i64, ptr %fn.p
  %fn = inttoptr i64 %fn.a to ptr
  %args.p = getelementptr i64, ptr %fn.p, i64 1
  %args.a = load i64, ptr %args.p
  %args = inttoptr i64 %args.a to ptr
  %part.p = getelementptr i64, ptr %fn.p, i64 2
  %part.a = load i64, ptr %part.p
  %part = inttoptr i64 %part.a to ptr
  %n.p = getelementptr i64, ptr %fn.p, i64 3
  %n = load i64, ptr %n.p
  %edges = getelementptr i64, ptr %fn.p, i64 4
  %claimed.i = mul i64 %k, 2
  %claimed = getelementptr i64, ptr %counters, i64 %claimed.i
  %finished = getelementptr i64, ptr %claimed, i64 1
  br label %claim
claim:
  %c = atomicrmw add ptr %claimed, i64 1 monotonic
  %left = icmp slt i64 %c, %n
  br i1 %left, label %call, label %wait
call:
  %lo.p = getelementptr i64, ptr %edges, i64 %c
  %lo = load i64, ptr %lo.p
  %hi.p = getelementptr i64, ptr %lo.p, i64 1
  %hi = load i64, ptr %hi.p
  call void %fn(i64 %lo, i64 %hi, ptr %args, ptr %part)
  %old = atomicrmw add ptr %finished, i64 1 release
  br label %claim
wait:
  %k1 = add i64 %k, 1
  %last = icmp sge i64 %k1, %count
  %alone = icmp sle i64 %threads, 1
  %skip = or i1 %last, %alone
  br i1 %skip, label %next, label %barrier
barrier:
  call void @graphopt_wait_v2(ptr %finished, i64 %n)
  br label %next
next:
  br label %head
done:
  ret void
}

; i64 worker(ptr mailbox, i64 thread, i64 seen, i64 spins): a pool thread's loop. It runs
; each step published in the mailbox (i64s: generation, count, entries, threads, stride,
; counters, left, state) as `thread`, until `spins` polls in a row find no new generation;
; it returns the last generation it saw, and the thread sleeps in Python. A thread joins a
; step before it reads the step's table: `state` is the step's generation (its low 31
; bits) << 32, a bit the caller sets when it closes the step (1 << 31), and the number of
; threads that joined; a thread joins by adding itself to that count while the state says
; its generation, open. It counts itself in `left` when done. So the caller, once its own
; share of the work is over, closes the step and waits only for the threads that joined:
; a pool thread the OS did not run in time (asleep, or waiting for a core) sees the step
; closed when it comes, and goes back to polling.
define i64 @graphopt_worker_v2(ptr %mb, i64 %thread, i64 %seen0, i64 %spins) {
entry:
  %count.p = getelementptr i64, ptr %mb, i64 1
  %entries.p = getelementptr i64, ptr %mb, i64 2
  %threads.p = getelementptr i64, ptr %mb, i64 3
  %stride.p = getelementptr i64, ptr %mb, i64 4
  %counters.p = getelementptr i64, ptr %mb, i64 5
  %left.p = getelementptr i64, ptr %mb, i64 6
  %state.p = getelementptr i64, ptr %mb, i64 7
  br label %idle
idle:
  %seen = phi i64 [ %seen0, %entry ], [ %gen, %work ], [ %gen, %join ], [ %gen, %run ]
  br label %poll
poll:
  %i = phi i64 [ 0, %idle ], [ %i1, %again ]
  %gen = load atomic i64, ptr %mb acquire, align 8
  %new = icmp ne i64 %gen, %seen
  br i1 %new, label %work, label %again
again:
  {pause}
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %spins
  br i1 %more, label %poll, label %out
out:
  ret i64 %seen
work:
  %threads = load i64, ptr %threads.p
  %mine = icmp slt i64 %thread, %threads
  %tag = and i64 %gen, 2147483647
  br i1 %mine, label %join, label %idle
join:
  %s = load atomic i64, ptr %state.p acquire, align 8
  %s.tag = lshr i64 %s, 32
  %same = icmp eq i64 %s.tag, %tag
  %closed.bit = and i64 %s, 2147483648
  %open = icmp eq i64 %closed.bit, 0
  %can = and i1 %same, %open
  br i1 %can, label %try, label %idle
try:
  %s1 = add i64 %s, 1
  %pair = cmpxchg ptr %state.p, i64 %s, i64 %s1 acq_rel acquire
  %joined = extractvalue { i64, i1 } %pair, 1
  br i1 %joined, label %run, label %join
run:
  %count = load i64, ptr %count.p
  %entries.a = load i64, ptr %entries.p
  %entries = inttoptr i64 %entries.a to ptr
  %stride = load i64, ptr %stride.p
  %threads.now = load i64, ptr %threads.p
  %counters.a = load i64, ptr %counters.p
  %counters = inttoptr i64 %counters.a to ptr
  call void @graphopt_sink_v2(i64 %count, ptr %entries, i64 %threads.now, i64 %stride,
                              ptr %counters)
  %old = atomicrmw add ptr %left.p, i64 1 release
  br label %idle
}

; i64 close(ptr mailbox): closes the published step to threads that have not joined it; how
; many did.
define i64 @graphopt_close_v2(ptr %mb) {
  %state.p = getelementptr i64, ptr %mb, i64 7
  %old = atomicrmw or ptr %state.p, i64 2147483648 acq_rel
  %joined = and i64 %old, 2147483647
  ret i64 %joined
}

; void publish(ptr mailbox): the next generation, after every store this thread made before
; (release): a pool thread that sees it sees the step's table and counters too.
define void @graphopt_publish_v2(ptr %mb) {
  %old = atomicrmw add ptr %mb, i64 1 release
  ret void
}

; void call(ptr record): one kernel called alone, on units [lo, hi), from a record of i64s
; (function, lo, hi, pointer table, partials). ctypes converts each argument of a call from
; Python (~0.3 us an integer), and passes a record it is given as a pointer for ~0.1 us: on
; a small step, a kernel's four arguments cost more than its work (runtime.NativeKernel).
define void @graphopt_call_v2(ptr %rec) {
{call_record}
  call void %fn(i64 %lo, i64 %hi, ptr %args, ptr %part)
  ret void
}

; void sink_call(ptr record): the sink on a table, from a record of i64s (count, entries,
; threads, stride, counters): the caller's call of a step, for the same reason.
define void @graphopt_sink_call_v2(ptr %rec) {
{sink_record}
  call void @graphopt_sink_v2(i64 %count, ptr %entries, i64 %threads, i64 %stride,
                              ptr %counters)
  ret void
}

; void wait(ptr counter, i64 goal): returns once *counter >= goal. After YIELD_POLLS polls
; it yields its core at each poll: the thread it waits for may be one the OS has not
; running, for want of a free core.
define void @graphopt_wait_v2(ptr %c, i64 %goal) {
entry:
  br label %poll
poll:
  %i = phi i64 [ 0, %entry ], [ %i1, %again ], [ %i1, %yield ]
  %v = load atomic i64, ptr %c acquire, align 8
  %ok = icmp sge i64 %v, %goal
  br i1 %ok, label %done, label %again
again:
  {pause}
  %i1 = add i64 %i, 1
  %long = icmp sge i64 %i1, {yield_polls}
  br i1 %long, label %yield, label %poll
yield:
  {yield}
  br label %poll
done:
  ret void
}
{declare}
"""


WorkerFn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int64)
WaitFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
PublishFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
CloseFn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)


class Record(ctypes.Structure):
    """Five i64s a native call reads its arguments from (`call`: function, lo, hi, pointer
    table, partials; `sink_call`: count, entries, threads, stride, counters): ctypes passes
    one as a pointer, without converting anything (see SINK_IR's call)."""

    _fields_ = [(f"word{i}", ctypes.c_int64) for i in range(5)]


RecordFn = ctypes.CFUNCTYPE(None, ctypes.POINTER(Record))


@dataclass(frozen=True)
class Sink:
    """The sink's functions: `run` a step as one of its threads (`run_record`: from a
    Record), a pool thread's `worker` loop, `publish` a step to the pool and `close` it,
    `wait` for a counter, `call` one kernel from a Record (see SINK_IR)."""

    run: SinkFn
    worker: WorkerFn
    publish: PublishFn
    close: CloseFn
    wait: WaitFn
    call: RecordFn
    run_record: RecordFn


def _sink_ir() -> str:
    # A spinning thread tells an x86 core so (`pause`: less power, and the core's other
    # hardware thread runs on); other targets spin without it. Yielding is POSIX's
    # sched_yield (in the C library every POSIX process has loaded); elsewhere a wait spins.
    x86, posix = baseline().is_x86, os.name == "posix"
    return (SINK_IR.replace("{call_record}", _record("fn", "*lo", "*hi", "args", "part"))
            .replace("{sink_record}", _record("*count", "entries", "*threads", "*stride",
                                              "counters"))
            .replace("{pause}", 'call void asm sideeffect "pause", ""()' if x86 else "")
            .replace("{yield_polls}", str(YIELD_POLLS))
            .replace("{yield}", "%r = call i32 @sched_yield()" if posix else "")
            .replace("{declare}", "declare i32 @sched_yield()" if posix else ""))


def _record(*words: str) -> str:
    """IR that loads the words of the Record at %rec into values of these names: an i64 for
    a name marked `*`, else a pointer."""
    lines = []
    for i, word in enumerate(words):
        name = word.lstrip("*")
        lines.append(f"  %{name}.p = getelementptr i64, ptr %rec, i64 {i}")
        if word.startswith("*"):
            lines.append(f"  %{name} = load i64, ptr %{name}.p")
        else:
            lines += [f"  %{name}.a = load i64, ptr %{name}.p",
                      f"  %{name} = inttoptr i64 %{name}.a to ptr"]
    return "\n".join(lines)


@functools.cache
def sink(use_cache: bool = True) -> Sink:
    """The sink's functions, loaded once per process; its object code is cached on disk like a
    kernel's (compiling it costs ~10 ms, a tenth of a warm start)."""
    run, worker, publish, close, wait, call, run_record = runtime_functions(
        _sink_ir(), (SINK_NAME, WORKER_NAME, PUBLISH_NAME, CLOSE_NAME, WAIT_NAME, CALL_NAME,
                     SINK_CALL_NAME), use_cache)
    return Sink(SinkFn(run), WorkerFn(worker), PublishFn(publish), CloseFn(close),
                WaitFn(wait), RecordFn(call), RecordFn(run_record))


class Table(NamedTuple):
    """A step's kernel table as the sink reads it (rows: see SINK_IR), the threads it uses,
    its chunk counters (two per row) and the addresses of both, taken once
    (`ndarray.ctypes.data` costs microseconds, a step's own cost when the step is small)."""

    rows: np.ndarray
    threads: int
    counters: np.ndarray
    address: int
    counters_address: int
    record: Record  # the sink's arguments for this table (Sink.run_record)


class Row(NamedTuple):
    """One step of a kernel table (see SINK_IR): a function of the kernel signature, its
    pointer table, its partials (0: none), the edges of the chunks its threads claim, and
    how many threads it may use."""

    fn: int
    args: int
    partials: int
    edges: Sequence[int]
    threads: int


def table(steps: Sequence[Row]) -> Table:
    """The table of these steps, run in order (on as many threads as the most any may use)."""
    rows = np.zeros((len(steps), 4 + max(len(r.edges) for r in steps)), np.int64)
    for row, r in zip(rows, steps):
        row[:4] = (r.fn, r.args, r.partials, len(r.edges) - 1)
        row[4:4 + len(r.edges)] = r.edges
    threads = max(r.threads for r in steps)
    counters = np.zeros(2 * len(rows), np.int64)
    record = Record(len(rows), rows.ctypes.data, threads, rows.shape[1], counters.ctypes.data)
    return Table(rows, threads, counters, rows.ctypes.data, counters.ctypes.data, record)


def run(s: Sink, t: Table) -> None:
    """One step of table t: on this thread alone, or with the pool's threads. Its counters
    are zeroed first."""
    t.counters.fill(0)
    if t.threads == 1:
        s.run_record(t.record)
    else:
        pool(s).run(t)


# -- the pool -----------------------------------------------------------------------------------
SPIN_SECONDS = 300e-6  # how long a pool thread polls for the next step before it sleeps
_MAILBOX = ("generation", "count", "entries", "threads", "stride", "counters", "left", "state")
_TAG_BITS = (1 << 31) - 1  # the generation bits a step's state carries


class SinkPool:
    def __init__(self, sink: Sink, workers: int):
        self.sink = sink
        self.mailbox = np.zeros(len(_MAILBOX), np.int64)
        self._address = self.mailbox.ctypes.data
        self._left = self._address + 8 * _MAILBOX.index("left")
        self._wake = threading.Condition()
        self._sleeping = 0  # pool threads asleep on _wake, or about to look and sleep
        self._step = threading.Lock()  # the mailbox holds one step at a time
        self.spins = self._calibrate()
        self.workers = workers
        for t in range(1, workers + 1):
            threading.Thread(target=self._serve, args=(t,), daemon=True,
                             name=f"graphopt-sink-{t}").start()

    def _calibrate(self) -> int:
        """Polls per SPIN_SECONDS on this machine (a poll is a load and a `pause`, whose
        length differs from CPU to CPU by 10x): one timed poll loop that finds no step."""
        n = 4096
        start = time.perf_counter()
        self.sink.worker(self._address, 0, int(self.mailbox[0]), n)
        return max(64, int(n * SPIN_SECONDS / max(time.perf_counter() - start, 1e-9)))

    def _serve(self, thread: int) -> None:
        seen = 0
        while True:
            seen = self.sink.worker(self._address, thread, seen, self.spins)
            with self._wake:
                self._sleeping += 1  # before it looks: see run
                try:
                    while int(self.mailbox[0]) == seen:
                        self._wake.wait()
                finally:
                    self._sleeping -= 1

    def run(self, t: Table) -> None:
        """One step: the table's kernels on its threads, this one included; its counters are
        zero."""
        assert t.threads <= self.workers + 1, \
            "a step on more threads than the pool could never end"
        count, stride = t.rows.shape
        with self._step:
            generation = int(self.mailbox[0]) + 1
            self.mailbox[1:] = (count, t.address, t.threads, stride, t.counters_address, 0,
                                (generation & _TAG_BITS) << 32)
            self.sink.publish(self._address)
            # Only a thread asleep needs waking (a Condition's notify costs microseconds in
            # Python; back-to-back steps find the threads polling). A thread counts itself
            # asleep before it looks at the generation: so either it sees this one, or this
            # sees it counted, and its notify waits for the thread to be in wait().
            if self._sleeping:
                with self._wake:
                    self._wake.notify_all()
            self.sink.run_record(t.record)
            self.sink.wait(self._left, self.sink.close(self._address))


_pool: SinkPool | None = None
_pid = 0
_made = threading.Lock()


def pool(sink: Sink) -> SinkPool:
    """The process's pool: one thread per core beyond the caller's (made again in a forked
    child, which has none of its parent's threads)."""
    global _pool, _pid
    with _made:
        if _pool is None or _pid != os.getpid():
            _pool, _pid = SinkPool(sink, max(0, (os.cpu_count() or 1) - 1)), os.getpid()
        return _pool
