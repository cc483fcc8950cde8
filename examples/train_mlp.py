"""Train a 2-hidden-layer MLP classifier with AdamW and a warmup-cosine schedule, where the
whole training step (forward, backward, update) is one compiled graph.

The data set is made here: three interleaved spiral arms in the plane (fixed seed), which a
linear model cannot separate. The step is

    loss, grads = value_and_grad(loss_fn, wrt=params)(x, labels)
    opt.step(grads)

under `graphopt.jit`: the backward pass is part of the step's graph, so the passes (dce, cse,
fusion) work across forward, backward and the AdamW update. The example prints the loss as it
falls, the size of the IR before and after the passes, the start of the compiled graph, the
memory report, and the time of a step eager vs jit.

    python examples/train_mlp.py
"""
from __future__ import annotations

import time

import numpy as np

import graphopt as go
from graphopt import ops
from graphopt.ir.kernel import cost as kernel_cost
from graphopt.optim import AdamW
from graphopt.optim.schedules import WarmupCosine

CLASSES, POINTS, HIDDEN = 3, 300, 32
STEPS, WARMUP, BASE_LR = 150, 15, 0.02


def spirals(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """POINTS points on CLASSES spiral arms with noise; labels are the arm."""
    per = POINTS // CLASSES
    r = np.tile(np.linspace(0.05, 1.0, per), CLASSES)
    labels = np.repeat(np.arange(CLASSES), per)
    theta = labels * 2 * np.pi / CLASSES + 4.0 * r + rng.normal(0, 0.2, POINTS)
    x = np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1)
    return x.astype(np.float32), labels.astype(np.int32)


def init(rng: np.random.Generator) -> dict[str, go.Parameter]:
    sizes = [(2, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, CLASSES)]
    params = {}
    for i, (fan_in, fan_out) in enumerate(sizes):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in)  # He init
        params[f"fc{i}.w"] = go.Parameter(w.astype(np.float32), name=f"fc{i}.w")
        params[f"fc{i}.b"] = go.Parameter(np.zeros(fan_out, np.float32), name=f"fc{i}.b")
    return params


def logits(p: dict[str, go.Parameter], x):
    h = ops.gelu(x @ p["fc0.w"] + p["fc0.b"])
    h = ops.relu(h @ p["fc1.w"] + p["fc1.b"])
    return h @ p["fc2.w"] + p["fc2.b"]


def make_step(state_dtype=None):
    """The training step from the same start: (train_step, params, x, labels)."""
    rng = np.random.default_rng(0)
    x, labels = spirals(rng)
    params = init(rng)
    opt = AdamW(params, lr=WarmupCosine(BASE_LR, WARMUP, STEPS), weight_decay=1e-4,
                **({"state_dtype": state_dtype} if state_dtype else {}))
    grad_fn = go.value_and_grad(lambda x, labels: ops.softmax_cross_entropy(
        logits(params, x), labels), wrt=params)

    def train_step(x, labels):
        loss, grads = grad_fn(x, labels)  # the backward, in the same graph
        opt.step(grads)  # AdamW: assigns to every parameter and moment
        return loss
    return train_step, params, x, labels


def train(state_dtype=None):
    """Train from the same start; returns the step, its compiled form and the losses."""
    train_step, params, x, labels = make_step(state_dtype)
    step = go.jit(train_step)
    compiled = step.lower(x, labels)
    losses = [float(step(x, labels)) for _ in range(STEPS)]
    predict = go.jit(lambda x: logits(params, x))
    accuracy = float(np.mean(np.argmax(predict(x), axis=1) == labels))
    return x, labels, train_step, step, compiled, losses, accuracy


def update_bytes(compiled) -> int:
    """Bytes per element of the kernels that store (the parameter and moment updates)."""
    return max(kernel_cost(n).bytes_per_element for n in compiled.graph.nodes
               if n.op == "kernel" and n.body.effects and n.attrs["spaces"][0])


def main() -> None:
    x, labels, train_step, step, compiled, losses, accuracy = train()
    traced, optimized = compiled.traced_graph, compiled.graph
    kernels = sum(n.op == "kernel" for n in optimized.nodes)
    print(f"data: {POINTS} points on {CLASSES} spiral arms; MLP 2-{HIDDEN}-{HIDDEN}-{CLASSES}, "
          f"AdamW, warmup-cosine lr ({WARMUP} warmup steps of {STEPS})")
    print(f"IR size: {len(traced.nodes)} nodes as traced, {len(optimized.nodes)} after the "
          f"passes ({kernels} fused kernels)")

    for i, loss in enumerate(losses):
        if i % 15 == 0 or i == STEPS - 1:
            print(f"step {i:4d}  loss {loss:.4f}")
    print(f"final loss: {losses[-1]:.4f} (first step {losses[0]:.4f}); "
          f"train accuracy {accuracy:.1%}")

    # AdamW's moments in bf16: the update kernel moves fewer bytes per element; the same
    # run from the same start shows what it costs in accuracy.
    *_, bf16_compiled, bf16_losses, bf16_accuracy = train(state_dtype="bf16")
    print(f"moments in f32:  {update_bytes(compiled)} B/elem in the update kernel, final loss "
          f"{losses[-1]:.4f}, accuracy {accuracy:.1%}")
    print(f"moments in bf16: {update_bytes(bf16_compiled)} B/elem in the update kernel, final "
          f"loss {bf16_losses[-1]:.4f}, accuracy {bf16_accuracy:.1%}")

    # Eager mode runs the same step op by op (value_and_grad traces and interprets its part).
    times = {}
    for name, fn, calls in (("eager", train_step, 3), ("jit", step, 20)):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x, labels)
        times[name] = (time.perf_counter() - start) / calls
    print(f"step time: eager {times['eager'] * 1e3:.1f} ms, jit {times['jit'] * 1e3:.1f} ms "
          f"({times['eager'] / times['jit']:.1f}x)")

    lines = str(optimized).splitlines()
    inputs = len(optimized.inputs)
    print(f"\nthe compiled step ({len(lines)} lines; its {inputs} inputs and the end left out):")
    print("\n".join(lines[:1] + lines[1 + inputs:1 + inputs + 28]) + "\n  ...\n")
    print(compiled.memory_report())


if __name__ == "__main__":
    main()
