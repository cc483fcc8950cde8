"""Family 8: an f16/bf16 parameter with an f32 master copy, changed by something other than
its optimizer (an assign in another step, in eager mode, in the same step, a checkpoint of
the weights alone). The parameter is the source of truth: the next step re-seeds the master
from it, element by element, and keeps the master's extra bits wherever the parameter still
holds the master's rounding. Nothing an outside write stored is lost."""
import ml_dtypes
import numpy as np
import pytest

import graphopt as go
from graphopt import amp, optim
from graphopt.checkpoint import restore

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
KINDS = ["SGD", "SGD-momentum", "Adam", "AdamW", "NAdam", "Adamax", "Adagrad", "RMSprop",
         "LAMB", "Lion"]
MODES = ["llvm", "interpreter", "eager"]


def make_opt(kind, ps, lr):
    if kind == "SGD-momentum":
        return optim.SGD(ps, lr=lr, momentum=0.9)
    return getattr(optim, kind)(ps, lr=lr)


def stepper(fn, mode):
    return fn if mode == "eager" else go.jit(fn, backend=mode)


def params(n, dtype, value=1.0):
    return [go.Parameter(np.full((3, 4) if i else 5, value, dtype), name=f"w{i}")
            for i in range(n)]


def grads_of(ps):
    return [np.full(p.shape, 0.5, p.dtype.np_dtype) for p in ps]


@pytest.mark.parametrize("n", [1, 3], ids=["one", "mapped"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_an_assign_in_another_step_survives_the_next_step(kind, mode, n):
    """The issue's reproducer, for every optimizer: lr=0, a step, assign 7, a step."""
    ps = params(n, BF16)
    opt = make_opt(kind, ps, lr=0.0)
    step = stepper(lambda gs: opt.step(gs), mode)
    step(grads_of(ps))

    def write():
        for p in ps:
            go.assign(p, 7.0)
    stepper(write, mode)()
    step(grads_of(ps))
    for p in ps:
        np.testing.assert_array_equal(p.numpy(), np.full(p.shape, 7, BF16))
        master = opt.state[p.name]["master"].numpy()
        assert master.dtype == np.float32
        np.testing.assert_array_equal(master, np.full(p.shape, 7, np.float32))


def _write_jit(ps, opt, tmp_path, mode):
    go.jit(lambda: [go.assign(p, 7.0) for p in ps] and None, backend="interpreter")()


def _write_eager(ps, opt, tmp_path, mode):
    for p in ps:
        go.assign(p, np.full(p.shape, 7, p.dtype.np_dtype))


def _write_restore(ps, opt, tmp_path, mode):
    restore(ps, {p.name: np.full(p.shape, 7, p.dtype.np_dtype) for p in ps}, "weights")


def _write_load_weights_only(ps, opt, tmp_path, mode):
    """A checkpoint of the weights alone (another run's), loaded into this one."""
    others = [go.Parameter(np.full(p.shape, 7, p.dtype.np_dtype), name=p.name) for p in ps]
    go.save(tmp_path / "weights.npz", others)
    go.load(tmp_path / "weights.npz", ps)


WRITERS = {"jit-assign": _write_jit, "eager-assign": _write_eager, "restore": _write_restore,
           "load-weights": _write_load_weights_only}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_outside_writer_survives(writer, dtype, mode, tmp_path):
    ps = params(2, dtype)
    opt = optim.Adam(ps, lr=0.0)
    step = stepper(lambda gs: opt.step(gs), mode)
    step(grads_of(ps))
    WRITERS[writer](ps, opt, tmp_path, mode)
    step(grads_of(ps))
    for p in ps:
        np.testing.assert_array_equal(p.numpy(), np.full(p.shape, 7, dtype))
        np.testing.assert_array_equal(opt.state[p.name]["master"].numpy(), 7)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 3], ids=["one", "mapped"])
def test_an_assign_in_the_same_step_before_the_update(mode, n):
    ps = params(n, BF16)
    opt = optim.SGD(ps, lr=0.25)

    def step(gs):
        for p in ps:
            go.assign(p, 7.0)
        opt.step(gs)
    stepper(step, mode)(grads_of(ps))
    for p in ps:  # 7 − 0.25·0.5, from the assigned 7, not from the stale master's 1
        np.testing.assert_array_equal(opt.state[p.name]["master"].numpy(), 6.875)
        np.testing.assert_array_equal(p.numpy(), np.full(p.shape, 6.875, BF16))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_a_step_after_the_write_starts_from_the_written_value(mode, dtype):
    ps = params(2, dtype)
    opt = optim.SGD(ps, lr=1e-3)
    step = stepper(lambda gs: opt.step(gs), mode)
    for _ in range(3):
        step(grads_of(ps))
    _write_eager(ps, opt, None, mode)
    step(grads_of(ps))
    want = np.float32(7) - np.float32(1e-3) * np.float32(0.5)
    for p in ps:
        np.testing.assert_array_equal(opt.state[p.name]["master"].numpy(), want)
        np.testing.assert_array_equal(p.numpy(), np.full(p.shape, want).astype(dtype))


