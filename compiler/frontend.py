"""Phase 0: lower a spec's op statements into the graph IR (SSA names, weights resolved)."""

from __future__ import annotations

from typing import Any

from .expr import Add, Call, Ref, Statement
from .ir import DimRef, Graph, KindRef, Node, Region
from .ops import OPS, REQUIRED
from .spec import ModelSpec, SpecError

LAYER_PREFIX = "blk.{i}."
# Values every region can read without defining them.
STEP_INPUTS = ("tokens", "positions", "logit_rows")


def lower(spec: ModelSpec) -> Graph:
    layer_weights = {n[len(LAYER_PREFIX) :] for n in spec.weights if n.startswith(LAYER_PREFIX)}
    global_weights = {n for n in spec.weights if not n.startswith(LAYER_PREFIX)}
    weight_shapes = {
        (n[len(LAYER_PREFIX) :] if n.startswith(LAYER_PREFIX) else n): w.shape for n, w in spec.weights.items()
    }
    regions = []
    carried = ("x",)
    bodies = spec.bodies()
    layer_regions = [
        (
            "layer" if name == "layer" else f"layer:{name}",
            statements,
            "layer.ops" if name == "layer" else f"layer[{name}]",
        )
        for name, statements in bodies.items()
    ]
    for name, statements, field in (
        ("prologue", spec.prologue, "model.prologue"),
        *layer_regions,
        ("epilogue", spec.epilogue, "model.epilogue"),
    ):
        in_layer = name.startswith("layer")
        lowering = _RegionLowering(
            spec, field, in_layer=in_layer, layer_weights=layer_weights, global_weights=global_weights
        )
        inputs = STEP_INPUTS + (carried if name != "prologue" else ())
        for value in inputs:
            lowering.define(value)
        if name == "epilogue":  # only rows whose logits the step needs go through the head
            lowering.emit(Node("select_rows", ("x", "logit_rows"), (lowering.fresh("x"),)))
        for index, statement in enumerate(statements):
            lowering.statement(statement, f"{field}[{index}]")
        outputs = ("logits",) if name == "epilogue" else ("x",)
        for out in outputs:
            if out not in lowering.current:
                raise SpecError(spec.path, field, f"expected the ops to assign {out!r}")
        regions.append(Region(name, inputs, tuple(lowering.nodes), tuple(lowering.current[o] for o in outputs)))
    return Graph(
        arch=spec.arch,
        spec_sha256=spec.source_sha256,
        regions=tuple(regions),
        weight_shapes=weight_shapes,
        layer_weights=frozenset(layer_weights),
        layer_kinds=dict(spec.layer_kinds.fields) if spec.layer_kinds else {},
    )


