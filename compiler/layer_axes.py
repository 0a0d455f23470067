"""Layers of different bodies: a spec's `[layer_axes]` and its one op block per kind of each axis.

A layer is the concatenation of one block per axis, in the order the axes are declared, e.g.

    [layer_axes.mixer]                       # which token mixer each layer runs
    kinds = ["linear_attention", "full_attention"]
    hf = "layer_types"                       # config.json lists each layer's kind ...
    every = { dim = "full_attention_interval", kind = "full_attention" }  # ... else layer i is `kind` when
                                             # (i + 1) % interval == 0 and the axis's first kind otherwise
    [layer_axes.mlp]
    kinds = ["dense", "moe"]
    every = { dim = "decoder_sparse_step", kind = "moe" }
    only = { hf = "mlp_only_layers", kind = "dense" }   # listed layers take this kind whatever the rule says

    [layer.linear_attention]  ops = [...]    # one block per kind
    [layer.moe]               ops = [...]

A layer's body is named after its kinds ("linear_attention+moe"); every combination of kinds is one body, one
IR region and one function of the generated plan. The mapping from layer index to body is resolved at load from
the checkpoint's config (`layer_bodies`): the compiler never sees a layer index.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

BODY_SEPARATOR = "+"


@dataclass(frozen=True)
class LayerAxis:
    name: str
    kinds: tuple[str, ...]  # the first is the kind a layer takes when no rule names another
    hf: str | None = None  # config.json key listing each layer's kind
    every_dim: str | None = None  # a dimension n: layer i is `every_kind` when (i + 1) % n == 0
    every_kind: str | None = None
    only_hf: str | None = None  # config.json key listing layers that take `only_kind`
    only_kind: str | None = None


def body_names(axes: Sequence[LayerAxis]) -> tuple[str, ...]:
    """Every combination of one kind per axis, in declaration order."""
    return tuple(BODY_SEPARATOR.join(combo) for combo in itertools.product(*(a.kinds for a in axes)))


def body_kinds(body: str) -> tuple[str, ...]:
    return tuple(body.split(BODY_SEPARATOR))


def parse_layer_axes(table: Any, error: Callable[[str, str], Exception]) -> tuple[LayerAxis, ...]:
    """error(where, expected) builds the spec error to raise."""
    if not isinstance(table, dict) or not table:
        raise error("layer_axes", "expected a table of axes like [layer_axes.mixer]")
    axes = []
    for name, entry in table.items():
        where = f"layer_axes.{name}"
        allowed = {"kinds", "hf", "every", "only"}
        if not isinstance(entry, dict) or set(entry) - allowed:
            raise error(where, f"expected a table with keys among {sorted(allowed)}")
        kinds = entry.get("kinds")
        if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
            raise error(f"{where}.kinds", "expected a non-empty list of kind names")
        every, only = entry.get("every", {}), entry.get("only", {})
        for key, rule, fields in (("every", every, {"dim", "kind"}), ("only", only, {"hf", "kind"})):
            if not isinstance(rule, dict) or (rule and set(rule) != fields):
                raise error(f"{where}.{key}", f"expected a table with keys {sorted(fields)}")
            if rule and rule["kind"] not in kinds:
                raise error(f"{where}.{key}.kind", f"expected one of {kinds}, got {rule['kind']!r}")
        hf = entry.get("hf")
        if hf is not None and not isinstance(hf, str):
            raise error(f"{where}.hf", "expected a config.json key")
        axes.append(
            LayerAxis(
                name=name,
                kinds=tuple(kinds),
                hf=hf,
                every_dim=every.get("dim"),
                every_kind=every.get("kind"),
                only_hf=only.get("hf"),
                only_kind=only.get("kind"),
            )
        )
    return tuple(axes)


def resolve_bodies(
    axes: Sequence[LayerAxis], layers: int, lookup: Callable[[str], Any], dims: dict[str, Any]
) -> tuple[str, ...]:
    """Each layer's body name. lookup(key) reads config.json (None when absent or not an HF checkpoint)."""
    per_axis = [_axis_kinds(axis, layers, lookup, dims) for axis in axes]
    return tuple(BODY_SEPARATOR.join(kinds) for kinds in zip(*per_axis))


def _axis_kinds(axis: LayerAxis, layers: int, lookup: Callable[[str], Any], dims: dict[str, Any]) -> list[str]:
    declared = lookup(axis.hf) if axis.hf else None
    if isinstance(declared, list) and declared:
        if len(declared) != layers or any(k not in axis.kinds for k in declared):
            raise ValueError(f"config {axis.hf} must list {layers} kinds among {list(axis.kinds)}, got {declared}")
        kinds = list(declared)
    else:
        kinds = [axis.kinds[0]] * layers
        interval = int(dims.get(axis.every_dim) or 0) if axis.every_dim else 0
        if interval > 0:
            kinds = [axis.every_kind if (i + 1) % interval == 0 else kinds[i] for i in range(layers)]
    listed = lookup(axis.only_hf) if axis.only_hf else None
    for i in listed or ():
        if 0 <= int(i) < layers:
            kinds[int(i)] = axis.only_kind
    return kinds
