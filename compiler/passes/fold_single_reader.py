"""What fusion passes share: fold a producer into the one op that reads its output.

    t = producer(...); y = reader(t, ...)   ==>   y = merge(producer, reader)

For every node of `reader_op` whose first input is the first output of a `producer_op` node, read by nothing
else (the region returning it counts as a read), `merge(producer, reader)` gives the node that replaces the
reader, or None to leave the pair alone; the producer is dropped. Regions are rewritten independently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..ir import Graph, Node


def fold_single_reader(
    graph: Graph, producer_op: str, reader_op: str, merge: Callable[[Node, Node], Node | None]
) -> Graph:
    regions = []
    for region in graph.regions:
        nodes = list(region.nodes)
        uses = region.reads()
        producers = {node.outputs[0]: i for i, node in enumerate(nodes) if node.op == producer_op}
        drop = set()
        for i, node in enumerate(nodes):
            j = producers.get(node.inputs[0]) if node.op == reader_op and node.inputs else None
            if j is None or uses[node.inputs[0]] != 1:
                continue
            merged = merge(nodes[j], node)
            if merged is not None:
                nodes[i] = merged
                drop.add(j)
        regions.append(replace(region, nodes=tuple(n for i, n in enumerate(nodes) if i not in drop)))
    return replace(graph, regions=tuple(regions))