def small_steps(mode, write):
    """4 Adam steps of about 1e-4 on two bf16 parameters of 1.0, `write(i, ps)` after the
    i-th: steps that do not move a bf16 1.0, so only the masters hold them. Returns each
    parameter's value and master."""
    ps = params(2, BF16)
    opt = optim.Adam(ps, lr=1e-4)
    step = stepper(lambda gs: opt.step(gs), mode)
    for i in range(4):
        step(grads_of(ps))
        write(i, ps)
    return [(p.numpy(), opt.state[p.name]["master"].numpy()) for p in ps]


def _write_first_element(i, ps):
    for p in ps:
        if i == 2:
            a = p.numpy()
            a.reshape(-1)[0] = 7
            go.assign(p, a)


@pytest.mark.parametrize("mode", MODES)
def test_only_the_written_elements_are_reseeded(mode):
    """Elements the outside write left alone keep their master's extra bits."""
    written, untouched = small_steps(mode, _write_first_element), small_steps(mode, lambda *a: 0)
    for (p_w, m_w), (p_0, m_0) in zip(written, untouched):
        assert p_w.reshape(-1)[1:].tobytes() == p_0.reshape(-1)[1:].tobytes()
        np.testing.assert_array_equal(m_w.reshape(-1)[1:], m_0.reshape(-1)[1:])
        assert (m_0 != 1).all() and (p_0 == 1).all()  # the masters' own bits
        assert p_w.reshape(-1)[0] == 7 and abs(m_w.reshape(-1)[0] - 7) < 1e-3  # ~1e-4 from 7


@pytest.mark.parametrize("mode", MODES)
def test_writing_the_same_value_keeps_the_masters_bits(mode):
    def same(i, ps):
        for p in ps:
            go.assign(p, p.numpy())
    for (p_w, m_w), (p_0, m_0) in zip(small_steps(mode, same), small_steps(mode, lambda *a: 0)):
        assert p_w.tobytes() == p_0.tobytes() and m_w.tobytes() == m_0.tobytes()
        assert (m_0 != 1).all()


@pytest.mark.parametrize("mode", MODES)
def test_a_skipped_step_changes_nothing_then_a_step_reseeds(mode):
    ps = params(2, BF16)
    opt = optim.SGD(ps, lr=0.0, momentum=0.9)
    step = stepper(lambda gs, ok: opt.step(gs, where=ok), mode)
    step(grads_of(ps), np.bool_(True))
    _write_eager(ps, opt, None, mode)
    before = [p.numpy() for p in ps + opt.parameters()]
    step(grads_of(ps), np.bool_(False))  # skipped: bit-identical, the stale master too
    for p, b in zip(ps + opt.parameters(), before):
        assert p.numpy().tobytes() == b.tobytes(), p.name
    step(grads_of(ps), np.bool_(True))
    for p in ps:
        np.testing.assert_array_equal(p.numpy(), np.full(p.shape, 7, BF16))
        np.testing.assert_array_equal(opt.state[p.name]["master"].numpy(), 7)


@pytest.mark.parametrize("mode", MODES)
def test_under_loss_scaling_and_accumulation(mode):
    ps = params(2, BF16)
    opt = optim.AdamW(ps, lr=0.0)
    acc = optim.Accumulate(opt, steps=2)
    scaler = amp.DynamicLossScaler(init_scale=4.0)
    step = stepper(lambda gs: scaler.step(acc, gs), mode)
    for _ in range(2):
        step(grads_of(ps))
    _write_eager(ps, opt, None, mode)
    for _ in range(2):
        step(grads_of(ps))
    for p in ps:
        np.testing.assert_array_equal(p.numpy(), np.full(p.shape, 7, BF16))


def test_the_optimizer_state_alone_does_not_overwrite_the_weights():
    """`load_state_dict` restores the optimizer, not the weights (as in torch): a master
    that disagrees with its parameter is re-seeded from the parameter at the next step."""
    src = params(1, BF16, value=3.0)
    opt_src = optim.SGD(src, lr=0.0)
    ps = params(1, BF16)
    opt = optim.SGD(ps, lr=0.0)
    opt.load_state_dict(opt_src.state_dict())
    assert (opt.state["w0"]["master"].numpy() == 3).all()
    opt.step(grads_of(ps))
    np.testing.assert_array_equal(ps[0].numpy(), np.ones(5, BF16))
    np.testing.assert_array_equal(opt.state["w0"]["master"].numpy(), 1)
