"""DataParallel in one process (the world of size 1): the strategy's checks, that a
data-parallel step of one rank is the step itself, and its passes (compiled, not run, for a
stand-in world of two ranks). Runs with several ranks are in test_data_parallel_mpi.py."""
from __future__ import annotations

import io
import re

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import graphopt as go
from graphopt import comm, ops
from graphopt import distributed as dist
from graphopt.distributed.layout import Bucket, pack
from graphopt.errors import ArgumentError

SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"


def load_script():
    spec = importlib.util.spec_from_file_location("ddp_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ddp = load_script()


class CompileOnly:
    """Rank 0 of a world of two, for steps that are compiled and not run."""

    rank, size = 0, 2

    def __getattr__(self, name):
        raise AssertionError(f"{name}: this stand-in world only compiles steps")


@pytest.fixture
def two_ranks():
    """The world is a stand-in of two ranks (compile only), then the one process again."""
    alone = comm.group("world")
    comm.set_group("world", CompileOnly())
    yield
    comm.set_group("world", alone)


def lowered(opt: str, clip: bool, parallel):
    """ddp_train's step for this rank of the world, compiled (not run)."""
    step, x, labels, *_ = ddp.make_step(opt, clip, parallel=parallel, ranks=dist.world_size())
    return step.lower(x, labels)


@pytest.mark.parametrize("bad, message", [
    (dict(zero=3), "zero must be 0, 1 or 2"),
    (dict(zero=True), "zero must be 0, 1 or 2"),
    (dict(bucket_bytes=0), "bucket_bytes must be a positive integer"),
    (dict(bucket_bytes=1.5), "bucket_bytes must be a positive integer"),
    (dict(group=3), "group must be a group's name"),
    (dict(compress="fp8"), "compress must be None, 'fp16' or 'bf16', got 'fp8'"),
])
def test_bad_arguments_are_refused(bad, message):
    with pytest.raises(ArgumentError, match=message):
        dist.DataParallel(**bad)


def test_jit_refuses_what_is_not_a_strategy():
    with pytest.raises(ArgumentError, match="parallel must be a strategy"):
        go.jit(lambda x: x, parallel="ddp")


def test_pack_closes_a_bucket_once_it_holds_the_bytes():
    assert pack([4, 4, 4, 4, 4], 8) == [[0, 1], [2, 3], [4]]
    assert pack([100, 1, 1], 8) == [[0], [1, 2]]  # a large tensor is a bucket of its own
    assert pack([1, 1, 1], 8, lambda current, i: i != 2) == [[0, 1], [2]]
    assert pack([], 8) == []


def test_a_bucket_pads_to_equal_shards():
    b = Bucket(((2, 3), (5,)), ranks=4)
    assert (b.sizes, b.offsets, b.total, b.shard, b.padded) == ([6, 5], [0, 6], 11, 3, 12)
    assert b.owners().tolist() == [0] * 6 + [1] * 5 + [2]


@pytest.mark.parametrize("opt", sorted(ddp.OPTIMIZERS))
@pytest.mark.parametrize("zero", [0, 1, 2])
def test_one_rank_is_the_step_itself(opt, zero):
    """At world size 1 every collective is its operand (pass one_rank) and a shard is the
    whole bucket: the same numbers as the step without DataParallel (LAMB's norms are summed
    in another order), no collective in the compiled step, and at zero=0 no bucket either:
    the step without DataParallel, node for node."""
    ref, _, ref_losses, ref_compiled = ddp.train(opt, 4, clip=False)
    params, optimizer, losses, compiled = ddp.train(opt, 4, clip=False,
                                                    parallel=dist.DataParallel(zero=zero))
    exact = opt != "lamb"
    for name, p in ref.items():
        if exact:
            np.testing.assert_array_equal(params[name].numpy(), p.numpy(), err_msg=name)
        else:
            np.testing.assert_allclose(params[name].numpy(), p.numpy(), rtol=1e-12,
                                       err_msg=name)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-12)
    kinds = {n.op for n in compiled.graph.nodes}
    assert not kinds & {"all_reduce", "reduce_scatter", "all_gather", "shard"}, kinds
    if zero == 0:
        assert [n.op for n in compiled.graph.nodes] == [n.op for n in ref_compiled.graph.nodes]
    assert compiled.pass_result.stats[0].name == "one_rank"


@pytest.mark.parametrize("opt", ["lazyadam", "sgd"])
def test_row_gradients_are_gathered_and_refused_under_zero(opt):
    """An embedding's row gradient is averaged as rows (every rank's rows all gathered, the
    values divided by the ranks): at world size 1 the same numbers as without DataParallel.
    ZeRO cannot shard a row update's state: an ArgumentError naming the table."""
    ref, _, ref_losses, _ = ddp.train(opt, 4, clip=True, embed=True)
    params, _, losses, _ = ddp.train(opt, 4, clip=True, embed=True,
                                     parallel=dist.DataParallel())
    for name, p in ref.items():
        np.testing.assert_array_equal(params[name].numpy(), p.numpy(), err_msg=name)
    np.testing.assert_array_equal(losses, ref_losses)
    with pytest.raises(ArgumentError, match="zero=1.*'emb' is a row gradient"):
        ddp.train(opt, 1, clip=False, embed=True, parallel=dist.DataParallel(zero=1))


