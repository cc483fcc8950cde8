#!/usr/bin/env python
"""One Adam step (f32), side by side: graphopt (llvm backend) and its peers.

    python benchmarks/adam.py                      # every case and every installed peer
    python benchmarks/adam.py --quick              # small sizes, 1-2 repeats (smoke test)
    python benchmarks/adam.py --cases 16M,many --impls graphopt,torch-fused
    python benchmarks/adam.py --profile many       # cProfile of graphopt's steps, one case

The step is torch.optim.Adam's (lr 1e-3, betas (0.9, 0.999), eps 1e-8 outside the square
root, bias correction, no weight decay):

    m <- m + (1 - b1)(g - m);   v <- b2 v + (1 - b2) g^2
    p <- p - lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps)

Implementations (`--impls`; a peer that is not installed is skipped, with a note):
  graphopt       graphopt.optim.Adam inside `graphopt.jit(step, backend="llvm")`, the gradients
                 as arguments of the step
  graphopt-ops   the same step written directly with graphopt.ops and graphopt.assign
  graphopt-bf16  graphopt with its moments stored in bf16 (`state_dtype="bf16"`): 20 bytes
                 per element instead of 28
  graphopt-v3    graphopt compiled for x86-64-v3 (GRAPHOPT_CPU: AVX2 and FMA, no AVX-512),
                 whatever this CPU has
  numpy          numpy as a user writes it: per tensor, in-place where natural
  torch-foreach  torch.optim.Adam(foreach=True)
  torch-fused    torch.optim.Adam(fused=True)
  jax            jax.jit of optax.adam's update + apply_updates (parameters and state donated)
  numba          one @njit(parallel=True) prange loop over the elements, one call per tensor

Cases (`--cases`): 1M, 16M, 64M (one tensor of that many f32 elements), bert (the 199 tensors
of BERT-base, 109.5M elements), many (1,000 tensors of 1k-10k elements, fixed seed).

Every (case, implementation) runs in its own subprocess, one at a time, so each starts with
its memory free and its own peak RSS is measured. Each times single steps after a warm-up and
reports the median; GB/s counts 28 bytes per element (read p, g, m, v; write p, m, v; 20 for
graphopt-bf16, whose m and v are 2 bytes). After
two steps, the first 1,024 elements of the first and the last tensor are compared with an
f64 reference (`max|dp|`). graphopt's compile is measured cold (a fresh process, an empty
GRAPHOPT_CACHE_DIR) and warm (another fresh process on the same cache directory, fresh
Parameters: the first call of the jitted step, to its end; `jit()` itself, which loads the
LLVM backend once per process, is timed apart); in every round, reported as the median over
the rounds. The machine's memory bandwidth
is measured before and after the run (a STREAM-like triad with numba prange on 2 threads, a
1-thread numpy copy).

Writes <out>/adam.md (tables), adam.json (everything measured) and adam.png (ms per step).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import common
from common import (add_run_options, bandwidth_report, begin, cpu_probe, finish, fmt_ms,
                    fmt_s, machine_summary, peak_rss_mb, run_on_snapshot, run_rounds,
                    timings, worker_bandwidth)

BYTES_PER_ELEMENT = 28  # read p, g, m, v; write p, m, v (f32)
# bf16 moments: read p, g (f32) and m, v (bf16); write p (f32), m, v (bf16)
BYTES_PER_ELEMENT_OF = {"graphopt-bf16": 20}
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8
SEED = 0
SAMPLE = 1024  # elements of the first and last tensor checked against the f64 reference

IMPLS = ["graphopt", "graphopt-ops", "graphopt-bf16", "graphopt-v3", "numpy", "torch-foreach", "torch-fused", "jax", "numba"]
REQUIRES = {"graphopt": ["graphopt"], "graphopt-ops": ["graphopt"],
            "graphopt-bf16": ["graphopt"], "graphopt-v3": ["graphopt"], "numpy": [],
            "torch-foreach": ["torch"], "torch-fused": ["torch"], "jax": ["jax", "optax"],
            "numba": ["numba"]}
GRAPHOPT_IMPLS = ("graphopt", "graphopt-ops", "graphopt-bf16", "graphopt-v3")
# graphopt-v3: the graphopt step compiled for x86-64-v3 (AVX2, FMA; no AVX-512), whatever
# this CPU has: the level the update kernels must hold on too.
CPU_OF = {"graphopt-v3": "x86-64-v3"}


def bytes_per_element(impl: str) -> int:
    return BYTES_PER_ELEMENT_OF.get(impl, BYTES_PER_ELEMENT)
CASES = ["1M", "16M", "64M", "bert", "many"]
WORKER_TIMEOUT = 900  # seconds for one (case, implementation)


# -- cases -----------------------------------------------------------------------------------

def bert_base_shapes(hidden: int = 768, layers: int = 12, ffn: int = 3072, vocab: int = 30522,
                     positions: int = 512, types: int = 2) -> list[tuple[int, ...]]:
    """The parameter shapes of BERT-base (bert-base-uncased with its pooler), in order."""
    h = hidden
    shapes: list[tuple[int, ...]] = [(vocab, h), (positions, h), (types, h), (h,), (h,)]
    for _ in range(layers):
        shapes += [(h, h), (h,)] * 4              # query, key, value, attention output
        shapes += [(h,), (h,)]                    # attention LayerNorm
        shapes += [(h, ffn), (ffn,), (ffn, h), (h,)]  # intermediate, output
        shapes += [(h,), (h,)]                    # output LayerNorm
    shapes += [(h, h), (h,)]                      # pooler
    return shapes


def case_shapes(case: str, quick: bool = False) -> list[tuple[int, ...]]:
    if case in ("1M", "16M", "64M"):
        n = {"1M": 1 << 20, "16M": 1 << 24, "64M": 1 << 26}[case]
        return [(n >> 6 if quick else n,)]
    if case == "bert":
        return bert_base_shapes(64, 12, 256, 1000, 64) if quick else bert_base_shapes()
    if case == "many":
        sizes = np.random.default_rng(SEED).integers(1000, 10001, size=50 if quick else 1000)
        return [(int(s),) for s in sizes]
    raise SystemExit(f"unknown case {case!r}; known: {', '.join(CASES)}")


def case_label(case: str, shapes: list[tuple[int, ...]]) -> str:
    n = sum(math.prod(s) for s in shapes)
    return f"{len(shapes)} tensor{'s' * (len(shapes) > 1)}, {n / 1e6:.2f}M elements"


def _uniform(i: int, kind: int, n: int) -> np.ndarray:
    """f32 uniform in [-1, 1) from the stream (SEED, tensor i, kind): a prefix of n elements
    is the same for any longer n, so the f64 reference can regenerate just a prefix."""
    a = np.empty(n, np.float32)
    np.random.default_rng([SEED, i, kind]).random(out=a, dtype=np.float32)
    a *= 2
    a -= 1
    return a


def make_data(shapes: list[tuple[int, ...]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Parameters and gradients, uniform in [-1, 1), one seeded stream per tensor and kind."""
    ps = [_uniform(i, 0, math.prod(s)).reshape(s) for i, s in enumerate(shapes)]
    gs = [_uniform(i, 1, math.prod(s)).reshape(s) for i, s in enumerate(shapes)]
    return ps, gs


