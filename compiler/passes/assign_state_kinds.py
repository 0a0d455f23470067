"""Give every layer kind the state kind its attention reads and writes: one paged KV kind per distinct
attention window.

Layers whose attention sees every earlier token share the kind "kv"; layers with a sliding window of W
tokens share "kv_<W's dimension>" (e.g. "kv_window"). Each kind gets its own block pool and block table
per request at run time, so a sliding kind can hand back blocks that fell out of its window while the
full kind keeps them. Which layer is which kind is the checkpoint's business (`layer_types`), so the
graph records the choice per layer kind (`Graph.layer_state`) and the attention node gets a `state`
attribute: a PerKind literal, the kind's index, which hoist_layer_constants turns into a per-layer
constant (the plan picks that kind's slots and block tables with it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..ir import DimRef, Graph, KindRef, PerKind, StateKindDecl
from ..ops import OPS

FULL = "kv"
NO_KINDS = "default"  # the one layer kind of a spec without [layer_kinds] (as the runtime names it)


def assign_state_kinds(graph: Graph) -> Graph:
    layer = graph.region("layer")
    stateful = [i for i, node in enumerate(layer.nodes) if OPS[node.op].stateful]
    if not stateful:
        return graph
    if len(stateful) > 1:
        raise ValueError(
            f"{graph.arch}: a layer body may hold one stateful op (it gets one KV pool per layer), "
            f"found {len(stateful)}"
        )
    node = layer.nodes[stateful[0]]
    kinds = graph.layer_kinds or {NO_KINDS: {}}
    windows = {kind: _window_of(node.attr("window", 0), kinds[kind]) for kind in sorted(kinds)}
    decls: dict[str, StateKindDecl] = {}
    for window in windows.values():
        decls.setdefault(_state_name(window), StateKindDecl(_state_name(window), window))
    ordered = sorted(decls.values(), key=lambda d: (d.name != FULL, d.name))  # full attention first
    index = {decl.name: i for i, decl in enumerate(ordered)}
    layer_state = tuple((kind, _state_name(window)) for kind, window in windows.items())
    node = node.with_attrs(state=PerKind(tuple((kind, index[name]) for kind, name in layer_state)))
    nodes = layer.nodes[: stateful[0]] + (node,) + layer.nodes[stateful[0] + 1 :]
    graph = graph.with_region(replace(layer, nodes=nodes))
    return replace(graph, state_kinds=tuple(ordered), layer_state=layer_state)


def _window_of(window: Any, fields: dict[str, Any]) -> Any:
    """A window attribute as seen by one layer kind: 0 (unlimited), DimRef or int."""
    if isinstance(window, KindRef):
        window = fields[window.field]
        window = DimRef(window) if isinstance(window, str) else window
    return window or 0


def _state_name(window: Any) -> str:
    if isinstance(window, DimRef):
        return f"kv_{window.name}"
    if isinstance(window, int) and window > 0:
        return f"kv_window{window}"
    if window == 0:
        return FULL
    raise ValueError(f"attention window must be a dimension or an integer, got {window!r}")
