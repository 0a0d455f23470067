"""Give every layer kind the state kind its stateful op reads and writes, declared by that op.

Paged KV (attention): one kind per distinct attention window. Layers whose attention sees every earlier token
share "kv"; layers with a sliding window of W tokens share "kv_<W's dimension>" (e.g. "kv_window"). Each kind
gets its own block pool and block table per request at run time, so a sliding kind can hand back blocks that
fell out of its window while the full kind keeps them.

Slot state (ops whose OpDef has `slot_state`, e.g. a recurrent linear attention): fixed-size arrays per request,
one slot per request in a pool of slots, named and shaped by the op (`Graph.state_kinds`, listed in the
manifest with shapes and dtypes).

Which layer is which kind is the checkpoint's business (`layer_types`, ...), so the graph records the choice
per layer kind (`Graph.layer_state`: a scalar kind of [layer_kinds], or a body of [layer_axes]) and the op gets
a `state` attribute: a PerKind literal, the kind's index among kinds of its layout, which
hoist_layer_constants turns into a per-layer constant (the plan picks that kind's slots and tables with it).
A layer body holds at most one stateful op; a body without one keeps no state.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..ir import DimRef, Graph, KindRef, PerKind, StateKindDecl
from ..ops import OPS

FULL = "kv"
NO_KINDS = "default"  # the one layer kind of a spec without [layer_kinds] (as the runtime names it)


def assign_state_kinds(graph: Graph) -> Graph:
    found = []  # (region, node index, {layer kind: StateKindDecl})
    for region in graph.layer_regions():
        stateful = [i for i, node in enumerate(region.nodes) if OPS[node.op].stateful]
        if not stateful:
            continue
        if len(stateful) > 1:
            raise ValueError(
                f"{graph.arch}: a layer body may hold one stateful op (it gets one state per layer), "
                f"found {len(stateful)} in {region.name}"
            )
        node = region.nodes[stateful[0]]
        if region.name == "layer":
            kinds = graph.layer_kinds or {NO_KINDS: {}}
        else:
            kinds = {region.body: {}}
        slot = OPS[node.op].slot_state
        if slot is not None:
            name, arrays = slot(dict(node.attrs), graph.shapes.get(region.name, {}), node)
            decls = {kind: StateKindDecl(name, layout="slot", arrays=arrays) for kind in sorted(kinds)}
        else:
            decls = {}
            for kind in sorted(kinds):
                window = _window_of(node.attr("window", 0), kinds[kind])
                decls[kind] = StateKindDecl(_state_name(window), window)
        found.append((region, stateful[0], decls))
    if not found:
        return graph
    unique: dict[str, StateKindDecl] = {}
    for _, _, decls in found:
        for decl in decls.values():
            if unique.setdefault(decl.name, decl) != decl:
                raise ValueError(f"{graph.arch}: state kind {decl.name!r} is declared with two different shapes")
    ordered = sorted(unique.values(), key=lambda d: (d.layout != "paged", d.name != FULL, d.name))
    index = {}
    for layout in ("paged", "slot"):
        for i, decl in enumerate(d for d in ordered if d.layout == layout):
            index[decl.name] = i
    layer_state = []
    for region, at, decls in found:
        per_kind = tuple((kind, index[decl.name]) for kind, decl in decls.items())
        layer_state += [(kind, decl.name) for kind, decl in decls.items()]
        nodes = list(region.nodes)
        nodes[at] = nodes[at].with_attrs(state=PerKind(per_kind))
        graph = graph.with_region(replace(region, nodes=tuple(nodes)))
    return replace(graph, state_kinds=tuple(ordered), layer_state=tuple(layer_state))


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
