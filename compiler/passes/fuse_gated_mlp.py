"""Hand an MLP's gate/up projection and its gated down projection to one op, for targets with a kernel for it.

    t = linear(h, W_gate_up); y = gated_linear(t, W_down, act)   ==>   y = gated_mlp(h, W_gate_up, W_down, act)

Only where `t` feeds nothing else and the linear has no bias, and only when the target names a `gated_mlp`
kernel. The op sees both weights at trace time, so it can pick by their kind (linear_quant.gated_mlp): FP8
weights make act(gate) * up in the gate/up GEMV's epilogue, where the down GEMV cannot make it cheaply (each
of its programs would recompute the activation of its whole input); every other weight runs the two ops it
replaced, unchanged. Runs after carry_split_k_partials, so the gated_linear's `partials` mark carries over.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node


def fuse_gated_mlp(graph: Graph) -> Graph:
    regions = []
    for region in graph.regions:
        nodes = list(region.nodes)
        uses = region.reads()
        producers = {node.outputs[0]: i for i, node in enumerate(nodes) if node.op == "linear"}
        drop = set()
        for i, node in enumerate(nodes):
            j = producers.get(node.inputs[0]) if node.op == "gated_linear" else None
            if j is None or uses[node.inputs[0]] != 1 or [p for p, _ in nodes[j].weights] != ["weight"]:
                continue
            gate_up = nodes[j]
            nodes[i] = Node("gated_mlp", gate_up.inputs, node.outputs,
                            (("gate_up", gate_up.weight("weight")), ("down", node.weight("weight"))), node.attrs)
            drop.add(j)
        regions.append(replace(region, nodes=tuple(n for i, n in enumerate(nodes) if i not in drop)))
    return replace(graph, regions=tuple(regions))
