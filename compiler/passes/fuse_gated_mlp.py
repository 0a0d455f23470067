"""Hand an MLP's gate/up projection and its gated down projection to one op, for targets with a kernel for it.

    t = linear(h, W_gate_up); y = gated_linear(t, W_down, act)   ==>   y = gated_mlp(h, W_gate_up, W_down, act)

Only where `t` feeds nothing else and the linear has no bias, and only when the target names a `gated_mlp`
kernel. The op sees both weights at trace time, so it can pick by their kind (linear_quant.gated_mlp): FP8
weights make act(gate) * up in the gate/up GEMV's epilogue, where the down GEMV cannot make it cheaply (each
of its programs would recompute the activation of its whole input); every other weight runs the two ops it
replaced, unchanged. Runs after carry_split_k_partials, so the gated_linear's `partials` mark carries over.
"""

from __future__ import annotations

from ..ir import Graph, Node
from .fold_single_reader import fold_single_reader


def fuse_gated_mlp(graph: Graph) -> Graph:
    return fold_single_reader(graph, "linear", "gated_linear", _merge)


def _merge(gate_up: Node, gated: Node) -> Node | None:
    if [p for p, _ in gate_up.weights] != ["weight"]:  # a biased gate/up projection keeps its own op
        return None
    return Node(
        "gated_mlp",
        gate_up.inputs,
        gated.outputs,
        (("gate_up", gate_up.weight("weight")), ("down", gated.weight("weight"))),
        gated.attrs,
    )
