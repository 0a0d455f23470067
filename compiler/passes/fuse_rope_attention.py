"""Fuse the rotary embedding with the attention that reads it, for targets with a kernel that does both.

    q1, k1 = rope_apply(q, k, positions, inv_freq); a = attention(q1, k1, v, window, state)
    ==>  a = rope_attention(q, k, v, positions, inv_freq, window, state)

Only where q1 and k1 feed nothing else, and only when the target names a `rope_attention` kernel (the cpu
target and the deterministic variants keep the two ops: their plans stay as they were, bit for bit).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node


def fuse_rope_attention(graph: Graph) -> Graph:
    regions = []
    for region in graph.regions:
        nodes = list(region.nodes)
        uses = region.reads()
        ropes = {node.outputs: i for i, node in enumerate(nodes) if node.op == "rope_apply"}
        drop = set()
        for i, node in enumerate(nodes):
            if node.op != "attention":
                continue
            j = ropes.get(tuple(node.inputs[:2]))
            if j is None or any(uses[name] != 1 for name in nodes[j].outputs):
                continue
            rope = nodes[j]
            q, k, positions, inv_freq = rope.inputs
            v, window, state = node.inputs[2:]
            nodes[i] = Node(
                "rope_attention",
                (q, k, v, positions, inv_freq, window, state),
                node.outputs,
                node.weights,
                rope.attrs + node.attrs,
            )
            drop.add(j)
        regions.append(replace(region, nodes=tuple(n for i, n in enumerate(nodes) if i not in drop)))
    return replace(graph, regions=tuple(regions))
