"""Let the down projection hand its split-K partial sums to the next layer's norm, which adds them itself.

After defer_residual_add a layer ends with the MLP's down projection, whose output is carried as `x_add`
into the next layer's first op, `add_rms_norm_to_proj(x, x_add, ...)`, and into the epilogue's `add`:

    layer:     ...; t = gated_linear(gate_up, W_down)            -> (x_1, t)
    next:      x_in, h = add_rms_norm_to_proj(x, x_add, w, W_qkv)

A decode GEMV split along `in` writes fp32 partials that XLA sums in a launch of its own before that norm.
Marking the gated_linear `partials=True` lets it return them unsummed (split_k.SplitKPartials): the norm
kernel sums them as it loads its operand (norm/quant_kernel.py), the epilogue's add sums them as XLA did.

Applies only where the carried output comes from a gated_linear (or the gated_mlp that fuse_gated_mlp makes of
one, if the pass runs again) read by nothing else in the layer, the next
layer reads it with add_rms_norm_to_proj and the epilogue with an add (every reader then accepts partials);
otherwise the graph is returned unchanged. The plan computes the same values: the partials are summed in
fp32 and rounded to the activation dtype once, as before.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Region
from .defer_residual_add import PENDING

EPILOGUE_READERS = ("add", "add_rms_norm", "add_rms_norm_to_proj")
PRODUCERS = ("gated_linear", "gated_mlp")  # gated_mlp (fuse_gated_mlp, later) hands the mark to its down GEMV


def carry_split_k_partials(graph: Graph) -> Graph:
    """Every layer body is marked, or none (each layer's carried value is read by the next, of any body)."""
    epilogue = graph.region("epilogue")
    epilogue_readers = [n for n in epilogue.nodes if PENDING in n.inputs]
    if (
        len(epilogue_readers) != 1
        or epilogue_readers[0].op not in EPILOGUE_READERS
        or epilogue_readers[0].inputs[1] != PENDING
    ):
        return graph
    marked = [_marked(layer) for layer in graph.layer_regions()]
    if not marked or any(m is None for m in marked):
        return graph
    for layer in marked:
        graph = graph.with_region(layer)
    return graph


def _marked(layer: Region) -> Region | None:
    if PENDING not in layer.inputs or len(layer.outputs) != 2:
        return None
    carried = layer.outputs[1]  # the layer returns (x, x_add): forward hands them on in that order
    producer = next((i for i, n in enumerate(layer.nodes) if carried in n.outputs), None)
    if producer is None or layer.nodes[producer].op not in PRODUCERS or any(carried in n.inputs for n in layer.nodes):
        return None
    layer_readers = [n for n in layer.nodes if PENDING in n.inputs]
    if [n.op for n in layer_readers] != ["add_rms_norm_to_proj"] or layer_readers[0].inputs[1] != PENDING:
        return None
    nodes = list(layer.nodes)
    nodes[producer] = nodes[producer].with_attrs(partials=True)
    return replace(layer, nodes=tuple(nodes))