def reference_sample(shapes: list[tuple[int, ...]], steps: int = 2) -> list[np.ndarray]:
    """The f64 result of `steps` Adam steps on the checked prefixes."""
    out = []
    for i in sorted({0, len(shapes) - 1}):
        k = min(SAMPLE, math.prod(shapes[i]))
        p = _uniform(i, 0, k).astype(np.float64)
        g = _uniform(i, 1, k).astype(np.float64)
        m, v = np.zeros(k), np.zeros(k)
        for t in range(1, steps + 1):
            m = m + (1 - BETA1) * (g - m)
            v = BETA2 * v + (1 - BETA2) * g * g
            p = p - LR / (1 - BETA1 ** t) * m / (np.sqrt(v) / math.sqrt(1 - BETA2 ** t) + EPS)
        out.append(p)
    return out


def sample_of(arrays: list[np.ndarray]) -> list[list[float]]:
    return [np.asarray(arrays[i]).reshape(-1)[:SAMPLE].astype(np.float64).tolist()
            for i in sorted({0, len(arrays) - 1})]


def scalars(t: int) -> tuple[float, float]:
    """torch's step_size and bias_correction2_sqrt for step t (from 1), in f64."""
    return LR / (1 - BETA1 ** t), math.sqrt(1 - BETA2 ** t)


# -- implementations: each returns (step, sync, sample) after its setup ----------------------
# step() runs one Adam step; sync() waits for it (asynchronous runtimes); sample() returns the
# checked prefixes of the parameters. `info` collects what an implementation wants reported.

def setup_numpy(ps, gs, info):
    ms = [np.zeros_like(p) for p in ps]
    vs = [np.zeros_like(p) for p in ps]
    t = [0]

    def step():
        t[0] += 1
        step_size, bias2_sqrt = scalars(t[0])
        for p, g, m, v in zip(ps, gs, ms, vs):
            m *= BETA1
            m += (1 - BETA1) * g
            v *= BETA2
            v += (1 - BETA2) * g * g
            p -= step_size * m / (np.sqrt(v) / bias2_sqrt + EPS)

    return step, lambda: None, lambda: sample_of(ps)


