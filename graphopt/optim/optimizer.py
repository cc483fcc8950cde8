"""The Optimizer base class: parameter groups, state as Parameters, one step as traced Python.

An optimizer step is plain Python over graphopt ops and `assign`, so the same code builds a
graph inside `@graphopt.jit` and computes at once in eager mode. Everything it keeps is a
`Parameter` the graph reads as `@name`:

    @fc1.w.exp_avg, @fc1.w.exp_avg_sq   state of each parameter, named after it
    @fc1.w.master                       f32 copy of an f16/bf16 parameter (mixed precision)
    @opt.group0.lr, @opt.group0.beta1   hyper-parameters, f64 scalars (see groups.py)
    @opt.step                           the number of steps taken (i64)

A step, as `Optimizer.step` builds it:

    t = step + 1                          f64; 1 on the first step, as torch counts
    for each group:
        c = self.scalars(group, h)        per-group f64 scalars (bias corrections, lr, ...)
        for each parameter and its gradient g:
            self.update(slot, g, c)       reads and assigns the parameter and its state
            (or update_rows)              g a row gradient: only the rows it touches
    step = step + 1

The rule is picked per parameter by the kind of gradient it gets (MindSpore's
MultitypeFuncGraph): a dense tensor goes to `update`, a row gradient (`Rows`, from a sparse
embedding) to `update_rows`, coalesced first; `gradient_kinds` says which an optimizer has.
A row rule reads and writes through the same `read`/`write` calls as a dense one, which then
read and write the gradient's rows of the parameter and of each state (take_rows, and an
assign of those rows), so a rule that holds for every element serves both kinds.

Scalar math (bias corrections, step sizes) is done in f64, as torch does it with Python
floats, and each result is cast once to the dtype the update is computed in, where it meets
the tensors: an f32 run rounds the same numbers torch rounds.

Every write goes through `_write`. When a step is called with `where=cond` (a bool scalar
tensor), it stores `where(cond, new, old)`: a skipped step (an overflow under loss scaling,
a micro-batch under accumulation) leaves every parameter and every state bit-identical, with
no Python branch on a traced value and one compiled step for both outcomes.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from .. import memory, ops
from ..compile import aliasing
from ..errors import CheckpointError, OptimizerError
from ..frontend import Parameter, assign
from ..frontend.hypermap import MapUnsupported, hypermap
from ..frontend.rows import Rows
from ..frontend.tensor import Tensor
from ..frontend.traces import current_trace, user_location
from ..ir.types import DType, RowsType, TensorType, bf16, bool_, f16, f32, f64, to_dtype
from .arguments import CheckedArguments
from .groups import Option, ParamGroup, as_group_dicts, check_parameters, flag
from .rules import l2_norm

LOW_PRECISION = (f16, bf16)
DENSE, ROWS = "dense", "rows"  # the kinds of gradient an update rule takes


@dataclass
class Slot:
    """One parameter as its optimizer sees it: what `update` gets.

    Attributes:
        param: the Parameter.
        group: its parameter group.
        compute: the dtype its update is computed in (f32 for an f16/bf16 parameter with
            master weights, else its own).
        state_dtype: the dtype its state is stored in.
        state: its state Parameters by key ("exp_avg", ..., and "master").
        rows: for a row rule (`update_rows`), the coalesced row gradient of this step: the
            rule then reads and writes those rows only. None for a dense rule.
    """

    param: Parameter
    group: ParamGroup
    compute: DType  # the dtype its update is computed in
    state_dtype: DType  # the dtype its state is stored in
    state: dict[str, Parameter] = field(default_factory=dict)  # by key: "exp_avg", "master"
    rows: Rows | None = None

    @property
    def master(self) -> Parameter | None:
        return self.state.get("master")

    def part(self, p: Parameter) -> Tensor:
        """p (the parameter, its master copy or a state) as the update reads it: whole, or
        the rows of the row gradient (`take_rows`)."""
        return p if self.rows is None else ops.take_rows(p, self.rows)

    def current(self) -> Tensor:
        """The parameter's value as the update reads it (a ZeRO shard reads its part of
        the flat parameters instead)."""
        return self.part(self.param)

    def commit(self, opt: Optimizer, value: Tensor) -> None:
        """Store the parameter's new value, rounded to its dtype (where the step's `where=`
        holds)."""
        opt._write(self.param, as_dtype(value, self.param.dtype), self.rows)

    def norm(self, x: Tensor) -> Tensor:
        """The L2 norm of `x`, a tensor of this parameter's shape (LAMB's trust ratio).
        Under ZeRO a shard holds parts of several parameters: there it is each element's
        parameter's norm, over every rank."""
        return l2_norm(x)


