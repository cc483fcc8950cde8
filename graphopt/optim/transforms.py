"""Gradient transforms: global-norm clipping, value clipping, gradient centralization.

Each takes the gradients as a list (or a dict by name) and returns new ones in the same
structure; nothing is changed in place, so they compose inside a traced step. A row gradient
(`graphopt.Rows`) is coalesced first and transformed as its rows' values, so its norm is
the dense gradient's (duplicates summed) and its untouched rows stay untouched:

    grads, norm = clip_grad_norm(grads, max_norm=1.0)
    opt.step(centralize_gradients(grads))
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from .. import ops
from ..errors import OptimizerError
from ..frontend.rows import Rows
from ..frontend.tensor import Tensor
from ..ir.types import f32
from .optimizer import as_dtype, dtype_of

Grads = Sequence[Any] | Mapping[str, Any]


def _map(grads: Grads, fn: Callable[[Any], Any]) -> Any:
    def each(g: Any) -> Any:
        if isinstance(g, Rows):
            c = g.coalesce()
            return ops.with_values(c, fn(c.values))
        return fn(_tensor(g))
    if isinstance(grads, Mapping):
        return {k: each(g) for k, g in grads.items()}
    return [each(g) for g in grads]


def _leaves(grads: Grads) -> list[Tensor]:
    """The gradients as tensors: a row gradient's coalesced values."""
    gs = list(grads.values()) if isinstance(grads, Mapping) else list(grads)
    return [g.coalesce().values if isinstance(g, Rows) else _tensor(g) for g in gs]


def _norm_dtype(g: Tensor) -> Any:
    # Norms of f16/bf16 gradients are taken in f32: a sum of squares overflows f16 at 65504.
    return f32 if g.dtype.itemsize < 4 else g.dtype


def global_norm(grads: Grads, norm_type: float = 2.0) -> Tensor:
    """The norm of all gradients together, as if concatenated: torch's clip_grad_norm_
    computes each tensor's norm, then the norm of those norms (`inf`: the largest |g|)."""
    leaves = [as_dtype(g, _norm_dtype(g)) for g in _leaves(grads)]
    if not leaves:
        raise OptimizerError("global_norm: no gradients")
    if math.isinf(norm_type):
        norms = [ops.max(ops.abs(g)) for g in leaves]
        total = norms[0]
        for n in norms[1:]:
            total = ops.maximum(total, n.astype(total.dtype))
        return total
    p = float(norm_type)
    if p <= 0:
        raise OptimizerError(f"global_norm: norm_type must be > 0, got {norm_type}")
    norms = [ops.sum(ops.abs(g) ** p) ** (1 / p) for g in leaves]
    total = sum((n.astype(norms[0].dtype) ** p for n in norms[1:]), norms[0] ** p)
    return total ** (1 / p)


def clip_grad_norm(grads: Grads, max_norm: Any, norm_type: float = 2.0,
                   eps: float = 1e-6) -> tuple[Any, Tensor]:
    """Scale all gradients by min(1, max_norm / (total_norm + eps)); return (the scaled
    gradients, total_norm). torch.nn.utils.clip_grad_norm_'s formula (which always
    multiplies, by 1 when the norm is small), without changing anything in place.

    A non-finite norm makes every gradient non-finite, as in torch; under loss scaling
    that step is then skipped (see graphopt.amp)."""
    total = global_norm(grads, norm_type)
    coef = ops.minimum(max_norm / (total + eps), 1.0)
    return _map(grads, lambda g: g * as_dtype(coef, dtype_of(g))), total


def clip_grad_value(grads: Grads, clip_value: float) -> Any:
    """Clamp every gradient element to [-clip_value, clip_value]
    (torch.nn.utils.clip_grad_value_)."""
    if not clip_value >= 0:
        raise OptimizerError(f"clip_grad_value: clip_value must be >= 0, got {clip_value}")
    v = float(clip_value)
    return _map(grads, lambda g: ops.minimum(ops.maximum(g, -v), v))


def centralize_gradients(grads: Grads) -> Any:
    """Gradient centralization (Yong et al. 2020; MindSpore's grad_centralization): for a
    gradient of rank > 1, subtract its mean over every axis but the first (per output
    channel); gradients of rank 0 or 1 pass unchanged."""
    def centralize(g: Tensor) -> Tensor:  # a row gradient's values: per row, as dense
        if g.ndim <= 1:
            return g
        return g - ops.mean(g, axis=tuple(range(1, g.ndim)), keepdims=True)
    return _map(grads, centralize)


def _tensor(g: Any) -> Tensor:
    """A numpy gradient (eager mode) as a graphopt tensor, so `.dtype` and ops work on it."""
    return g if isinstance(g, Tensor) else ops.depend(g)
