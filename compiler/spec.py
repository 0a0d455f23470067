"""Model specs: the schema, parsing and validation of `specs/<arch>.toml`.

A spec is data only. Every error names the file, the field and what was expected, so a typo in a
spec reads like `specs/<arch>.toml: layer.ops[4]: unknown op 'rms_nrom' (known: ...)`.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .expr import Call, ExprError, Statement, expression_names, parse_statement
from .layer_axes import LayerAxis, body_kinds, body_names, parse_layer_axes
from .ops import OPS

SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"


class SpecError(ValueError):
    def __init__(self, path: Path | str, where: str, expected: str):
        self.path, self.where, self.expected = str(path), where, expected
        super().__init__(f"{path}: {where}: {expected}")


@dataclass(frozen=True)
class DimSource:
    """Where one dimension comes from; the first source a checkpoint has wins."""

    hf: tuple[str, ...] = ()
    gguf: tuple[str, ...] = ()
    weight: str | None = None  # read from a tensor's shape instead
    axis: int = 0
    default: Any = None  # literal, table, or arithmetic over other dims (a string)
    has_default: bool = False


@dataclass(frozen=True)
class WeightSource:
    hf: str | None  # HF tensor name template ({i} = layer, {e} = expert: stacked); None: not in HF checkpoints
    gguf: str | None = None  # the GGUF tensor name where it is not the logical name (e.g. "blk.{i}.ssm_a")
    tied_to: str | None = None  # logical weight used when this one is absent
    optional: bool = False
    hf_transform: str | None = None
    gguf_transform: str | None = None
    shape: tuple[str, ...] = ()  # arithmetic over dims, one per axis (numpy order: rows first)


@dataclass(frozen=True)
class LayerKinds:
    hf_key: str | None
    default_period: tuple[str, ...]
    fields: dict[str, dict[str, Any]]  # kind -> field -> dim name (str) or literal


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    arch: str
    hf_architectures: tuple[str, ...]
    gguf_architecture: str
    dims: dict[str, DimSource]
    weights: dict[str, WeightSource]
    layer_kinds: LayerKinds | None
    prologue: tuple[Statement, ...]
    layer: tuple[Statement, ...]  # the one body of a spec without [layer_axes]
    epilogue: tuple[Statement, ...]
    source_sha256: str = field(default="")
    layer_axes: tuple[LayerAxis, ...] = ()
    blocks: dict[str, tuple[Statement, ...]] = field(default_factory=dict)  # [layer.<kind>] ops per axis kind

    def bodies(self) -> dict[str, tuple[Statement, ...]]:
        """Each layer body's statements: "layer" alone, or one per combination of the axes' kinds."""
        if not self.layer_axes:
            return {"layer": self.layer}
        return {
            name: tuple(s for kind in body_kinds(name) for s in self.blocks[kind])
            for name in body_names(self.layer_axes)
        }


def load_spec(path: str | Path) -> ModelSpec:
    path = Path(path)
    try:
        raw_bytes = path.read_bytes()
    except OSError as e:
        raise SpecError(path, "file", f"cannot be read ({e.strerror})") from None
    try:
        data = tomllib.loads(raw_bytes.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SpecError(path, "file", f"expected valid TOML ({e})") from None
    known = {
        "arch",
        "hf_architectures",
        "gguf_architecture",
        "dims",
        "weights",
        "layer_kinds",
        "layer_axes",
        "model",
        "layer",
    }
    for key in data:
        if key not in known:
            raise SpecError(path, key, f"unknown top-level field (expected one of {sorted(known)})")
    axes = ()
    if "layer_axes" in data:
        axes = parse_layer_axes(data["layer_axes"], lambda where, expected: SpecError(path, where, expected))
        if "layer_kinds" in data:
            raise SpecError(path, "layer_kinds", "expected either [layer_kinds] or [layer_axes], not both")
    layer_allowed = {k for a in axes for k in a.kinds} if axes else {"ops"}
    for table, allowed in (("model", {"prologue", "epilogue"}), ("layer", layer_allowed)):
        for key in _table(path, data, table):
            if key not in allowed:
                raise SpecError(path, f"{table}.{key}", f"unknown field (expected {sorted(allowed)})")
    blocks = {}
    for kind in sorted(layer_allowed) if axes else ():
        table = _table(path, _table(path, data, "layer"), kind)
        blocks[kind] = _parse_ops(path, table, "ops", f"layer.{kind}.ops")
    dims = _parse_dims(path, _table(path, data, "dims"))
    spec = ModelSpec(
        path=path,
        arch=_string(path, data, "arch"),
        hf_architectures=tuple(_string_list(path, data.get("hf_architectures", []), "hf_architectures")),
        gguf_architecture=_string(path, data, "gguf_architecture"),
        dims=dims,
        weights=_parse_weights(path, _table(path, data, "weights"), dims),
        layer_kinds=_parse_layer_kinds(path, data.get("layer_kinds"), dims),
        prologue=_parse_ops(path, _table(path, data, "model"), "prologue", "model.prologue"),
        layer=() if axes else _parse_ops(path, _table(path, data, "layer"), "ops", "layer.ops"),
        epilogue=_parse_ops(path, _table(path, data, "model"), "epilogue", "model.epilogue"),
        source_sha256=hashlib.sha256(raw_bytes).hexdigest(),
        layer_axes=axes,
        blocks=blocks,
    )
    for axis in axes:
        if axis.every_dim is not None and axis.every_dim not in dims:
            raise SpecError(path, f"layer_axes.{axis.name}.every.dim", f"unknown dimension {axis.every_dim!r}")
    return spec


def spec_for_arch(arch: str) -> ModelSpec:
    path = SPECS_DIR / f"{arch}.toml"
    if not path.exists():
        raise SpecError(path, "arch", f"no spec for architecture {arch!r} (have: {sorted(known_archs())})")
    return load_spec(path)


def known_archs() -> list[str]:
    return sorted(p.stem for p in SPECS_DIR.glob("*.toml"))


def all_specs() -> list[ModelSpec]:
    return [load_spec(SPECS_DIR / f"{a}.toml") for a in known_archs()]


# ---- field parsers ----------------------------------------------------------------------------


def _table(path: Path, data: dict, key: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict):
        raise SpecError(path, key, f"expected a table [{key}]")
    return value


def _string(path: Path, data: dict, key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise SpecError(path, key, "expected a non-empty string")
    return value


def _string_list(path: Path, value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(path, where, "expected a string or a list of strings")
    return value


def _parse_dims(path: Path, table: dict) -> dict[str, DimSource]:
    dims = {}
    allowed = {"hf", "gguf", "weight", "axis", "default"}
    for name, entry in table.items():
        where = f"dims.{name}"
        if not isinstance(entry, dict):
            raise SpecError(path, where, 'expected a table like { hf = "hidden_size", gguf = "embedding_length" }')
        extra = set(entry) - allowed
        if extra:
            raise SpecError(path, where, f"unknown keys {sorted(extra)} (allowed: {sorted(allowed)})")
        if not ({"hf", "gguf", "weight", "default"} & set(entry)):
            raise SpecError(path, where, "expected at least one of hf, gguf, weight or default")
        axis = entry.get("axis", 0)
        if not isinstance(axis, int):
            raise SpecError(path, f"{where}.axis", "expected an integer")
        weight = entry.get("weight")
        if weight is not None and not isinstance(weight, str):
            raise SpecError(path, f"{where}.weight", "expected a tensor name")
        dims[name] = DimSource(
            hf=tuple(_string_list(path, entry.get("hf", []), f"{where}.hf")),
            gguf=tuple(_string_list(path, entry.get("gguf", []), f"{where}.gguf")),
            weight=weight,
            axis=axis,
            default=entry.get("default"),
            has_default="default" in entry,
        )
    return dims


def _parse_weights(path: Path, table: dict, dims: dict[str, DimSource]) -> dict[str, WeightSource]:
    weights = {}
    allowed = {"hf", "gguf", "tied_to", "optional", "hf_transform", "gguf_transform", "shape"}
    for name, entry in table.items():
        where = f"weights.{name!r}"
        if isinstance(entry, str):
            entry = {"hf": entry}
        if not isinstance(entry, dict):
            raise SpecError(path, where, "expected an HF tensor name or a table")
        extra = set(entry) - allowed
        if extra:
            raise SpecError(path, where, f"unknown keys {sorted(extra)} (allowed: {sorted(allowed)})")
        tied = entry.get("tied_to")
        if tied is not None and tied not in table:
            raise SpecError(path, f"{where}.tied_to", f"expected a weight declared in [weights], got {tied!r}")
        for key in ("hf_transform", "gguf_transform"):
            if entry.get(key) is not None:
                from .weight_transforms import parse_transform

                try:
                    parse_transform(entry[key])
                except ValueError as e:
                    raise SpecError(path, f"{where}.{key}", str(e)) from None
        shape = entry.get("shape")
        if not isinstance(shape, str) or not shape.strip():
            raise SpecError(path, f"{where}.shape", 'expected the tensor shape over dims, e.g. "hq * dh, d"')
        axes = tuple(a.strip() for a in shape.split(","))
        for axis in axes:
            try:
                unknown = expression_names(axis) - set(dims)
            except ExprError as e:
                raise SpecError(path, f"{where}.shape", str(e)) from None
            if unknown:
                raise SpecError(path, f"{where}.shape", f"unknown dimensions {sorted(unknown)}")
        weights[name] = WeightSource(
            hf=entry.get("hf"),
            gguf=entry.get("gguf"),
            tied_to=tied,
            optional=bool(entry.get("optional", False)),
            hf_transform=entry.get("hf_transform"),
            gguf_transform=entry.get("gguf_transform"),
            shape=axes,
        )
    return weights


def _parse_layer_kinds(path: Path, table: Any, dims: dict[str, DimSource]) -> LayerKinds | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise SpecError(path, "layer_kinds", "expected a table")
    period = table.get("default_period")
    if not isinstance(period, list) or not period or not all(isinstance(p, str) for p in period):
        raise SpecError(path, "layer_kinds.default_period", "expected a non-empty list of kind names")
    kinds = {k: v for k, v in table.items() if isinstance(v, dict)}
    for kind in period:
        if kind not in kinds:
            raise SpecError(path, "layer_kinds.default_period", f"kind {kind!r} has no [layer_kinds.{kind}] table")
    field_sets = {k: set(v) for k, v in kinds.items()}
    first = next(iter(field_sets.values()))
    for kind, fields in field_sets.items():
        if fields != first:
            raise SpecError(
                path, f"layer_kinds.{kind}", f"expected the same fields as the other kinds ({sorted(first)})"
            )
        for fname, value in kinds[kind].items():
            if isinstance(value, str) and value not in dims:
                raise SpecError(path, f"layer_kinds.{kind}.{fname}", f"expected a dimension name, got {value!r}")
    hf_key = table.get("hf")
    return LayerKinds(hf_key=hf_key, default_period=tuple(period), fields=kinds)


def _parse_ops(path: Path, table: dict, key: str, where: str) -> tuple[Statement, ...]:
    lines = table.get(key)
    if not isinstance(lines, list) or not all(isinstance(s, str) for s in lines):
        raise SpecError(path, where, "expected a list of op statements like \"h = rms_norm(x, 'attn_norm', eps)\"")
    statements = []
    for index, line in enumerate(lines):
        try:
            statement = parse_statement(line)
        except ExprError as e:
            raise SpecError(path, f"{where}[{index}]", str(e)) from None
        for call in _calls(statement):
            if call.op not in OPS or not OPS[call.op].spec_level:
                raise SpecError(
                    path,
                    f"{where}[{index}]",
                    f"unknown op {call.op!r} (known: {', '.join(sorted(o for o in OPS if OPS[o].spec_level))})",
                )
        statements.append(statement)
    return tuple(statements)


def _calls(node: Any):
    if isinstance(node, Statement):
        for value in node.values:
            yield from _calls(value)
    elif isinstance(node, Call):
        yield node
        for arg in node.args:
            yield from _calls(arg)
        for _, value in node.kwargs:
            yield from _calls(value)
    elif hasattr(node, "left"):
        yield from _calls(node.left)
        yield from _calls(node.right)


def gathered_only_weights(spec: ModelSpec) -> frozenset[str]:
    """Weights the spec's ops use only as an embedding table: a step gathers a few of their rows and never
    reads them whole (no dense copy for them at load, and not in a step's weight bytes)."""
    gathered, other = set(), set()
    for statement in (*spec.prologue, *spec.layer, *(s for b in spec.blocks.values() for s in b), *spec.epilogue):
        for call in _calls(statement):
            for i, arg in enumerate(call.args):
                if isinstance(arg, str):
                    (gathered if call.op == "embedding" and i == 1 else other).add(arg)
    return frozenset(gathered - other)
