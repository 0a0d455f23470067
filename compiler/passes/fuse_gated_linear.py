"""Fuse a gated activation into the projection that reads it, for targets with a kernel that does both.

    a = gated_act_packed(gate_up, act); y = linear(a, w)   ==>   y = gated_linear(gate_up, w, act)

Only where `a` feeds nothing else and the linear has no bias, and only when the target names a
`gated_linear` kernel: there the decode GEMV on int8 activations makes act(gate) * up inside its activation
quantizer (compiler/ops/linear_quant.py), one kernel less per layer. The cpu target and the deterministic
variants keep the two ops (their plans stay as they were, bit for bit).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node


def fuse_gated_linear(graph: Graph) -> Graph:
    regions = []
    for region in graph.regions:
        nodes = list(region.nodes)
        uses = region.reads()
        gated = {node.outputs[0]: i for i, node in enumerate(nodes) if node.op == "gated_act_packed"}
        drop = set()
        for i, node in enumerate(nodes):
            j = gated.get(node.inputs[0]) if node.op == "linear" and node.inputs else None
            if j is None or uses[node.inputs[0]] != 1 or [p for p, _ in node.weights] != ["weight"]:
                continue
            act = nodes[j]
            nodes[i] = Node("gated_linear", act.inputs, node.outputs, node.weights, act.attrs)
            drop.add(j)
        regions.append(replace(region, nodes=tuple(n for i, n in enumerate(nodes) if i not in drop)))
    return replace(graph, regions=tuple(regions))
