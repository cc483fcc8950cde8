#!/usr/bin/env python
"""A whole training step (forward, backward, AdamW; f32), side by side: graphopt and its peers.

    python benchmarks/train_step.py                   # every case and every installed peer
    python benchmarks/train_step.py --quick           # fewer steps, 1 round (smoke test)
    python benchmarks/train_step.py --cases mlp-small --impls graphopt,torch

The step: the loss of one batch, its gradient with respect to every parameter, and one AdamW
update (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2 on every parameter, as
torch.optim.AdamW). It returns the loss (before the update).

Cases (`--cases`):
  mlp-large    MLP classifier 784-1024-1024-10, batch 256, relu, mean softmax cross-entropy
               over int labels
  mlp-small    the same, 784-256-256-10
  transformer  one transformer block over a batch of 8 sequences of 128 tokens: a 2048x256
               embedding table (gather), layernorm, single-head self-attention (q, k, v and
               output projections 256x256 with biases, softmax(q k^T / 16) v, no mask),
               residual, layernorm, MLP 256-1024-256 with gelu (tanh form), residual; a linear
               head to 2048 classes, mean softmax cross-entropy against int targets

Implementations (`--impls`; a peer that is not installed is skipped, with a note):
  graphopt       graphopt.jit(backend="llvm") of value_and_grad + graphopt.optim.AdamW
  torch          torch eager, loss.backward(), torch.optim.AdamW(fused=True)
  torch-compile  torch.compile of the same step function (inductor; the backward's graph
                 break and the optimizer compiled as torch.compile does them); a compile
                 that fails or exceeds --compile-timeout is reported as an error
  jax            jax.jit of jax.value_and_grad + optax.adamw (parameters and state donated)

Each model is written once (`mlp_loss`, `transformer_loss`) over a small table of
primitives per framework (`Prims`), so every framework computes the same function; where a
framework has its own fused form of a primitive (torch's layer_norm, softmax, cross_entropy)
it is used. Every implementation starts from the same weights and batch (numpy, fixed seed)
and uses 2 threads (torch.set_num_threads(2); XLA's and OpenBLAS's thread pools; graphopt's
GRAPHOPT_THREADS default, this machine's cores).

Every (case, implementation) runs in its own subprocess, one at a time; `--rounds` of them,
interleaved (odd rounds in reverse order), and the report gives the median of the rounds'
medians. In each: the first call (setup to the end of the first step: trace and compile for
graphopt, with an empty GRAPHOPT_CACHE_DIR; jit compile for JAX; torch.compile's compile,
with an empty inductor cache), then warm-up steps, then timed steps (the median). The steps
are the same number for every implementation, so the loss the last one returns is comparable
across them (`loss`; `Δloss`: the largest relative difference from torch eager's loss
over the steps, where that loss is above LOSS_FLOOR: a model that learns its batch by heart
ends near 0, where relative differences are rounding). For graphopt, a replay of the
compiled program's nodes one by one, timed (each through the runtime's own node loop, on
copies of the inputs), splits the step into matmul (numpy's BLAS), compiled kernels, other
numpy nodes and the Python around them; for torch eager, torch.profiler splits its step into
matmul (its BLAS: aten::mm, addmm, bmm) and the rest, so the two splits stand side by side.
The machine's memory bandwidth is measured before and after.

Writes <out>/train_step.md (tables), train_step.json (everything measured) and train_step.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

import common
from common import (add_run_options, bandwidth_report, begin, cpu_probe, finish,
                    fmt_ms, fmt_s, machine_summary, peak_rss_mb, run_on_snapshot,
                    run_rounds, worker_bandwidth)

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 1e-2
LN_EPS = 1e-5
SEED = 0
THREADS = 2

IMPLS = ["graphopt", "torch", "torch-compile", "jax"]
REQUIRES = {"graphopt": ["graphopt"], "torch": ["torch"], "torch-compile": ["torch"],
            "jax": ["jax", "optax"]}
REFERENCE = "torch"  # Δloss is relative to this implementation's loss
LOSS_FLOOR = 1e-2  # Δloss compares the steps where the reference's loss is above this
CASES = ["mlp-large", "mlp-small", "transformer"]
WORKER_TIMEOUT = 900  # seconds for one (case, implementation)
# Steps in each worker: (warm-up after the first call, timed); the same for every
# implementation, so that the last step's loss compares across them.
STEPS = {False: (5, 30), True: (2, 5)}


# -- cases -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    kind: str  # "mlp" or "transformer"
    label: str
    sizes: tuple[int, ...] = ()  # mlp: the layer widths, input first
    batch: int = 256
    vocab: int = 2048
    seq: int = 128
    dim: int = 256
    hidden: int = 1024


CASE_DEFS = {
    "mlp-large": Case("mlp", "MLP 784-1024-1024-10, batch 256", (784, 1024, 1024, 10)),
    "mlp-small": Case("mlp", "MLP 784-256-256-10, batch 256", (784, 256, 256, 10)),
    "transformer": Case("transformer", "1 block, d 256, seq 128, batch 8, vocab 2048",
                        batch=8),
}


def case_def(case: str) -> Case:
    if case.endswith(TINY):
        return tiny_twin(case_def(case[:-len(TINY)]))
    if case not in CASE_DEFS:
        raise SystemExit(f"unknown case {case!r}; known: {', '.join(CASES)}")
    return CASE_DEFS[case]


TINY = "@tiny"  # a case's tiny twin: its step at shapes where the arithmetic costs nothing


def tiny_twin(c: Case) -> Case:
    """The same model (as many layers, the same ops) 8 wide, batch 2, sequence 4: its step's
    time is the fixed cost of its nodes, Python's dispatch between them most of all."""
    return Case(c.kind, f"{c.label} at tiny shapes", tuple(8 for _ in c.sizes[:-1]) +
                c.sizes[-1:] if c.sizes else (), batch=2, vocab=16, seq=4, dim=8, hidden=16)


