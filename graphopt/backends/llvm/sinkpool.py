"""The threads that run a graph-sink step with the caller.

A step split over threads is as quick as its slowest share, and a thread woken from sleep
starts late: a futex wake-up, then the GIL hand-off, cost 0.1-0.2 ms on this machine, a third
of a 1M-element Adam step. So the pool's threads wait for work in native code: after each
step they poll a mailbox (engine.SINK_IR's worker loop) for SPIN_SECONDS before they sleep in
Python, and back-to-back steps find them awake. The caller publishes a step (its kernel table
and thread count) by bumping the mailbox's generation, runs share 0 itself, and waits, in
native code too, until the other shares count themselves done.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from . import engine

SPIN_SECONDS = 300e-6  # how long a pool thread polls for the next step before it sleeps
_MAILBOX = ("generation", "count", "entries", "threads", "stride", "barrier", "done")


class SinkPool:
    def __init__(self, sink: engine.Sink, workers: int):
        self.sink = sink
        self.mailbox = np.zeros(len(_MAILBOX), np.int64)
        self._address = self.mailbox.ctypes.data
        self._done = self._address + 8 * _MAILBOX.index("done")
        self._wake = threading.Condition()
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
                while int(self.mailbox[0]) == seen:
                    self._wake.wait()

    def run(self, table: np.ndarray, threads: int, barrier: np.ndarray) -> None:
        """One step: the table's kernels on `threads` threads, this one included."""
        assert threads <= self.workers + 1, "a step on more threads than the pool could never end"
        count, stride = table.shape
        with self._step:
            self.mailbox[1:] = (count, table.ctypes.data, threads, stride,
                                barrier.ctypes.data, 0)
            with self._wake:
                self.sink.publish(self._address)
                self._wake.notify_all()
            self.sink.run(count, table.ctypes.data, 0, threads, stride, barrier.ctypes.data)
            self.sink.wait(self._done, threads - 1)


_pool: SinkPool | None = None
_pid = 0
_made = threading.Lock()


def pool(sink: engine.Sink) -> SinkPool:
    """The process's pool: one thread per core beyond the caller's (made again in a forked
    child, which has none of its parent's threads)."""
    global _pool, _pid
    with _made:
        if _pool is None or _pid != os.getpid():
            _pool, _pid = SinkPool(sink, max(0, (os.cpu_count() or 1) - 1)), os.getpid()
        return _pool
