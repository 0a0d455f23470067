"""NVFP4 weights (NVIDIA ModelOpt's checkpoint layout) on the device, and their `jnp` reference.

A [out, in] matrix is stored as
  packed  uint8  [out, in / 2]    two E2M1 codes per byte: element 2j in the low nibble of byte j, 2j + 1 in
                                  the high one; a code is sign (bit 3), exponent (bits 1-2), mantissa (bit 0):
                                  0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives
  scales  uint8  [out, in / 16]   one FP8 E4M3 scale per 16 consecutive elements of a row (its bits)
  row_scale float32 [out]         the checkpoint's per-tensor FP32 `weight_scale_2`, per row so that
                                  projections stacked along `out` (q/k/v, gate/up) keep their own
  w[r, k] = e2m1(code[r, k]) * e4m3(scales[r, k // 16]) * row_scale[r]
An E2M1 value times an E4M3 scale has at most 6 significant bits, so it is exact in bf16; the per-row scale is
applied to the fp32 product. The checkpoint's `input_scale` (activation quantization for FP4 tensor cores)
is not used: Hopper has none, activations stay bf16 (W4A16).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

GROUP = 16  # elements per FP8 scale
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


class Nvfp4Weight(NamedTuple):
    """One NVFP4 [out, in] matrix (module docstring); a pytree whose leaves are the three arrays."""

    packed: jax.Array | np.ndarray
    scales: jax.Array | np.ndarray
    row_scale: jax.Array | np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.packed.shape[0]), 2 * int(self.packed.shape[1]))

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in self)


def e4m3_values(bits: jax.Array) -> jax.Array:
    """uint8 E4M3 bit patterns -> float32."""
    return jax.lax.bitcast_convert_type(bits.astype(jnp.uint8), jnp.float8_e4m3fn).astype(jnp.float32)


def dequantize_nvfp4(w: Nvfp4Weight) -> jax.Array:
    """Nvfp4Weight -> float32 [out, in]."""
    packed = jnp.asarray(w.packed)
    codes = jnp.stack([packed & 15, packed >> 4], axis=-1).reshape(w.shape)  # [out, in]: element order
    values = jnp.asarray(E2M1_VALUES)[codes.astype(jnp.int32)]
    scales = jnp.repeat(e4m3_values(jnp.asarray(w.scales)), GROUP, axis=1)
    return values * scales * jnp.asarray(w.row_scale, jnp.float32)[:, None]


def nvfp4_matmul_ref(x: jax.Array, w: Nvfp4Weight) -> jax.Array:
    """x [m, in] @ W.T -> [m, out] in x's dtype, fp32 accumulation (exact fp32 products)."""
    y = jnp.einsum("mk,ok->mo", x.astype(jnp.float32), dequantize_nvfp4(w), precision=jax.lax.Precision.HIGHEST)
    return y.astype(x.dtype)


def quantize_nvfp4(weight: np.ndarray, global_scale: float | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """A float [out, in] matrix -> (packed uint8 [out, in/2], scales float8_e4m3fn [out, in/16], weight_scale_2)
    as ModelOpt's export lays them out: the per-tensor scale maps the largest group scale to E4M3's 448, each
    group's scale maps its largest magnitude to E2M1's 6, codes round to the nearest E2M1 value. For writing
    test checkpoints (tools/dev/make_nvfp4_checkpoint.py); the loader never quantizes."""
    weight = np.asarray(weight, np.float32)
    out, inner = weight.shape
    if inner % GROUP:
        raise ValueError(f"NVFP4 rows must be whole groups of {GROUP}, got {inner}")
    groups = weight.reshape(out, inner // GROUP, GROUP)
    amax = np.abs(groups).max(axis=-1)
    if global_scale is None:
        global_scale = float(max(amax.max(), 1e-12) / (6.0 * 448.0))
    scales = (amax / 6.0 / global_scale).astype(ml_dtypes.float8_e4m3fn)
    denominator = scales.astype(np.float32)[..., None] * global_scale
    quotients = np.where(denominator > 0, groups / np.where(denominator > 0, denominator, 1), 0)
    codes = np.clip(quotients, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(out, inner) & 15
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, scales, global_scale
