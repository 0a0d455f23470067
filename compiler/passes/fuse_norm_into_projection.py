"""Tell a norm which projection alone reads it, for targets with kernels that then write that projection's
int8 activations in the norm's own launch (compiler/ops/norm_quant_gpu.py).

    h = rms_norm(x, w); y = linear(h, W)        ==>  h = rms_norm_to_proj(x, w, W); y = linear(h, W)
    s, h = add_rms_norm(x, r, w); y = linear(h, W)  ==>  s, h = add_rms_norm_to_proj(x, r, w, W); ...

(linear_split alike.) Only where h feeds that one projection, and only when the target names the `_to_proj`
kernels: the cpu target and the deterministic variants keep the plain norms (their plans stay as they were).
The projection's weight rides along as the norm's `reader` weight: at trace time its kernel sees whether
the GEMV takes int8 activations at that row count, and in which packing.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node

FUSED = {"rms_norm": ("rms_norm_to_proj", 0), "add_rms_norm": ("add_rms_norm_to_proj", 1)}  # op -> (op, output)
PROJECTIONS = ("linear", "linear_split")


def fuse_norm_into_projection(graph: Graph) -> Graph:
    regions = []
    for region in graph.regions:
        readers: dict[str, list[Node]] = {name: [region] for name in region.outputs}  # a region output: kept
        for node in region.nodes:
            for name in node.inputs:
                readers.setdefault(name, []).append(node)
        nodes = []
        for node in region.nodes:
            if node.op in FUSED:
                op, output = FUSED[node.op]
                only = readers.get(node.outputs[output], [])
                if (len(only) == 1 and isinstance(only[0], Node) and only[0].op in PROJECTIONS
                        and only[0].inputs[0] == node.outputs[output]):
                    node = Node(op, node.inputs, node.outputs, node.weights + (("reader", only[0].weight("weight")),),
                                node.attrs)
            nodes.append(node)
        regions.append(replace(region, nodes=tuple(nodes)))
    return replace(graph, regions=tuple(regions))
