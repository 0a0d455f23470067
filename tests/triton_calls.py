"""Shared by the lowering tests: the XLA Triton custom calls a function lowers to for an NVIDIA GPU."""

from __future__ import annotations

import re

import jax

from ember.compiler.kernels.triton.launch import XLA_TRITON_TARGET


def triton_calls(fn, *args) -> list[dict]:
    """The XLA Triton custom calls of fn lowered for an NVIDIA GPU: name, grid, warps, stages, IR."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = []
    for line in text.splitlines():
        if XLA_TRITON_TARGET not in line:
            continue
        field = lambda key: int(re.search(rf"{key} = (\d+) : i32", line).group(1))  # noqa: E731
        calls.append(
            {
                "name": re.search(r'name = "([^"]+)"', line).group(1),
                "grid": (field("grid_x"), field("grid_y"), field("grid_z")),
                "num_warps": field("num_warps"),
                "num_stages": field("num_stages"),
                "ir": re.search(r'ir = "(.*?)", name', line).group(1),
            }
        )
    return calls
