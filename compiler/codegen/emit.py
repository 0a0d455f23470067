"""Code generation: a compiled graph becomes a readable Python plan module plus a manifest."""

from __future__ import annotations

import ast
import json
import pprint
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from ..frontend import STEP_INPUTS
from ..ir import DimRef, Expr, Graph, KindRef, Node, PerKind
from ..ops import OPS
from ..pipeline import COMPILER_VERSION
from ..sharding import weight_sharding
from ..spec import ModelSpec
from ..targets import Target
from ..targets.mesh import SINGLE_DEVICE, MeshConfig

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    keep_trailing_newline=True,
    trim_blocks=False,
    lstrip_blocks=False,
    autoescape=False,
)
_SIGNATURES = {  # {carried}: the values handed from region to region (x, and x_add: defer_residual_add)
    "prologue": "dims, weights, batch",
    "layer": "dims, w, constants, {carried}, state, batch",
    "epilogue": "dims, weights, {carried}, batch",
}


@dataclass(frozen=True)
class GeneratedPlan:
    source: str
    manifest: dict


def plan_filename(variant: str) -> str:
    return "plan.py" if variant == "default" else f"plan_{variant}.py"


def generate(
    graph: Graph, spec: ModelSpec, target: Target, variant: str = "default", mesh: MeshConfig = SINGLE_DEVICE
) -> GeneratedPlan:
    imports: dict[str, tuple[str, str, str]] = {}
    regions = []
    for region in graph.regions:
        weights_var = "w" if region.is_layer else "weights"
        lines, returns = [], ", ".join(region.outputs)
        if region.is_layer:
            lines += [f"{c.name} = constants[{c.name!r}]" for c in graph.layer_constants if c.body == region.body]
            state = _state_arrays(region)
            if state:
                lines.append(f"{', '.join(state)} = state")
            returns += f", ({', '.join(state)}{',' if len(state) == 1 else ''})"
        for node in region.nodes:
            alias = _alias(node.kernel)
            module, function = node.kernel.split(":")
            imports[alias] = (alias, module, function)
            lines.append(_call_line(node, alias, weights_var))
        kind = "layer" if region.is_layer else region.name
        regions.append(
            {
                "name": function_name(region.name),
                "returns": returns,
                "lines": lines,
                "signature": _SIGNATURES[kind].format(carried=", ".join(_carried(graph, region))),
            }
        )
    layers = graph.layer_regions()
    source = _TEMPLATES.get_template("plan.py.j2").render(
        spec_file=f"specs/{spec.path.name}",
        target=target.name,
        variant=variant,
        spec_sha256=spec.source_sha256,
        compiler_version=COMPILER_VERSION,
        arch=graph.arch,
        imports=sorted(imports.values()),
        regions=regions,
        carried=_carried(graph, layers[0]),
        bodies=[(r.body, function_name(r.name)) for r in layers] if layers[0].name != "layer" else [],
        global_weights=repr(tuple(sorted(_used_weights(graph, layer=False)))),
        layer_weights=repr(tuple(sorted(_used_weights(graph, layer=True)))),
        kernel_policy=pprint.pformat(target.policy.to_dict(), width=110),
    )
    return GeneratedPlan(source=source, manifest=_manifest(graph, spec, target) | _mesh_section(graph, mesh))


def write_plan(plans: dict[str, GeneratedPlan], out_dir: Path) -> list[Path]:
    """Write each variant's plan module and one manifest (shared: variants differ only in kernels)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for variant, plan in plans.items():
        path = out_dir / plan_filename(variant)
        path.write_text(plan.source)
        written.append(path)
    manifest = dict(plans["default"].manifest)
    manifest["variants"] = {variant: plan_filename(variant) for variant in plans}
    manifest_path = out_dir / "manifest.json"
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return written + [manifest_path]


def function_name(region: str) -> str:
    """The plan function of a region: "layer:linear_attention+moe" -> "layer_linear_attention_moe"."""
    return region.replace(":", "_").replace("+", "_")


def _state_arrays(region) -> tuple[str, ...]:
    """The names of the layer's state arrays: those of its stateful op (none when it has none)."""
    stateful = [node for node in region.nodes if OPS[node.op].stateful]
    return OPS[stateful[0].op].state_arrays if stateful else ()


def _carried(graph: Graph, region) -> list[str]:
    """The region's inputs handed on from the region before: neither the step's own (tokens, positions,
    logit_rows) nor the layer constants."""
    constants = {c.name for c in graph.layer_constants}
    return [name for name in region.inputs if name not in STEP_INPUTS and name not in constants]


def _alias(kernel: str) -> str:
    """ "ember.compiler.kernels.norm.kernel:rms_norm" -> "norm_kernel_rms_norm" (family, module, function)."""
    module, function = kernel.split(":")
    return f"{module.removeprefix('ember.compiler.kernels.').replace('.', '_')}_{function}"


