"""Parameter groups and their hyper-parameters, which are data, not constants.

Each numeric hyper-parameter of a group (lr, weight_decay, eps, momentum, each beta, ...) lives
in a scalar f64 `Parameter` named `<optimizer>.group<i>.<key>` (`opt.group0.lr`), and the
traced step reads it as `@opt.group0.lr`. Writing `opt.param_groups[0]["lr"] = 1e-4` between
steps stores the new number in that Parameter's buffer: the compiled step is unchanged (no
retrace, no recompile) and its next run reads the new value.

Some options decide which nodes and which state a step has (`amsgrad`, `nesterov`, whether
SGD has a momentum buffer at all, an lr schedule). They are fixed when the optimizer is built;
changing one is an error, because a compiled step would silently keep the old graph.
"""
from __future__ import annotations

import math
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import OptimizerError
from ..frontend import Parameter, assign
from ..frontend.traces import current_trace
from .schedules import Schedule

DATA, FLAG, INIT = "data", "flag", "init"


@dataclass(frozen=True)
class Option:
    """One constructor argument of an optimizer, with torch.optim's name and range.

    kind: DATA (a scalar Parameter the graph reads; may change between steps), FLAG (a bool
    that decides the graph's structure; fixed), or INIT (used when the state is created, e.g.
    Adagrad's initial_accumulator_value; fixed). `names` splits a pair such as betas into one
    scalar Parameter per element. `rule` says the valid range in words, `check` tests it.
    """

    kind: str = DATA
    rule: str = ">= 0"
    check: Callable[[float], bool] = lambda x: x >= 0
    names: tuple[str, ...] = ()


def nonneg() -> Option:
    """A number >= 0 (lr, eps, weight_decay, momentum, ...)."""
    return Option()


def real() -> Option:
    return Option(rule="a finite number", check=lambda x: True)


def flag() -> Option:
    return Option(kind=FLAG, rule="True or False", check=lambda x: True)


def betas() -> Option:
    """A pair of decay rates, each in [0, 1) as torch checks them; one Parameter each."""
    return Option(rule="in [0, 1)", check=lambda x: 0 <= x < 1, names=("beta1", "beta2"))


def _is_schedule(x: Any) -> bool:
    return isinstance(x, Schedule)


