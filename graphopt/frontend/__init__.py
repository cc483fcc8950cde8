"""The frontend: Parameters, tensors, the tracer, jit and eager mode."""
from .jit import CacheInfo, JittedFunction, jit
from .parameter import Parameter
from .tensor import EagerTensor, Tensor, TracedTensor
from .tracer import assign, depend, trace

__all__ = ["Parameter", "Tensor", "TracedTensor", "EagerTensor", "trace", "jit", "assign",
           "depend", "JittedFunction", "CacheInfo"]
