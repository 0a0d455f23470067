"""Which axis of each weight is split over the device mesh, decided from the ops that read the weights.

Tensor parallelism (compiler/targets/mesh.py) places weights as sharded arrays and lets XLA's SPMD partitioner
split every step; whatever is decided here, the step computes the same values (XLA inserts the collectives a
split needs). What this pass chooses is where the splits line up, so that a layer needs one all-reduce per
block, by following the activations:

- a `linear` reading an unsplit activation is column-parallel (its weight [out, in] split along `out`, a bias
  along its one axis) when every op its output flows through keeps a split feature axis (heads split, per-head
  norms, RoPE, attention, gated activations) until a `linear` reads it; that linear is row-parallel (split
  along `in`: XLA all-reduces its partial sums). A column split that would reach any other op (a recurrent
  mixer, a residual add, a region's output) is dropped: that linear's weight stays whole.
- the `linear` producing the plan's logits is column-parallel too: the vocabulary split (the sampler's
  reductions over the vocabulary run across the shards); the `embedding` table is split along the vocabulary.
- `moe` experts: by expert (axis 0) with expert parallelism, else by expert width (gate/up [E, ffn, d] along
  ffn, down [E, d, ffn] along ffn); the router stays whole.
- everything else (norm weights, Gated DeltaNet's projections and conv) is replicated.

Each split names the dimension expression that must divide by the mesh size (`divides`): a head count where
a `split_heads` follows (`kind` "heads": the runtime refuses a mesh that does not divide it, and keeps the
weight whole where there are fewer heads than devices, e.g. KV heads), the expert count with expert parallelism
(`kind` "experts": refused when it does not divide), else the weight's own axis (`kind` "axis": kept whole when
it does not divide).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import DimRef, Graph, Node, Region
from .targets.mesh import MeshConfig

# ops whose outputs keep an input's split feature axis (per-head or elementwise work)
PRESERVING = frozenset(
    {"split_heads", "rms_norm", "rope_apply", "attention", "split_at", "sigmoid_gate", "gated_act", "scale"}
)
LOGITS = "logits"


@dataclass
class _Split:
    """A weight axis split over the mesh."""

    axis: int
    divides: str
    kind: str = "axis"  # "heads" (from a split_heads), "experts" (expert parallel) or "axis" (its own dimension)

    def to_dict(self) -> dict:
        return {"axis": self.axis, "divides": self.divides, "kind": self.kind}


@dataclass
class _Flow:
    """A split activation: the dimension that splits it and the column-parallel linears it comes from."""

    divides: str
    kind: str
    sources: set[int] = field(default_factory=set)  # ids of column-parallel linear nodes


def weight_sharding(graph: Graph, mesh: MeshConfig) -> dict[str, dict[str, dict]]:
    """{"global": {weight: split}, "layer": {weight: split}} for the weights split over the mesh (a weight
    not named is replicated); each split {"axis", "divides", "kind"}. Empty sections for a one-device mesh."""
    out: dict[str, dict[str, dict]] = {"global": {}, "layer": {}}
    if not mesh.sharded:
        return out
    conflicts: set[str] = set()
    for region in graph.regions:
        section = out["layer" if region.is_layer else "global"]
        for name, split in _region_splits(region, graph, mesh).items():
            entry = split.to_dict()
            if section.get(name, entry) != entry:
                conflicts.add(name)  # two bodies disagree: keep it whole
            section[name] = entry
    for section in out.values():
        for name in conflicts & section.keys():
            del section[name]
    return out


def _region_splits(region: Region, graph: Graph, mesh: MeshConfig) -> dict[str, _Split]:
    """The region's weight splits, dropping column splits that reach an op that cannot take them, until none
    does."""
    blocked: set[int] = set()
    while True:
        splits, reached = _propagate(region, graph, mesh, blocked)
        if not reached - blocked:
            return splits
        blocked |= reached


def _propagate(region: Region, graph: Graph, mesh: MeshConfig, blocked: set[int]):
    """One forward walk: (weight splits, ids of column linears whose split reached an op that cannot take it)."""
    splits: dict[str, _Split] = {}
    flows: dict[str, _Flow] = {}
    columns: dict[int, Node] = {}
    reached: set[int] = set()
    for node in region.nodes:
        split_inputs = [flows[name] for name in node.inputs if name in flows]
        if node.op == "linear":
            weight = node.weight("weight")
            if split_inputs:  # row-parallel: the partial sums all-reduced by XLA
                flow = split_inputs[0]
                splits[weight] = _Split(1, flow.divides, flow.kind)
            elif id(node) not in blocked:
                divides = graph.weight_shapes[weight][0]
                splits[weight] = _Split(0, divides)
                if node.weight("bias"):
                    splits[node.weight("bias")] = _Split(0, divides)
                columns[id(node)] = node
                flows[node.outputs[0]] = _Flow(divides, "axis", {id(node)})
        elif node.op == "embedding":
            table = node.weight("table")
            splits[table] = _Split(0, graph.weight_shapes[table][0])
            _reach(split_inputs, reached)
        elif node.op == "moe":
            splits.update(_moe_splits(node, graph, mesh))
            _reach(split_inputs, reached)
        elif node.op in PRESERVING and split_inputs:
            flow = _Flow(split_inputs[0].divides, split_inputs[0].kind, set().union(*(f.sources for f in split_inputs)))
            heads = dict(node.attrs).get("heads") if node.op == "split_heads" else None
            if isinstance(heads, DimRef):  # the split is whole heads: the head count must divide
                flow = _Flow(heads.name, "heads", flow.sources)
                for source in flow.sources:
                    column = columns[source]
                    for _, name in column.weights:
                        splits[name] = _Split(0, heads.name, "heads")
            for name in node.outputs:
                flows[name] = flow
        else:
            _reach(split_inputs, reached)
    for name in region.outputs:
        if name in flows and not (name == LOGITS and not region.is_layer):
            reached |= flows[name].sources
    # a row-parallel linear whose column source was dropped reads an unsplit activation on the next walk
    return splits, reached


def _reach(flows: list[_Flow], reached: set[int]) -> None:
    for flow in flows:
        reached |= flow.sources


def _moe_splits(node: Node, graph: Graph, mesh: MeshConfig) -> dict[str, _Split]:
    """Routed experts: whole experts per device (expert parallel) or every expert's width split."""
    splits = {}
    for param, name in node.weights:
        if param == "router":
            continue
        shape = graph.weight_shapes[name]  # gate/up [E, ffn, d], down [E, d, ffn]
        if mesh.expert_parallel:
            splits[name] = _Split(0, shape[0], "experts")
        else:
            axis = 2 if param == "down" else 1
            splits[name] = _Split(axis, shape[axis])
    return splits