def _linear(rng: np.random.Generator, params: dict, name: str, fan_in: int, fan_out: int
            ) -> None:
    """torch.nn.Linear's initialisation: weight and bias uniform in ±1/sqrt(fan_in); the
    weight stored [in, out] (x @ w)."""
    bound = 1 / math.sqrt(fan_in)
    params[f"{name}.w"] = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
    params[f"{name}.b"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)


def make_case(case: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(parameters by name, inputs, int64 labels): the same for every implementation."""
    c = case_def(case)
    rng = np.random.default_rng(SEED)
    params: dict[str, np.ndarray] = {}
    if c.kind == "mlp":
        for i, (n_in, n_out) in enumerate(zip(c.sizes, c.sizes[1:])):
            _linear(rng, params, f"fc{i}", n_in, n_out)
        x = rng.standard_normal((c.batch, c.sizes[0])).astype(np.float32)
        y = rng.integers(0, c.sizes[-1], c.batch)
        return params, x, y
    d = c.dim
    params["embed"] = (rng.standard_normal((c.vocab, d)) * 0.02).astype(np.float32)
    for ln in ("ln1", "ln2"):
        params[f"{ln}.g"] = np.ones(d, np.float32)
        params[f"{ln}.b"] = np.zeros(d, np.float32)
    for name in ("q", "k", "v", "o"):
        _linear(rng, params, name, d, d)
    _linear(rng, params, "ff1", d, c.hidden)
    _linear(rng, params, "ff2", c.hidden, d)
    _linear(rng, params, "head", d, c.vocab)
    tokens = rng.integers(0, c.vocab, (c.batch, c.seq))
    targets = rng.integers(0, c.vocab, (c.batch, c.seq))
    return params, tokens, targets


# -- the models, once, over each framework's primitives ----------------------------------------

@dataclass(frozen=True)
class Prims:
    """What the models need beyond +, -, *, / and @ (a matmul of 2-D or batched 3-D
    operands)."""

    relu: Callable
    gelu: Callable  # the tanh form
    softmax: Callable  # over the last axis
    cross_entropy: Callable  # (logits [n, classes], int labels [n]) -> the mean
    gather: Callable  # (table, int ids) -> table[ids]
    swap_last: Callable  # [b, s, d] -> [b, d, s]
    reshape: Callable
    layer_norm: Callable  # (x, gain, bias) over the last axis, eps LN_EPS


def mlp_loss(f: Prims, p: dict, x: Any, labels: Any) -> Any:
    layers = len(p) // 2
    h = x
    for i in range(layers - 1):
        h = f.relu(h @ p[f"fc{i}.w"] + p[f"fc{i}.b"])
    return f.cross_entropy(h @ p[f"fc{layers - 1}.w"] + p[f"fc{layers - 1}.b"], labels)


def transformer_loss(f: Prims, p: dict, tokens: Any, targets: Any) -> Any:
    batch, seq = tokens.shape
    dim = p["q.w"].shape[0]

    def linear(h, name):  # on [batch * seq, features]
        return h @ p[f"{name}.w"] + p[f"{name}.b"]

    h = f.reshape(f.gather(p["embed"], tokens), (batch * seq, dim))
    a = f.layer_norm(h, p["ln1.g"], p["ln1.b"])
    q, k, v = (f.reshape(linear(a, n), (batch, seq, dim)) for n in ("q", "k", "v"))
    attn = f.softmax((q @ f.swap_last(k)) * (1 / math.sqrt(dim))) @ v
    h = h + linear(f.reshape(attn, (batch * seq, dim)), "o")
    m = f.layer_norm(h, p["ln2.g"], p["ln2.b"])
    h = h + linear(f.gelu(linear(m, "ff1")), "ff2")
    return f.cross_entropy(linear(h, "head"), f.reshape(targets, (batch * seq,)))


LOSSES = {"mlp": mlp_loss, "transformer": transformer_loss}


def manual_layer_norm(mean: Callable, rsqrt: Callable) -> Callable:
    """layer_norm from a keepdims mean over the last axis and rsqrt."""
    def layer_norm(x, gain, bias):
        centered = x - mean(x)
        return centered * rsqrt(mean(centered * centered) + LN_EPS) * gain + bias
    return layer_norm


def graphopt_prims() -> Prims:
    from graphopt import ops
    return Prims(relu=ops.relu, gelu=ops.gelu, softmax=lambda x: ops.softmax(x, axis=-1),
                 cross_entropy=ops.softmax_cross_entropy, gather=ops.gather,
                 swap_last=lambda x: ops.transpose(x, (0, 2, 1)), reshape=ops.reshape,
                 layer_norm=manual_layer_norm(lambda x: ops.mean(x, axis=-1, keepdims=True),
                                              ops.rsqrt))


def torch_prims() -> Prims:
    import torch
    import torch.nn.functional as F
    return Prims(relu=torch.relu, gelu=lambda x: F.gelu(x, approximate="tanh"),
                 softmax=lambda x: torch.softmax(x, dim=-1), cross_entropy=F.cross_entropy,
                 gather=lambda table, ids: table[ids], swap_last=lambda x: x.transpose(1, 2),
                 reshape=torch.reshape,
                 layer_norm=lambda x, g, b: F.layer_norm(x, g.shape, g, b, eps=LN_EPS))


def jax_prims() -> Prims:
    import jax
    import jax.numpy as jnp

    def cross_entropy(logits, labels):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))

    return Prims(relu=jax.nn.relu, gelu=lambda x: jax.nn.gelu(x, approximate=True),
                 softmax=lambda x: jax.nn.softmax(x, axis=-1), cross_entropy=cross_entropy,
                 gather=lambda table, ids: jnp.take(table, ids, axis=0),
                 swap_last=lambda x: jnp.swapaxes(x, 1, 2), reshape=jnp.reshape,
                 layer_norm=manual_layer_norm(lambda x: jnp.mean(x, axis=-1, keepdims=True),
                                              jax.lax.rsqrt))


# -- implementations: each returns step() -> the loss (a float) after its setup --------------
# `info` collects what an implementation wants reported.

def setup_graphopt(case: str, info: dict) -> Callable[[], float]:
    import graphopt as go
    from graphopt import optim
    info["graphopt_file"] = go.__file__
    arrays, x, y = make_case(case)
    loss_fn = LOSSES[case_def(case).kind]
    f = graphopt_prims()
    params = {n: go.Parameter(a, name=n) for n, a in arrays.items()}
    opt = optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    loss_and_grads = go.value_and_grad(lambda x, y: loss_fn(f, params, x, y), wrt=params)

    def train_step(x, y):
        loss, grads = loss_and_grads(x, y)
        opt.step(grads)
        return loss

    start = time.perf_counter()
    jitted = go.jit(train_step, backend="llvm")
    exe = jitted.lower(x, y)
    info["cold_compile_s"] = time.perf_counter() - start
    info["kernels"] = len(exe.kernels)
    info["kernel_compile_s"] = sum(k.compile_seconds for k in exe.kernels)
    info["fallbacks"] = [f"{fb.node.op}: {fb.reason}" for fb in exe.program.fallbacks]
    info["pass_s"] = sum(s.seconds for s in exe.pass_result.stats)
    info["traced_nodes"] = len(exe.traced_graph.nodes)
    info["graph_nodes"] = len(exe.graph.nodes)
    info["_exe"], info["_args"] = exe, (x, y)
    return lambda: float(jitted(x, y))


def setup_torch(case: str, info: dict, compiled: bool) -> Callable[[], float]:
    import torch
    torch.set_num_threads(THREADS)
    info["threads"] = torch.get_num_threads()
    arrays, x, y = make_case(case)
    loss_fn = LOSSES[case_def(case).kind]
    f = torch_prims()
    params = {n: torch.tensor(a, requires_grad=True) for n, a in arrays.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WEIGHT_DECAY, fused=True)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def train_step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(f, params, x, y)
        loss.backward()
        opt.step()
        return loss.detach()

    step = torch.compile(train_step) if compiled else train_step
    return lambda: float(step(tx, ty))


def setup_jax(case: str, info: dict) -> Callable[[], float]:
    import functools
    import jax
    import jax.numpy as jnp
    import optax
    info["version"] = f"jax {jax.__version__}, optax {optax.__version__}"
    arrays, x, y = make_case(case)
    loss_fn = functools.partial(LOSSES[case_def(case).kind], jax_prims())
    tx = optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WEIGHT_DECAY)
    params = {n: jnp.asarray(a) for n, a in arrays.items()}
    state = [params, tx.init(params)]
    jx, jy = jnp.asarray(x), jnp.asarray(y, dtype=jnp.int32)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step():
        state[0], state[1], loss = train_step(state[0], state[1], jx, jy)
        return float(loss)  # waits for the step

    return step


SETUPS: dict[str, Callable[[str, dict], Callable[[], float]]] = {
    "graphopt": setup_graphopt,
    "torch": lambda case, info: setup_torch(case, info, compiled=False),
    "torch-compile": lambda case, info: setup_torch(case, info, compiled=True),
    "jax": setup_jax,
}


# -- graphopt's step, node by node -------------------------------------------------------------

MATMUL = "matmul (numpy's BLAS)"

def node_kind(node, program) -> str:
    """The breakdown's row of a node the program runs."""
    if id(node) in program.native:
        return "kernels (LLVM)"
    if node.op == "matmul":
        return MATMUL
    if node.body is not None:
        return "kernels run by numpy (no lowering)"
    return f"numpy: {node.op}"


def node_label(node, program) -> str:
    """A node in the breakdown's list of the slowest: its op (a kernel's name and the ops it
    fused) and its first result's type."""
    k = program.native.get(id(node))
    what = node.op
    if node.body is not None:
        ops = sorted({n.op for n in node.body.nodes})
        what = f"{k.name if k is not None else node.op} [{' '.join(ops)}]"
    out = node.outputs[0].type if node.outputs else ""
    return f"{what} -> {out}"


def replay_breakdown(exe, args: tuple, reps: int, slowest: int = 12) -> dict[str, Any]:
    """Each node of the compiled program run on its own (LLVMProgram.node_times: the
    runtime's node loop, one node at a time), on copies of the inputs, timed: per row of
    node_kind, the nodes' count and the median over `reps` replays of their ms per step; the
    replay's total; and (`slowest`) the nodes that took longest."""
    program = exe.program
    inputs = {v: p._value.copy() for v, p in exe.param_inputs}
    assert len(exe.graph.args) == len(args)
    inputs.update(zip(exe.graph.args, args))
    kinds = [node_kind(n, program) for n in program.nodes]
    count: dict[str, int] = {}
    for k in kinds:
        count[k] = count.get(k, 0) + 1
    per_rep: dict[str, list[float]] = {k: [] for k in [*count, "total"]}
    per_node = np.zeros((reps + 1, len(program.nodes)))
    for rep in range(reps + 1):  # the first is a warm-up
        seconds = dict.fromkeys(count, 0.0)
        start = time.perf_counter()
        per_node[rep] = program.node_times(inputs)
        for kind, sec in zip(kinds, per_node[rep]):
            seconds[kind] += sec
        per_rep["total"].append(time.perf_counter() - start)
        for k, sec in seconds.items():
            per_rep[k].append(sec)
    out: dict[str, Any] = {k: {"nodes": count.get(k, len(program.nodes)),
                               "ms": float(np.median(ts[1:]) * 1e3)}
                           for k, ts in per_rep.items()}
    node_ms = np.median(per_node[1:], axis=0) * 1e3
    out["slowest"] = [{"node": node_label(program.nodes[i], program), "kind": kinds[i],
                       "ms": float(node_ms[i])} for i in np.argsort(-node_ms)[:slowest]]
    return out


def python_overhead(case: str, reps: int) -> dict[str, float]:
    """The step's Python overhead: its tiny twin's step (jit's call, checks and commit, the
    runtime's node loop, numpy's and ctypes' calls on arrays of a few elements), the median
    over 10x `reps` steps, per node of its program."""
    info: dict[str, Any] = {}
    step = setup_graphopt(case + TINY, info)
    for _ in range(20):
        step()
    times = []
    for _ in range(10 * reps):
        s = time.perf_counter()
        step()
        times.append(time.perf_counter() - s)
    nodes = len(info["_exe"].program.nodes)
    us = float(np.median(times) * 1e6)
    return {"step_us": us, "nodes": nodes, "us_per_node": us / nodes}


TORCH_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def torch_matmul_ms(step: Callable[[], float], reps: int) -> tuple[float, float]:
    """The milliseconds per step torch spends in its matrix products and in all its ops (the
    self CPU times under torch.profiler, over `reps` steps): the profiler slows the ops it
    records, so the two are read together, not beside an unprofiled step."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            step()
    events = prof.key_averages()
    mm = sum(e.self_cpu_time_total for e in events if e.key in TORCH_MATMULS)
    return mm / reps / 1e3, sum(e.self_cpu_time_total for e in events) / reps / 1e3


# -- workers (one subprocess each) -----------------------------------------------------------

def worker_run(impl: str, case: str, quick: bool) -> dict:
    info: dict[str, Any] = {}
    start = time.perf_counter()
    step = SETUPS[impl](case, info)
    losses = [step()]
    first_call = time.perf_counter() - start
    warmup, reps = STEPS[quick]
    losses += [step() for _ in range(warmup)]
    probe = cpu_probe()
    times: list[float] = []
    for _ in range(reps):
        s = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - s)
    ms = float(np.median(times) * 1e3)
    exe, args = info.pop("_exe", None), info.pop("_args", None)
    if exe is not None:
        info["kernel_runs_per_step"] = sum(k.calls for k in exe.kernels) / len(losses)
        info["breakdown"] = replay_breakdown(exe, args, 3 if quick else 10)
        info["overhead"] = python_overhead(case, reps)
    if impl == "torch":
        info["matmul_ms"], info["profiled_ms"] = torch_matmul_ms(step, 3 if quick else 10)
    return {"impl": impl, "case": case, "ms": ms, "min_ms": float(np.min(times) * 1e3),
            "reps": reps, "warmup": warmup, "steps": len(losses), "first_call_s": first_call,
            "loss": losses[-1], "losses": losses, "peak_rss_mb": peak_rss_mb(),
            "cpu_probe": probe, **info}


def worker_main(args) -> None:
    if args.worker == "bandwidth":
        result = worker_bandwidth(args.quick)
    else:
        try:
            result = worker_run(args.worker, args.case, args.quick)
        except Exception as e:  # reported in the results (a torch.compile that fails)
            tail = traceback.format_exc().strip().splitlines()[-3:]
            result = {"error": f"{type(e).__name__}: {str(e).strip()[:300]}",
                      "traceback": tail}
    print("RESULT " + json.dumps(result), flush=True)


# -- the driver --------------------------------------------------------------------------------

def run_worker(argv: list[str], env: dict | None = None, timeout: float = WORKER_TIMEOUT
               ) -> dict:
    return common.run_worker(__file__, argv, env, timeout)


def installed(impl: str) -> str | None:
    """None if the implementation can run, else why not."""
    return common.installed(REQUIRES[impl])


def thread_env() -> dict[str, str]:
    """The environment every worker runs in: 2 threads for the BLAS and XLA pools."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(THREADS)
    env["XLA_FLAGS"] = " ".join(filter(None, [
        os.environ.get("XLA_FLAGS"), "--xla_cpu_multi_thread_eigen=true",
        f"intra_op_parallelism_threads={THREADS}"]))
    return env


# Measured in every round and reported as the median over the rounds (first-call times too:
# one fresh process is one sample of a noisy machine).
ROUND_KEYS = ("ms", "cpu_probe", "first_call_s", "cold_compile_s")


def run_one(impl: str, case: str, rnd: int, q: list[str], cache_root: Path,
            compile_timeout: float) -> dict:
    """One (implementation, case) in a subprocess, with empty compile caches (graphopt's,
    inductor's): every first call is a cold compile."""
    env = thread_env()
    fresh = cache_root / f"{case}-{impl}-{rnd}"
    fresh.mkdir(mode=0o700)
    env["GRAPHOPT_CACHE_DIR"] = str(fresh / "graphopt")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(fresh / "inductor")
    env["TRITON_CACHE_DIR"] = str(fresh / "triton")
    s = time.perf_counter()
    timeout = compile_timeout if impl == "torch-compile" else WORKER_TIMEOUT
    r = run_worker(["--worker", impl, "--case", case, *q], env, timeout)
    if "error" in r:
        return r
    print(f"{case:<12} {impl:<14} {fmt_ms(r['ms']):>9} ms  loss {r['loss']:.6g}  "
          f"first call {fmt_s(r['first_call_s'])}  2-core probe {r['cpu_probe']:.2f}  "
          f"(round {rnd + 1}, {time.perf_counter() - s:.0f} s)", flush=True)
    return r


def loss_delta(by: dict, r: dict) -> tuple[float, int] | None:
    """The largest |loss - the reference's| / the reference's over the steps where the
    reference's loss is above LOSS_FLOOR, and how many steps those are (None without a
    reference)."""
    ref = by.get(REFERENCE)
    if not ref or "error" in ref or "losses" not in r:
        return None
    pairs = [(a, b) for a, b in zip(r["losses"], ref["losses"]) if abs(b) > LOSS_FLOOR]
    return max((abs(a - b) / abs(b) for a, b in pairs), default=0.0), len(pairs)


def render(results: dict, cases: list[str], impls: list[str], skipped: dict,
           bandwidth: list[dict], machine: dict, quick: bool, wall: float) -> tuple[str, str]:
    """(plain-text tables for the terminal, markdown report)."""
    cols = [i for i in impls if i not in skipped]
    lines = [f"{'case':<12} {'implementation':<14} {'ms/step':>9} {'first call':>11} "
             f"{'loss':>10} {'Δloss (steps)':>12} {'2-core':>6} {'graphopt÷this':>13}"]
    md = ["| case | implementation | ms/step | rounds | first call | peak RSS | "
          f"loss after the steps | Δloss vs {REFERENCE} | 2-core | graphopt ÷ this |",
          "|---" * 10 + "|"]
    measured = [(case, impl, results[case][impl]) for case in cases for impl in cols
                if impl in results.get(case, {})]
    for case, impl, r in measured:
        by = results[case]
        g = by.get("graphopt")
        g_ok = g is not None and "error" not in g
        if "error" in r:
            lines.append(f"{case:<12} {impl:<14} ERROR {r['error'][:300]}")
            md.append(f"| {case} | {impl} | error: {r['error'][:300].replace('|', '/')} "
                      f"| | | | | | | |")
            continue
        ratio = f"{g['ms'] / r['ms']:.2f}" if g_ok else "—"
        delta = loss_delta(by, r)
        d_s = "—" if delta is None else f"{delta[0]:.1e} ({delta[1]})"
        rounds = ", ".join(fmt_ms(x) for x in r.get("rounds_ms", [r["ms"]]))
        probe = float(np.median(r.get("rounds_cpu_probe", [r["cpu_probe"]])))
        lines.append(f"{case:<12} {impl:<14} {fmt_ms(r['ms']):>9} "
                     f"{fmt_s(r['first_call_s']):>11} {r['loss']:>10.6g} {d_s:>12} "
                     f"{probe:6.2f} {ratio:>13}")
        md.append(f"| {case} | {impl} | **{fmt_ms(r['ms'])}** | {rounds} | "
                  f"{fmt_s(r['first_call_s'])} | {r['peak_rss_mb']:.0f} MB | "
                  f"{r['loss']:.6g} | {d_s} | {probe:.2f} | {ratio} |")
    text = "\n".join(lines)

    comp = ["| case | traced nodes | nodes after passes | kernels | kernel runs/step | "
            "kernels run by numpy | passes | LLVM compile (sum) | cold compile (jit+lower) | "
            "first call |", "|---" * 10 + "|"]
    brk_rows: list[str] = []
    kinds: list[str] = []
    for case in cases:
        r = results.get(case, {}).get("graphopt")
        if r and "error" not in r:
            kinds += [k for k in r["breakdown"] if k not in kinds and
                      k not in ("total", "slowest")]
    fixed = [MATMUL, "kernels (LLVM)", "kernels run by numpy (no lowering)"]
    kinds = [k for k in fixed if k in kinds] + sorted(k for k in kinds if k not in fixed)
    brk = ["| case | step (ms) | " + " | ".join(kinds) + " | replay total | Python "
           "around the nodes | Python overhead per node |", "|---" * (len(kinds) + 5) + "|"]
    brk_txt = []
    slow = ["| case | node | kind | ms |", "|---|---|---|---|"]
    for case in cases:
        r = results.get(case, {}).get("graphopt")
        if not r or "error" in r:
            continue
        comp.append(f"| {case} | {r['traced_nodes']} | {r['graph_nodes']} | {r['kernels']} | "
                    f"{r['kernel_runs_per_step']:.0f} | {len(r['fallbacks'])} | "
                    f"{fmt_s(r['pass_s'])} | {fmt_s(r['kernel_compile_s'])} | "
                    f"{fmt_s(r['cold_compile_s'])} | {fmt_s(r['first_call_s'])} |")
        b = r["breakdown"]
        total = b["total"]["ms"]
        rest = r["ms"] - total

        def cell(k, b=b, r=r):
            if k not in b:
                return "—"
            return f"{fmt_ms(b[k]['ms'])} ({b[k]['nodes']}; {b[k]['ms'] / r['ms']:.0%})"
        o = r.get("overhead")  # (a results file of an older run has none)
        per_node = (f"{o['us_per_node']:.1f} µs ({o['nodes']} nodes, {o['step_us']:.0f} µs)"
                    if o else "—")
        brk.append(f"| {case} | {fmt_ms(r['ms'])} | " + " | ".join(cell(k) for k in kinds)
                   + f" | {fmt_ms(total)} | {fmt_ms(rest)} ({rest / r['ms']:.0%}) | "
                   f"{per_node} |")
        brk_txt.append(f"{case}: step {fmt_ms(r['ms'])} ms = " + ", ".join(
            f"{k} {fmt_ms(b[k]['ms'])}" for k in kinds if k in b)
            + f", Python around the nodes {fmt_ms(rest)}"
            + (f"; Python overhead: {o['us_per_node']:.1f} µs per node" if o else ""))
        brk_rows += [f"- {case}: {fb}" for fb in r["fallbacks"]]
        slow += [f"| {case} | {n['node'].replace('|', '/')} | {n['kind']} | "
                 f"{fmt_ms(n['ms'])} |" for n in b.get("slowest", [])]
    text += "\n\ngraphopt step by node kind (replay, ms)\n" + "\n".join(brk_txt)
    split = ["| case | graphopt matmul | graphopt rest | torch matmul | torch rest | "
             "matmul: graphopt ÷ torch | rest: graphopt ÷ torch |", "|---" * 7 + "|"]
    for case in cases:
        g, t = (results.get(case, {}).get(i) for i in ("graphopt", "torch"))
        if not g or not t or "error" in g or "error" in t or "profiled_ms" not in t:
            continue
        gm = g["breakdown"].get(MATMUL, {}).get("ms", 0.0)
        g_rest = g["breakdown"]["total"]["ms"] - gm
        tm, t_rest = t["matmul_ms"], t["profiled_ms"] - t["matmul_ms"]
        split.append(f"| {case} | {fmt_ms(gm)} | {fmt_ms(g_rest)} | {fmt_ms(tm)} | "
                     f"{fmt_ms(t_rest)} | {gm / tm:.2f} | {g_rest / t_rest:.2f} |")
    bw_text, bw_md = bandwidth_report(bandwidth) if bandwidth else ("", [])
    text += "\n\n" + bw_text if bw_text else ""
    if skipped:
        text += "\n\nskipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())
    warmup, reps = STEPS[quick]
    out = ["# Training step benchmark" + (" (--quick: few steps, not a measurement)"
                                          if quick else ""), "",
           f"`python benchmarks/train_step.py{' --quick' if quick else ''}` on "
           f"{machine_summary(machine)}. Run took {wall:.0f} s. On a machine shared with other "
           "jobs the timings are noisy: the `2-core` column says how much of the second "
           "core each measurement got, `rounds` how far the rounds differ.", "",
           "One training step: forward, backward, AdamW (lr 1e-3, weight decay 1e-2), f32, "
           f"{THREADS} threads. ms/step: the median over the rounds of each round's median "
           f"of {reps} timed steps after the first call and {warmup} warm-up steps (`rounds` "
           "lists each round's median; the rounds interleave the implementations, each in a "
           "fresh process); `first call` is setup (importing the framework included) to the end "
           "of the first step (graphopt: "
           "trace, passes and LLVM compile with an empty cache; JAX: jit compile; "
           "torch-compile: dynamo and inductor with an empty inductor cache); `loss after "
           f"the steps` is the loss the last step returns ({1 + warmup + reps} steps from "
           f"the same weights and batch); `Δloss` is the largest relative difference from "
           f"{REFERENCE}'s loss over the steps where {REFERENCE}'s is above {LOSS_FLOOR:g} "
           "(in parentheses: how many steps; the MLPs learn their one batch by heart and "
           "end near 0, where relative differences are only rounding); `2-core` is the "
           "speedup of 2 threads over 1 on a compute-bound "
           "numpy probe run before the timed steps (2.0: both cores free; near 1.0: one "
           "core's worth); `graphopt ÷ this` is graphopt's time over this row's (below 1: "
           "graphopt is faster).", "",
           "Cases: " + "; ".join(f"{c}: {case_def(c).label}" for c in cases), "", *md, "",
           "## graphopt's step by node kind", "",
           "A replay of the compiled program (`jit(step).lower(x, y).program`): each node "
           "run on its own through the runtime's node loop (`LLVMProgram.node_times`), on "
           "copies of the inputs, timed with `time.perf_counter`; the median of 10 replays "
           "(3 with --quick) per row (in parentheses: the number of nodes, and the share of "
           "the step). `Python around the nodes` is the step's time less the replay's: "
           "jit's argument flattening and checks, the runtime's loop, the commit of the "
           "new parameter values (a negative value: the step ran faster than its replay, "
           "noise). `Python overhead per node`: the same step at tiny shapes (8 wide, batch "
           "2, sequence 4: the arithmetic costs nothing), its median step time over its nodes "
           "(in parentheses: their number and the step's time): what each node costs in "
           "Python, numpy's and ctypes' calls included.", "", *brk, "",
           *(["Nodes numpy runs because their op has no LLVM lowering:", "", *brk_rows, ""]
             if brk_rows else []),
           "The slowest nodes of the replay (median ms per step; a kernel by its name and "
           "the ops it fused):", "", *slow, "",
           "## Matmul and the rest, graphopt and torch eager", "",
           "ms per step. graphopt's from the replay above (the rest: the replay's other "
           "nodes); torch's from torch.profiler, over 10 steps (3 with --quick) after the "
           "timed ones: the self CPU time of aten::mm, addmm and bmm, and of every other op "
           "(the profiler slows what it records, so its two figures are read together, not "
           "against the unprofiled step). Each framework's "
           "products are its BLAS's (numpy's OpenBLAS for graphopt, MKL for torch's "
           "x86 wheels).", "", *(split if len(split) > 2 else ["(no graphopt and torch rows)"]),
           "",
           "## graphopt compile", "", "`LLVM compile (sum)` adds up each kernel's compile "
           "time; a step's kernels compile in two processes (a compile helper), so the sum can "
           "exceed the cold compile's wall time.", "", *comp, "", *bw_md]
    if skipped:
        out += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()), ""]
    return text, "\n".join(out)


