"""Resolve a spec's dimensions against one checkpoint: config.json or GGUF metadata, else defaults."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...compiler.expr import ExprError, evaluate, expression_names
from ...compiler.layer_axes import resolve_bodies
from ...compiler.spec import ModelSpec
from .checkpoint import MISSING, Checkpoint, is_missing
from .formats.errors import CheckpointError


class Dims:
    """Resolved dimensions, read as attributes (`dims.hq`). Hashable, so jit can treat it as static."""

    def __init__(self, values: dict[str, Any]):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_key", json.dumps(values, sort_keys=True, default=str))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no dimension {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Dims is immutable")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dims) and other._key == self._key

    def __repr__(self) -> str:
        return f"Dims({self._key})"


@dataclass(frozen=True)
class ResolvedModel:
    dims: Dims
    layer_kinds: tuple[str, ...]  # one kind name per layer ("default" when the spec has no kinds; the body's
    # name, e.g. "linear_attention+moe", for a spec with [layer_axes], also in dims.layer_bodies)


def resolve(spec: ModelSpec, ckpt: Checkpoint) -> ResolvedModel:
    values: dict[str, Any] = {}
    pending: dict[str, str] = {}
    for name, source in spec.dims.items():
        found = _from_checkpoint(spec, ckpt, source)
        if not is_missing(found):
            values[name] = found
        elif source.has_default and isinstance(source.default, str):
            pending[name] = source.default
        elif source.has_default:
            values[name] = source.default
        else:
            keys = source.hf if ckpt.format == "hf" else tuple(_gguf_key(spec, k) for k in source.gguf)
            where = "config.json" if ckpt.format == "hf" else "GGUF metadata"
            raise CheckpointError(
                ckpt.path,
                f"{where} is missing {' or '.join(keys) or 'a value'} (dimension {name!r} of {spec.path.name})",
            )
    while pending:  # defaults are arithmetic over other dims: resolve in dependency order
        ready = {n: e for n, e in pending.items() if expression_names(e) <= set(values)}
        if not ready:
            raise CheckpointError(ckpt.path, f"cannot resolve dimensions {sorted(pending)} of {spec.path.name}")
        for name, expr in ready.items():
            try:
                values[name] = evaluate(expr, values)
            except (ExprError, ZeroDivisionError, TypeError) as e:
                raise CheckpointError(ckpt.path, f"dimension {name!r}: {e}") from None
            del pending[name]
    if spec.layer_axes:
        lookup = lambda key: None if ckpt.format != "hf" or is_missing(ckpt.lookup(key)) else ckpt.lookup(key)
        try:
            bodies = resolve_bodies(spec.layer_axes, int(values["layers"]), lookup, values)
        except ValueError as e:
            raise CheckpointError(ckpt.path, str(e)) from None
        values["layer_bodies"] = list(bodies)  # static for the plan: forward picks each layer's body with it
        return ResolvedModel(Dims(values), bodies)
    return ResolvedModel(Dims(values), _layer_kinds(spec, ckpt, values))


def _gguf_key(spec: ModelSpec, key: str) -> str:
    return key if key.startswith(("general.", "tokenizer.")) else f"{spec.gguf_architecture}.{key}"


def _from_checkpoint(spec: ModelSpec, ckpt: Checkpoint, source) -> Any:
    keys = source.hf if ckpt.format == "hf" else tuple(_gguf_key(spec, k) for k in source.gguf)
    for key in keys:
        value = ckpt.lookup(key)
        if not is_missing(value):
            return value
    if source.weight is not None:
        name = source.weight
        if ckpt.format == "hf":
            entry = spec.weights.get(name)
            name = entry.hf if entry is not None else None
        if name and ckpt.has_tensor(name):
            return int(ckpt.tensor_shape(name)[source.axis])
    return MISSING


def _layer_kinds(spec: ModelSpec, ckpt: Checkpoint, values: dict[str, Any]) -> tuple[str, ...]:
    layers = int(values["layers"])
    kinds = spec.layer_kinds
    if kinds is None:
        return ("default",) * layers
    declared = ckpt.lookup(kinds.hf_key) if (kinds.hf_key and ckpt.format == "hf") else None
    if isinstance(declared, list) and declared:
        if len(declared) != layers or any(k not in kinds.fields for k in declared):
            raise CheckpointError(
                ckpt.path, f"config.json {kinds.hf_key} must list {layers} kinds among {sorted(kinds.fields)}"
            )
        return tuple(declared)
    period = kinds.default_period
    return tuple(period[i % len(period)] for i in range(layers))


def kind_field(spec: ModelSpec, resolved: ResolvedModel, layer: int, field: str) -> Any:
    """The value of a [layer_kinds] field for one layer: a dimension's value or a literal."""
    value = spec.layer_kinds.fields[resolved.layer_kinds[layer]][field]
    return resolved.dims[value] if isinstance(value, str) else value