class Hyper:
    """What a group's `scalars` reads, each made on first use (no dead nodes):

    `h.lr`, `h.beta1`, ...: the group's f64 scalar Parameters, except an lr given as a
        schedule, computed from the number of steps already taken (0 on the first step);
    `h.t`: this step's number as f64, 1 on the first step (torch's `step` after `+= 1`).
    """

    def __init__(self, group: ParamGroup, t: Callable[[], Tensor],
                 steps_done: Callable[[], Tensor]):
        self._group, self._t, self._done = group, t, steps_done

    def __getattr__(self, key: str) -> Any:
        if key == "t":
            value = self._t()
        elif key == "lr" and not self._group.is_data("lr"):
            value = self._group.flag("lr")(self._done())
        else:
            try:
                value = self._group.tensor(key)
            except KeyError:
                raise AttributeError(key) from None
        setattr(self, key, value)  # read once per step
        return value


class Scalars:
    """A group's f64 scalars, each cast to one compute dtype on first use (one cast node).
    Bool scalars (conditions) pass through as they are."""

    def __init__(self, values: Mapping[str, Any], dtype: DType):
        self._values, self._dtype = values, dtype

    def __getattr__(self, key: str) -> Any:
        try:
            v = self._values[key]
        except KeyError:
            raise AttributeError(key) from None
        if isinstance(v, Tensor) and v.dtype.is_float:
            v = as_dtype(v, self._dtype)
        setattr(self, key, v)
        return v


