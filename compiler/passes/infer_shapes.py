"""Give every value a symbolic shape (arithmetic over the spec's dims, "N" tokens, "R" logit rows)."""

from __future__ import annotations

from dataclasses import replace

from ..ir import DimRef, Graph
from ..ops import OPS

INPUT_SHAPES = {"tokens": ("N",), "positions": ("N",), "logit_rows": ("R",)}


def infer_shapes(graph: Graph) -> Graph:
    constants = {c.name: constant_shape(c.name) for c in graph.layer_constants}
    carried = ("N", "d")
    all_shapes = {}
    for region in graph.regions:
        # the carried values (x, and the deferred residual add's operand: defer_residual_add) share one shape
        carried_inputs = {name: carried for name in region.inputs if name not in INPUT_SHAPES}
        shapes = {**INPUT_SHAPES, **carried_inputs, **constants}
        all_shapes[region.name] = shapes
        for node in region.nodes:
            attrs = {k: (v.name if isinstance(v, DimRef) else v) for k, v in node.attrs}
            weights = {param: graph.weight_shapes[name] for param, name in node.weights}
            out_shapes = OPS[node.op].shape([shapes[i] for i in node.inputs], attrs, weights)
            shapes.update(zip(node.outputs, out_shapes))
        if region.name != "epilogue":
            carried = shapes[region.outputs[0]]
    return replace(graph, shapes=all_shapes)


def constant_shape(name: str) -> tuple[str, ...]:
    return ("dh // 2",) if name.startswith("rope_inv_freq") else ()
