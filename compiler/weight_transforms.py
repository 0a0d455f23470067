"""Transforms a loader applies to a tensor so every source ends in the same (GGUF) convention."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

_CALL = re.compile(r"^([a-z_]+)(?:\(([a-z_0-9,]*)\))?$")
# transform -> (least, most) arguments, each a dimension name
_ARG_COUNT = {"add_one": (0, 0), "unpermute_rotary": (1, 1), "ungroup_rows": (2, 16)}
_USAGE = "add_one, unpermute_rotary(<heads dim>), ungroup_rows(<groups dim>, <part size dim>, ...)"


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
    if name == "ungroup_rows":
        return _ungroup_rows(tensor, int(dims[args[0]]), [int(dims[a]) for a in args[1:]])
    # GGML's converter reorders each head's q/k rows from HF's halves layout into GGML's pairs
    # layout; invert it: rows [h, 2, dh/2] were stored as [h, dh/2, 2].
    heads = int(dims[args[0]])
    rows = tensor.shape[0]
    rest = tensor.shape[1:]
    return tensor.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(tensor.shape)


def _ungroup_rows(tensor: np.ndarray, groups: int, sizes: list[int]) -> np.ndarray:
    """A fused projection whose rows are grouped (per key head: [part 0, part 1, ...] of `sizes` rows each)
    -> every group's part 0, then every group's part 1, ...: the flat layout of separate projections."""
    per_group = tensor.reshape(groups, sum(sizes), *tensor.shape[1:])
    bounds = np.cumsum([0, *sizes])
    parts = [per_group[:, lo:hi].reshape(groups * (hi - lo), *tensor.shape[1:]) for lo, hi in zip(bounds, bounds[1:])]
    return np.concatenate(parts, axis=0)
