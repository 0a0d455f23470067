"""Choose the implementation of every node for the graph's target."""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph
from ..targets import Target


def select_kernels(graph: Graph, target: Target) -> Graph:
    regions = []
    for region in graph.regions:
        nodes = tuple(replace(node, kernel=target.kernel_for(node, graph)) for node in region.nodes)
        regions.append(replace(region, nodes=nodes))
    return replace(graph, regions=tuple(regions), target=target.name)
