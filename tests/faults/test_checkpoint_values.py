"""Family 12: a checkpoint's arrays are checked, never reinterpreted (stored dtype against the
metadata, the metadata against the Parameter, shapes), and the values loaded are checked as
the constructors check their arguments: hyper-parameters by the optimizer's own validation
(the same code as `Adam(lr=...)` and `group["lr"] = ...`), step counters, loss scales. In a
file and in a state dict; nothing changes when a check fails."""
import math

import numpy as np
import pytest

import graphopt as go
from checkpoint_support import good, run  # noqa: F401 (fixtures)
from checkpoint_support import BF16, Run, metadata, npy, with_entries
from graphopt import amp, optim
from graphopt.errors import CheckpointError, OptimizerError


def _load_refused(run, path, message):
    before = run.snapshot()
    with pytest.raises(CheckpointError, match=message) as e:
        run.load(path)
    assert str(path) in str(e.value)
    run.assert_unchanged(before)
    return str(e.value)


# -- stored dtypes, metadata dtypes, shapes -------------------------------------------------------
def _as(name, dtype, shape=None, meta_dtype=None):
    """Entry `name` rewritten as `dtype` (its values cast; `shape` reshaped), and optionally
    the metadata's dtype for it changed too."""
    def make(good, out):
        a = np.load(good)[name]
        a = a.astype(dtype) if shape is None else np.resize(a, shape).astype(dtype)
        meta = None
        if meta_dtype is not None:
            meta = metadata(good)
            meta["dtypes"][name] = meta_dtype
        return with_entries(good, out, replace={name: npy(a)}, meta=meta)
    return make


REINTERPRET = "where the metadata says {} \\({}\\); graphopt does not reinterpret bits"
ARRAY_CASES = {
    "i32-for-f32": (_as("fc.w", np.int32), r"'fc.w' is stored as <i4 \(i32\[3,4\]\) " +
                    REINTERPRET.format("f32", "<f4")),
    "u32-for-f32": (_as("fc.w", np.uint32), r"stored as <u4 .*" + REINTERPRET.format("f32", "<f4")),
    "f64-for-f32": (_as("fc.w", np.float64), r"stored as <f8 \(f64\[3,4\]\)"),
    "f16-for-f32": (_as("fc.w", np.float16), r"stored as <f2 \(f16\[3,4\]\)"),
    "big-endian-f32": (_as("fc.w", ">f4"), r"stored as >f4"),
    "f16-for-bf16": (_as("fc.b", np.float16), r"'fc.b' is stored as <f2 .*" +
                     REINTERPRET.format("bf16", "<u2")),
    "i16-for-bf16": (_as("fc.b", np.int16), r"'fc.b' is stored as <i2 .*bf16 \(<u2\)"),
    "f32-for-bf16": (_as("fc.b", np.float32), r"'fc.b' is stored as <f4"),
    "f64-for-i64-step": (_as("opt.step", np.float64), r"'opt.step' is stored as <f8 .*i64"),
    "i32-for-i64-step": (_as("opt.step", np.int32), r"'opt.step' is stored as <i4"),
    "u64-for-i64-step": (_as("opt.step", np.uint64), r"'opt.step' is stored as <u8"),
    "i64-for-f64-lr": (_as("opt.group0.lr", np.int64), r"'opt.group0.lr' is stored as <i8"),
    "bool-for-i64": (_as("loss_scale.growth_tracker", np.bool_),
                     r"'loss_scale.growth_tracker' is stored as \|b1"),
    "f64-for-f32-scale": (_as("loss_scale", np.float64), r"'loss_scale' is stored as <f8"),
    "consistent-but-f64": (_as("fc.w", np.float64, meta_dtype="f64"),
                           r"'fc.w' is f64\[3,4\], the parameter is f32\[3,4\]"),
    "consistent-but-i32-step": (_as("opt.step", np.int32, meta_dtype="i32"),
                                r"'opt.step' is i32\[\], the parameter is i64\[\]"),
    "bf16-said-f16": (_as("fc.b", np.float16, meta_dtype="f16"),
                      r"'fc.b' is f16\[4\], the parameter is bf16\[4\]"),
    "uint16-said-f16": (_as("fc.b", np.uint16, meta_dtype="f16"), r"stored as <u2 .*says f16"),
    "transposed": (_as("fc.w", np.float32, shape=(4, 3)),
                   r"'fc.w' is f32\[4,3\], the parameter is f32\[3,4\]"),
    "flattened": (_as("fc.w", np.float32, shape=(12,)), r"'fc.w' is f32\[12\]"),
    "empty": (_as("fc.w", np.float32, shape=(0, 4)), r"'fc.w' is f32\[0,4\]"),
    "scalar-as-vector": (_as("opt.group0.lr", np.float64, shape=(1,)),
                         r"'opt.group0.lr' is f64\[1\], the parameter is f64\[\]"),
    "vector-as-scalar": (_as("fc.b.master", np.float32, shape=()),
                         r"'fc.b.master' is f32\[\], the parameter is f32\[4\]"),
}


