"""Carry a layer's last residual add into the next layer's first norm, whose kernel then does it.

A pre-norm block ends with the residual add and the next block begins with a norm of its sum:

    layer i:   ... ; x_2 = add(x_1, t)                 (on the H200 fused by XLA into t's split-K sum)
    layer i+1: h = rms_norm(x, w); ...; uses of x

The add cannot meet that norm inside one region (fuse_add_rms_norm), so the layer hands both operands on:

    layer:     (x, x_add) -> ... -> (x_1, t)
               x_in, h = add_rms_norm(x, x_add, w); ... uses of x_in
    epilogue:  x_in = add(x, x_add); ... uses of x_in

The plan's forward starts with x_add = None (the prologue's output is already the residual stream):
add_rms_norm(x, None, w) is rms_norm(x, w) with x passed through, and add(x, None) is x. Every op rounds
as before (the sum in the activation dtype, then the norm of it), so plans compute the same values.

Applies only where the layer's output is an add read by nothing else and the layer's first reader of its
input is an rms_norm of it; otherwise the graph is returned unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node, Region

PENDING = "x_add"  # the carried second operand of the residual add
SUM = "x_in"  # the completed residual stream inside the region


def defer_residual_add(graph: Graph) -> Graph:
    """Every layer body is rewritten, or none (the bodies hand the same carried values on)."""
    epilogue = graph.region("epilogue")
    if "x" not in epilogue.inputs or PENDING in epilogue.inputs or any(SUM in n.outputs for n in epilogue.nodes):
        return graph
    rewritten = [_deferred(layer) for layer in graph.layer_regions()]
    if not rewritten or any(r is None for r in rewritten):
        return graph
    epilogue = replace(
        epilogue,
        inputs=epilogue.inputs + (PENDING,),
        nodes=(Node("add", ("x", PENDING), (SUM,)), *(_renamed(n, "x", SUM) for n in epilogue.nodes)),
    )
    for layer in rewritten:
        graph = graph.with_region(layer)
    return graph.with_region(epilogue)


def _deferred(layer: Region) -> Region | None:
    if PENDING in layer.inputs or "x" not in layer.inputs or any(SUM in n.outputs for n in layer.nodes):
        return None
    last_add = _last_add(layer)
    first = next((i for i, n in enumerate(layer.nodes) if "x" in n.inputs), None)
    if last_add is None or first is None:
        return None
    norm = layer.nodes[first]
    if norm.op != "rms_norm" or norm.inputs != ("x",):
        return None
    add = layer.nodes[last_add]
    nodes = [_renamed(n, "x", SUM) for n in layer.nodes]
    nodes[first] = Node("add_rms_norm", ("x", PENDING), (SUM, norm.outputs[0]), norm.weights, norm.attrs)
    del nodes[last_add]
    return replace(layer, inputs=layer.inputs + (PENDING,), nodes=tuple(nodes), outputs=add.inputs)


def _last_add(layer: Region) -> int | None:
    """Index of the add producing the layer's one output, when nothing else reads that output."""
    if len(layer.outputs) != 1:
        return None
    out = layer.outputs[0]
    index = next((i for i, n in enumerate(layer.nodes) if out in n.outputs), None)
    if index is None or layer.nodes[index].op != "add" or any(out in n.inputs for n in layer.nodes):
        return None
    return index


def _renamed(node: Node, old: str, new: str) -> Node:
    return replace(node, inputs=tuple(new if name == old else name for name in node.inputs))
