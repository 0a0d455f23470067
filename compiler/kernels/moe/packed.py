"""GGUF-quantized expert stacks kept packed on the device: the layout, its host packing and the `jnp` dequantizer.

An expert stack [E, out, in] (GGUF's ffn_*_exps tensors) is E matrices of whole blocks; on the device it is a
QuantizedWeight whose `shape` is (E, out, in) and whose planes are each expert's planes of
compiler/kernels/gguf_gemv/layout.py stacked along a new first axis, expert-major:

  Q4_K  qs [E, in/256, out, 32] u32, scales [E, in/256, out, 3] u32, d / dmin [E, in/256, out] f16
  Q6_K  ql [E, in/256, out, 32] u32, qh [E, in/256, out, 16] u32, scales [E, in/256, out, 16] i8, d f16
  Q8_0  qs [E, in/32, out, 32] i8, d [E, in/32, out] f16
  Q5_0  qs [E, in/32, out, 16] u8, qh [E, in/32, out] u32, d [E, in/32, out] f16

so one expert's planes are the dense layout of its [out, in] matrix, at offset expert * (plane size / E): a
kernel reading only the chosen experts offsets its plane pointers and walks the blocks as the dense GEMVs do
(packed_kernels.py). The bytes are GGUF's (a 30B-A3B Q4_K_M's experts stay ~16 GB instead of ~57 GB in bf16).
"""

from __future__ import annotations

import jax
import numpy as np

from ember.compiler.kernels.gguf_gemv.layout import FORMATS, QuantizedWeight, pack
from ember.compiler.kernels.gguf_gemv.reference import dequantize

# the formats an expert stack may be kept in (packed_kernels.py decodes each); WeightPolicy.packed_experts names them
EXPERT_FORMATS = tuple(FORMATS)


def is_packed_experts(w) -> bool:
    """Whether `w` is an expert stack kept packed (a 3-D QuantizedWeight)."""
    return isinstance(w, QuantizedWeight) and len(w.shape) == 3


def pack_experts(raw: np.ndarray, fmt: str, shape: tuple[int, int, int]) -> QuantizedWeight:
    """GGUF bytes of an [E, out, in] expert stack (E * out rows of whole blocks) -> the stacked device layout."""
    experts, out, inner = shape
    per_expert = np.ascontiguousarray(raw, dtype=np.uint8).reshape(experts, -1)
    packed = [pack(per_expert[e], fmt, (out, inner)) for e in range(experts)]
    planes = {name: np.stack([p.planes[name] for p in packed]) for name in packed[0].planes}
    return QuantizedWeight(planes, packed[0].format, (experts, out, inner))


def dequantize_experts(w: QuantizedWeight) -> jax.Array:
    """A packed expert stack -> float32 [E, out, in], each expert as gguf_gemv/reference.py dequantizes it
    (bit-equal to the `gguf` package)."""
    matrix = tuple(w.shape[1:])
    return jax.vmap(lambda planes: dequantize(QuantizedWeight(planes, w.format, matrix)))(w.planes)


def dense_experts(w, dtype=None) -> jax.Array:
    """An expert stack as a float array: a packed one dequantized (to `dtype`, float32 by default), a float
    one unchanged."""
    if not is_packed_experts(w):
        return w
    values = dequantize_experts(w)
    return values if dtype is None else values.astype(dtype)