def setup_torch(ps, gs, info, fused: bool):
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    info["threads"] = torch.get_num_threads()
    info["version"] = torch.__version__
    params = [torch.nn.Parameter(torch.from_numpy(p)) for p in ps]
    for p, g in zip(params, gs):
        p.grad = torch.from_numpy(g)
    kw = {"fused": True} if fused else {"foreach": True}
    opt = torch.optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS, **kw)
    return opt.step, lambda: None, lambda: sample_of([p.detach().numpy() for p in params])


def setup_jax(ps, gs, info):
    import functools
    import jax
    import jax.numpy as jnp
    import optax
    info["version"] = f"jax {jax.__version__}, optax {optax.__version__}"
    tx = optax.adam(LR, b1=BETA1, b2=BETA2, eps=EPS)
    params = [jnp.asarray(p) for p in ps]
    grads = [jnp.asarray(g) for g in gs]
    state = [tx.init(params)]
    cur = [params]
    del params

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def step():
        cur[0], state[0] = update(cur[0], state[0], grads)

    return step, lambda: jax.block_until_ready(cur[0]), lambda: sample_of(
        [np.asarray(cur[0][i]) for i in sorted({0, len(ps) - 1})])


def setup_numba(ps, gs, info):
    import numba
    from numba import njit, prange
    info["version"] = numba.__version__
    info["threads"] = numba.get_num_threads()

    @njit(parallel=True, fastmath=False, cache=False)
    def adam(p, g, m, v, one_minus_b1, b2, one_minus_b2, step_size, bias2_sqrt, eps):
        for i in prange(p.size):
            gi = g[i]
            mi = m[i] + one_minus_b1 * (gi - m[i])
            vi = b2 * v[i] + one_minus_b2 * gi * gi
            m[i] = mi
            v[i] = vi
            p[i] = p[i] - step_size * mi / (math.sqrt(vi) / bias2_sqrt + eps)

    flat_p = [p.reshape(-1) for p in ps]
    flat_g = [g.reshape(-1) for g in gs]
    ms = [np.zeros_like(p) for p in flat_p]
    vs = [np.zeros_like(p) for p in flat_p]
    f32 = np.float32
    t = [0]

    def step():
        t[0] += 1
        step_size, bias2_sqrt = scalars(t[0])
        c = (f32(1 - BETA1), f32(BETA2), f32(1 - BETA2), f32(step_size), f32(bias2_sqrt),
             f32(EPS))
        for p, g, m, v in zip(flat_p, flat_g, ms, vs):
            adam(p, g, m, v, *c)

    return step, lambda: None, lambda: sample_of(ps)


def graphopt_adam_step(ps, info, variant: str) -> tuple[Callable, list]:
    """The step function (not yet jitted) and the Parameters it updates."""
    import graphopt as go
    from graphopt import ops, optim
    params = [go.Parameter(p, name=f"p{i}") for i, p in enumerate(ps)]
    if variant != "graphopt-ops":
        opt = optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS,
                         state_dtype="bf16" if variant == "graphopt-bf16" else None)

        def adam_step(grads):
            opt.step(grads)
        return adam_step, params

    ms = [go.Parameter(np.zeros_like(p), name=f"p{i}.exp_avg") for i, p in enumerate(ps)]
    vs = [go.Parameter(np.zeros_like(p), name=f"p{i}.exp_avg_sq") for i, p in enumerate(ps)]

    def adam_ops_step(grads, step_size, bias2_sqrt):
        for p, m, v, g in zip(params, ms, vs, grads):
            m_new = m + (1 - BETA1) * (g - m)
            v_new = BETA2 * v + (1 - BETA2) * g * g
            go.assign(m, m_new)
            go.assign(v, v_new)
            go.assign(p, p - step_size * m_new / (ops.sqrt(v_new) / bias2_sqrt + EPS))
    return adam_ops_step, params


def setup_graphopt(ps, gs, info, variant: str):
    import graphopt as go
    info["cache_dir"] = os.environ.get("GRAPHOPT_CACHE_DIR")
    info["graphopt_file"] = go.__file__
    fn, params = graphopt_adam_step(ps, info, variant)
    ps.clear()  # the Parameters hold copies; drop the originals
    t = [0]

    def args():
        if variant != "graphopt-ops":
            return (gs,)
        step_size, bias2_sqrt = scalars(t[0])
        return gs, np.float32(step_size), np.float32(bias2_sqrt)

    start = time.perf_counter()
    jitted = go.jit(fn, backend="llvm")
    t[0] = 1
    exe = jitted.lower(*args())
    info["cold_compile_s"] = time.perf_counter() - start
    info["kernels"] = len(exe.kernels)
    info["kernel_compile_s"] = sum(k.compile_seconds for k in exe.kernels)
    info["cache_hits"] = sum(k.cache_hit for k in exe.kernels)
    info["fallbacks"] = len(exe.program.fallbacks)
    info["pass_s"] = sum(s.seconds for s in exe.pass_result.stats)
    info["graph_nodes"] = len(exe.graph.nodes)
    info["_exe"] = exe
    info["_jitted"] = jitted

    first = [True]

    def step():
        if not first[0]:
            t[0] += 1
        first[0] = False
        jitted(*args())

    return step, lambda: None, lambda: sample_of([p._value for p in params])


