"""Pack projections that read the same input into one matmul (q/k/v, gate/up).

Linears sharing an input (and all biased or all unbiased) become one `linear_split` over a weight the
loader concatenates along its rows; a `gated_act` fed by a packed gate/up pair reads the packed
output directly (`gated_act_packed`), so the split costs nothing.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Expr, Graph, Node, PackedWeight


def pack_parallel_linears(graph: Graph) -> Graph:
    packed = list(graph.packed_weights)
    graph = replace(graph, weight_shapes=dict(graph.weight_shapes))
    regions = []
    for region in graph.regions:
        groups: dict[tuple, list[Node]] = {}
        for node in region.nodes:
            if node.op == "linear" and all(w in graph.layer_weights for _, w in node.weights):
                key = (node.inputs[0], tuple(p for p, _ in node.weights))
                groups.setdefault(key, []).append(node)
        replaced: dict[int, Node | None] = {}
        for group in groups.values():
            if len(group) < 2:
                continue
            fused = _fuse(group, packed, graph)
            for i, node in enumerate(group):
                replaced[id(node)] = fused if i == 0 else None
        nodes = []
        for node in region.nodes:
            new = replaced.get(id(node), node)
            if new is not None:
                nodes.append(new)
        regions.append(replace(region, nodes=tuple(_pack_gated(nodes))))
    return replace(graph, regions=tuple(regions), packed_weights=tuple(packed))


def _fuse(group: list[Node], packed: list[PackedWeight], graph: Graph) -> Node:
    weights = []
    for param in (p for p, _ in group[0].weights):
        parts = tuple(n.weight(param) for n in group)
        stem = "+".join(p.rsplit(".", 1)[0] for p in parts)
        name = f"{stem}.{parts[0].rsplit('.', 1)[1]}"
        packed.append(PackedWeight(name, parts))
        graph.weight_shapes[name] = (
            " + ".join(f"({graph.weight_shapes[p][0]})" for p in parts),
            *graph.weight_shapes[parts[0]][1:],
        )
        weights.append((param, name))
    sizes = tuple(Expr(graph.weight_shapes[n.weight("weight")][0]) for n in group)
    outputs = tuple(n.outputs[0] for n in group)
    return Node("linear_split", group[0].inputs, outputs, tuple(weights), (("sizes", sizes),))


def _pack_gated(nodes: list[Node]) -> list[Node]:
    producers = {node.outputs: node for node in nodes if node.op == "linear_split" and len(node.outputs) == 2}
    out = []
    for node in nodes:
        if node.op == "gated_act" and node.inputs in producers:
            split = producers.pop(node.inputs)
            joined = "_".join(node.inputs)
            out[out.index(split)] = Node("linear", split.inputs, (joined,), split.weights, ())
            node = Node("gated_act_packed", (joined,), node.outputs, (), node.attrs)
        out.append(node)
    return out