class _RegionLowering:
    def __init__(self, spec: ModelSpec, field: str, *, in_layer: bool, layer_weights, global_weights):
        self.spec, self.field, self.in_layer = spec, field, in_layer
        self.layer_weights, self.global_weights = layer_weights, global_weights
        self.nodes: list[Node] = []
        self.current: dict[str, str] = {}  # spec name -> current SSA name
        self.counts: dict[str, int] = {}
        self.where = field

    def fresh(self, base: str) -> str:
        n = self.counts.get(base, -1) + 1
        self.counts[base] = n
        return base if n == 0 else f"{base}_{n}"

    def define(self, name: str) -> str:
        ssa = self.fresh(name)
        self.current[name] = ssa
        return ssa

    def emit(self, node: Node) -> None:
        self.nodes.append(node)
        if node.op == "select_rows":
            self.current["x"] = node.outputs[0]

    def error(self, expected: str) -> SpecError:
        return SpecError(self.spec.path, self.where, expected)

    def statement(self, statement: Statement, where: str) -> None:
        self.where = where
        if len(statement.values) == 1 and len(statement.targets) > 1:
            results = self.expr(statement.values[0], n_outputs=len(statement.targets))
        else:
            results = [self.expr(v, n_outputs=1)[0] for v in statement.values]
        for target, ssa in zip(statement.targets, results):
            final = self.fresh(target)
            self._rename(ssa, final)
            self.current[target] = final

    def _rename(self, old: str, new: str) -> None:
        for i, node in enumerate(self.nodes):
            if old in node.outputs:
                outs = tuple(new if o == old else o for o in node.outputs)
                self.nodes[i] = Node(node.op, node.inputs, outs, node.weights, node.attrs)
                return
        raise self.error(f"cannot assign {old!r}: it is not computed by an op here")

    def expr(self, node: Any, *, n_outputs: int) -> list[str]:
        if isinstance(node, Add):
            left, right = self.value(node.left), self.value(node.right)
            out = self.fresh("t")
            self.emit(Node("add", (left, right), (out,)))
            return [out]
        if isinstance(node, Call):
            return self.call(node, n_outputs)
        if isinstance(node, Ref) and n_outputs == 1:
            return [self.value(node)]
        raise self.error(f"expected an op call, got {node!r}")

    def value(self, node: Any) -> str:
        if isinstance(node, Ref):
            if node.name not in self.current:
                raise self.error(f"value {node.name!r} is used before it is assigned")
            return self.current[node.name]
        return self.expr(node, n_outputs=1)[0]

    def call(self, call: Call, n_outputs: int) -> list[str]:
        op = OPS[call.op]
        if op.outputs != n_outputs:
            raise self.error(f"op {call.op!r} yields {op.outputs} value(s), assigned to {n_outputs}")
        bound = self._bind(call, op)
        inputs, weights, attrs = [], [], []
        for param in op.params:
            arg = bound.get(param.name, param.default)
            if arg is REQUIRED:
                raise self.error(f"op {call.op!r} needs argument {param.name!r}")
            if param.kind == "value":
                inputs.append(self.value(arg))
            elif param.kind == "weight":
                if arg is not None:
                    weights.append((param.name, self.weight_name(arg, "weight")))
            elif param.kind == "dim":
                attrs.append((param.name, self.dim(arg, param.name)))
            elif not isinstance(arg, (str, int, float, bool)) or isinstance(arg, Ref):
                raise self.error(f"argument {param.name!r} of {call.op!r} must be a literal, got {arg!r}")
            elif param.name == "bias":
                if arg is True:
                    weights.append(("bias", self.weight_name(bound["weight"], "bias")))
            else:
                attrs.append((param.name, arg))
        outputs = tuple(self.fresh("t") for _ in range(n_outputs))
        self.emit(Node(call.op, tuple(inputs), outputs, tuple(weights), tuple(attrs)))
        return list(outputs)

    def _bind(self, call: Call, op) -> dict[str, Any]:
        if len(call.args) > len(op.params):
            raise self.error(f"op {call.op!r} takes at most {len(op.params)} arguments")
        bound = {p.name: a for p, a in zip(op.params, call.args)}
        names = {p.name for p in op.params}
        for key, value in call.kwargs:
            if key not in names:
                raise self.error(f"op {call.op!r} has no argument {key!r} (has: {', '.join(sorted(names))})")
            if key in bound:
                raise self.error(f"op {call.op!r} got {key!r} twice")
            bound[key] = value
        return bound

    def weight_name(self, name: Any, suffix: str) -> str:
        if not isinstance(name, str):
            raise self.error(f"expected a weight name in quotes, got {name!r}")
        full = f"{name}.{suffix}"
        if self.in_layer and full in self.layer_weights:
            return full
        if full in self.global_weights:
            return full
        raise self.error(f"weight {full!r} is not declared in [weights]")

    def dim(self, arg: Any, param: str) -> Any:
        if isinstance(arg, Ref):
            if arg.name.startswith("kind."):
                kinds = self.spec.layer_kinds
                fieldname = arg.name[5:]
                if not self.in_layer or kinds is None or fieldname not in next(iter(kinds.fields.values())):
                    raise self.error(f"{arg.name!r} is not a field of [layer_kinds]")
                return KindRef(fieldname)
            if arg.name not in self.spec.dims:
                raise self.error(f"argument {param!r}: unknown dimension {arg.name!r}")
            return DimRef(arg.name)
        if isinstance(arg, (int, float, dict)) or arg is None:
            return arg
        raise self.error(f"argument {param!r}: expected a dimension or a number, got {arg!r}")
