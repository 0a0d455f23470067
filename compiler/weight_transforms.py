"""Transforms a loader applies to a tensor so every source ends in the same (GGUF) convention."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

_CALL = re.compile(r"^([a-z_]+)(?:\(([a-z_0-9,]*)\))?$")
# transform -> (least, most) arguments, each a dimension name
_ARG_COUNT = {
    "add_one": (0, 0),
    "neg_exp": (0, 0),
    "squeeze": (0, 0),
    "unpermute_rotary": (1, 1),
    "ungroup_rows": (4, 16),
    "untile_rows": (3, 3),
    "untile_columns": (2, 2),
}
_USAGE = (
    "add_one, neg_exp, squeeze, unpermute_rotary(<heads dim>), "
    "ungroup_rows(<first part>, <end part>, <groups dim>, <part size dim>, ...), "
    "untile_rows(<groups dim>, <head size dim>, <rows before>), untile_columns(<groups dim>, <head size dim>)"
)


def parse_transform(text: str) -> tuple[str, tuple[str, ...]]:
    m = _CALL.match(text.replace(" ", ""))
    if not m or m.group(1) not in _ARG_COUNT:
        raise ValueError(f"unknown transform {text!r} (known: {_USAGE})")
    name = m.group(1)
    args = tuple(a for a in (m.group(2) or "").split(",") if a)
    least, most = _ARG_COUNT[name]
    if not least <= len(args) <= most:
        raise ValueError(f"transform {name} takes {least} to {most} argument(s): {text!r}")
    return name, args


def apply_transform(text: str, tensor: np.ndarray, dims: Mapping[str, Any]) -> np.ndarray:
    name, args = parse_transform(text)
    if name == "add_one":  # norms computing x * (1 + w): GGUF files store 1 + w
        return (tensor.astype(np.float32) + np.float32(1.0)).astype(np.float32)
    if name == "neg_exp":  # a log-parameterised decay rate A_log stored as -exp(A_log) (GGUF's ssm_a)
        return -np.exp(tensor.astype(np.float32))
    if name == "squeeze":  # drop unit axes (a depthwise conv's [C, 1, W] weight stored as [C, W])
        return np.squeeze(tensor)
    if name in ("untile_rows", "untile_columns"):
        groups, size = _int_or_dim(args[0], dims), _int_or_dim(args[1], dims)
        skip = 0 if name == "untile_columns" else _int_or_dim(args[2], dims)
        moved = np.moveaxis(tensor, 1, 0) if name == "untile_columns" else tensor
        out = np.concatenate([moved[:skip], _untiled(moved[skip:], groups, size)], axis=0)
        return np.moveaxis(out, 0, 1) if name == "untile_columns" else out
    if name == "ungroup_rows":
        parts = _ungroup_rows(tensor, int(dims[args[2]]), [int(dims[a]) for a in args[3:]])
        return np.concatenate(parts[int(args[0]) : int(args[1])], axis=0)
    # GGML's converter reorders each head's q/k rows from HF's halves layout into GGML's pairs
    # layout; invert it: rows [h, 2, dh/2] were stored as [h, dh/2, 2].
    heads = int(dims[args[0]])
    rows = tensor.shape[0]
    rest = tensor.shape[1:]
    return tensor.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(tensor.shape)


def _ungroup_rows(tensor: np.ndarray, groups: int, sizes: list[int]) -> list[np.ndarray]:
    """A fused projection whose rows are grouped (per key head: [part 0, part 1, ...] of `sizes` rows each)
    -> [every group's part 0, every group's part 1, ...]: the flat layout of separate projections
    (ungroup_rows(first, end, ...) keeps parts first..end - 1, concatenated)."""
    per_group = tensor.reshape(groups, sum(sizes), *tensor.shape[1:])
    bounds = np.cumsum([0, *sizes])
    parts = [per_group[:, lo:hi].reshape(groups * (hi - lo), *tensor.shape[1:]) for lo, hi in zip(bounds, bounds[1:])]
    return parts


def _int_or_dim(arg: str, dims: Mapping[str, Any]) -> int:
    return int(arg) if arg.isdigit() else int(dims[arg])


def _untiled(rows: np.ndarray, groups: int, size: int) -> np.ndarray:
    """Heads of `size` rows stored tiled (head t * groups + g: how some GGUF converters order value heads over key groups)
    -> grouped (head g * per_group + t: each key group's value heads together, as HF and the ops keep them)."""
    per_group = rows.shape[0] // (groups * size)
    tiled = rows.reshape(per_group, groups, size, *rows.shape[1:])
    return np.swapaxes(tiled, 0, 1).reshape(rows.shape)