@pytest.mark.parametrize("case", list(ARRAY_CASES))
def test_dtypes_and_shapes_are_checked_never_reinterpreted(case, good, run, tmp_path):
    make, message = ARRAY_CASES[case]
    _load_refused(run, make(good, tmp_path / f"{case}.npz"), message)


def test_a_fortran_order_array_loads_its_values(good, run, tmp_path):
    w = np.load(good)["fc.w"]
    path = with_entries(good, tmp_path / "f.npz", replace={"fc.w": npy(np.asfortranarray(w))})
    run.load(path)
    np.testing.assert_array_equal(run.params[0].numpy(), w)
    assert run.params[1].numpy().dtype == BF16


# -- values: hyper-parameters, counters, scales ------------------------------------------------
def _small(kind, **options):
    w = go.Parameter(np.ones((2, 3), np.float32), name="w")
    return [w], getattr(optim, kind)([w], **options)


# case: (optimizer, its options, entry, bad value, what the message says, the constructor
# call that the same value breaks, or None when the value is state, not an argument)
HYPER_CASES = {
    "lr-negative": ("Adam", {}, "opt.group0.lr", -1.0, "lr must be >= 0", {"lr": -1.0}),
    "lr-nan": ("Adam", {}, "opt.group0.lr", math.nan, "lr must be >= 0", {"lr": math.nan}),
    "lr-inf": ("Adam", {}, "opt.group0.lr", math.inf, "lr must be >= 0", {"lr": math.inf}),
    "lr-minus-inf": ("SGD", {}, "opt.group0.lr", -math.inf, "lr must be >= 0",
                     {"lr": -math.inf}),
    "beta1-5": ("Adam", {}, "opt.group0.beta1", 5.0, r"betas\[0\] must be in \[0, 1\)",
                {"betas": (5.0, 0.999)}),
    "beta1-1": ("AdamW", {}, "opt.group0.beta1", 1.0, r"betas\[0\] must be in \[0, 1\)",
                {"betas": (1.0, 0.999)}),
    "beta1-negative": ("NAdam", {}, "opt.group0.beta1", -0.1, r"betas\[0\] must be in",
                       {"betas": (-0.1, 0.999)}),
    "beta2-1": ("Adamax", {}, "opt.group0.beta2", 1.0, r"betas\[1\] must be in \[0, 1\)",
                {"betas": (0.9, 1.0)}),
    "beta2-nan": ("Lion", {}, "opt.group0.beta2", math.nan, r"betas\[1\] must be in",
                  {"betas": (0.9, math.nan)}),
    "eps-negative": ("Adam", {}, "opt.group0.eps", -1e-8, "eps must be >= 0", {"eps": -1e-8}),
    "weight-decay-negative": ("AdamW", {}, "opt.group0.weight_decay", -0.1,
                              "weight_decay must be >= 0", {"weight_decay": -0.1}),
    "weight-decay-inf": ("LAMB", {}, "opt.group0.weight_decay", math.inf,
                         "weight_decay must be >= 0", {"weight_decay": math.inf}),
    "momentum-negative": ("SGD", {"momentum": 0.9}, "opt.group0.momentum", -0.5,
                          "momentum must be >= 0", {"momentum": -0.5}),
    "dampening-nan": ("SGD", {}, "opt.group0.dampening", math.nan,
                      "dampening must be a finite number", {"dampening": math.nan}),
    "momentum-to-zero": ("SGD", {"momentum": 0.9}, "opt.group0.momentum", 0.0,
                         "momentum cannot change from 0.9 to 0.0", None),
    "momentum-from-zero": ("SGD", {}, "opt.group0.momentum", 0.5,
                           "momentum cannot change from 0.0 to 0.5", None),
    "nesterov-dampening": ("SGD", {"momentum": 0.9, "nesterov": True}, "opt.group0.dampening",
                           0.5, "Nesterov momentum requires a momentum and zero dampening",
                           {"momentum": 0.9, "nesterov": True, "dampening": 0.5}),
    "rmsprop-alpha": ("RMSprop", {}, "opt.group0.alpha", -1.0, "alpha must be >= 0",
                      {"alpha": -1.0}),
    "rmsprop-momentum-to-zero": ("RMSprop", {"momentum": 0.5}, "opt.group0.momentum", 0.0,
                                 "momentum cannot change", None),
    "adagrad-lr-decay": ("Adagrad", {}, "opt.group0.lr_decay", -1.0, "lr_decay must be >= 0",
                         {"lr_decay": -1.0}),
    "nadam-momentum-decay": ("NAdam", {}, "opt.group0.momentum_decay", -1.0,
                             "momentum_decay must be >= 0", {"momentum_decay": -1.0}),
    "nadam-mu-product-nan": ("NAdam", {}, "opt.group0.mu_product", math.nan,
                             "'opt.group0.mu_product' must be a finite number", None),
    "step-negative": ("Adam", {}, "opt.step", -1, "'opt.step' is -1; a count >= 0", None),
}


