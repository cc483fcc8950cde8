"""Whole networks: gradients against torch.autograd (f64, 1e-10), and a training step with
value_and_grad + an optimizer giving the same parameters eagerly and under jit."""
from __future__ import annotations

import numpy as np
import pytest

import graphopt as go
from graphopt import ops

SIZES = [(5, 8), (8, 8), (8, 3)]


def init(rng, sizes=SIZES):
    params = {}
    for i, (fan_in, fan_out) in enumerate(sizes):
        params[f"fc{i}.w"] = go.Parameter(rng.standard_normal((fan_in, fan_out)) / fan_in ** 0.5,
                                          name=f"fc{i}.w")
        params[f"fc{i}.b"] = go.Parameter(0.1 * rng.standard_normal(fan_out), name=f"fc{i}.b")
    return params


def mlp_loss(p, x, labels):
    """2 hidden layers (gelu, relu), softmax cross-entropy."""
    h = ops.gelu(x @ p["fc0.w"] + p["fc0.b"])
    h = ops.relu(h @ p["fc1.w"] + p["fc1.b"])
    return ops.softmax_cross_entropy(h @ p["fc2.w"] + p["fc2.b"], labels)


def embedding_loss(p, table, tokens, target):
    """An embedding lookup (gather), sigmoid/softplus/tanh, log_softmax and an MSE."""
    e = ops.gather(table, tokens).mean(axis=1)  # [batch, 5]
    h = ops.softplus(e @ p["fc0.w"]) * ops.sigmoid(ops.tanh(p["fc0.b"]))
    return ops.mse_loss(ops.log_softmax(h @ p["fc1.w"], axis=-1), target)


def torch_grads(fn, params, *args):
    torch = pytest.importorskip("torch")
    tp = {k: torch.tensor(v.numpy(), requires_grad=True) for k, v in params.items()}
    loss = fn(torch, tp, *args)
    loss.backward()
    return float(loss.detach()), {k: t.grad.numpy() for k, t in tp.items()}


def test_mlp_gradients_match_torch():
    rng = np.random.default_rng(0)
    params = init(rng)
    x, labels = rng.standard_normal((16, 5)), rng.integers(0, 3, 16)

    def torch_mlp(torch, p, x, labels):
        F = torch.nn.functional
        h = F.gelu(torch.tensor(x) @ p["fc0.w"] + p["fc0.b"], approximate="tanh")
        h = torch.relu(h @ p["fc1.w"] + p["fc1.b"])
        return F.cross_entropy(h @ p["fc2.w"] + p["fc2.b"], torch.tensor(labels))

    want_loss, want = torch_grads(torch_mlp, params, x, labels)
    for run in (go.value_and_grad(lambda x, y: mlp_loss(params, x, y), wrt=params),):
        for mode in (run, go.jit(run)):
            loss, grads = mode(x, labels)
            assert abs(float(loss) - want_loss) < 1e-12
            for k in params:
                np.testing.assert_allclose(grads[k], want[k], rtol=0, atol=1e-10, err_msg=k)


def test_embedding_network_gradients_match_torch():
    rng = np.random.default_rng(1)
    params = init(rng, [(5, 6), (6, 4)])
    params["fc0.b"] = go.Parameter(rng.standard_normal(6), name="fc0.b")
    del params["fc1.b"]
    table = go.Parameter(rng.standard_normal((10, 5)), name="table")
    tokens = rng.integers(0, 10, (7, 3))  # repeated tokens: their gradients add up
    target = rng.standard_normal((7, 4))

    def torch_net(torch, p, tokens, target):
        F = torch.nn.functional
        e = p["table"][torch.tensor(tokens)].mean(dim=1)
        h = F.softplus(e @ p["fc0.w"]) * torch.sigmoid(torch.tanh(p["fc0.b"]))
        return F.mse_loss(F.log_softmax(h @ p["fc1.w"], dim=-1), torch.tensor(target))

    everything = {**params, "table": table}
    want_loss, want = torch_grads(torch_net, everything, tokens, target)
    loss, grads = go.jit(go.value_and_grad(
        lambda tokens, target: embedding_loss(params, table, tokens, target),
        wrt=everything))(tokens, target)
    assert abs(float(loss) - want_loss) < 1e-12
    for k in everything:
        np.testing.assert_allclose(grads[k], want[k], rtol=0, atol=1e-10, err_msg=k)


def hand_written_adamw(params, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2):
    """AdamW with ops and assigns (torch.optim.AdamW's formula), for the agreement test."""
    m = {k: go.Parameter(np.zeros(p.shape), name=f"{k}.m") for k, p in params.items()}
    v = {k: go.Parameter(np.zeros(p.shape), name=f"{k}.v") for k, p in params.items()}
    t = go.Parameter(np.float64(0), name="t")

    def step(grads):
        go.assign(t, t + 1)
        for k, p in params.items():
            g = grads[k]
            go.assign(m[k], b1 * m[k] + (1 - b1) * g)
            go.assign(v[k], b2 * v[k] + (1 - b2) * g * g)
            update = (m[k] / (1 - b1 ** t)) / (ops.sqrt(v[k] / (1 - b2 ** t)) + eps)
            go.assign(p, p * (1 - lr * wd) - lr * update)
    return step


def optimizers():
    yield "hand-written AdamW", hand_written_adamw
    optim = getattr(go, "optim", None)
    for name in ("SGD", "AdamW"):
        cls = getattr(optim, name, None)
        if cls is not None:
            kwargs = {"momentum": 0.9} if name == "SGD" else {"weight_decay": 1e-2}
            yield f"graphopt.optim.{name}", (lambda params, cls=cls, kw=kwargs:
                                             cls(params, lr=1e-2, **kw).step)


@pytest.mark.parametrize("name,make_optimizer", list(optimizers()), ids=lambda x: str(x))
def test_training_eager_and_jit_agree_after_20_steps(name, make_optimizer):
    data = np.random.default_rng(2)
    x, labels = data.standard_normal((32, 5)), data.integers(0, 3, 32)
    final = {}
    for mode in ("eager", "jit"):
        params = init(np.random.default_rng(3))
        update = make_optimizer(params)
        grad_fn = go.value_and_grad(lambda x, y: mlp_loss(params, x, y), wrt=params)

        def train_step(x, labels):
            loss, grads = grad_fn(x, labels)
            update(grads)
            return loss

        step = go.jit(train_step) if mode == "jit" else train_step
        losses = [float(step(x, labels)) for _ in range(20)]
        assert losses[-1] < losses[0]
        final[mode] = {k: p.numpy() for k, p in params.items()}
    for k in final["eager"]:
        np.testing.assert_allclose(final["jit"][k], final["eager"][k], rtol=1e-10, atol=1e-12,
                                   err_msg=k)


def test_train_mlp_example_learns():
    """examples/train_mlp.py: the loss after training is below 0.1 (it starts near ln 3)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).parent.parent / "examples" / "train_mlp.py"
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    final, first = map(float, re.search(r"final loss: ([\d.]+) \(first step ([\d.]+)\)",
                                        done.stdout).groups())
    assert first > 1.0 and final < 0.1
    assert "kept alive for the backward pass" in done.stdout
