"""Turn per-layer parameters into arrays computed once at load, so one layer body serves every layer.

rope(q, k, positions, theta, scaling, divisors) becomes rope_apply(q, k, positions, inv_freq) with
inv_freq a layer constant [layers, dh/2]; attention's window and state kind index (see
assign_state_kinds) become layer constants [layers]. This
is what lets the layer loop be a single scanned body even when layers differ (sliding vs global).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Expr, Graph, LayerConstant, Node


def hoist_layer_constants(graph: Graph) -> Graph:
    layer = graph.region("layer")
    constants = list(graph.layer_constants)
    nodes, inputs = [], list(layer.inputs)
    for node in layer.nodes:
        if node.op == "rope":
            name = f"rope_inv_freq{len(constants)}"
            head_dim = graph.shapes["layer"][node.inputs[0]][-1]
            divisors = node.weight("freq_divisors")
            constants.append(
                LayerConstant(
                    name,
                    "ember.compiler.kernels.rope.reference:inv_frequencies",
                    (
                        ("theta", node.attr("theta")),
                        ("head_dim", Expr(head_dim)),
                        ("scaling", node.attr("scaling")),
                        ("divisors", ("weight", divisors) if divisors else None),
                    ),
                )
            )
            inputs.append(name)
            node = Node("rope_apply", (*node.inputs, name), node.outputs, (), (("style", node.attr("style")),))
        elif node.op == "attention":
            window = f"attn_window{len(constants)}"
            constants.append(
                LayerConstant(
                    window, "ember.compiler.kernels.attention.reference:window_size", (("window", node.attr("window")),)
                )
            )
            state = f"attn_state{len(constants)}"
            constants.append(
                LayerConstant(
                    state, "ember.compiler.kernels.attention.reference:state_index", (("index", node.attr("state", 0)),)
                )
            )
            inputs += [window, state]
            node = Node(
                "attention",
                (*node.inputs, window, state),
                node.outputs,
                node.weights,
                tuple((k, v) for k, v in node.attrs if k not in ("window", "state")),
            )
        nodes.append(node)
    layer = replace(layer, nodes=tuple(nodes), inputs=tuple(inputs))
    return replace(graph.with_region(layer), layer_constants=tuple(constants))
