"""Fuse a gated activation into the projection that reads it, for targets with a kernel that does both.

    a = gated_act_packed(gate_up, act); y = linear(a, w)   ==>   y = gated_linear(gate_up, w, act)

Only where `a` feeds nothing else and the linear has no bias, and only when the target names a
`gated_linear` kernel: there the decode GEMV on int8 activations makes act(gate) * up inside its activation
quantizer (compiler/kernels/gguf_gemv/linear.py), one kernel less per layer. The cpu target and the deterministic
variants keep the two ops (their plans stay as they were, bit for bit).
"""

from __future__ import annotations

from ..ir import Graph, Node
from .fold_single_reader import fold_single_reader


def fuse_gated_linear(graph: Graph) -> Graph:
    return fold_single_reader(graph, "gated_act_packed", "linear", _merge)


def _merge(act: Node, linear: Node) -> Node | None:
    if [p for p, _ in linear.weights] != ["weight"]:  # a biased projection keeps its own op
        return None
    return Node("gated_linear", act.inputs, linear.outputs, linear.weights, act.attrs)
