"""FP8 checkpoints (HF safetensors): a projection stored as F8_E4M3 values beside its scale.

  `<name>_scale`      per tensor ([] or [1]) or per output channel ([out, 1] or [out]): compressed-tensors
                      ("FP8-dynamic" models) and fbgemm_fp8 checkpoints
  `<name>_scale_inv`  one per 128 x 128 block, [⌈out/128⌉, ⌈in/128⌉]: the "fp8" method with
                      weight_block_size [128, 128] (DeepSeek-V3, Qwen3-FP8)
In both the weight is values x scale ("_inv" names what the quantizer divided by). A target that keeps
"fp8" (Target.quantized_formats) gets the values and scales as a compiler/kernels/dense_gemv/fp8.py Fp8Weight (a
per-tensor scale becomes a per-channel one); any other gets the dequantized float32 matrix.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...compiler.kernels.dense_gemv.fp8 import BLOCK, Fp8Weight, dequantize_fp8
from .checkpoint import Checkpoint
from .formats.errors import CheckpointError

FP8_STORAGE = "F8_E4M3"


class HostFp8(NamedTuple):
    """An FP8 matrix on the host: values float8_e4m3fn [out, in]; scale float32 [out] or [R, C] blocks."""

    values: np.ndarray
    scale: np.ndarray

    @property
    def blocked(self) -> bool:
        return self.scale.ndim == 2

    def dequantized(self) -> np.ndarray:
        return np.asarray(dequantize_fp8(Fp8Weight(self.values, self.scale)))


def is_fp8(ckpt: Checkpoint, name: str) -> bool:
    return ckpt.format == "hf" and ckpt.storage_dtype(name) == FP8_STORAGE


def read_fp8(ckpt: Checkpoint, name: str) -> HostFp8:
    """The FP8 tensor `name` with its scale (CheckpointError when the scale is missing or misshapen)."""
    values = ckpt.load_fp8(name)
    if values.ndim != 2:
        raise CheckpointError(
            ckpt.path, f"FP8 tensor {name!r} has shape {list(values.shape)}; only matrices are supported"
        )
    out, inner = values.shape
    if ckpt.has_tensor(name + "_scale_inv"):
        scale = ckpt.load(name + "_scale_inv")
        blocks = (-(-out // BLOCK), -(-inner // BLOCK))
        if scale.shape != blocks:
            raise CheckpointError(
                ckpt.path,
                f"{name}_scale_inv has shape {list(scale.shape)}, expected "
                f"{list(blocks)} (128 x 128 blocks of a {out} x {inner} matrix)",
            )
        return HostFp8(values, np.ascontiguousarray(scale, np.float32))
    if not ckpt.has_tensor(name + "_scale"):
        raise CheckpointError(ckpt.path, f"FP8 tensor {name!r} has no {name}_scale or {name}_scale_inv")
    scale = np.asarray(ckpt.load(name + "_scale"), np.float32)
    if scale.size == 1:
        scale = np.full(out, scale.reshape(()), np.float32)
    elif scale.shape in ((out,), (out, 1)):
        scale = scale.reshape(out)
    else:
        raise CheckpointError(
            ckpt.path,
            f"{name}_scale has shape {list(scale.shape)}: expected one scale, or one per output channel ({out})",
        )
    return HostFp8(values, np.ascontiguousarray(scale))


def concat_rows(parts: list[HostFp8]) -> HostFp8:
    """Parts stacked along `out` (q/k/v, gate/up): per-channel scales stack; 128-block scales stack when every
    part but the last fills whole 128-row blocks (the loader keeps only such parts as FP8)."""
    return HostFp8(np.concatenate([p.values for p in parts]), np.concatenate([p.scale for p in parts]))