def test_row_gradients_are_all_gathered(two_ranks):
    """For two ranks, the table's row gradient is two all_gathers (its indices and its
    values), the dense gradients an all_reduce."""
    step, x, labels, *_ = ddp.make_step("lazyadam", False, parallel=dist.DataParallel(),
                                        ranks=dist.world_size(), embed=True)
    ops_run = [n for n in step.lower(x, labels).graph.nodes if n.opdef.ordered]
    gathered = [n for n in ops_run if n.op == "all_gather"]
    assert {n.inputs[0].type.dtype.name for n in gathered} == {"i64", "f64"}, ops_run
    assert len(gathered) == 2 and {n.op for n in ops_run} == {"all_gather", "all_reduce"}


def test_buckets_follow_bucket_bytes(two_ranks):
    """The bucket pass packs the step's six gradient all_reduces as layout.pack says."""
    sizes = [int(np.prod(s)) * 8 for a, b in ddp.SIZES for s in ((a, b), (b,))]
    for cap in (1, 300, 10**9):
        compiled = lowered("adam", False, dist.DataParallel(bucket_bytes=cap))
        reduces = [n for n in compiled.graph.nodes if n.op == "all_reduce"]
        assert len(reduces) == len(pack(sizes, cap)), cap


def test_zero_shards_the_state():
    """At zero>=1 the optimizer keeps no per-parameter state; its shards hold it all."""
    _, opt, _, _ = ddp.train("adam", 1, clip=False, parallel=dist.DataParallel(zero=1))
    assert all(not s for s in opt.state.values())
    whole = 2 * sum(int(np.prod(s)) * 8 for a, b in ddp.SIZES for s in ((a, b), (b,)))
    assert ddp.state_bytes(opt) == whole  # one rank: a shard is the whole bucket


def test_clipping_under_zero2_reduces_the_gradients_whole(two_ranks):
    """A global-norm clip scales every gradient after its all_reduce: the optimizer's shard
    is then a shard of clipped whole gradients, which zero=2 cannot reduce_scatter; they
    are all_reduced (in buckets), the state stays sharded, and the refusal says why."""
    compiled = lowered("adam", True, dist.DataParallel(zero=2))
    ops_run = [n.op for n in compiled.graph.nodes if n.opdef.ordered]
    assert "reduce_scatter" not in ops_run and ops_run.count("all_reduce") == 1, ops_run
    reasons = [r.reason for r in compiled.pass_result.refusals if r.pass_name == "zero"]
    assert any("changed after its all_reduce (multiply" in r for r in reasons), reasons


def test_a_sharded_optimizer_refuses_another_layout():
    params = ddp.init(np.float64)
    opt = ddp.OPTIMIZERS["adam"](params)
    x, labels = ddp.data(np.float64)
    grad_fn = go.value_and_grad(lambda x, y: ops.softmax_cross_entropy(
        x @ params["fc0.w"] @ params["fc1.w"] @ params["fc2.w"], y), wrt=params)

    def step(x, y):
        opt.step(grad_fn(x, y)[1])

    go.jit(step, parallel=dist.DataParallel(zero=1))(x, labels)
    with pytest.raises(go.errors.OptimizerError, match="sharded for 1 ranks with buckets"):
        go.jit(step, parallel=dist.DataParallel(zero=1, bucket_bytes=64))(x, labels)
    with pytest.raises(go.errors.OptimizerError, match="its state is sharded over 1 ranks"):
        go.jit(step)(x, labels)


def test_explain_shows_the_passes_and_the_buckets(two_ranks):
    """explain traces a jitted step for its strategy and runs its passes first; the
    collectives are listed with the tensors each bucket holds."""
    params = ddp.init(np.float64)
    opt = ddp.OPTIMIZERS["adam"](params)
    x, labels = ddp.data(np.float64)
    grad_fn = go.value_and_grad(lambda x, y: ops.softmax_cross_entropy(
        x @ params["fc0.w"] @ params["fc1.w"] @ params["fc2.w"] + params["fc2.b"], y),
        wrt=params)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt.step(grads)
        return loss

    out = io.StringIO()
    result = go.explain(go.jit(step, parallel=dist.DataParallel(zero=2, bucket_bytes=10**6)),
                        x, labels, out=out)
    text = out.getvalue()
    assert [s.name for s in result.stats[:2]] == ["zero", "bucket"]
    assert "reduce_scatter" in text and "all_reduce" not in text.split("=== collectives")[1]
    # one bucket: the six gradients in the optimizer's order (fc0.b's, which the loss does
    # not read, is a constant), then the zero that pads 419 elements to 2 equal shards
    assert re.search(r"bucket of 7: f64\[5,16\] \(test_data_parallel.py:\d+\), "
                     r"f64\[16\] constant, f64\[16,16\].*, f64\[1\] constant\n", text), text


