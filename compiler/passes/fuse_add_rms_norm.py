"""Fuse a residual add with the RMSNorm that reads its sum: one pass over the activations.

s = add(x, y); h = rms_norm(s, w)   ==>   s, h = add_rms_norm(x, y, w)
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node


def fuse_add_rms_norm(graph: Graph) -> Graph:
    regions = []
    for region in graph.regions:
        nodes = list(region.nodes)
        adds = {n.outputs[0]: i for i, n in enumerate(nodes) if n.op == "add"}
        drop = set()
        for i, node in enumerate(nodes):
            if node.op == "rms_norm" and node.inputs[0] in adds and adds[node.inputs[0]] not in drop:
                j = adds[node.inputs[0]]
                add = nodes[j]
                nodes[i] = Node("add_rms_norm", add.inputs, (add.outputs[0], node.outputs[0]), node.weights, node.attrs)
                drop.add(j)
        regions.append(replace(region, nodes=tuple(n for i, n in enumerate(nodes) if i not in drop)))
    return replace(graph, regions=tuple(regions))
