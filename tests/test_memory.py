"""Buffers of Parameters and optimizer state: aligned, and large ones staggered in the page."""
import ml_dtypes
import numpy as np
import pytest

import graphopt as go
from graphopt import memory, optim

LARGE = memory.STAGGER_BYTES // 4  # f32 elements of a buffer that is staggered


def page_offset(a: np.ndarray) -> int:
    return memory.address(a) % memory.PAGE


@pytest.mark.parametrize("shape", [(), (1,), (3, 5), (LARGE - 1,), (LARGE,), (2, LARGE)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                                   np.int64, np.bool_])
def test_buffers_are_aligned_contiguous_and_writable(shape, dtype):
    a = memory.full(shape, 1, dtype)
    assert a.shape == shape and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable
    assert memory.address(a) % memory.ALIGN == 0
    assert np.all(a == 1)


def test_large_buffers_take_the_slots_in_turn_and_never_numpys_offset():
    offsets = [page_offset(memory.empty(LARGE, np.float32)) for _ in memory.SLOTS * 2]
    assert set(offsets) == set(memory.SLOTS)
    assert all(abs(o - 16) >= 512 for o in offsets)  # numpy's large arrays start at 16
    assert page_offset(memory.empty((LARGE,), np.float32, offset=3 * 64)) == 192
    with pytest.raises(AssertionError):
        memory.empty(LARGE, np.float32, offset=100)  # not a multiple of 64


def test_parameter_copies_into_a_placed_buffer_or_adopts_when_asked():
    src = np.arange(LARGE, dtype=np.float64)
    p = go.Parameter(src, dtype=go.f32)
    assert p._value.dtype == np.float32 and np.array_equal(p.numpy(), src.astype(np.float32))
    assert page_offset(p._value) in memory.SLOTS
    own = np.zeros(LARGE, np.float32)
    assert go.Parameter(own, copy=False)._value is own  # taken as it is, wherever it is
    q = go.Parameter.full((4, 3), 7, go.bf16, name="q")
    assert q.type == go.Parameter(np.full((4, 3), 7, ml_dtypes.bfloat16)).type
    assert np.all(q.numpy().astype(np.float32) == 7)


@pytest.mark.parametrize("dtype, master", [(np.float32, False), (ml_dtypes.bfloat16, True)])
def test_a_parameter_and_its_state_sit_at_different_offsets(dtype, master):
    """The streams one update kernel reads and writes never share an offset mod 4096."""
    p = go.Parameter(np.ones(LARGE, dtype), name="w", copy=False)  # numpy's own offset
    opt = optim.Adam([p], amsgrad=True, master_weights=master)
    acc = optim.Accumulate(opt, steps=2)
    state = opt.state["w"]
    assert sorted(state) == sorted(["exp_avg", "exp_avg_sq", "max_exp_avg_sq"] +
                                   ["master"] * master)
    buffers = [p._value] + [s._value for s in state.values()] + [a._value for a in acc.accum]
    offsets = [page_offset(b) for b in buffers]
    assert len(set(offsets)) == len(offsets), offsets
    assert all(memory.address(b) % memory.ALIGN == 0 for b in buffers[1:])
    for key, s in state.items():  # written when made: zeros, and the master copy of p
        want = p.numpy().astype(np.float32) if key == "master" else np.zeros(LARGE)
        assert np.array_equal(s.numpy(), want)