@pytest.mark.parametrize("compress, half", [("fp16", "f16"), ("bf16", "bf16")])
def test_compression_divides_casts_sums_and_casts_back(compress, half, two_ranks):
    """Each gradient: divided by the ranks in its dtype, cast to the half, summed (not
    averaged: the division came first), cast back; the bucket is of the half dtype."""
    parallel = dist.DataParallel(compress=compress, bucket_bytes=1 << 20)
    assert parallel.key() != dist.DataParallel().key()
    step, x, labels, *_ = ddp.make_step("sgd", False, np.float32, parallel,
                                        ranks=dist.world_size())
    compiled = step.lower(x, labels)
    traced = [n for n in compiled.traced_graph.nodes if n.op == "all_reduce"]
    assert len(traced) == len(ddp.SIZES) * 2
    for n in traced:
        assert (n.attrs["reduce"], n.out.type.dtype.name) == ("sum", half), n
        cast = n.inputs[0].node
        assert (cast.op, cast.inputs[0].node.op) == ("cast", "divide"), cast
        # read through a cast back to f32 (the optimizer's kernel has it in its body)
        for u in (u for u in n.out.users if n.out in u.inputs):  # (not an after edge)
            casts = [u] if u.op == "cast" else [b for b in u.body.nodes if b.op == "cast"]
            assert any(c.attrs["dtype"].name == "f32" for c in casts), u
    (bucket,) = [n for n in compiled.graph.nodes if n.op == "all_reduce"]
    assert bucket.out.type.dtype.name == half


def test_a_loss_scaler_decides_for_every_rank_and_counts_its_skips():
    """Under DataParallel the scaler's "finite" is an all_reduce max of "not finite"; a
    skipped step counts in <name>.skipped."""
    from graphopt import amp, optim
    w = go.Parameter(np.ones(4, np.float32), name="w")
    scaler = amp.DynamicLossScaler(init_scale=4.0)
    opt = optim.SGD([w], lr=0.1)
    grad_fn = go.value_and_grad(lambda x: scaler.scale((w * x).sum()), wrt=[w])

    def step(x):
        _, grads = grad_fn(x)
        return scaler.step(opt, grads)

    fn = go.jit(step, parallel=dist.DataParallel())
    flags = [n for n in fn.lower(np.ones(4, np.float32)).traced_graph.nodes
             if n.op == "all_reduce" and n.out.type.dtype.name == "bool"]
    assert [n.attrs["reduce"] for n in flags] == ["max"]
    assert bool(fn(np.ones(4, np.float32))) and scaler.skipped_steps == 0
    before = w.numpy().copy()
    assert not bool(fn(np.full(4, np.inf, np.float32)))
    assert scaler.skipped_steps == 1 and scaler.scale_value == 2.0
    np.testing.assert_array_equal(w.numpy(), before)


def test_a_gradient_left_for_an_accumulate_must_reach_it():
    """Under DataParallel the gradient of a Parameter an Accumulate sums is left unreduced
    for it: a step that bypasses the Accumulate is refused, not averaged nowhere."""
    from graphopt import optim
    from graphopt.errors import OptimizerError
    w = go.Parameter(np.ones(4, np.float32), name="w")
    opt = optim.SGD([w], lr=0.1, name="sgd")
    acc = optim.Accumulate(opt, 2)
    grad_fn = go.value_and_grad(lambda x: (w * x).sum(), wrt=[w])

    def bypass(x):
        _, grads = grad_fn(x)
        opt.step(grads)

    def through(x):
        _, grads = grad_fn(x)
        acc.step(grads)

    with pytest.raises(OptimizerError, match="Parameter 'w' is left this rank's own under "
                                             "DataParallel, for the Accumulate that sums it "
                                             r"\('sgd', steps=2\)"):
        go.jit(bypass, parallel=dist.DataParallel())(np.ones(4, np.float32))
    fn = go.jit(through, parallel=dist.DataParallel())
    # (as traced: at one rank the one_rank pass then removes every collective)
    whens = [n for n in fn.lower(np.ones(4, np.float32)).traced_graph.nodes
             if n.opdef.ordered]
    assert [(n.op, n.attrs["every"]) for n in whens] == [("all_reduce_when", 2)]
    for _ in range(2):
        fn(np.ones(4, np.float32))
    np.testing.assert_allclose(w.numpy(), 0.9)  # the mean of two gradients of ones
