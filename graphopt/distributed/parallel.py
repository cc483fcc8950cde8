"""DataParallel: the strategy `jit(step, parallel=DataParallel(...))` compiles a step with.

Every rank runs the same step on its own slice of the batch. The user's step function is
the single-process one; the strategy adds the communication where it belongs:

- **value_and_grad** (`gradients`): each gradient with respect to a Parameter is averaged
  over the ranks, an `all_reduce(reduce="mean")` (torch DDP's average, so the learning
  rate of one process on the whole batch is right for N ranks on N slices). What the step
  does with its gradients next (clip them, log their norm) sees the averaged ones. With
  `compress`, the average is pre-divided by the ranks, cast to f16/bf16, summed, and cast
  back (`reduce`). A gradient an `Accumulate` sums is left this rank's own: the Accumulate
  reduces the sum once, on its k-th call (`reduce` with `when`, an all_reduce_when).
- **the loss scaler** (`agree`): whether the gradients are finite is decided for all the
  ranks at once (an all_reduce max of "not finite"), so every rank skips the same steps.
- **the optimizer** (`sharding`, zero >= 1): each rank keeps and updates only its shard of
  the flat buckets of parameters (sharding.py).
- **the passes** (`pipeline`): `zero` (zero >= 1) and `bucket` run before the default
  pipeline (passes.py), with `bucket_bytes`; at one rank `one_rank` (one_rank.py) instead.
- **the first run** (`prepare`): the ranks check that they compiled the same step
  (fingerprint.py), before any collective could pair with a different one.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from .. import comm, ops
from ..errors import ArgumentError, OptimizerError
from ..frontend.rows import Rows
from ..frontend.traces import current_trace
from ..ir.types import bf16, f16
from ..optim.accumulate import Accumulate, accumulating
from ..optim.optimizer import dtype_of
from .layout import DEFAULT_BUCKET_BYTES
from .sharding import Sharding

COMPRESSIONS = {"fp16": f16, "bf16": bf16}  # DataParallel(compress=...): the wire dtype
# The trace being made -> id(Accumulate) -> (it, a Parameter it sums, whether it reduced):
# the gradients value_and_grad left unreduced for an Accumulate (`finish` checks them).
_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

if TYPE_CHECKING:
    from ..optim.optimizer import Optimizer


@dataclass(frozen=True)
class DataParallel:
    """Data-parallel training over the ranks of `group` (see graphopt.distributed.init).

    Args:
        zero: 0: gradients are averaged by all_reduce, every rank keeps the whole optimizer
            state. 1: the optimizer state (moments, master weights) is sharded, each rank
            updating 1/N of every bucket, then all_gathering the parameters; a bucket of
            gradients that something else reads whole is all_reduced, the others are
            reduce_scattered. 2: a reduce_scatter gives each rank only its shard's averaged
            gradient (gathered back for what reads one whole).
        bucket_bytes: gradients are packed into flat buckets that close once they hold this
            many bytes (torch DDP's 25 MiB by default): fewer, larger collectives.
        group: the process group ("world": every rank of the job).
        compress: None, or "fp16" / "bf16": gradients are sent in that dtype (half the
            bytes of f32), each divided by the number of ranks before the cast so that the
            sum cannot overflow where the average does not (torch's fp16 comm hook), summed
            in f32 by the communicator and rounded once, then cast back to the gradient's
            dtype.

    Raises:
        ArgumentError: a zero stage other than 0, 1, 2, a bucket size that is not a
            positive integer, or a compression other than "fp16" and "bf16".
    """

    zero: int = 0
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    group: str = "world"
    compress: str | None = None
    # The optimizers stepped in steps traced for it (for the memory report).
    _optimizers: weakref.WeakSet = field(default_factory=weakref.WeakSet, compare=False,
                                         repr=False)

    def __post_init__(self) -> None:
        if self.zero not in (0, 1, 2) or isinstance(self.zero, bool):
            raise ArgumentError(f"DataParallel: zero must be 0, 1 or 2, got {self.zero!r}")
        if not isinstance(self.bucket_bytes, int) or isinstance(self.bucket_bytes, bool) or \
                self.bucket_bytes < 1:
            raise ArgumentError(f"DataParallel: bucket_bytes must be a positive integer, got "
                                f"{self.bucket_bytes!r}")
        if self.compress is not None and self.compress not in COMPRESSIONS:
            raise ArgumentError(f"DataParallel: compress must be None, 'fp16' or 'bf16', got "
                                f"{self.compress!r}")
        if not isinstance(self.group, str):
            raise ArgumentError(f"DataParallel: group must be a group's name, got "
                                f"{self.group!r}")

    @property
    def ranks(self) -> int:
        """The number of ranks in the group, now."""
        return comm.group(self.group).size

    def key(self) -> tuple:
        """What a compiled step depends on besides its arguments: a step traced for 4 ranks
        is not the step for 2."""
        return ("DataParallel", self.zero, self.bucket_bytes, self.group, self.compress,
                self.ranks)

    def gradients(self, params: Sequence[Any], grads: list[Any]) -> list[Any]:
        """The gradients with respect to `params`, averaged over the ranks; those of the
        Parameters an Accumulate sums are this rank's own (it reduces their sum once per
        update, `summed`; `finish` checks that it did). A row gradient (K rows on each rank)
        is averaged as rows: every rank's rows, all gathered (N·K rows), their values
        divided by N; the optimizer coalesces them (torch DDP gathers sparse gradients
        likewise). ZeRO shards flat buckets of the state, which row updates cannot address:
        with zero >= 1 a row gradient is an ArgumentError."""
        out = []
        for p, g in zip(params, grads):
            acc = accumulating(p)
            if isinstance(g, Rows):
                out.append(self._rows_mean(p, g))
            elif acc is None:
                out.append(self.reduce(g))
            else:
                _TRACED.setdefault(current_trace(), {}).setdefault(id(acc), (acc, p, False))
                out.append(g)
        return out

    def summed(self, acc: Accumulate) -> None:
        """The Accumulate `acc` reduced its sums in the step being traced."""
        left = _TRACED.setdefault(current_trace(), {})
        left[id(acc)] = (acc, None, True)

    def finish(self, trace: Any) -> None:
        """At the end of a trace: every gradient left unreduced for an Accumulate went to
        that Accumulate's step, else it would be reduced nowhere (OptimizerError)."""
        for acc, p, summed in _TRACED.pop(trace, {}).values():
            if not summed:
                raise OptimizerError(
                    f"the gradient of Parameter '{p.name}' is left this rank's own under "
                    f"DataParallel, for the Accumulate that sums it ('{acc.opt.name}', "
                    f"steps={acc.steps}), but the step never called that Accumulate's step, "
                    f"so it is averaged over the ranks nowhere: step its optimizer through "
                    f"the Accumulate")

    def _rows_mean(self, param: Any, g: Rows) -> Rows:
        if self.zero:
            raise ArgumentError(f"DataParallel(zero={self.zero}): the gradient of "
                                f"'{param.name}' is a row gradient, and ZeRO shards the "
                                f"optimizer state in flat buckets that a row update cannot "
                                f"address; use zero=0, or make it dense (ops.embedding with "
                                f"sparse=False)")
        values = ops.all_gather(g.values, group=self.group) / float(self.ranks)
        return ops.rows(ops.all_gather(g.indices, group=self.group), values, g.shape)

    def reduce(self, g: Any, when: Any = None, every: int = 1) -> Any:
        """g averaged over the ranks (compressed if asked); with `when` (a rank-independent
        bool scalar), only on the runs where it is true, one in `every`, and g itself on the
        others (all_reduce_when)."""
        def collective(x: Any, reduce: str) -> Any:
            if when is None:
                return ops.all_reduce(x, reduce, group=self.group)
            return ops.all_reduce_when(x, when, every, reduce, group=self.group)
        if self.compress is None:
            return collective(g, "mean")
        # Divided before the cast: a sum of N halves can overflow where their mean does not.
        half = ops.cast(g / float(self.ranks), COMPRESSIONS[self.compress])
        return ops.cast(collective(half, "sum"), dtype_of(g))

    def agree(self, flag: Any) -> Any:
        """A bool scalar that is true on every rank when `flag` is true on every rank, else
        false on every rank: the all_reduce max of its negation (one byte)."""
        return ~ops.all_reduce(~flag, "max", group=self.group)

    def sharding(self, opt: Optimizer) -> Sharding | None:
        """The optimizer's shards on this rank (made on first use), None at zero=0."""
        self._optimizers.add(opt)
        if self.zero == 0:
            return None
        s = opt.sharding
        layout = (comm.group(self.group).rank, self.ranks, self.bucket_bytes, self.group)
        if s is None:
            s = opt.sharding = Sharding(opt, *layout)
        elif (s.rank, s.ranks, s.bucket_bytes, s.group) != layout:
            raise OptimizerError(f"{type(opt).__name__} '{opt.name}': its state is sharded "
                                 f"for {s.ranks} ranks with buckets of {s.bucket_bytes} bytes; "
                                 f"this step asks for {layout[1]} ranks and {layout[2]} bytes")
        return s

    def pipeline(self, passes: list[str]) -> list[str]:
        """The pass pipeline: the data-parallel passes first, then `passes`; at one rank,
        `one_rank` instead (its collectives are their operands: none is left to bucket)."""
        if self.ranks == 1:
            return ["one_rank"] + list(passes)
        return (["zero"] if self.zero else []) + ["bucket"] + list(passes)

    def pass_options(self) -> dict[str, Any]:
        """The settings of those passes."""
        return {"zero": self.zero, "bucket_bytes": self.bucket_bytes}

    def memory_report(self, graph: Any, params: Sequence[Any]) -> str:
        """What this rank holds for a compiled step, measured from its buffers: the
        parameters its optimizers update, the reduced gradients (the results of the
        gradient collectives, as the step holds them), and the optimizer state, next to
        what one process holds."""
        mine = {id(p) for p in params}
        opts = [o for o in self._optimizers if any(id(p) in mine for p in o.params)]
        weights = sum(p.numpy().nbytes for o in opts for p in o.params)
        state = sum(p.numpy().nbytes for o in opts for p in o.parameters() if p.numpy().ndim)
        whole = sum(o.sharding.whole_bytes() if o.sharding is not None else
                    sum(p.numpy().nbytes for p in o.parameters() if p.numpy().ndim)
                    for o in opts)
        grads = sum(n.outputs[0].type.nbytes for n in graph.nodes
                    if n.op in ("all_reduce", "all_reduce_when", "reduce_scatter"))
        c = comm.group(self.group)
        share = f" (1/{c.size} of {whole:,} B, + padding)" if self.zero and c.size > 1 else ""
        return (f"data parallel, rank {c.rank} of {c.size}, zero={self.zero}: this rank holds\n"
                f"  parameters       {weights:>12,} B\n"
                f"  gradients        {grads:>12,} B (reduced)\n"
                f"  optimizer state  {state:>12,} B{share}")

    def prepare(self, graph: Any, what: str) -> None:
        """Before the first run of a compiled step: every rank compiled the same one (a
        CollectiveError on every rank otherwise, naming the ranks and the difference)."""
        from .fingerprint import check_same
        check_same(graph, what, self.group)