SETUPS: dict[str, Callable] = {
    "numpy": setup_numpy,
    "torch-foreach": lambda ps, gs, info: setup_torch(ps, gs, info, fused=False),
    "torch-fused": lambda ps, gs, info: setup_torch(ps, gs, info, fused=True),
    "jax": setup_jax,
    "numba": setup_numba,
    **{g: functools.partial(setup_graphopt, variant=g) for g in GRAPHOPT_IMPLS},
}


# -- workers (one subprocess each) -----------------------------------------------------------

def worker_run(impl: str, case: str, quick: bool, timing_only: bool = False) -> dict:
    shapes = case_shapes(case, quick)
    elements = sum(math.prod(s) for s in shapes)
    ps, gs = make_data(shapes)
    info: dict[str, Any] = {}
    start = time.perf_counter()
    step, sync, sample = SETUPS[impl](ps, gs, info)
    step()
    sync()
    first_call = time.perf_counter() - start
    step()
    sync()
    checked = sample()
    warmup, min_reps, max_reps, budget = (0, 1, 2, 0.0) if quick else (3, 5, 200, 1.0)
    w0 = time.perf_counter()
    for _ in range(warmup):  # up to 3 steps, at most ~0.3 s of them
        step()
        sync()
        if time.perf_counter() - w0 > 0.3:
            warmup = _ + 1
            break
    probe = cpu_probe()
    times: list[float] = []
    t0 = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - t0 < budget):
        s = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - s)
    exe = info.pop("_exe", None)
    info.pop("_jitted", None)
    if exe is not None:
        # Kernels run per step (each counts its runs), and the native calls that ran them on
        # each thread: 1 when the graph sink runs the whole step.
        steps_run = 2 + warmup + len(times)
        info["kernel_runs_per_step"] = sum(getattr(k, "calls", 0) for k in exe.kernels) / steps_run
        info["native_calls_per_step"] = exe.program.native_calls
    ms = float(np.median(times) * 1e3)
    return {"impl": impl, "case": case, "tensors": len(shapes), "elements": elements,
            "ms": ms, "min_ms": float(np.min(times) * 1e3), "reps": len(times),
            "gbps": bytes_per_element(impl) * elements / (ms * 1e-3) / 1e9,
            "first_call_s": first_call, "sample": checked, "peak_rss_mb": peak_rss_mb(),
            "cpu_probe": probe, **info}


def worker_warm(impl: str, case: str, quick: bool) -> dict:
    """A fresh process on a warm cache: jit with fresh Parameters, time to the first result."""
    import graphopt as go
    shapes = case_shapes(case, quick)
    ps, gs = make_data(shapes)
    info: dict[str, Any] = {}
    s = time.perf_counter()
    fn, params = graphopt_adam_step(ps, info, impl)
    setup = time.perf_counter() - s
    ps.clear()
    args = (gs, *map(np.float32, scalars(1))) if impl == "graphopt-ops" else (gs,)
    start = time.perf_counter()
    jitted = go.jit(fn, backend="llvm")  # loads the backend (llvmlite), once per process
    made = time.perf_counter()
    jitted(*args)
    first = time.perf_counter() - made
    exe = jitted.lower(*args)
    return {"impl": impl, "case": case, "warm_first_call_s": first,
            "warm_jit_s": made - start, "warm_param_setup_s": setup,
            "warm_cache_hits": sum(k.cache_hit for k in exe.kernels),
            "warm_kernels": len(exe.kernels),
            "warm_kernel_load_s": sum(k.compile_seconds for k in exe.kernels)}


def worker_main(args) -> None:
    if args.worker == "bandwidth":
        result = worker_bandwidth(args.quick)
    elif args.warm:
        result = worker_warm(args.worker, args.case, args.quick)
    else:
        result = worker_run(args.worker, args.case, args.quick)
    print("RESULT " + json.dumps(result), flush=True)


# -- the driver --------------------------------------------------------------------------------

def run_worker(argv: list[str], env: dict | None = None) -> dict:
    return common.run_worker(__file__, argv, env, WORKER_TIMEOUT)


def installed(impl: str) -> str | None:
    """None if the implementation can run, else why not."""
    return common.installed(REQUIRES[impl])


