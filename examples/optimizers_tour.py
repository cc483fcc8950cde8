"""A tour of graphopt.optim: every optimizer on one small problem, then the pieces around
them (groups, hyper-parameters as data, schedules, clipping, loss scaling, accumulation,
bf16 state, checkpoints).

Run: python examples/optimizers_tour.py
The problem is softmax regression on synthetic data; each training step (forward, backward,
update) is one compiled graph. It prints each optimizer's loss and the IR of an Adam step.
"""
import tempfile
from pathlib import Path

import numpy as np

import graphopt as go
from graphopt import amp, ops, optim
from graphopt.optim import schedules

rng = np.random.default_rng(0)
FEATURES, CLASSES, EXAMPLES, STEPS = 8, 3, 256, 60
teacher = rng.standard_normal((FEATURES, CLASSES))
x = rng.standard_normal((EXAMPLES, FEATURES)).astype(np.float32)
y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((EXAMPLES, CLASSES)), axis=1)


def model():
    """Fresh parameters: a weight matrix and a bias, named as the IR will show them."""
    return [go.Parameter(np.zeros((FEATURES, CLASSES), np.float32), name="fc.w"),
            go.Parameter(np.zeros(CLASSES, np.float32), name="fc.b")]


def loss_fn(w, b, x, y):
    logits = ops.matmul(x, w) + b
    return ops.softmax_cross_entropy(logits, y)


def train_step(params, opt):
    """One compiled step: loss and gradients (autodiff), then the optimizer's update."""
    @go.jit
    def step(x, y):
        loss, grads = go.value_and_grad(lambda x, y: loss_fn(*params, x, y), wrt=params)(x, y)
        opt.step(grads)  # grads: a list in the order of opt.params
        return loss
    return step


# -- every optimizer, torch's names and arguments ---------------------------------------------
print(f"softmax regression, {EXAMPLES} examples, {STEPS} full-batch steps (initial loss "
      f"{np.log(CLASSES):.4f})")
CHOICES = {
    "SGD": lambda ps: optim.SGD(ps, lr=0.5, momentum=0.9, nesterov=True),
    "Adagrad": lambda ps: optim.Adagrad(ps, lr=0.5),
    "RMSprop": lambda ps: optim.RMSprop(ps, lr=0.01, centered=True),
    "Adam": lambda ps: optim.Adam(ps, lr=0.05),
    "AdamW": lambda ps: optim.AdamW(ps, lr=0.05, weight_decay=0.01, amsgrad=True),
    "NAdam": lambda ps: optim.NAdam(ps, lr=0.05),
    "Adamax": lambda ps: optim.Adamax(ps, lr=0.1),
    "LAMB": lambda ps: optim.LAMB(ps, lr=0.05),
    "Lion": lambda ps: optim.Lion(ps, lr=0.01),
}
for name, make in CHOICES.items():
    params = model()
    step = train_step(params, make(params))
    losses = [float(step(x, y)) for _ in range(STEPS)]
    assert losses[-1] < 0.6 * losses[0], name
    print(f"  {name:8s} loss {losses[0]:.4f} -> {losses[-1]:.4f}   "
          f"(compiled {step.cache_info().traces}x)")

# -- the IR of one optimizer step ---------------------------------------------------------------
params = model()
opt = optim.Adam(params, lr=1e-3)
print("\nAdam's update alone, as the tracer records it (hyper-parameters are f64 params):")
print(go.trace(opt.step, [np.zeros((FEATURES, CLASSES), np.float32),
                          np.zeros(CLASSES, np.float32)]))

# -- groups, and hyper-parameters as data -------------------------------------------------------
params = model()
opt = optim.AdamW(optim.decay_groups(params, weight_decay=0.1), lr=0.05)
print("groups:", [(g["weight_decay"], [p.name for p in g["params"]]) for g in opt.param_groups])
step = train_step(params, opt)
for k in range(STEPS):
    if k == STEPS // 2:
        opt.param_groups[0]["lr"] = opt.param_groups[1]["lr"] = 0.005  # a new number, same graph
    loss = float(step(x, y))
print(f"lr changed mid-run: loss {loss:.4f}, {step.cache_info()}")

# -- an lr schedule computed in the graph from the step counter --------------------------------
sched = schedules.WarmupCosine(base_lr=0.1, warmup_steps=10, total_steps=STEPS, min_lr=0.001)
params = model()
opt = optim.AdamW(params, lr=sched, weight_decay=0.01)
step = train_step(params, opt)
for k in range(STEPS):
    loss = float(step(x, y))
print(f"WarmupCosine: lr(0)={sched.value(0)}, lr(10)={sched.value(10)}, "
      f"lr({STEPS})={sched.value(STEPS):.4g}; loss {loss:.4f}")

# -- clipping, loss scaling with an overflow, accumulation -------------------------------------
params = model()
opt = optim.SGD(params, lr=0.5, momentum=0.9)
scaler = amp.DynamicLossScaler(init_scale=2.0 ** 12, growth_interval=20)
accum = optim.Accumulate(opt, steps=2)


def scaled_loss(x, y):
    loss = loss_fn(*params, x, y)
    return scaler.scale(loss), loss  # differentiate the scaled loss, report the loss


@go.jit
def robust_step(x, y, poison):
    (_, loss), grads = go.value_and_grad(scaled_loss, wrt=params, has_aux=True)(x, y)
    grads, finite = scaler.unscale([g * poison for g in grads])  # poison=inf: an overflow
    grads, norm = optim.clip_grad_norm(grads, max_norm=1.0)
    accum.step(grads, where=finite)  # an overflowed micro-batch is dropped, bit for bit
    scaler.update(finite)
    return loss, finite


for k in range(8):
    poison = np.float32(np.inf if k == 3 else 1.0)
    loss, finite = robust_step(x[k % 2::2], y[k % 2::2], poison)
    print(f"  micro-batch {k}: loss {float(loss):.4f} finite={bool(finite)!s:5s} "
          f"scale={scaler.scale_value:g} updates={int(opt.step_count.numpy())}")
print("one graph for every case:", robust_step.cache_info())

# -- bf16 optimizer state: half the bytes a step moves ------------------------------------------
for state_dtype in ("f32", "bf16"):
    params = model()
    opt = optim.Adam(params, lr=0.05, state_dtype=state_dtype)
    step = train_step(params, opt)
    for _ in range(STEPS):
        loss = float(step(x, y))
    state_bytes = sum(p.numpy().nbytes for s in opt.state.values() for p in s.values())
    print(f"Adam, state_dtype={state_dtype}: {state_bytes} bytes of state, loss {loss:.6f}")

# -- checkpoints: resume bit for bit ------------------------------------------------------------
path = Path(tempfile.mkdtemp()) / "run.npz"
params = model()
opt = optim.NAdam(params, lr=0.05)
step = train_step(params, opt)
for _ in range(10):
    step(x, y)
go.save(path, params, opt)
for _ in range(10):
    step(x, y)
uninterrupted = [p.numpy() for p in params]
params = model()
opt = optim.NAdam(params, lr=0.05)
go.load(path, params, opt)
step = train_step(params, opt)
for _ in range(10):
    step(x, y)
same = all(np.array_equal(a, p.numpy()) for a, p in zip(uninterrupted, params))
print(f"resumed from {path.name} after 10 steps: identical to the uninterrupted run: {same}")
assert same
