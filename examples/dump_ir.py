"""Trace a small step, then look at it every way graphopt can show it.

Run: python examples/dump_ir.py [OUT_DIR]
Writes step.txt, step.dot (and step.svg when graphviz's `dot` program is installed), parses the
text back, and lists the networkx view's nodes.
"""
import shutil
import sys
from pathlib import Path

import numpy as np

import graphopt as go
from graphopt import ops

out = Path(sys.argv[1] if len(sys.argv) > 1 else "graphopt_dump_out")
out.mkdir(parents=True, exist_ok=True)

w = go.Parameter(np.ones((2, 3), np.float32), name="w")
scale = go.Parameter(np.float32(1.0), name="loss_scale")


def step(grad):
    g = grad / scale
    finite = ops.isfinite(g).astype(go.f32).sum() == g.size  # every element finite?
    go.assign(w, ops.where(finite, w - 0.01 * g, w))  # skip the update on overflow
    go.assign(scale, ops.where(finite, scale, scale * 0.5))
    return finite


graph = go.trace(step, np.ones((2, 3), np.float32))
text = graph.format(locs=True)
print(text)

again = go.parse(text)  # the text form parses back to the same graph
assert again.format(locs=True) == text
again.verify()

for ext in ("txt", "dot") + (("svg",) if shutil.which("dot") else ()):
    print("wrote", go.dump(graph, out / f"step.{ext}"))

nx_graph = graph.to_networkx()
print("networkx:", nx_graph.number_of_nodes(), "nodes,", nx_graph.number_of_edges(), "edges")
print("ops:", sorted({d["op"] for _, d in nx_graph.nodes(data=True)}))
