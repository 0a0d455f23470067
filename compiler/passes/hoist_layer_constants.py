"""Turn per-layer parameters into arrays computed once at load, so one layer body serves every layer.

rope(q, k, positions, theta, scaling, divisors) becomes rope_apply(q, k, positions, inv_freq) with
inv_freq a layer constant [layers, dh/2]; attention's window and state kind index (see
assign_state_kinds) become layer constants [layers]. This
is what lets the layer loop be a single scanned body even when layers differ (sliding vs global).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Expr, Graph, LayerConstant, Node, Region
from ..ops import OPS


def hoist_layer_constants(graph: Graph) -> Graph:
    constants = list(graph.layer_constants)
    for layer in graph.layer_regions():
        graph = graph.with_region(_hoist(graph, layer, constants))
    return replace(graph, layer_constants=tuple(constants))


def _hoist(graph: Graph, layer: Region, constants: list[LayerConstant]) -> Region:
    """Rewrite one layer body's nodes, appending the constants they read to `constants`."""
    nodes, inputs = [], list(layer.inputs)
    body = layer.body
    for node in layer.nodes:
        if node.op == "rope":
            name = f"rope_inv_freq{len(constants)}"
            head_dim = graph.shapes[layer.name][node.inputs[0]][-1]
            rotary = node.attr("rotary_dim")
            divisors = node.weight("freq_divisors")
            constants.append(
                LayerConstant(
                    name,
                    "ember.compiler.kernels.rope.reference:inv_frequencies",
                    (
                        ("theta", node.attr("theta")),
                        ("head_dim", Expr(head_dim) if rotary is None else rotary),
                        ("scaling", node.attr("scaling")),
                        ("divisors", ("weight", divisors) if divisors else None),
                    ),
                    body,
                )
            )
            inputs.append(name)
            node = Node("rope_apply", (*node.inputs, name), node.outputs, (), (("style", node.attr("style")),))
        elif node.op == "attention":
            window = f"attn_window{len(constants)}"
            constants.append(
                LayerConstant(
                    window,
                    "ember.compiler.kernels.attention.reference:window_size",
                    (("window", node.attr("window")),),
                    body,
                )
            )
            state = _state_index(f"attn_state{len(constants)}", node, body, constants)
            inputs += [window, state]
            node = Node(
                "attention",
                (*node.inputs, window, state),
                node.outputs,
                node.weights,
                tuple((k, v) for k, v in node.attrs if k not in ("window", "state")),
            )
        elif OPS[node.op].slot_state is not None:  # the slot kind's index: which row of the step's slots
            state = _state_index(f"slot_state{len(constants)}", node, body, constants)
            inputs.append(state)
            node = Node(
                node.op,
                (*node.inputs, state),
                node.outputs,
                node.weights,
                tuple((k, v) for k, v in node.attrs if k != "state"),
            )
        nodes.append(node)
    return replace(layer, nodes=tuple(nodes), inputs=tuple(inputs))


def _state_index(name: str, node: Node, body, constants: list[LayerConstant]) -> str:
    """Append the layer constant `name`: the index of the state kind `node` reads (per layer); return the name."""
    index = (("index", node.attr("state", 0)),)
    constants.append(LayerConstant(name, "ember.compiler.kernels.attention.reference:state_index", index, body))
    return name
