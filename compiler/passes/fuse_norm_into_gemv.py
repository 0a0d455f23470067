"""Hand a residual add + RMSNorm to the one projection reading its normed row, for targets whose GEMV can
make the norm in its prologue (compiler/ops/norm_gemv.py; FP8 weights: quant/fp8_norm_gemv.py).

    s, h = add_rms_norm_to_proj(x, y, w, W); q, k, v = linear_split(h, W)
        ==>  s, q, k, v = add_rms_norm_linear_split(x, y, w, W)
    s, h = add_rms_norm_to_proj(x, y, w, W_gu); o = gated_mlp(h, W_gu, W_down)
        ==>  s, o = add_rms_norm_gated_mlp(x, y, w, W_gu, W_down)

Only where h feeds that projection alone (as its input; the region returning h counts as a read), and only
for the fused ops the target names. The fused node takes the norm's place, so every later reader of the sum s
still finds it first; the projection read nothing but h. At trace time the op picks: the fused kernel where
the weight and the row fit it, else the two ops it replaced, unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node

FUSED = {"linear_split": "add_rms_norm_linear_split", "gated_mlp": "add_rms_norm_gated_mlp"}
NORM = "add_rms_norm_to_proj"


def fuse_norm_into_gemv(graph: Graph, available: frozenset[str] = frozenset(FUSED.values())) -> Graph:
    regions = []
    for region in graph.regions:
        nodes = list(region.nodes)
        uses = region.reads()
        norms = {node.outputs[1]: i for i, node in enumerate(nodes) if node.op == NORM}
        drop = set()
        for i, node in enumerate(nodes):
            op = FUSED.get(node.op)
            j = norms.get(node.inputs[0]) if op in available and node.inputs else None
            if j is None or uses[node.inputs[0]] != 1:
                continue
            norm = nodes[j]
            weights = tuple(("proj" if param == "weight" else param, name) for param, name in node.weights)
            nodes[j] = Node(op, norm.inputs, (norm.outputs[0], *node.outputs),
                            (("weight", norm.weight("weight")),) + weights, norm.attrs + node.attrs)
            drop.add(i)
        regions.append(replace(region, nodes=tuple(n for i, n in enumerate(nodes) if i not in drop)))
    return replace(graph, regions=tuple(regions))
