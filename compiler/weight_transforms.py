"""Transforms a loader applies to a tensor so every source ends in the same (GGUF) convention."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

_CALL = re.compile(r"^([a-z_]+)(?:\(([a-z_]*)\))?$")
_ARG_COUNT = {"add_one": 0, "unpermute_rotary": 1}


def parse_transform(text: str) -> tuple[str, str | None]:
    m = _CALL.match(text.replace(" ", ""))
    if not m or m.group(1) not in _ARG_COUNT:
        raise ValueError(f"unknown transform {text!r} (known: add_one, unpermute_rotary(<heads dim>))")
    name, arg = m.group(1), m.group(2) or None
    if (arg is not None) != bool(_ARG_COUNT[name]):
        raise ValueError(f"transform {name} takes {_ARG_COUNT[name]} argument(s): {text!r}")
    return name, arg


def apply_transform(text: str, tensor: np.ndarray, dims: Mapping[str, Any]) -> np.ndarray:
    name, arg = parse_transform(text)
    if name == "add_one":  # norms computing x * (1 + w): GGUF files store 1 + w
        return (tensor.astype(np.float32) + np.float32(1.0)).astype(np.float32)
    # GGML's converter reorders each head's q/k rows from HF's halves layout into GGML's pairs
    # layout; invert it: rows [h, 2, dh/2] were stored as [h, dh/2, 2].
    heads = int(dims[arg])
    rows = tensor.shape[0]
    rest = tensor.shape[1:]
    return tensor.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(tensor.shape)