def _call_line(node: Node, alias: str, weights_var: str) -> str:
    args = list(node.inputs)
    args += [f"{weights_var}[{name!r}]" for _, name in node.weights]
    outputs = list(node.outputs)
    if OPS[node.op].stateful:
        args += [*OPS[node.op].state_arrays, "batch"]
        outputs += OPS[node.op].state_arrays
    args += [f"{key}={_render(value)}" for key, value in node.attrs]
    target = ", ".join(outputs)
    return f"{target} = {alias}({', '.join(args)})"


def _render(value: Any) -> str:
    if isinstance(value, DimRef):
        return f"dims.{value.name}"
    if isinstance(value, Expr):
        return _render_expr(value.text)
    if isinstance(value, (KindRef, PerKind)):
        raise ValueError(f"layer-kind value {value} must be hoisted into a layer constant before codegen")
    if isinstance(value, tuple):
        return "(" + ", ".join(_render(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


class _PrefixDims(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Attribute(ast.Name("dims", ast.Load()), node.id, ast.Load()), node)


def _render_expr(text: str) -> str:
    return ast.unparse(_PrefixDims().visit(ast.parse(text, mode="eval")))


def _used_weights(graph: Graph, *, layer: bool, body: str | None = None) -> set[str]:
    names = set()
    for region in graph.regions:
        if region.is_layer == layer and (body is None or region.body == body):
            names |= {w for node in region.nodes for _, w in node.weights}
    return names


def _state_entry(decl, index: int) -> dict:
    if decl.layout == "slot":
        return {
            "layout": "slot",
            "index": index,
            "per_layer": True,
            "arrays": {name: {"shape": list(shape), "dtype": dtype} for name, shape, dtype in decl.arrays},
        }
    return {
        "layout": "paged",
        "index": index,
        "window": _manifest_arg(decl.window),
        "per_layer": True,
        "axes": ["hkv", "dh"],
    }


def _state_section(graph: Graph) -> dict:
    """Each state kind by name; `index` counts within its layout (paged kinds: the row of a StepBatch's slots
    and block tables; slot kinds: the row of its state_slots)."""
    counts: dict[str, int] = {}
    out = {}
    for decl in graph.state_kinds:
        out[decl.name] = _state_entry(decl, counts.get(decl.layout, 0))
        counts[decl.layout] = counts.get(decl.layout, 0) + 1
    return out


def _manifest(graph: Graph, spec: ModelSpec, target: Target) -> dict:
    return {
        "arch": graph.arch,
        "spec": f"specs/{spec.path.name}",
        "spec_sha256": spec.source_sha256,
        "compiler_version": COMPILER_VERSION,
        "target": target.name,
        "activation_dtype": target.activation_dtype,
        # which kernel and config each op takes (compiler/targets/policy.py): the runtime traces with it
        "kernel_policy": target.policy.to_dict(),
        "entries": {
            "forward": {
                "kinds": ["prefill", "decode", "mixed"],
                "decode_buckets": list(target.decode_buckets),
                "prefill_buckets": list(target.prefill_buckets),
                "prefill_segments": list(target.prefill_segments),
                "segment_max_tokens": target.segment_max_tokens,
            }
        },
        # one paged KV kind per distinct attention window (assign_state_kinds); `index` is the row of the
        # kind's slots and block tables in a StepBatch, `layer_state` maps each layer kind to its state kind
        "state": _state_section(graph),
        "layer_state": dict(graph.layer_state),
        "global_weights": sorted(_used_weights(graph, layer=False)),
        "layer_weights": sorted(_used_weights(graph, layer=True)),
        "packed_weights": {p.name: list(p.parts) for p in graph.packed_weights},
        "layer_constants": {
            c.name: {"function": c.function, "args": {k: _manifest_arg(v) for k, v in c.args}}
            | ({"body": c.body} if c.body != "layer" else {})
            for c in graph.layer_constants
        },
    } | _bodies_section(graph)


def _mesh_section(graph: Graph, mesh: MeshConfig) -> dict:
    """For a plan spread over several devices: the mesh and each split weight (compiler/sharding.py). A one-device
    plan records neither: its manifest is the one it always was."""
    if not mesh.sharded:
        return {}
    return {"mesh": mesh.to_dict(), "weight_sharding": weight_sharding(graph, mesh)}


def _bodies_section(graph: Graph) -> dict:
    """For specs with [layer_axes]: each body's layer weights (a layer loads its own body's only)."""
    layers = graph.layer_regions()
    if len(layers) == 1 and layers[0].name == "layer":
        return {}
    return {"body_weights": {r.body: sorted(_used_weights(graph, layer=True, body=r.body)) for r in layers}}


def _manifest_arg(value: Any) -> Any:
    if isinstance(value, DimRef):
        return {"dim": value.name}
    if isinstance(value, KindRef):
        return {"kind": value.field}
    if isinstance(value, PerKind):
        return {"per_kind": dict(value.values)}
    if isinstance(value, Expr):
        return {"expr": value.text}
    if isinstance(value, tuple) and value and value[0] == "weight":
        return {"weight": value[1]}
    return {"value": value}