class Optimizer(metaclass=CheckedArguments):
    """Base class of graphopt's optimizers (torch.optim's interface, a traced step).

    Subclasses declare `options` (their constructor's hyper-parameters, see groups.Option),
    the state each parameter keeps (`init_state`), the per-group scalars (`scalars`) and the
    update of one parameter (`update`). Their constructors pass `**kwargs` on to this one
    (name, state_dtype, master_weights); a call with an argument the constructor does not
    take is an OptimizerError at the caller's line (arguments.py).

    Args:
        params: the float Parameters to update, as a list or a dict by name, or torch-style
            group dicts, each with a "params" entry and its own hyper-parameters (see
            `decay_groups`).
        defaults: the subclass's hyper-parameters by option name, for every group that
            does not set its own.
        name: the prefix of the optimizer's own Parameters (`opt.step`, `opt.group0.lr`);
            two optimizers in one step need different names.
        state_dtype: the dtype of the state tensors (moments, buffers); None means the
            compute dtype. bf16 halves the bytes a step moves: the update is still computed
            in f32 and each state is rounded to nearest-even when it is stored.
        master_weights: for f16/bf16 parameters, keep an f32 master copy (`<name>.master`),
            compute the update in f32 on it and write the parameter back rounded. Where the
            parameter was written by something else since (it no longer holds the master's
            rounding), the step re-seeds the master from it (see `read`).

    Raises:
        OptimizerError: a parameter that is not a float Parameter or is in two groups, an
            unknown hyper-parameter, or a value out of its range.
    """

    options: ClassVar[dict[str, Option]] = {}
    # The kinds of gradient it has a rule for: "dense" (`update`), "rows" (`update_rows`).
    gradient_kinds: ClassVar[tuple[str, ...]] = (DENSE,)

    def __init__(self, params: Any, defaults: dict[str, Any], *, name: str = "opt",
                 state_dtype: Any = None, master_weights: bool = True):
        self.name = name
        kind = type(self).__name__
        groups = as_group_dicts(params)
        check_parameters(groups, kind)
        if state_dtype is not None:
            state_dtype = _float_dtype(state_dtype, "state_dtype")
        self.state_dtype = state_dtype
        self.master_weights = bool(master_weights)
        self.param_groups: list[ParamGroup] = []
        for i, g in enumerate(groups):
            values = {**defaults, **{k: v for k, v in g.items() if k != "params"}}
            self.param_groups.append(ParamGroup(name, i, list(g["params"]), values,
                                                self.options, self.check_group))
        self.step_count = Parameter(np.int64(0), name=f"{name}.step")
        self.group_state: list[dict[str, Parameter]] = [
            {k: Parameter(np.float64(v), name=f"{name}.group{g.index}.{k}")
             for k, v in self.init_group_state(g).items()} for g in self.param_groups]
        self._slots = [self._make_slot(p, g) for g in self.param_groups for p in g.params]
        self._apply: Any = None  # the `where=` condition of the step being built
        # Under DataParallel(zero >= 1): this rank's shards of the state (distributed/).
        self.sharding: Any = None

    # -- what a subclass defines -----------------------------------------------------------
    def init_state(self, group: ParamGroup) -> dict[str, float]:
        """The state tensors each parameter of `group` keeps, called once per group when
        the optimizer is built.

        Returns:
            key -> initial fill value. Each key becomes a Parameter `<param>.<key>` of
                the parameter's shape, in the state dtype, that `update` reads with
                `read_state` and writes with `write_state`. The base class keeps none.
        """
        return {}

    def init_group_state(self, group: ParamGroup) -> dict[str, float]:
        """Scalar state shared by the parameters of a group (NAdam's mu_product), called
        once per group when the optimizer is built.

        Returns:
            key -> initial value. Each becomes an f64 scalar Parameter
                `<name>.group<i>.<key>`, in `self.group_state[i]`. The base class keeps
                none.
        """
        return {}

    def scalars(self, group: ParamGroup, h: Hyper) -> dict[str, Any]:
        """The group's scalars for this step (bias corrections, step sizes), computed once
        per group and step, in f64.

        Args:
            group: the group.
            h: its hyper-parameters as f64 scalar tensors (`h.lr`, `h.beta1`, ...) and
                `h.t`, this step's number (1 on the first step).

        Returns:
            name -> scalar. `update` reads them as `c.<name>`, each cast once to the
                parameter's compute dtype. The base class gives `lr`.
        """
        return {"lr": h.lr}

    def update(self, slot: Slot, g: Tensor, c: Scalars) -> None:
        """Write the new value of one parameter and of its state: the update rule.

        Read with `read` and `read_state`, write with `write` and `write_state` (never
        `assign` directly: those honour the step's `where=`).

        Args:
            slot: the parameter, its group, its compute dtype and its state.
            g: its gradient in the compute dtype (negated when the group maximizes).
            c: the group's `scalars`, cast to the compute dtype.
        """
        raise NotImplementedError

    def update_rows(self, slot: Slot, g: Tensor, c: Scalars) -> None:
        """The update rule for a row gradient (optimizers with "rows" in `gradient_kinds`):
        like `update`, on the rows the gradient touches. `read`, `read_state` give those
        rows of the parameter and of its state, `write`, `write_state` store them; the other
        rows are left as they are.

        Args:
            slot: the parameter, with `slot.rows` the coalesced row gradient (unique
                indices; its no-row entries are read as zeros and never written).
            g: the gradient's values, [K, *param.shape[1:]], in the compute dtype (negated
                when the group maximizes).
            c: the group's `scalars`, cast to the compute dtype.
        """
        raise NotImplementedError

    def densifies_rows(self, slot: Slot) -> bool:
        """Whether a row gradient of this parameter is made dense and given to `update`
        (SGD with momentum: its buffer moves every row, as torch's does). The base class:
        never."""
        return False

    def check_group(self, group: ParamGroup, new: dict[str, Any],
                    old: dict[str, Any] | None) -> None:
        """Check a group's hyper-parameters together (each one's range is checked
        already), at construction and on every change: Nesterov needs a momentum, say.

        Args:
            group: the group.
            new: its values as they would be, by option name.
            old: its values before the change; None at construction.

        Raises:
            OptimizerError: the combination is refused. The base class refuses none.
        """

    # -- the step --------------------------------------------------------------------------
    @property
    def params(self) -> list[Parameter]:
        """Every parameter, all groups in order: the order of a gradient sequence."""
        return [s.param for s in self._slots]

    @property
    def state(self) -> dict[str, dict[str, Parameter]]:
        """Each parameter's state Parameters, by parameter name then key (like torch's)."""
        return {s.param.name: dict(s.state) for s in self._slots}

    def step(self, grads: Sequence[Any] | Mapping[str, Any], where: Any = None) -> None:
        """One update of every parameter from its gradient.

        Args:
            grads: one gradient per parameter, in the order of `self.params`, or a dict by
                parameter name; each of the parameter's shape, and of its dtype (or f32 for
                an f16/bf16 parameter): a dense tensor, or a row gradient (`Rows`) where the
                optimizer has a row rule (`gradient_kinds`).
            where: None, or a bool scalar (a Python bool or a tensor): where it is false,
                the step changes nothing, not even the step count.

        Raises:
            OptimizerError: a gradient missing, extra, or of the wrong shape or dtype, of a
                kind the optimizer has no rule for, or a `where` that is not a bool scalar;
                raised before anything changes.
        """
        grads = self.check_grads(grads)
        apply = check_condition(where, f"{type(self).__name__}.step")
        self._apply = apply
        try:
            count = self.step_count
            new_count = count + 1
            t = functools.cache(lambda: ops.cast(new_count, f64))  # made when first used
            done = functools.cache(lambda: ops.cast(count, f64))
            by_param = dict(zip((s.param.name for s in self._slots), grads))
            parallel = getattr(current_trace(), "parallel", None)
            sharded = parallel.sharding(self) if parallel is not None else None
            if sharded is None and self.sharding is not None:
                raise OptimizerError(f"{type(self).__name__} '{self.name}': its state is "
                                     f"sharded over {self.sharding.ranks} ranks (ZeRO); step it "
                                     f"under DataParallel(zero=1 or 2)", loc=user_location())
            for group in self.param_groups:
                values = self.scalars(group, Hyper(group, t, done))
                if sharded is not None:  # ZeRO: this rank updates its shard of each bucket
                    sharded.update(group, values, by_param)
                    continue
                casts: dict[DType, Scalars] = {}
                for batch in self._batches(group):
                    rows = [s for s in batch if isinstance(by_param[s.param.name], Rows)]
                    dense = [s for s in batch if not isinstance(by_param[s.param.name], Rows)]
                    if self._map(dense, values, by_param):
                        batch = rows  # (the dense ones are updated)
                    for slot in batch:
                        c = casts.setdefault(slot.compute, Scalars(values, slot.compute))
                        self._update(slot, by_param[slot.param.name], c)
            self._write(self.step_count, new_count)
        finally:
            self._apply = None

    def _batches(self, group: ParamGroup) -> list[list[Slot]]:
        """The group's parameters in batches one update rule can be mapped over: the same
        dtypes and the same state (shapes may differ)."""
        batches: dict[tuple, list[Slot]] = {}
        for s in (s for s in self._slots if s.group is group):
            key = (s.param.dtype, s.compute, tuple((k, p.dtype) for k, p in s.state.items()))
            batches.setdefault(key, []).append(s)
        return list(batches.values())

    def _map(self, batch: list[Slot], values: Mapping[str, Any],
             by_param: Mapping[str, Any]) -> bool:
        """Under jit, trace the update of the batch's first parameter once and map it over
        all of them: one multi-tensor kernel, whatever the number of parameters (see
        frontend/hypermap.py). False (nothing traced) where the rule does not map: a rule
        with a norm (LAMB), gradients that are not traced tensors, a single parameter."""
        if len(batch) < 2 or current_trace() is None:
            return False
        first = batch[0]

        def rule() -> None:  # a Scalars of its own: its casts belong to the mapped body
            g = self._gradient(first, by_param[first.param.name])
            self.update(first, g, Scalars(values, first.compute))

        instances = [{"param": s.param, "grad": by_param[s.param.name],
                      **{("state", k): p for k, p in s.state.items()}} for s in batch]
        try:
            hypermap(rule, instances)
        except MapUnsupported:
            return False
        return True

    def _update(self, slot: Slot, g: Any, c: Scalars) -> None:
        """The rule for the kind of gradient g is: `update_rows` on the coalesced rows of a
        row gradient (unless the parameter `densifies_rows`), else `update`."""
        if isinstance(g, Rows) and not self.densifies_rows(slot):
            rows = g if g.unique else ops.coalesce(g)
            slot = dataclasses.replace(slot, rows=rows)
            self.update_rows(slot, self._gradient(slot, rows.values), c)
        else:
            self.update(slot, self._gradient(slot, g.dense() if isinstance(g, Rows) else g), c)

    def _gradient(self, slot: Slot, g: Any) -> Tensor:
        g = as_dtype(g, slot.compute)
        return -g if slot.group.flag("maximize") else g

    # -- reading and writing parameters and state (for `update`) ---------------------------
    def read(self, slot: Slot) -> Tensor:
        """The parameter's value in its compute dtype: its f32 master copy, if it has one and
        the parameter still holds the master's rounding, else the parameter itself.

        The parameter is the source of truth; the master only adds the bits its dtype
        rounds away. Where something other than this optimizer wrote the parameter (an
        `assign` in another step, a checkpoint of the weights alone), the parameter no longer
        equals round(master), and the master is re-seeded from it: `where` per element, in
        the update's kernel (2 bytes more read per element), never a lost write."""
        p = slot.current()
        if slot.master is None:
            return p
        master = slot.part(slot.master)
        return ops.where(as_dtype(master, p.dtype) == p, master, as_dtype(p, master.dtype))

    def write(self, slot: Slot, value: Tensor) -> None:
        """Store the new parameter value (and the master copy, which keeps it unrounded),
        only where the step's `where=` holds."""
        if slot.master is not None:
            self._write(slot.master, value, slot.rows)
        slot.commit(self, value)

    def read_state(self, slot: Slot, key: str) -> Tensor:
        """The parameter's state tensor `key` ("exp_avg", ...) in its compute dtype (a cast
        where the state is stored narrower, as with state_dtype=bf16); under a row rule,
        its rows."""
        return as_dtype(slot.part(slot.state[key]), slot.compute)

    def write_state(self, slot: Slot, key: str, value: Tensor) -> None:
        """Store the new value of the state tensor `key`, rounded to its stored dtype (and
        only where the step's `where=` holds); under a row rule, its rows."""
        p = slot.state[key]
        self._write(p, as_dtype(value, p.dtype), slot.rows)

    def _write(self, target: Parameter, value: Any, rows: Rows | None = None) -> None:
        """assign(target, value); with `rows`, value is those rows of target."""
        if self._apply is not None:
            value = ops.where(self._apply, value,
                              target if rows is None else ops.take_rows(target, rows))
        assign(target, value if rows is None else ops.with_values(rows, value))

    # -- checking input --------------------------------------------------------------------
    def check_grads(self, grads: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        """The gradients as a list in the order of `self.params`, or an OptimizerError that
        names the parameter (raised before anything changes). In eager mode also an
        AliasingError for a gradient that views a parameter made with copy=False, as a
        compiled step refuses such an argument (compile/aliasing.py): the update would read
        it after overwriting it."""
        kind = type(self).__name__
        names = [s.param.name for s in self._slots]
        if isinstance(grads, Mapping):
            missing = [n for n in names if n not in grads]
            known = set(names)
            extra = [str(k) for k in grads if k not in known]
            if missing or extra:
                parts = ([f"missing for {', '.join(map(repr, missing))}"] if missing else []) + \
                    ([f"given for unknown {', '.join(map(repr, extra))}"] if extra else [])
                raise OptimizerError(f"{kind}.step: gradients {'; '.join(parts)}")
            grads = [grads[n] for n in names]
        elif isinstance(grads, (Tensor, np.ndarray)) or not isinstance(grads, Sequence):
            raise OptimizerError(f"{kind}.step: grads must be a sequence (in the order of "
                                 f"opt.params) or a dict by parameter name, got "
                                 f"{type(grads).__name__}")
        else:
            grads = list(grads)
            if len(grads) != len(names):
                more = f"missing for {', '.join(map(repr, names[len(grads):]))}" \
                    if len(grads) < len(names) else f"{len(grads) - len(names)} too many"
                raise OptimizerError(f"{kind}.step: {len(grads)} gradients for {len(names)} "
                                     f"parameters ({more})")
        for slot, g in zip(self._slots, grads):
            t = _type_of(g)
            self._check_kind(slot, t)
            # f32 gradients of f16/bf16 parameters are welcome (graphopt.amp unscales into
            # f32); they are rounded to the compute dtype if it is narrower.
            p = slot.param.type
            if t is not None and t.shape == p.shape and t.dtype in (p.dtype, slot.compute):
                continue  # the usual case, checked without building sets
            allowed = {p.dtype, slot.compute} | ({f32} if p.dtype in LOW_PRECISION else set())
            if t is None or t.shape != p.shape or t.dtype not in allowed:
                got = "None" if g is None else str(t) if t else type(g).__name__
                want = " or ".join(str(TensorType(slot.param.shape, d)) for d in
                                   sorted(allowed, key=lambda d: d.name))
                raise OptimizerError(f"{kind}.step: the gradient of '{slot.param.name}' is "
                                     f"{got}, expected {want}")
        if current_trace() is None:
            exposed = aliasing.exposed(self.params)
            if exposed:
                aliasing.check_arguments(exposed, grads, names, f"{kind}.step: the gradient "
                                                                f"of '{{}}'")
        return grads

    def _check_kind(self, slot: Slot, t: TensorType | RowsType | None) -> None:
        """An OptimizerError if the optimizer has no rule for this kind of gradient."""
        rows = isinstance(t, RowsType)
        if (ROWS if rows else DENSE) in self.gradient_kinds or t is None:
            return
        kind, name = type(self).__name__, slot.param.name
        if rows:
            raise OptimizerError(f"{kind}.step: the gradient of '{name}' is a row gradient "
                                 f"({t}); {kind} takes dense gradients only. Optimizers that "
                                 f"take row gradients: {', '.join(row_optimizers())}; or "
                                 f"pass the dense gradient, g.dense()")
        raise OptimizerError(f"{kind}.step: the gradient of '{name}' is dense ({t}); {kind} "
                             f"takes row gradients only (ops.embedding(..., sparse=True) "
                             f"gives them); for dense gradients use Adam or LazyAdam")

    # -- state: creation, listing, saving --------------------------------------------------
    def _make_slot(self, p: Parameter, group: ParamGroup) -> Slot:
        master = self.master_weights and p.dtype in LOW_PRECISION
        compute = f32 if master else p.dtype
        slot = Slot(p, group, compute, self.state_dtype or compute)
        # Each state buffer starts k slots after the parameter's in the page, so a kernel's
        # streams do not alias (graphopt.memory). Written now, not left to the first step:
        # memory fresh from the system is faulted in by its first write, and in a step split
        # over threads those faults contend (a first step of 1,000 tensors took 10 ms longer).
        k = itertools.count(1)
        if master:
            slot.state["master"] = Parameter(p._value, dtype=f32, name=f"{p.name}.master",
                                             offset=memory.offset_after(p._value, next(k)))
        for key, fill in self.init_state(group).items():
            slot.state[key] = Parameter.full(p.shape, fill, slot.state_dtype,
                                             name=f"{p.name}.{key}",
                                             offset=memory.offset_after(p._value, next(k)))
        return slot

    def parameters(self) -> list[Parameter]:
        """Every Parameter the optimizer owns: step counter, hyper-parameters, state."""
        out = [self.step_count]
        for g, gs in zip(self.param_groups, self.group_state):
            out += g.hyper_parameters() + list(gs.values())
        for s in self._slots:
            out += list(s.state.values())
        return out + (self.sharding.parameters() if self.sharding is not None else [])

    def state_dict(self) -> dict[str, Any]:
        """A copy of everything needed to resume: the fixed options of each group (for a
        check on load) and the value of every Parameter the optimizer owns, by name."""
        return {"param_groups": [self._structure(g) for g in self.param_groups],
                "state": {p.name: p.numpy() for p in self.parameters()}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a `state_dict()`; checks everything before changing anything (its form,
        the fixed options of each group, every array's name, shape and dtype, and the values
        as the constructor checks them), else a CheckpointError."""
        from ..checkpoint import restore
        where = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, Mapping) or set(state_dict) != {"param_groups", "state"}:
            got = sorted(map(str, state_dict)) if isinstance(state_dict, Mapping) else \
                type(state_dict).__name__
            raise CheckpointError(f"{where}: not a state_dict (a dict of 'param_groups' and "
                                  f"'state', as state_dict() makes), got {got}")
        groups, arrays = state_dict["param_groups"], state_dict["state"]
        if not isinstance(groups, (list, tuple)) or \
                not all(isinstance(g, Mapping) for g in groups):
            raise CheckpointError(f"{where}: 'param_groups' must be a list of dicts, one per "
                                  f"group, got {_short(groups)}")
        difference = _group_difference(groups, [self._structure(g) for g in self.param_groups])
        if difference:
            raise CheckpointError(f"{where}: the saved groups differ from this optimizer's: "
                                  f"{difference}")
        if not isinstance(arrays, Mapping):
            raise CheckpointError(f"{where}: 'state' must be a dict of arrays by Parameter "
                                  f"name, got {_short(arrays)}")
        restore(self.parameters(), arrays, f"{type(self).__name__} state_dict", [self])

    def check_loaded(self, values: Mapping[str, np.ndarray]) -> None:
        """Values about to be loaded into this optimizer's Parameters (by name), checked as
        the constructor checks its arguments: each group's hyper-parameters (by the same
        code, `ParamGroup.check_change`), the step count, the groups' state. Raises
        OptimizerError naming the entry."""
        check_count(values, self.step_count)
        for group, state in zip(self.param_groups, self.group_state):
            group.check_loaded(values)
            for p in state.values():
                x = float(np.asarray(values[p.name]))
                if not math.isfinite(x):
                    raise OptimizerError(f"'{p.name}' must be a finite number, got {x}")

    def _structure(self, group: ParamGroup) -> dict[str, Any]:
        fixed = {k: group[k] for k in group if k != "params" and not group.is_data(k)
                 and not callable(group[k])}
        return {"params": [p.name for p in group.params], **fixed}

    def __repr__(self) -> str:
        groups = "\n".join(f"  {g!r}" for g in self.param_groups)
        return f"{type(self).__name__}(name={self.name!r}\n{groups}\n)"


def check_count(values: Mapping[str, np.ndarray], counter: Parameter,
                below: int | None = None) -> None:
    """A counter Parameter's value about to be loaded: an integer >= 0 (and < `below`)."""
    n = int(np.asarray(values[counter.name]))
    if n < 0 or (below is not None and n >= below):
        rule = ">= 0" if below is None else f"in [0, {below})"
        raise OptimizerError(f"'{counter.name}' is {n}; a count {rule}")


def _group_difference(groups: Sequence[Mapping[str, Any]],
                      mine: list[dict[str, Any]]) -> str | None:
    """The first difference between saved groups and this optimizer's, in words, or None."""
    if len(groups) != len(mine):
        return f"{len(groups)} groups saved, {len(mine)} here"
    for i, (saved, here) in enumerate(zip(groups, mine)):
        for key in sorted(set(saved) | set(here), key=str):
            if key not in saved or key not in here:
                side = "here" if key in here else "in the state dict"
                return f"group {i} has {key!r} {side} only"
            try:
                same = bool(saved[key] == here[key])
            except (TypeError, ValueError):  # values that do not compare (arrays)
                same = False
            if not same:
                return f"group {i}: {key!r} is {_short(saved[key])} in the state dict, " \
                       f"{_short(here[key])} here"
    return None


def _short(x: Any) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text[:60]}..." if len(text) > 64 else f"{type(x).__name__} {text}"


