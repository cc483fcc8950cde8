"""Family 10: a max over no elements is an OpTypeError when the step is traced, in eager mode
and under jit on both backends alike; a sum of none is 0 and a mean of none NaN everywhere."""
import warnings

import numpy as np
import pytest

import graphopt as go
from graphopt import ops
from graphopt.errors import OpTypeError

MODES = ["eager", "interpreter", "llvm"]


def run(mode, fn, x):
    if mode == "eager":
        return np.asarray(fn(go.EagerTensor(x)).numpy())
    return go.jit(fn, backend=mode, cache=False)(x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape, axis", [((0,), None), ((3, 0), 1), ((0, 4), 0), ((0, 4), None),
                                         ((2, 0, 3), (1, 2))])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_a_max_of_no_elements_is_an_error_when_traced(mode, shape, axis, dtype):
    with pytest.raises(OpTypeError, match="max over an empty axis"):
        run(mode, lambda x: ops.max(x, axis), np.zeros(shape, dtype))


@pytest.mark.parametrize("mode", MODES)
def test_a_max_over_a_nonempty_axis_of_an_empty_array_is_empty(mode):
    out = run(mode, lambda x: ops.max(x, 0), np.zeros((3, 0), np.float32))
    assert out.shape == (0,)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_a_sum_of_none_is_zero_and_a_mean_nan(mode, dtype):
    x = np.zeros(0, dtype)
    assert run(mode, lambda x: ops.sum(x), x) == 0
    if dtype == np.float32:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert np.isnan(run(mode, lambda x: x.mean(), x))
