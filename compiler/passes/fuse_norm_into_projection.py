"""Tell a producer which projection alone reads its output, for targets with kernels that then write that
projection's int8 activations in the producer's own launch (compiler/kernels/norm/quant_kernel.py for the norms,
attention/paged.py's combine for the decode attention).

    h = rms_norm(x, w); y = linear(h, W)        ==>  h = rms_norm_to_proj(x, w, W); y = linear(h, W)
    s, h = add_rms_norm(x, r, w); y = linear(h, W)  ==>  s, h = add_rms_norm_to_proj(x, r, w, W); ...
    a = rope_attention(q, k, v, ...); y = linear(a, W)  ==>  a = rope_attention_to_proj(q, k, v, ..., W); ...

(linear_split alike.) Only where the output feeds that one projection, and only for the `_to_proj` kernels
the target names: the cpu target and the deterministic variants keep the plain ops (their plans stay as they
were). The projection's weight rides along as the producer's `reader` weight: at trace time its kernel sees
whether the GEMV takes int8 activations at that row count, and in which packing.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node

# op -> (its _to_proj op, the output the projection reads)
FUSED = {
    "rms_norm": ("rms_norm_to_proj", 0),
    "add_rms_norm": ("add_rms_norm_to_proj", 1),
    "rope_attention": ("rope_attention_to_proj", 0),
}
PROJECTIONS = ("linear", "linear_split")


def fuse_norm_into_projection(
    graph: Graph, available: frozenset[str] = frozenset(op for op, _ in FUSED.values())
) -> Graph:
    """available: the `_to_proj` ops the target has kernels for (the others stay as they are)."""
    regions = []
    for region in graph.regions:
        readers: dict[str, list[Node]] = {name: [region] for name in region.outputs}  # a region output: kept
        for node in region.nodes:
            for name in node.inputs:
                readers.setdefault(name, []).append(node)
        nodes = []
        for node in region.nodes:
            if node.op in FUSED and FUSED[node.op][0] in available:
                op, output = FUSED[node.op]
                only = readers.get(node.outputs[output], [])
                if (
                    len(only) == 1
                    and isinstance(only[0], Node)
                    and only[0].op in PROJECTIONS
                    and only[0].inputs[0] == node.outputs[output]
                ):
                    node = Node(
                        op,
                        node.inputs,
                        node.outputs,
                        node.weights + (("reader", only[0].weight("weight")),),
                        node.attrs,
                    )
            nodes.append(node)
        regions.append(replace(region, nodes=tuple(nodes)))
    return replace(graph, regions=tuple(regions))