class ParamGroup(MutableMapping):
    """One parameter group: `group["params"]` and its hyper-parameters, torch-style.

    Reading a data hyper-parameter gives its current Python value (`group["betas"]` is a
    tuple); writing one checks it and stores it into the scalar Parameter the graph reads.
    `group.tensor("lr")` is what the traced step uses: the Parameter itself.
    """

    def __init__(self, owner: str, index: int, params: list[Parameter],
                 values: dict[str, Any], options: dict[str, Option],
                 validate: Callable[[ParamGroup, dict[str, Any], dict[str, Any] | None],
                                    None]):
        self.owner, self.index = owner, index
        self.params = params
        self._options = options
        self._validate = validate  # the optimizer's cross-option checks (nesterov needs ...)
        self._fixed: dict[str, Any] = {}  # flags, init options, an lr schedule
        self._data: dict[str, tuple[Parameter, ...]] = {}  # key -> its scalar Parameter(s)
        values = {k: self._checked(k, v) for k, v in values.items()}
        validate(self, values, None)
        for key, value in values.items():
            opt = options[key]
            if opt.kind != DATA or _is_schedule(value):
                self._fixed[key] = value
                continue
            names = opt.names or (key,)
            numbers = value if opt.names else (value,)
            self._data[key] = tuple(
                Parameter(np.float64(x), name=f"{owner}.group{index}.{n}")
                for n, x in zip(names, numbers))

    # -- what the traced step reads --------------------------------------------------------
    def tensor(self, key: str) -> Parameter:
        """The scalar f64 Parameter holding a data hyper-parameter (one of a pair by its name,
        e.g. "beta1")."""
        for k, params in self._data.items():
            names = self._options[k].names or (k,)
            if key in names:
                return params[names.index(key)]
        raise KeyError(key)

    def flag(self, key: str) -> Any:
        """A fixed option (a flag, an init value, an lr schedule)."""
        return self._fixed[key]

    def is_data(self, key: str) -> bool:
        """Whether `key` is a data hyper-parameter: a number held in scalar Parameters that
        may change between steps (not a flag, an init value or an lr schedule)."""
        return key in self._data

    def hyper_parameters(self) -> list[Parameter]:
        """The scalar f64 Parameters of the group's data hyper-parameters (a pair such as
        betas gives two), for checkpoints."""
        return [p for ps in self._data.values() for p in ps]

    @property
    def label(self) -> str:
        """How errors name the group: the optimizer, the index and its first parameters."""
        names = ", ".join(p.name for p in self.params[:3])
        more = f", ... ({len(self.params)} parameters)" if len(self.params) > 3 else ""
        return f"{self.owner} group {self.index} ({names}{more})"

    # -- the dict interface ----------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if key == "params":
            return list(self.params)
        if key in self._fixed:
            return self._fixed[key]
        if key in self._data:
            values = tuple(float(p.numpy()) for p in self._data[key])
            return values if self._options[key].names else values[0]
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        if current_trace() is not None:
            raise OptimizerError(f"{self.label}: set {key!r} between steps, not inside a "
                                 f"traced step (use a schedule to compute it in the graph)")
        if key == "params":
            raise OptimizerError(f"{self.label}: the parameters of a group are fixed when the "
                                 f"optimizer is built")
        if key not in self._data:
            value = self._checked(key, value)  # a bad value is named as such first
            if _is_schedule(value) or _is_schedule(self._fixed.get(key)):
                why = "an lr schedule is part of the compiled step"
            else:
                why = f"{key!r} decides the structure of the compiled step"
            raise OptimizerError(f"{self.label}: {key!r} cannot change after the optimizer is "
                                 f"built ({why}); build a new optimizer")
        value = self.check_change({key: value})[key]
        numbers = value if self._options[key].names else (value,)
        for p, x in zip(self._data[key], numbers):
            assign(p, np.float64(x))

    def __delitem__(self, key: str) -> None:
        raise OptimizerError(f"{self.label}: options cannot be removed")

    def __iter__(self) -> Iterator[str]:
        yield "params"
        yield from self._options

    def __len__(self) -> int:
        return 1 + len(self._options)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={self[k]!r}" for k in self if k != "params")
        return f"ParamGroup({self.label}: {shown})"

    # -- checking values -------------------------------------------------------------------
    def check_change(self, changes: dict[str, Any],
                     entry: Callable[[str], str] | None = None) -> dict[str, Any]:
        """New values of data hyper-parameters (key -> value), checked as the constructor
        checks its arguments: each value's kind and range (`_checked`), then the optimizer's
        checks across options, against the group's other current values. Returns them in
        canonical form. `entry(key)`, if given, starts the message about a refused value
        (for a check across options: about each value that changed).
        `group[key] = value` and a checkpoint's values (`check_loaded`) both come here."""
        new = {}
        for key, value in changes.items():
            try:
                new[key] = self._checked(key, value)
            except OptimizerError as e:
                if entry is None:
                    raise
                raise OptimizerError(f"{entry(key)}: {e.message}") from None
        old = {k: self[k] for k in self if k != "params"}
        try:
            self._validate(self, old | new, old)
        except OptimizerError as e:
            changed = [entry(k) for k in new if new[k] != old[k]] if entry else []
            if not changed:
                raise
            raise OptimizerError(f"{', '.join(changed)}: {e.message}") from None
        return new

    def check_loaded(self, values: Any) -> None:
        """The group's hyper-parameters as a checkpoint would set them (`values`: arrays by
        Parameter name, every one of this group's present), checked by `check_change`."""
        changes = {}
        for key, params in self._data.items():
            numbers = tuple(np.asarray(values[p.name]).item() for p in params)
            changes[key] = numbers if self._options[key].names else numbers[0]
        entries = {key: " and ".join(f"'{p.name}'" for p in ps) for key, ps in self._data.items()}
        self.check_change(changes, entries.__getitem__)

    def _checked(self, key: str, value: Any) -> Any:
        """The value in canonical form (floats, a tuple for pairs), or an OptimizerError."""
        opt = self._options.get(key)
        if opt is None:
            raise OptimizerError(f"{self.label}: unknown hyper-parameter {key!r}; this "
                                 f"optimizer takes {', '.join(self._options)}")
        if opt.kind == FLAG:
            if not isinstance(value, (bool, np.bool_)):
                raise OptimizerError(f"{self.label}: {key} must be True or False, got {value!r}")
            return bool(value)
        if key == "lr" and _is_schedule(value):
            return value
        if opt.names:
            if not isinstance(value, (tuple, list)) or len(value) != len(opt.names):
                raise OptimizerError(f"{self.label}: {key} must be a pair of numbers, "
                                     f"got {value!r}")
            return tuple(_number(self.label, f"{key}[{i}]", x, opt)
                         for i, x in enumerate(value))
        return _number(self.label, key, value, opt)


