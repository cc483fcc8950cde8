"""SGD with momentum (torch.optim.SGD's formula) as one traced step.

Run: python examples/sgd_momentum.py
It prints the IR of the step, runs it under jit and in eager mode, and checks both against
plain numpy.
"""
import numpy as np

import graphopt as go

LR, MOMENTUM = 0.1, 0.9

rng = np.random.default_rng(0)
w = go.Parameter(rng.standard_normal((3, 4)), name="w")
buf = go.Parameter(np.zeros((3, 4)), name="w.momentum_buffer")


def sgd_step(grad):
    go.assign(buf, MOMENTUM * buf + grad)  # torch: buf = momentum * buf + (1 - dampening) * g
    go.assign(w, w - LR * buf)  # reads the new buffer


print(go.trace(sgd_step, np.zeros((3, 4))).format(locs=True))

grads = [rng.standard_normal((3, 4)) for _ in range(10)]
w_ref, buf_ref = w.numpy(), buf.numpy()
for g in grads:
    buf_ref = MOMENTUM * buf_ref + g
    w_ref = w_ref - LR * buf_ref

start = w.numpy()
step = go.jit(sgd_step)
for g in grads:
    step(g)
jit_result = w.numpy()

go.assign(w, start)  # eager assign: takes effect at once
go.assign(buf, np.zeros((3, 4)))
for g in grads:
    sgd_step(g)  # the same function, op by op
eager_result = w.numpy()

print("max |jit - numpy|   =", np.abs(jit_result - w_ref).max())
print("max |eager - numpy| =", np.abs(eager_result - w_ref).max())
assert np.allclose(jit_result, w_ref, rtol=1e-12) and np.allclose(eager_result, w_ref, rtol=1e-12)
print("traced", step.cache_info().traces, "time(s) for", len(grads), "steps")
