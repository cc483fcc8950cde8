"""Logical tensors in one process: what a rank's shard of a bucket holds, and a one-process
checkpoint of ZeRO state, which names it as one process does and loads at any zero stage.
(Jobs of several ranks: test_checkpoint_reshard.py.)"""
from __future__ import annotations

import numpy as np
import pytest
from test_data_parallel import ddp

import graphopt as go
from graphopt import distributed as dist
from graphopt.distributed.layout import Bucket


@pytest.mark.parametrize("shapes", [((2, 3), (5,)), ((7,),), ((1,), (1,), (9, 2), (3,))])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_the_shards_parts_hold_every_element_once(shapes, ranks):
    b = Bucket(shapes, ranks)
    flat = np.full(b.padded, -1)
    for rank in range(ranks):
        for member, start, stop, at in b.parts(rank):
            assert 0 <= at and at + stop - start <= b.shard
            flat[rank * b.shard + at:rank * b.shard + at + stop - start] = \
                b.offsets[member] + np.arange(start, stop)
    np.testing.assert_array_equal(flat[:b.total], np.arange(b.total))  # padding: no part


def _run(zero: int, steps: int, path=None):
    """Adam on the test MLP under DataParallel(zero) in this world of one, from `path`."""
    parallel = dist.DataParallel(zero=zero, bucket_bytes=256)

    def start(params, opt):
        if zero:
            parallel.sharding(opt)
        if path is not None:
            go.load(path, params, opt)

    return ddp.train("adam", steps, False, np.float64, parallel, start=start)


@pytest.mark.parametrize("saved, loaded", [(1, 0), (0, 2), (2, 1)])
def test_a_one_process_checkpoint_of_zero_state_loads_at_any_stage(tmp_path, saved, loaded):
    params, opt, _, _ = _run(saved, 3)
    assert (opt.sharding is not None) == bool(saved)
    go.save(tmp_path / "run.npz", params, opt)
    names = set(np.load(tmp_path / "run.npz").files)
    assert "fc0.w.exp_avg" in names and not any(".zero" in n for n in names), names
    resumed, _, losses, _ = _run(loaded, 3, tmp_path / "run.npz")
    whole, _, all_losses, _ = ddp.train("adam", 6, False)
    np.testing.assert_allclose(losses, all_losses[3:], rtol=1e-12)
    for k, p in whole.items():
        np.testing.assert_allclose(resumed[k].numpy(), p.numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=k)
