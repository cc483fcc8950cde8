"""Train a small click-through model whose embedding tables get row gradients: each step
updates only the rows it looked up.

The model: a user table (100,000 x 32) and an item table (10,000 x 16), looked up with
`ops.embedding(..., sparse=True)`, and an MLP on the two rows, which predicts a click. The
data are made here with a fixed seed: each user and item has a hidden taste vector, and a
click is drawn with the probability of how well they agree; ids are skewed (a few items and
users are popular), so a batch repeats rows. One compiled step runs forward, backward and two
optimizers: LazyAdam on the tables (a row rule: its row gradients are coalesced, then one row
kernel updates the rows of both tables and their moments in place) and AdamW on the MLP.

The example prints the loss as it falls, the row kernel of the compiled step, and the bytes
the tables' update moves per step against what a dense Adam step on the same tables moves
(both from the kernels' cost model).

    python examples/train_embedding.py
"""
from __future__ import annotations

import time

import numpy as np

import graphopt as go
from graphopt import ops
from graphopt.ir.kernel import cost as kernel_cost
from graphopt.optim import Adam, AdamW, LazyAdam

USERS, ITEMS, USER_DIM, ITEM_DIM, HIDDEN = 100_000, 10_000, 32, 16, 64
BATCH, STEPS, TASTE = 2048, 300, 4


def skewed(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """Ids in [0, n), a few popular ones: a Zipf-like draw, shuffled over the table."""
    ranks = np.minimum(rng.zipf(1.2, size) - 1, n - 1)
    return rng.permutation(n)[ranks]


def clicks(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """STEPS batches of (user ids, item ids, clicked): a click is likelier for a good item,
    an eager user, and where their hidden tastes agree."""
    users, items = rng.standard_normal((USERS, TASTE)), rng.standard_normal((ITEMS, TASTE))
    user_bias, item_bias = rng.normal(0, 1.5, USERS), rng.normal(0, 1.5, ITEMS)
    batches = []
    for _ in range(STEPS):
        u, i = skewed(rng, USERS, BATCH), skewed(rng, ITEMS, BATCH)
        z = user_bias[u] + item_bias[i] + np.sum(users[u] * items[i], axis=1)
        batches.append((u, i, (rng.random(BATCH) < 1 / (1 + np.exp(-z))).astype(np.float32)))
    return batches


def init(rng: np.random.Generator) -> tuple[list[go.Parameter], list[go.Parameter]]:
    tables = [go.Parameter((0.1 * rng.standard_normal((USERS, USER_DIM))).astype(np.float32),
                           name="user_table"),
              go.Parameter((0.1 * rng.standard_normal((ITEMS, ITEM_DIM))).astype(np.float32),
                           name="item_table")]
    fan_in = USER_DIM + ITEM_DIM
    mlp = [go.Parameter((rng.standard_normal((fan_in, HIDDEN)) * np.sqrt(2 / fan_in))
                        .astype(np.float32), name="fc0.w"),
           go.Parameter(np.zeros(HIDDEN, np.float32), name="fc0.b"),
           go.Parameter((rng.standard_normal((HIDDEN, 1)) / np.sqrt(HIDDEN)).astype(np.float32),
                        name="fc1.w"),
           go.Parameter(np.zeros(1, np.float32), name="fc1.b")]
    return tables, mlp


def loss_fn(tables, mlp, user, item, clicked):
    """Binary cross-entropy of the predicted click logit, from the two looked-up rows."""
    rows = [ops.embedding(tables[0], user, sparse=True),
            ops.embedding(tables[1], item, sparse=True)]
    h = ops.relu(ops.concat(rows, axis=1) @ mlp[0] + mlp[1])
    z = ops.reshape(h @ mlp[2] + mlp[3], (BATCH,))
    return ops.mean(ops.softplus(z) - clicked * z)  # = mean(-log p(clicked))


def main() -> None:
    rng = np.random.default_rng(0)
    batches = clicks(rng)
    tables, mlp = init(rng)
    table_opt = LazyAdam(tables, lr=0.05, name="tables")
    mlp_opt = AdamW(mlp, lr=3e-3, name="mlp")
    grad_fn = go.value_and_grad(lambda *batch: loss_fn(tables, mlp, *batch), wrt=tables + mlp)

    @go.jit
    def train_step(user, item, clicked):
        loss, grads = grad_fn(user, item, clicked)  # the tables' are row gradients
        table_opt.step(grads[:2])  # LazyAdam: only the rows looked up
        mlp_opt.step(grads[2:])  # AdamW: every element
        return loss

    compiled = train_step.lower(*batches[0])
    start = time.perf_counter()
    losses = []
    for s, batch in enumerate(batches, 1):
        losses.append(float(train_step(*batch)))
        if s % 50 == 0:  # (each batch has other rows: the mean of 50 says more than one)
            print(f"steps {s - 49:3d}-{s:3d}  mean loss {np.mean(losses[-50:]):.4f}")
    seconds = (time.perf_counter() - start) / STEPS

    print("\nThe compiled step's row update: each table's gradient coalesced, then one row "
          "kernel for both tables:")
    lines = compiled.graph.format().splitlines()
    shown = [line for line in lines if any(f"= {op} " in line for op in
                                           ("coalesce", "rows_values", "row_kernel"))]
    print("\n".join([lines[0], "  ...", *shown, "  ...", "}"]))

    (rows_kernel,) = [n for n in compiled.graph.nodes if n.op == "row_kernel"]
    sparse = kernel_cost(rows_kernel).total_bytes

    # A dense Adam step on the same tables, compiled (not run): what it would move.
    dense_opt = Adam([go.Parameter(t.numpy(), name=f"dense.{t.name}") for t in tables],
                     name="dense")
    dense_step = go.jit(lambda g0, g1: dense_opt.step([g0, g1]))
    dense_graph = dense_step.lower(*(np.zeros(t.shape, np.float32) for t in tables)).graph
    dense = sum(kernel_cost(n).total_bytes for n in dense_graph.nodes if n.body is not None)
    distinct = [np.mean([np.unique(b[k]).size for b in batches]) for k in (0, 1)]
    moved = sum(n * t.shape[1] * kernel_cost(rows_kernel).bytes_per_element
                for n, t in zip(distinct, tables))
    print(f"\nrows a step looks up: {2 * BATCH}, {sum(distinct):.0f} distinct on average "
          f"(of {USERS + ITEMS})")
    print(f"bytes the tables' update moves per step: at most {sparse / 1e6:.2f} MB (the row "
          f"kernel's cost, for {2 * BATCH} rows), {moved / 1e6:.2f} MB for the distinct rows "
          f"it writes; a dense Adam step on the same tables: {dense / 1e6:.1f} MB "
          f"({dense / sparse:.0f}x, {dense / moved:.0f}x)")
    print(f"one whole training step: {seconds * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