def _bad_value(opt, entry, value):
    dtype = {p.name: p.dtype.np_dtype for p in opt.parameters()}[entry]
    return np.array(value, dtype)


@pytest.mark.parametrize("where", ["file", "state_dict"])
@pytest.mark.parametrize("case", list(HYPER_CASES))
def test_hyper_parameters_loaded_are_checked_like_constructor_arguments(case, where, tmp_path):
    kind, options, entry, value, rule, constructor = HYPER_CASES[case]
    params, opt = _small(kind, **options)
    opt.step([np.ones((2, 3), np.float32)])
    before = {p.name: p.numpy().tobytes() for p in params + opt.parameters()}
    bad = _bad_value(opt, entry, value)
    with pytest.raises(CheckpointError, match=rule) as e:
        if where == "file":
            go.save(tmp_path / "good.npz", params, opt)
            path = with_entries(tmp_path / "good.npz", tmp_path / "bad.npz",
                                replace={entry: npy(bad)})
            go.load(path, params, opt)
        else:
            sd = opt.state_dict()
            sd["state"][entry] = bad
            opt.load_state_dict(sd)
    message = str(e.value)
    assert entry in message, message
    assert before == {p.name: p.numpy().tobytes() for p in params + opt.parameters()}
    if constructor is not None:  # the constructor refuses the same value, in the same words
        with pytest.raises(OptimizerError, match=rule):
            getattr(optim, kind)(params, **{**options, **constructor})
    opt.step([np.ones((2, 3), np.float32)])  # the optimizer still works


@pytest.mark.parametrize("value", [0.0, 0.5, 1e-12])
def test_good_hyper_parameters_load(value, tmp_path):
    params, opt = _small("Adam")
    sd = opt.state_dict()
    sd["state"]["opt.group0.lr"] = np.float64(value)
    sd["state"]["opt.group0.beta1"] = np.float64(value)
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["lr"] == value and opt.param_groups[0]["betas"][0] == value


COUNTER_CASES = {
    "accum-count-negative": ("opt.accum_count", -1, r"'opt.accum_count' is -1; a count in "
                             r"\[0, 2\)"),
    "accum-count-steps": ("opt.accum_count", 2, r"'opt.accum_count' is 2; a count in \[0, 2\)"),
    "accum-count-huge": ("opt.accum_count", 2 ** 62, r"'opt.accum_count' is 4611686018427387904"),
    "tracker-negative": ("loss_scale.growth_tracker", -1,
                         r"'loss_scale.growth_tracker' is -1; a count in \[0, 5\)"),
    "tracker-interval": ("loss_scale.growth_tracker", 5, r"is 5; a count in \[0, 5\)"),
    "scale-zero": ("loss_scale", 0.0, r"'loss_scale' \(DynamicLossScaler\): the scale must be "
                   r"a finite number > 0"),
    "scale-negative": ("loss_scale", -8.0, "the scale must be a finite number > 0"),
    "scale-nan": ("loss_scale", math.nan, "the scale must be a finite number > 0"),
    "scale-inf": ("loss_scale", math.inf, "the scale must be a finite number > 0"),
    "step-negative": ("opt.step", -3, r"'opt.step' is -3; a count >= 0"),
    "lr-nan": ("opt.group0.lr", math.nan, r"'opt.group0.lr': .*lr must be >= 0, got nan"),
}


@pytest.mark.parametrize("case", list(COUNTER_CASES))
def test_counters_and_scales_loaded_are_checked(case, good, run, tmp_path):
    entry, value, message = COUNTER_CASES[case]
    dtype = np.load(good)[entry].dtype
    path = with_entries(good, tmp_path / "bad.npz", replace={entry: npy(np.array(value, dtype))})
    _load_refused(run, path, message)


def test_the_loss_scale_is_checked_as_the_constructor_checks_it():
    for bad in (0.0, -1.0, math.nan, math.inf, 1e39, 1e-46, True, "8"):
        with pytest.raises(OptimizerError, match="the scale must be a finite number > 0"):
            amp.DynamicLossScaler(init_scale=bad)
        with pytest.raises(OptimizerError, match="the scale must be a finite number > 0"):
            amp.StaticLossScaler().set_scale(bad)


def test_a_static_scale_loaded_is_checked(tmp_path):
    w = go.Parameter(np.ones(3, np.float32), name="w")
    scaler = amp.StaticLossScaler(64.0)
    go.save(tmp_path / "s.npz", [w], scaler)
    path = with_entries(tmp_path / "s.npz", tmp_path / "bad.npz",
                        replace={"loss_scale": npy(np.float32(0))})
    with pytest.raises(CheckpointError, match=r"'loss_scale' \(StaticLossScaler\)"):
        go.load(path, [w], scaler)
    assert scaler.scale_value == 64.0