# Measured in every round and reported as the median over the rounds (compile times too:
# one fresh process is one sample of a noisy machine).
ROUND_KEYS = ("ms", "cpu_probe", "first_call_s", "cold_compile_s", "warm_jit_s",
              "warm_first_call_s")


def run_one(impl: str, case: str, rnd: int, q: list[str], cache_root: Path, jax_cache: Path,
            reference: list[np.ndarray]) -> dict:
    """One (implementation, case) in a subprocess; for graphopt, the cold compile (an empty
    cache directory) and then, in another process, the warm-cache first call."""
    env = dict(os.environ)
    cache_dir = None
    if impl in GRAPHOPT_IMPLS:
        cache_dir = cache_root / f"{case}-{impl}-{rnd}"  # empty: a cold compile
        cache_dir.mkdir(mode=0o700)
        env["GRAPHOPT_CACHE_DIR"] = str(cache_dir)
        if impl in CPU_OF:
            env["GRAPHOPT_CPU"] = CPU_OF[impl]
    if impl == "jax":
        env["JAX_COMPILATION_CACHE_DIR"] = str(jax_cache)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    s = time.perf_counter()
    r = run_worker(["--worker", impl, "--case", case, *q], env)
    if "error" in r:
        return r
    got = [np.asarray(x) for x in r.pop("sample")]
    r["max_err"] = float(max(np.max(np.abs(a - b)) if a.size else 0.0
                             for a, b in zip(got, reference)))
    if cache_dir is not None:
        warm = run_worker(["--worker", impl, "--case", case, "--warm", *q], env)
        if "error" in warm:
            return {"error": "warm-cache run: " + warm["error"]}
        r.update({k: v for k, v in warm.items() if k not in ("impl", "case")})
    print(f"{case:<6} {impl:<14} {fmt_ms(r['ms']):>9} ms  {r['gbps']:6.1f} GB/s  "
          f"2-core probe {r['cpu_probe']:.2f}  (round {rnd + 1}, "
          f"{time.perf_counter() - s:.0f} s)", flush=True)
    return r


def targets(results: dict) -> list[tuple[str, str, str, str]]:
    """The speed targets docs/performance.md sets: (target, measured, needed, met/not met)."""
    rows = []

    def res(case, impl):
        r = results.get(case, {}).get(impl)
        return r if r and "error" not in r else None

    def ratio(case: str, impl: str, peer: str, needed: float, label: str = "") -> None:
        g, t = res(case, impl), res(case, peer)
        if g and t:
            x = g["ms"] / t["ms"]
            rows.append((label or f"{case}: {impl} ÷ {peer}", f"{x:.2f} ({fmt_ms(g['ms'])} vs "
                         f"{fmt_ms(t['ms'])} ms)", f"≤ {needed}", "met" if x <= needed
                         else "not met"))

    for impl in ("graphopt", "graphopt-v3"):
        for case in ("16M", "64M", "bert"):
            ratio(case, impl, "torch-fused", 1.0)
        ratio("1M", impl, "numba", 1.0)
    for case in ("16M", "64M"):  # bf16 state pays in proportion to the bytes it saves
        ratio(case, "graphopt-bf16", "torch-fused", 0.75,
              f"{case}: graphopt-bf16 ÷ torch fused (f32)")
    ratio("many", "graphopt", "torch-fused", 0.5, "many (1,000 tensors): graphopt ÷ torch fused")
    g = res("many", "graphopt")
    if g:
        rows.append(("many: cold compile (jit + lower, empty cache)",
                     fmt_s(g.get("cold_compile_s")), "< 1 s",
                     "met" if g.get("cold_compile_s", 1e9) < 1 else "not met"))
        w = g.get("warm_first_call_s")
        rows.append(("many: warm-cache first call (fresh process; "
                     f"jit() before it, loading llvmlite: {fmt_s(g.get('warm_jit_s'))})",
                     fmt_s(w), "< 50 ms", "—" if w is None else "met" if w < 0.05 else "not met"))
    return rows


