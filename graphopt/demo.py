"""`graphopt demo`: compile an Adam step over a small network's parameters and show it.

It traces the step into one graph, prints the IR with source locations, runs the pass
pipeline (which fuses the update of every parameter into one multi-tensor kernel), runs a few
steps (checking each against plain numpy), and writes both graphs as text, DOT and, when
graphviz's `dot` program is installed, SVG.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

import graphopt as go
from graphopt import ops
from graphopt.errors import GraphoptError
from graphopt.ir.kernel import cost as kernel_cost

SHAPES = {"fc1.w": (64, 32), "fc1.b": (32,), "fc2.w": (32, 10), "fc2.b": (10,)}
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


def make_params(rng: np.random.Generator, shapes: dict = SHAPES,
                prefix: str = "") -> tuple[dict, dict, dict, go.Parameter]:
    """Weights (named `prefix + name`), Adam's two moments for each, and a step counter."""
    weights = {n: go.Parameter(rng.standard_normal(s).astype(np.float32) * 0.1,
                               name=f"{prefix}{n}") for n, s in shapes.items()}
    exp_avg = {n: go.Parameter(np.zeros(s, np.float32), name=f"{prefix}{n}.exp_avg")
               for n, s in shapes.items()}
    exp_avg_sq = {n: go.Parameter(np.zeros(s, np.float32), name=f"{prefix}{n}.exp_avg_sq")
                  for n, s in shapes.items()}
    step = go.Parameter(np.zeros((), np.float32), name=f"{prefix}step")
    return weights, exp_avg, exp_avg_sq, step


def build_step(weights, exp_avg, exp_avg_sq, step):
    """Adam (torch.optim.Adam's formula) written with graphopt ops and assigns."""

    def adam_step(grads: dict, lr: float):
        go.assign(step, step + 1)
        bias1 = 1 - BETA1 ** step  # reads the new step count
        bias2 = 1 - BETA2 ** step
        for name, w in weights.items():
            g, m, v = grads[name], exp_avg[name], exp_avg_sq[name]
            go.assign(m, BETA1 * m + (1 - BETA1) * g)
            go.assign(v, BETA2 * v + (1 - BETA2) * g * g)
            go.assign(w, w - lr * (m / bias1) / (ops.sqrt(v / bias2) + EPS))
        return ops.sqrt(sum((grads[n] * grads[n]).sum() for n in weights))  # the grad norm

    return adam_step


def numpy_adam(state: dict, grads: dict, lr: float, t: int) -> None:
    """The same formula in numpy, in the same f32 operations, for comparison."""
    def f(x):  # 0-d f32 arrays: numpy's scalar types compute some ops in other ways
        return np.asarray(x, np.float32)

    bias1, bias2 = f(1) - f(BETA1) ** f(t), f(1) - f(BETA2) ** f(t)
    for name, g in grads.items():
        w, m, v = state[name]
        m = f(BETA1) * m + f(1 - BETA1) * g
        v = f(BETA2) * v + f(1 - BETA2) * g * g
        state[name] = (w - f(lr) * (m / bias1) / (np.sqrt(v / bias2) + f(EPS)), m, v)


def speed(rng: np.random.Generator, elements: int = 1 << 23, repeats: int = 5) -> None:
    """The same step over 8M elements: compiled, and numpy as a user would write it."""
    shapes = {"a": (elements // 2,), "b": (elements // 4,), "c": (elements // 8,),
              "d": (elements // 8,)}
    weights, m, v, t = make_params(rng, shapes, prefix="big.")
    grads = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    state = {n: (weights[n].numpy(), m[n].numpy(), v[n].numpy()) for n in shapes}
    timings = {}
    for name, fn in (("graphopt llvm", go.jit(build_step(weights, m, v, t))),
                     ("numpy", lambda g, lr: numpy_adam(state, g, lr, 1))):
        fn(grads, 1e-3)  # compile, warm up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(grads, 1e-3)
            times.append(time.perf_counter() - start)
        timings[name] = sorted(times)[len(times) // 2]
    print(f"\n== speed: Adam over {elements / 1e6:.1f}M f32 elements in 4 tensors "
          f"(28 bytes per element move)")
    for name, sec in timings.items():
        print(f"{name:>14}: {sec * 1e3:8.2f} ms/step  {28 * elements / sec / 1e9:6.1f} GB/s  "
              f"({sec / timings['graphopt llvm']:.1f}x graphopt's time)")


def gradients(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def run(out_dir: str = "graphopt_demo_out", steps: int = 5) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise GraphoptError(f"the demo runs 1 or more steps, not {steps!r}")
    rng = np.random.default_rng(0)
    weights, exp_avg, exp_avg_sq, step = make_params(rng)
    reference = {n: (w.numpy(), np.zeros(SHAPES[n], np.float32), np.zeros(SHAPES[n], np.float32))
                 for n, w in weights.items()}
    adam_step = go.jit(build_step(weights, exp_avg, exp_avg_sq, step))
    grads = gradients(rng)  # one step's at a time: any number of steps fits in memory

    compiled = adam_step.lower(grads, 1e-3)
    traced = compiled.traced_graph
    print(f"== traced IR of adam_step ({len(traced.nodes)} nodes, {len(traced.params)} "
          f"parameters, {len(traced.assigns())} assigns)\n")
    print(traced.format(locs=True))
    print("\n== the pass pipeline\n")
    print(compiled.pass_result)
    graph = compiled.graph
    print(f"\n== after the passes ({len(graph.nodes)} nodes; kernel comments give the bytes "
          f"each moves)\n")
    print(graph.format(locs=True))

    print("\n== the kernels the llvm backend compiled")
    for k in compiled.kernels:
        cost = kernel_cost(k.node)
        print(f"{k.name}: {len(k.node.attrs['spaces'])} tensor(s), {cost.elements} elements, "
              f"{cost.bytes_per_element} B/elem, {k.compile_seconds * 1e3:.1f} ms, "
              f"{'loaded from the disk cache' if k.cache_hit else 'compiled'} "
              f"(key {k.key[:12]})")
    print(f"native calls per step: {compiled.program.native_calls} per thread (the graph "
          f"sink runs every kernel of the step in one call)")

    print(f"\n== {steps} steps ({compiled.backend_name} backend), checked against plain numpy")
    for k in range(steps):
        lr = 1e-3 * (k + 1)  # a new learning rate is data: no retrace
        grads = grads if k == 0 else gradients(rng)
        start = time.perf_counter()
        norm = adam_step(grads, lr)
        ms = (time.perf_counter() - start) * 1e3
        numpy_adam(reference, grads, lr, k + 1)
        err = max(float(np.max(np.abs(weights[n].numpy() - reference[n][0]))) for n in SHAPES)
        print(f"step {k + 1}: lr={lr:.0e}  grad norm={float(norm):8.4f}  "
              f"max |graphopt - numpy| = {err:.1e}  {ms:6.2f} ms")
    info = adam_step.cache_info()
    print(f"traces={info.traces} compiles={info.compiles} cache hits={info.hits}")

    speed(rng)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print("\n== files")
    for ext in ("txt", "dot") + (("svg",) if shutil.which("dot") else ()):
        print("wrote", go.dump(traced, out / f"adam_step.traced.{ext}"))
        print("wrote", go.dump(graph, out / f"adam_step.{ext}"))
    if not shutil.which("dot"):
        print("(install graphviz's `dot` program to get adam_step.svg too)")
    return 0
