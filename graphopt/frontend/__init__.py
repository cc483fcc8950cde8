"""The frontend: Parameters, tensors, the tracer and eager mode: what a step function is
written with (graphopt.ops is its op library)."""
from .parameter import Parameter
from .rows import Rows
from .tensor import EagerTensor, Tensor, TracedTensor
from .bind import assign, depend
from .tracer import trace

__all__ = ["Parameter", "Tensor", "TracedTensor", "EagerTensor", "Rows", "trace", "assign",
           "depend"]
