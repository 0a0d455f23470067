"""The graph IR: SSA values in regions: the prologue, one region per layer body (a spec without [layer_axes]
has one, "layer", applied `layers` times; with axes, "layer:<body>" per combination of kinds, each layer
running its own), and the epilogue.

Nodes are immutable; passes return new graphs (`dataclasses.replace`). Attribute values are literals
or references resolved when a plan runs: `DimRef` (a model dimension), `KindRef` (a field of the
layer's kind, e.g. its rope theta), `PerKind` (a literal per layer kind) or `Expr` (arithmetic over
dimensions).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class DimRef:
    name: str

    def __str__(self) -> str:
        return f"dims.{self.name}"


@dataclass(frozen=True)
class KindRef:
    field: str

    def __str__(self) -> str:
        return f"kind.{self.field}"


@dataclass(frozen=True)
class PerKind:
    """A literal chosen by the layer's kind, resolved per layer at load (e.g. which state kind a layer uses)."""

    values: tuple[tuple[str, Any], ...]  # (layer kind, value), sorted by kind

    def __str__(self) -> str:
        return "per_kind(" + ", ".join(f"{k}={v!r}" for k, v in self.values) + ")"


@dataclass(frozen=True)
class StateKindDecl:
    """One kind of per-request state the plan's layers keep, declared by the op that uses it.

    paged: a KV pool per distinct attention window. Layers whose attention has the same window share a kind;
    each kind gets its own pool and block table per request.
    slot: fixed-size per-request state (a recurrent layer's), one slot per request in a pool of slots; each
    array is [slots, *shape] per layer of the kind."""

    name: str  # "kv" (full attention), "kv_<window>" (sliding window), or the slot op's kind name
    window: Any = 0  # paged: 0 = unlimited, else a DimRef or an int: the tokens a query sees, itself included
    layout: str = "paged"  # "paged" | "slot"
    arrays: tuple[tuple[str, tuple[str, ...], str], ...] = ()  # slot: (array name, shape over dims, dtype)


@dataclass(frozen=True)
class Expr:
    text: str

    def __str__(self) -> str:
        return f"expr({self.text})"


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: tuple[tuple[str, str], ...] = ()  # (param, logical weight name); layer weights drop "blk.{i}."
    attrs: tuple[tuple[str, Any], ...] = ()
    kernel: str | None = None  # "module:function", chosen per target

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)

    def weight(self, name: str) -> str | None:
        return dict(self.weights).get(name)

    def with_attrs(self, **updates: Any) -> Node:
        merged = dict(self.attrs)
        merged.update(updates)
        return replace(self, attrs=tuple(merged.items()))


@dataclass(frozen=True)
class Region:
    name: str  # "prologue" | "layer" | "layer:<body>" | "epilogue"
    inputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]

    @property
    def is_layer(self) -> bool:
        return self.name == "layer" or self.name.startswith("layer:")

    @property
    def body(self) -> str:
        """The layer body's name ("layer" for the one body of a spec without axes)."""
        return self.name.split(":", 1)[1] if ":" in self.name else self.name

    def reads(self) -> dict[str, int]:
        """How many times each value is read: by the region's nodes, and once more when the region returns it
        (what a fusion pass checks before it folds a value into the op that reads it)."""
        counts = {name: 1 for name in self.outputs}
        for node in self.nodes:
            for name in node.inputs:
                counts[name] = counts.get(name, 0) + 1
        return counts


@dataclass(frozen=True)
class LayerConstant:
    """A per-layer array computed once at load (e.g. rope frequencies), stacked over layers."""

    name: str
    function: str  # "module:function" called with the evaluated args
    args: tuple[tuple[str, Any], ...]  # values: literals, DimRef, KindRef, Expr, or ("weight", name)
    body: str = "layer"  # the layer body that reads it: only layers running that body get it


@dataclass(frozen=True)
class PackedWeight:
    """Weights concatenated along their first axis, built by the loader (packing of q/k/v, gate/up)."""

    name: str
    parts: tuple[str, ...]


@dataclass(frozen=True)
class Graph:
    arch: str
    spec_sha256: str
    regions: tuple[Region, ...]
    weight_shapes: dict[str, tuple[str, ...]]  # logical name (layer weights relative) -> shape exprs
    layer_weights: frozenset[str]  # which logical names are per layer
    shapes: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)  # region -> value -> shape
    layer_constants: tuple[LayerConstant, ...] = ()
    packed_weights: tuple[PackedWeight, ...] = ()
    target: str | None = None
    layer_kinds: dict[str, dict[str, Any]] = field(default_factory=dict)  # the spec's [layer_kinds] fields
    state_kinds: tuple[StateKindDecl, ...] = ()  # in pool-index order (full attention first)
    layer_state: tuple[tuple[str, str], ...] = ()  # (layer kind, state kind name)

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)

    def layer_regions(self) -> tuple[Region, ...]:
        return tuple(r for r in self.regions if r.is_layer)

    def with_region(self, region: Region) -> Graph:
        return replace(self, regions=tuple(region if r.name == region.name else r for r in self.regions))

    def dump(self) -> str:
        """A readable text form, one node per line, for --dump-ir."""
        lines = [f"graph {self.arch} (spec sha256 {self.spec_sha256[:12]}, target {self.target})"]
        for decl in self.state_kinds:
            users = ", ".join(k for k, name in self.layer_state if name == decl.name)
            if decl.layout == "slot":
                arrays = ", ".join(f"{n} [{', '.join(shape)}] {dtype}" for n, shape, dtype in decl.arrays)
                lines.append(f"  state {decl.name}: slot, {arrays} (layer kinds {users})")
            else:
                lines.append(f"  state {decl.name}: paged kv, window {_fmt(decl.window)} (layer kinds {users})")
        for packed in self.packed_weights:
            lines.append(f"  packed {packed.name} = concat({', '.join(packed.parts)})")
        for const in self.layer_constants:
            args = ", ".join(f"{k}={_fmt(v)}" for k, v in const.args)
            lines.append(f"  layer constant {const.name} = {const.function}({args})")
        for region in self.regions:
            lines.append(f"region {region.name}({', '.join(region.inputs)}) -> {', '.join(region.outputs)}")
            for node in region.nodes:
                shapes = self.shapes.get(region.name, {})
                outs = ", ".join(f"{o}: [{', '.join(shapes.get(o, ('?',)))}]" for o in node.outputs)
                ins = ", ".join(node.inputs)
                ws = "".join(f" {k}={w}" for k, w in node.weights)
                at = "".join(f" {k}={_fmt(v)}" for k, v in node.attrs)
                kern = f"  ~> {node.kernel}" if node.kernel else ""
                lines.append(f"  {outs} = {node.op}({ins}){ws}{at}{kern}")
        return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    return str(value) if isinstance(value, (DimRef, KindRef, Expr, PerKind)) else repr(value)