def render(results: dict, order_cases: list[str], impls: list[str], skipped: dict,
           bandwidth: list[dict], machine: dict, quick: bool, wall: float) -> tuple[str, str]:
    """(plain-text table for the terminal, markdown report)."""
    impl_cols = [i for i in impls if i not in skipped]
    lines, md = [], []
    head = f"{'case':<6} {'implementation':<14} {'ms/step':>9} {'GB/s':>7} {'first call':>11}" \
           f" {'max|dp|':>8} {'2-core':>6} " + " ".join(f"{'÷' + i:>14}" for i in GRAPHOPT_IMPLS
                                                        if i in impl_cols)
    lines.append(head)
    md.append("| case | implementation | ms/step | rounds | GB/s | first call | peak RSS | "
              "max\\|Δp\\| | 2-core | "
              + " | ".join(f"{g} ÷ this" for g in GRAPHOPT_IMPLS if g in impl_cols) + " |")
    md.append("|---" * (9 + sum(g in impl_cols for g in GRAPHOPT_IMPLS)) + "|")
    for case in order_cases:
        by = results.get(case, {})
        for impl in impl_cols:
            r = by.get(impl)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"{case:<6} {impl:<14} ERROR {r['error'][:200]}")
                md.append(f"| {case} | {impl} | error: {r['error'][:200]} |")
                continue
            ratios = []
            for g in GRAPHOPT_IMPLS:
                if g not in impl_cols:
                    continue
                gr = by.get(g)
                ratios.append(f"{gr['ms'] / r['ms']:.2f}" if gr and "error" not in gr else "—")
            err = r.get("max_err")
            err_s = "—" if err is None else f"{err:.0e}"
            rounds = r.get("rounds_ms", [r["ms"]])
            spread = ", ".join(fmt_ms(x) for x in rounds)
            probe = float(np.median(r.get("rounds_cpu_probe", [r.get("cpu_probe", 0.0)])))
            lines.append(f"{case:<6} {impl:<14} {fmt_ms(r['ms']):>9} {r['gbps']:7.1f} "
                         f"{fmt_s(r['first_call_s']):>11} {err_s:>8} {probe:6.2f} "
                         + " ".join(f"{x:>14}" for x in ratios))
            md.append(f"| {case} | {impl} | **{fmt_ms(r['ms'])}** | {spread} | {r['gbps']:.1f} | "
                      f"{fmt_s(r['first_call_s'])} | {r['peak_rss_mb']:.0f} MB | {err_s} | "
                      f"{probe:.2f} | " + " | ".join(ratios) + " |")
    text = "\n".join(lines)

    comp = ["| case | variant | kernels | native calls/step/thread | passes | LLVM compile "
            "(sum) | cold compile (jit+lower) | cold first call | warm jit() | "
            "warm first call | warm cache hits |", "|---" * 11 + "|"]
    comp_txt = [f"{'case':<6} {'variant':<13} {'kernels':>7} {'calls':>5} {'cold compile':>13}"
                f" {'warm 1st call':>13}"]
    for case in order_cases:
        for g in GRAPHOPT_IMPLS:
            r = results.get(case, {}).get(g)
            if not r or "error" in r:
                continue
            comp.append(f"| {case} | {g} | {r['kernels']} | {r['native_calls_per_step']:.0f} | "
                        f"{fmt_s(r['pass_s'])} | {fmt_s(r['kernel_compile_s'])} | "
                        f"{fmt_s(r['cold_compile_s'])} | {fmt_s(r['first_call_s'])} | "
                        f"{fmt_s(r.get('warm_jit_s'))} | {fmt_s(r.get('warm_first_call_s'))} | "
                        f"{r.get('warm_cache_hits', '—')}/{r.get('warm_kernels', '—')} |")
            comp_txt.append(f"{case:<6} {g:<13} {r['kernels']:>7} "
                            f"{r['native_calls_per_step']:>5.0f} "
                            f"{fmt_s(r['cold_compile_s']):>13} "
                            f"{fmt_s(r.get('warm_first_call_s')):>13}")
    text += "\n\ngraphopt compile\n" + "\n".join(comp_txt)

    bw_text, bw_md = bandwidth_report(bandwidth)
    text += "\n\n" + bw_text

    tgt = [] if quick else targets(results)
    if tgt:
        text += "\n\ntargets\n" + "\n".join(f"{a}: {b} (needed {c}) — {d}" for a, b, c, d in tgt)
    if skipped:
        text += "\n\nskipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())

    out = ["# Adam step benchmark" + (" (--quick: small sizes, not a measurement)" if quick
                                       else ""), "",
           f"`python benchmarks/adam.py{' --quick' if quick else ''}` on "
           f"{machine_summary(machine)}. Run took {wall:.0f} s.", "",
           "ms/step: the median over the rounds of each round's median ms per Adam step "
           "(f32) after warm-up (`rounds` lists each round's median; the rounds interleave "
           "the implementations); GB/s at 28 bytes per element (20 for graphopt-bf16); "
           "`2-core` is the speedup of 2 threads over 1 on a compute-bound numpy probe run "
           "just before the timed steps (2.0: both cores free; near 1.0: the host gave this "
           "machine about one core's worth); "
           "`first call` is setup to the end of the first step (includes any JIT compile); "
           "`max|Δp|` is the largest difference from an f64 reference after two steps (first "
           "1,024 elements of the first and last tensor); `X ÷ this` is X's time over this "
           "row's (below 1: X is faster).", "",
           "Cases: " + "; ".join(f"{c}: {results.get(c, {}).get('_label', '')}"
                                 for c in order_cases), "", *md, "",
           "## graphopt compile", "", "Cold: a fresh process with an empty "
           "GRAPHOPT_CACHE_DIR (`cold compile` = `jit` + `lower`: trace, passes, codegen, "
           "LLVM). Warm: another fresh process on the same cache directory, with fresh "
           "Parameters: `warm jit()` is making the jitted function (it loads the LLVM "
           "backend, llvmlite, once per process), `warm first call` its first call, to the "
           "end of the step. Compile figures are medians over the rounds; `native "
           "calls/step/thread` is 1 when the graph sink runs the whole step.", "", *comp, "",
           *bw_md]
    if tgt:
        out += ["## Targets", "", "| target | measured | needed | |", "|---|---|---|---|",
                *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in tgt], ""]
    if skipped:
        out += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()), ""]
    return text, "\n".join(out)