def report(run: common.Run, results: dict, bandwidth: list[dict]) -> None:
    """Δloss for every result, then the report's files (common.finish)."""
    for case in run.cases:
        for impl, r in results[case].items():
            if impl != "_label" and "error" not in r:
                r["loss_delta"] = loss_delta(results[case], r)
    text, md = render(results, run.cases, run.impls, run.skipped, bandwidth, run.machine,
                      run.quick, run.wall_s)
    finish(run, "train_step", results, bandwidth, text, md,
           "Training step (forward, backward, AdamW), f32, 2 threads"
           + (" (--quick)" if run.quick else ""),
           "ms per step (median, log scale; lower is better)")


def render_again(path: Path, out_dir: Path) -> int:
    """The report of a run, from its JSON: the same figures, this script's tables."""
    saved = json.loads(path.read_text())
    results = saved["results"]
    cases = list(results)
    impls = list(dict.fromkeys([i for by in results.values() for i in by if i != "_label"]
                               + list(saved["skipped"])))
    out_dir.mkdir(parents=True, exist_ok=True)
    run = common.Run(cases, impls, saved["skipped"], out_dir, saved["quick"],
                     saved["machine"], 0.0, saved["wall_s"])
    report(run, results, saved["bandwidth"])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap, CASES, IMPLS, f"{sum(STEPS[True]) + 1} steps per worker instead of "
                                      f"{sum(STEPS[False]) + 1}, 1 round")
    ap.add_argument("--compile-timeout", type=float, default=600,
                    help="seconds torch-compile's worker may take, compile included "
                         "(default 600)")
    common.add_driver_options(ap, "train_step")
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    if args.render:
        return render_again(Path(args.render), Path(args.out))
    run = begin(ap, args, IMPLS, case_def, installed)
    cases, q = run.cases, run.quick_args
    snapshot = run_on_snapshot(run.machine)
    bandwidth = []
    if not args.no_bandwidth:
        print("measuring memory bandwidth ...", flush=True)
        bandwidth.append(run_worker(["--worker", "bandwidth", *q]))
    cache_root = Path(tempfile.mkdtemp(prefix="graphopt-train-bench-"))
    try:
        results, errors = run_rounds(
            cases, run.runnable, args.rounds,
            lambda impl, case, rnd: run_one(impl, case, rnd, q, cache_root,
                                            args.compile_timeout),
            ROUND_KEYS, lambda case: case_def(case).label)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
        shutil.rmtree(snapshot, ignore_errors=True)
    # A torch.compile that fails here is a result (in the table), not a failed run.
    failed = any(impl != "torch-compile" for _, impl in errors)
    if not args.no_bandwidth:
        bandwidth.append(run_worker(["--worker", "bandwidth", *q]))
    run.stop()
    # The measurements first, as they are: a report that fails can be made again from them
    # (--render).
    (run.out_dir / "train_step.json").write_text(json.dumps(
        {"machine": run.machine, "quick": run.quick, "wall_s": run.wall_s,
         "bandwidth": bandwidth, "results": results, "skipped": run.skipped}, indent=1))
    report(run, results, bandwidth)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