def check_condition(where: Any, what: str) -> Any:
    """A step's `where=`: None, a Python bool, or a bool scalar tensor."""
    if where is None or isinstance(where, (bool, np.bool_)):
        return where
    t = _type_of(where)
    if t is None or t.shape != () or t.dtype != bool_:
        raise OptimizerError(f"{what}: where= must be a bool scalar, got "
                             f"{t or type(where).__name__}")
    return where


def row_optimizers() -> list[str]:
    """The names of graphopt's optimizers that take row gradients, sorted."""
    found, todo = set(), [Optimizer]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if ROWS in cls.gradient_kinds and cls.__module__.startswith("graphopt.optim"):
            found.add(cls.__name__)
    return sorted(found)


def _type_of(x: Any) -> TensorType | RowsType | None:
    if isinstance(x, (Tensor, Rows)):
        return x.type
    if isinstance(x, (np.ndarray, np.generic)):
        try:
            return TensorType(x.shape, to_dtype(x.dtype))
        except TypeError:
            return None
    return None


def dtype_of(x: Any) -> DType:
    """The dtype of a tensor, Parameter or numpy array (a gradient, traced or eager)."""
    return x.dtype if isinstance(x, Tensor) else to_dtype(np.asarray(x).dtype)


def as_dtype(x: Any, dtype: DType) -> Any:
    """x in `dtype`: a cast node only where the dtype differs."""
    return ops.cast(x, dtype) if dtype_of(x) != dtype else x


def _float_dtype(x: Any, what: str) -> DType:
    try:
        d = to_dtype(x)
    except TypeError as e:
        raise OptimizerError(f"{what}: {e}") from None
    if not d.is_float:
        raise OptimizerError(f"{what} must be a float dtype, got {d}")
    return d


COMMON_OPTIONS: dict[str, Option] = {"maximize": flag()}

