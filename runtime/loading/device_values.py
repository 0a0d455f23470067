"""Placing loaded weights on the device (load_params' `to_device` and `dense_copy`): float arrays in the
activation dtype, kept formats as their device layouts, and the dense copies of kept GGUF weights
(runtime/loading/weights.py builds the values; this module puts them where the plan reads them)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.kernels.cpu_gemv.layout import from_quantized
from ...compiler.kernels.dense_gemv.fp8 import Fp8Weight
from ...compiler.kernels.gguf_gemv.layout import DenseBacked, QuantizedWeight, WeightGroup
from ...compiler.kernels.gguf_gemv.reference import dequantize
from ...compiler.kernels.kept_shards import dense_like
from ...compiler.kernels.moe.packed import is_packed_experts
from ...compiler.kernels.nvfp4.reference import Nvfp4Weight
from ...compiler.targets.policy import CPU_BLOCK_LAYOUTS
from .fp8_checkpoint import HostFp8
from .nvfp4_checkpoint import HostNvfp4


def host_form(value, dtype, kept_layout: str = "planes"):
    """A kept value in the form device_placer gives it, its arrays still on the host (so a mesh placement sends
    each device only its shard): FP8 values and scales, GGUF planes tagged with `dtype`; None where the form is
    made on the device (int8 blocks: a jitted repack) or the value is not kept."""
    name = np.dtype(dtype).name
    if isinstance(value, HostFp8):
        return Fp8Weight(value.values, np.asarray(value.scale, np.float32), name)
    if isinstance(value, QuantizedWeight) and kept_layout == "planes" and not is_packed_experts(value):
        return value._replace(dtype=name)
    return None


def device_placer(dtype, kept_layout: str = "planes") -> Callable[[Any], Any]:
    """A load_params `to_device`: float arrays -> device arrays of the activation `dtype`; quantized
    weights -> their planes on the device unchanged (uint32 / int8 / fp16), tagged with `dtype`, or with
    kept_layout "int8_blocks" / "nibble_blocks" (the cpu target's: WeightPolicy.kept_layout) their codes and block
    scales (Q4_K's codes two per byte with "nibble_blocks")."""
    name = np.dtype(dtype).name

    def place(value):
        if isinstance(value, HostFp8):
            return Fp8Weight(jnp.asarray(value.values), jnp.asarray(value.scale, jnp.float32), name)
        if isinstance(value, HostNvfp4):
            return Nvfp4Weight(*(jax.device_put(a) for a in value))
        if isinstance(value, QuantizedWeight):
            placed = value._replace(planes={k: jax.device_put(p) for k, p in value.planes.items()}, dtype=name)
            if kept_layout in CPU_BLOCK_LAYOUTS and not is_packed_experts(placed):
                return from_quantized(placed, nibbles=kept_layout == "nibble_blocks")
            return placed
        if isinstance(value, WeightGroup):
            return WeightGroup(tuple(place(part) for part in value.parts))
        return jnp.asarray(value, dtype)

    return place


@functools.partial(jax.jit, static_argnums=1)
def _dequantized(weight: QuantizedWeight, dtype: str) -> jax.Array:
    return dequantize(weight).astype(dtype)


def dense_copier(dtype) -> Callable[[Any], Any]:
    """A load_params `dense_copy`: a kept GGUF weight (a QuantizedWeight, or a WeightGroup of them and float
    parts) -> DenseBacked(weight, its dequantized [out, in] copy in `dtype`, computed where the weight lives);
    anything else (floats, FP8) unchanged. The copy holds exactly what dequantizing at every call gave."""
    name = np.dtype(dtype).name

    def dense_part(part):
        return _dequantized(part, name) if isinstance(part, QuantizedWeight) else jnp.asarray(part, name)

    def copy(value):
        if is_packed_experts(value):  # read only where chosen: no copy (a 30B-A3B's would be ~57 GB)
            return value
        if isinstance(value, QuantizedWeight):  # split over a mesh: the copy split as the blocks are
            return DenseBacked(value, dense_like(dense_part(value), value.split))
        # a group holds at least one kept part (_combine merges float parts); FP8 parts get no copy
        if isinstance(value, WeightGroup) and not any(isinstance(p, (Fp8Weight, Nvfp4Weight)) for p in value.parts):
            return DenseBacked(value, jnp.concatenate([dense_part(p) for p in value.parts], axis=0))
        return value

    return copy