def _number(label: str, key: str, value: Any, opt: Option) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                      np.floating)):
        raise OptimizerError(f"{label}: {key} must be a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or not opt.check(x):
        raise OptimizerError(f"{label}: {key} must be {opt.rule}, got {value!r}")
    return x


def as_group_dicts(params: Any) -> list[dict[str, Any]]:
    """torch's forms of `params`: Parameters (a list, or a dict by name), or a list of group
    dicts each with a "params" entry."""
    if isinstance(params, Parameter):
        raise OptimizerError("params must be a list of Parameters or of group dicts, got a "
                             "single Parameter (wrap it in a list)")
    if isinstance(params, dict):
        params = list(params.values())
    params = list(params)
    if not params:
        raise OptimizerError("the optimizer got an empty parameter list")
    if all(isinstance(g, dict) for g in params):
        groups = []
        for i, g in enumerate(params):
            if "params" not in g:
                raise OptimizerError(f"parameter group {i} has no 'params' entry")
            ps = g["params"]
            ps = list(ps.values()) if isinstance(ps, dict) else \
                [ps] if isinstance(ps, Parameter) else list(ps)
            groups.append({**g, "params": ps})
        return groups
    return [{"params": params}]


def check_parameters(groups: Sequence[dict[str, Any]], owner: str) -> None:
    """Every entry is a float Parameter, and none is in two groups (or twice in one)."""
    seen: dict[int, int] = {}
    names: dict[str, int] = {}
    for i, g in enumerate(groups):
        for p in g["params"]:
            if not isinstance(p, Parameter):
                raise OptimizerError(f"{owner} group {i}: {p!r} is not a graphopt.Parameter")
            if not p.dtype.is_float:
                raise OptimizerError(f"{owner} group {i}: parameter '{p.name}' is {p.dtype}; "
                                     f"optimizers update float parameters only")
            if id(p) in seen:
                where = "twice in group" if seen[id(p)] == i else \
                    f"in groups {seen[id(p)]} and"
                raise OptimizerError(f"{owner}: parameter '{p.name}' is {where} {i}; a "
                                     f"parameter belongs to exactly one group")
            if p.name in names:
                raise OptimizerError(f"{owner}: two different parameters are named "
                                     f"'{p.name}'; optimizer state is named after them")
            seen[id(p)], names[p.name] = i, i


def decay_groups(params: Any, weight_decay: float, *,
                 no_decay: Callable[[Parameter], bool] | Sequence[str] | None = None,
                 ) -> list[dict[str, Any]]:
    """Split parameters into a decayed group and a group with weight_decay=0.

    By default a parameter gets no decay if it has at most one axis (biases, norm scales,
    embeddings' per-channel gains) or its name contains "bias" or "norm". `no_decay` may be a
    list of name fragments or a predicate instead. Both groups are returned, in that order,
    even if one is empty: `[{"params": decayed, "weight_decay": wd},
    {"params": others, "weight_decay": 0.0}]`.
    """
    ps = list(params.values()) if isinstance(params, dict) else list(params)
    if no_decay is None or not callable(no_decay):
        fragments = ("bias", "norm") if no_decay is None else tuple(no_decay)

        def skip(p: Parameter) -> bool:
            return (no_decay is None and p.ndim <= 1) or any(f in p.name for f in fragments)
    else:
        skip = no_decay
    return [{"params": [p for p in ps if not skip(p)], "weight_decay": weight_decay},
            {"params": [p for p in ps if skip(p)], "weight_decay": 0.0}]

