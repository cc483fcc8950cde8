"""The memory report: liveness over the scheduled graph, the peak, and what the forward keeps
alive for the backward pass (and what stop_gradient saves)."""
from __future__ import annotations

import numpy as np
import pytest

import graphopt as go
from graphopt import ops
from graphopt.ir.liveness import live_ranges, memory_report

CHAIN = """graph chain {
  arg %x: f64[100]
  %0 = exp %x : f64[100]
  %1 = exp %0 : f64[100]
  %2 = sum %1 {axes=[0], keepdims=false} : f64[]
  %3 = negative %0 : f64[100]
  return %2
}
"""


def test_liveness_of_a_hand_written_graph():
    g = go.parse(CHAIN)
    ranges = {r.name: (r.defined, r.last_use, r.last_reader) for r in live_ranges(g)}
    # %0 is read last by %3; %2 is returned (alive to the end); %3 is never read.
    assert ranges == {"%0": (0, 3, "%3"), "%1": (1, 2, "%2"), "%2": (2, 4, "return"),
                      "%3": (3, 3, "%3")}
    report = memory_report(g)
    assert report.live_bytes == [800, 1600, 1608, 1608]
    assert (report.input_bytes, report.peak_node, report.peak_bytes) == (800, 2, 2408)
    assert report.backward_start is None and report.kept == []
    assert "no backward pass" in str(report)
    assert "at node 2: %2 = sum %1 {axes=[0], keepdims=false} : f64[]" in str(report)


def make_step(stop: bool):
    """Two loss terms over a shared input; the second one's gradient may be stopped."""
    rng = np.random.default_rng(0)
    w = go.Parameter(rng.standard_normal((4, 8)), name="w")
    v = go.Parameter(rng.standard_normal((4, 8)), name="v")

    def loss(x):
        second = ops.sum(ops.sigmoid(x @ v))  # sigmoid's VJP reads its output
        return ops.sum(ops.tanh(x @ w)) + (ops.stop_gradient(second) if stop else second)

    def step(x):
        value, (gw, gv) = go.value_and_grad(loss, wrt=(w, v))(x)
        go.assign(w, w - 0.1 * gw)
        go.assign(v, v - 0.1 * gv)
        return value

    return step, np.ones((32, 4))


def test_kept_values_and_what_stop_gradient_saves():
    reports = {}
    for stop in (False, True):
        step, x = make_step(stop)
        exe = go.jit(step, passes="").lower(x)  # as traced: the schedule the code wrote
        reports[stop] = exe.memory_report()
    kept = {stop: [(r.value.node.op, str(r.value.type)) for r in rep.kept]
            for stop, rep in reports.items()}
    # tanh and sigmoid VJPs read their outputs: both activations stay alive across the turn.
    assert kept[False] == [("sigmoid", "f64[32,8]"), ("tanh", "f64[32,8]")]
    assert kept[True] == [("tanh", "f64[32,8]")]
    assert reports[False].kept_bytes - reports[True].kept_bytes == 32 * 8 * 8
    assert reports[True].peak_bytes < reports[False].peak_bytes
    text = str(reports[False])
    assert "kept alive for the backward pass (made before it, read by it): 2 values, 4096 B" \
        in text
    assert "backward pass starts at node" in text


def test_report_after_the_pass_pipeline():
    step, x = make_step(False)
    traced = go.jit(step, passes="").lower(x).memory_report()
    exe = go.jit(step).lower(x)
    report = exe.memory_report()
    assert report.nodes == len(exe.graph.nodes) < traced.nodes
    assert report.backward_start is not None
    # Fusion may compute a derivative in the forward kernel that makes the activation, so
    # the optimized step never keeps more than the traced one.
    assert report.kept_bytes <= traced.kept_bytes


@pytest.mark.parametrize("stop", [False, True])
def test_peak_matches_a_direct_count(stop):
    """The peak is the largest sum of bytes of values alive at one node, counted directly."""
    step, x = make_step(stop)
    g = go.jit(step, passes="").lower(x).graph
    ranges = live_ranges(g)
    direct = [sum(r.nbytes for r in ranges if r.defined <= i <= r.last_use)
              for i in range(len(g.nodes))]
    assert memory_report(g).live_bytes == direct