class _Timer:
    """Wraps methods of single objects with perf_counter timers (no profiler overhead)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def wrap(self, obj: Any, attr: str, label: str) -> None:
        fn = getattr(obj, attr)
        self.seconds.setdefault(label, 0.0)

        def timed(*a, **kw):
            s = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds[label] += time.perf_counter() - s
        setattr(obj, attr, timed)


def native_replay(exe, steps: int) -> Callable[[], tuple[float, float]] | None:
    """Seconds per step spent in native code alone: the step's kernels run again with the
    pointer tables of their last run (the caller runs a step first), on the same threads:
    the graph sink's table through its thread pool, or each kernel with its range split as
    the runtime splits it (the Python between calls is ~1 us)."""
    try:
        from graphopt.backends.llvm import runtime
        if exe.program.sink:
            return lambda: _timed(exe.program.sink_call, steps)
        return lambda: _timed(_kernel_calls(exe.kernels, runtime), steps)
    except Exception as e:  # a diagnostic: internals may change
        print(f"(native replay unavailable: {e})")
        return None


def _kernel_calls(kernels, runtime) -> Callable[[], None]:
    prepared = [(k.fn, k.splits(), k._args, k._partials_ptr) for k in kernels]
    pool = runtime._workers()

    def once():
        for fn, ranges, args, ptr in prepared:
            if len(ranges) == 1:
                fn(ranges[0][0], ranges[0][1], args, ptr)
            else:
                futures = [pool.submit(fn, lo, hi, args, ptr) for lo, hi in ranges[1:]]
                fn(ranges[0][0], ranges[0][1], args, ptr)
                for f in futures:
                    f.result()
    return once


def _timed(once: Callable[[], None], steps: int) -> tuple[float, float]:
    once()
    ts = timings(once, steps)
    return float(np.median(ts)), float(np.mean(ts))


def profile_case(case: str, quick: bool, steps: int, variant: str = "graphopt",
                 top: int = 30, use_cprofile: bool = True) -> None:
    """Where graphopt's time goes on one case: the cold compile under cProfile (jit + lower,
    empty cache); then the warm step: its median time, the native time alone (replayed), the
    time in each layer of the runtime (timers, no profiler), and the steps under cProfile."""
    import cProfile
    import pstats
    os.environ["GRAPHOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="graphopt-bench-")
    shapes = case_shapes(case, quick)
    ps, gs = make_data(shapes)
    info: dict[str, Any] = {}
    prof = cProfile.Profile()
    if use_cprofile:
        prof.enable()
    step, sync, _ = setup_graphopt(ps, gs, info, variant)
    prof.disable()
    exe = info["_exe"]
    print(f"=== {case}, {variant}: cold compile (jit + lower) "
          f"{'under cProfile ' if use_cprofile else ''}{info['cold_compile_s']:.2f} s: "
          f"passes {info['pass_s']:.2f} s, LLVM {info['kernel_compile_s']:.3f} s, "
          f"{info['kernels']} kernels")
    for s in exe.pass_result.stats:
        print(f"    pass {s.name:<10} {s.seconds * 1e3:9.1f} ms")
    if use_cprofile:
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(top)
        st.sort_stats("cumulative").print_stats(top)
    for _ in range(3):
        step()

    def median_step(mean: bool = False) -> float:
        ts = timings(step, steps)
        return float(np.mean(ts) if mean else np.median(ts))

    wall = median_step()
    replay = native_replay(exe, steps)
    step()  # the replay reuses this step's pointer tables
    native_median, native = replay() if replay else (None, None)
    # Layer timers: jit's signature lookup, the Executable's checks, the runtime, each
    # kernel's run (pointers, ranges, native call), the commit.
    t = _Timer()
    jitted = info["_jitted"]
    t.wrap(jitted, "_lookup", "jit: flatten + signature + lookup")
    t.wrap(exe, "_commit", "Executable._commit")
    t.wrap(exe.program, "run", "LLVMProgram.run")
    sink = exe.program.sink  # the whole step in one native call per thread
    native_label = "sink" if sink else "kernels"
    for k in exe.kernels:
        t.wrap(k, "prepare", "prepare")
        if not sink:
            t.wrap(k, "run", native_label)
    if sink:  # the caller's share and its wait for the other threads
        t.wrap(exe.program, "sink_call", native_label)
    t.wrap(exe, "run", "Executable.run")
    timed = median_step(mean=True)
    per = {k: v / steps for k, v in t.seconds.items()}
    print(f"=== {case}, {variant}: warm step {wall * 1e3:.2f} ms (median of {steps}, no "
          f"profiler); with layer timers {timed * 1e3:.2f} ms (mean; the layers below are "
          f"means too)")
    if native is not None:
        print(f"    native kernels alone (replayed, same ranges and threads): median "
              f"{native_median * 1e3:.2f} ms = {native_median / wall:.0%} of the step; "
              f"everything else (Python) {max(0.0, wall - native_median) * 1e3:.2f} ms")
    lookup = per["jit: flatten + signature + lookup"]
    erun, prun = per["Executable.run"], per["LLVMProgram.run"]
    prep, commit = per["prepare"], per["Executable._commit"]
    krun = per[native_label] - (0.0 if sink else prep)  # a kernel's run calls its prepare
    rows = [("jit __call__: pytree flatten, leaf_spec per argument, key lookup", lookup),
            ("Executable.run before the runtime: argument checks, param dict",
             erun - prun - commit),
            ("LLVMProgram.run outside the native calls: env, outputs, reductions",
             prun - krun - prep),
            ("pointer tables (NativeKernel.prepare: pointers of changed arrays, outputs)", prep),
            ("the graph sink's native call on this thread (threads wait for each other)"
             if sink else "NativeKernel.run less prepare: splits, thread hand-off, calls", krun)]
    if native is not None:
        rows.append(("  of which native code (replay)", native))
    rows.append(("Executable._commit", commit))
    rows.append(("rest (JittedFunction.__call__, the timers themselves)", timed - lookup - erun))
    for label, secs in rows:
        print(f"    {label:<86} {secs * 1e3:8.2f} ms")
    if use_cprofile:
        print(f"=== {case}, {variant}: {steps} steps under cProfile:")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            step()
        prof.disable()
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(top)
        st.sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap, CASES, IMPLS, "small sizes, 1-2 repeats")
    ap.add_argument("--profile", metavar="CASE", help="cProfile graphopt's steps on one case")
    ap.add_argument("--profile-steps", type=int, default=50)
    ap.add_argument("--no-cprofile", action="store_true",
                    help="with --profile: timers only (e.g. to run it under py-spy)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    if args.profile:
        for variant in args.impls.split(",") if args.impls != ",".join(IMPLS) else ["graphopt"]:
            profile_case(args.profile, args.quick, args.profile_steps, variant.strip(),
                         use_cprofile=not args.no_cprofile)
        return 0

    run = begin(ap, args, IMPLS, case_shapes, installed)
    cases, impls, skipped, q = run.cases, run.impls, run.skipped, run.quick_args
    snapshot = run_on_snapshot(run.machine)
    print("measuring memory bandwidth ...", flush=True)
    bandwidth = [run_worker(["--worker", "bandwidth", *q])]
    cache_root = Path(tempfile.mkdtemp(prefix="graphopt-bench-cache-"))
    jax_cache = cache_root / "jax"  # later rounds reuse JAX's compiled step
    references: dict[str, list[np.ndarray]] = {}

    def one(impl: str, case: str, rnd: int) -> dict:
        if case not in references:
            references[case] = reference_sample(case_shapes(case, args.quick))
        return run_one(impl, case, rnd, q, cache_root, jax_cache, references[case])

    try:
        results, errors = run_rounds(
            cases, run.runnable, args.rounds, one, ROUND_KEYS,
            lambda case: case_label(case, case_shapes(case, args.quick)))
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
        shutil.rmtree(snapshot, ignore_errors=True)
    failed = bool(errors)
    for by in results.values():  # each key a median over the rounds
        for r in by.values():
            if isinstance(r, dict) and "error" not in r:
                r["gbps"] = bytes_per_element(r["impl"]) * r["elements"] / r["ms"] / 1e6
    bandwidth.append(run_worker(["--worker", "bandwidth", *q]))
    wall = run.stop()
    text, md = render(results, cases, impls, skipped, bandwidth, run.machine, args.quick, wall)
    finish(run, "adam", results, bandwidth, text, md,
           "Adam step, f32" + (" (--quick sizes)" if args.quick else ""),
           "ms per Adam step (median, log scale; lower is better)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
