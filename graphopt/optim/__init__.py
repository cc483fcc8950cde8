"""Optimizers (torch.optim's names, arguments and formulas), parameter groups, lr schedules
in the graph, gradient transforms and gradient accumulation. See docs/optim.md."""
from . import schedules
from .accumulate import Accumulate
from .adam import Adam, Adamax, AdamW, NAdam
from .adaptive import Adagrad, RMSprop
from .ftrl import FTRL
from .groups import ParamGroup, decay_groups
from .lamb import LAMB
from .lion import Lion
from .optimizer import Optimizer
from .sgd import SGD
from .sparse_adam import LazyAdam, SparseAdam
from .transforms import centralize_gradients, clip_grad_norm, clip_grad_value, global_norm

__all__ = ["Optimizer", "ParamGroup", "decay_groups", "schedules", "SGD", "Adagrad",
           "RMSprop", "Adam", "AdamW", "NAdam", "Adamax", "LAMB", "Lion", "SparseAdam", "LazyAdam",
           "FTRL", "Accumulate",
           "clip_grad_norm", "clip_grad_value", "centralize_gradients", "global_norm"]
