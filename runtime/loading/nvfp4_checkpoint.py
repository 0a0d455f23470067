"""NVFP4 checkpoints (NVIDIA ModelOpt's HF export): a projection `<p>.weight` stored as

  `<p>.weight`          U8      [out, in / 2]   two E2M1 codes per byte, element 2j in the low nibble
  `<p>.weight_scale`    F8_E4M3 [out, in / 16]  one scale per 16 consecutive elements of a row
  `<p>.weight_scale_2`  F32     [] or [1]       the per-tensor scale
  `<p>.input_scale`     F32     [] or [1]       the activations' per-tensor scale (FP4 activations on
                                                Blackwell tensor cores; unused here: W4A16)
declared by config.json's `quantization_config` {"quant_method": "modelopt", "quant_algo": "NVFP4",
"group_size": 16, ...} and/or hf_quant_config.json's `quantization` {"quant_algo": "NVFP4", "group_size": 16,
"exclude_modules": [...]} (excluded modules are stored in bf16 and load as any float tensor). The weight is
e2m1(code) * weight_scale * weight_scale_2 (compiler/kernels/nvfp4/reference.py). A target that keeps "nvfp4"
gets an Nvfp4Weight (packed on the device); any other the dequantized float32 matrix.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

from ...compiler.kernels.nvfp4.reference import GROUP, Nvfp4Weight, dequantize_nvfp4
from .checkpoint import Checkpoint
from .formats.errors import CheckpointError


class HostNvfp4(NamedTuple):
    """An NVFP4 matrix on the host: packed uint8 [out, in/2], scales uint8 E4M3 bits [out, in/16], row_scale
    float32 [out] (the tensor's weight_scale_2 on each of its rows)."""

    packed: np.ndarray
    scales: np.ndarray
    row_scale: np.ndarray

    def weight(self) -> Nvfp4Weight:
        return Nvfp4Weight(self.packed, self.scales, self.row_scale)

    def dequantized(self) -> np.ndarray:
        return np.asarray(dequantize_nvfp4(self.weight()))


def quantization(ckpt: Checkpoint) -> dict | None:
    """The checkpoint's ModelOpt quantization block (config.json's quantization_config, else
    hf_quant_config.json's `quantization`); None when it declares none."""
    declared = ckpt.config.get("quantization_config")
    if isinstance(declared, dict) and declared.get("quant_method") in ("modelopt", "modelopt_fp4"):
        return declared
    path = ckpt.path / "hf_quant_config.json" if ckpt.format == "hf" else None
    if path is not None and path.is_file():
        block = json.loads(path.read_text()).get("quantization")
        return block if isinstance(block, dict) else None
    return None


def check_quantization(ckpt: Checkpoint) -> None:
    """Refuse a ModelOpt NVFP4 checkpoint whose group size is not 16 (the only layout read here)."""
    block = quantization(ckpt)
    if block and str(block.get("quant_algo", "")).upper() == "NVFP4" and int(block.get("group_size", GROUP)) != GROUP:
        raise CheckpointError(ckpt.path, f"NVFP4 group_size {block['group_size']}: only {GROUP} is supported")


def is_nvfp4(ckpt: Checkpoint, name: str) -> bool:
    return (
        ckpt.format == "hf"
        and ckpt.storage_dtype(name) == "U8"
        and ckpt.has_tensor(name + "_scale")
        and ckpt.has_tensor(name + "_scale_2")
    )


def read_nvfp4(ckpt: Checkpoint, name: str) -> HostNvfp4:
    """The NVFP4 tensor `name` with its scales (CheckpointError where a shape does not fit the layout)."""
    check_quantization(ckpt)
    packed = ckpt.load_u8(name)
    if packed.ndim != 2:
        raise CheckpointError(ckpt.path, f"NVFP4 tensor {name!r} has shape {list(packed.shape)}; expected a matrix")
    out, inner = packed.shape[0], 2 * packed.shape[1]
    if ckpt.storage_dtype(name + "_scale") != "F8_E4M3":
        raise CheckpointError(ckpt.path, f"{name}_scale is {ckpt.storage_dtype(name + '_scale')}, expected F8_E4M3")
    scales = ckpt.load_fp8(name + "_scale").view(np.uint8)
    if inner % GROUP or scales.shape != (out, inner // GROUP):
        raise CheckpointError(
            ckpt.path,
            f"{name}_scale has shape {list(scales.shape)}, expected {[out, inner // GROUP]} "
            f"(one per {GROUP} of a {out} x {inner} matrix)",
        )
    scale_2 = np.asarray(ckpt.load(name + "_scale_2"), np.float32)
    if scale_2.size != 1:
        raise CheckpointError(ckpt.path, f"{name}_scale_2 has shape {list(scale_2.shape)}; expected one value")
    return HostNvfp4(packed, np.ascontiguousarray(scales), np.full(out, scale_2.reshape(()), np.float32))


def concat_nvfp4(parts: list[HostNvfp4]) -> HostNvfp4:
    """Parts stacked along `out` (q/k/v, gate/up), each row keeping its own tensor's scale."""
    return HostNvfp4(*(np.concatenate([getattr(p, f) for p in parts]) for f in HostNvfp4._fields))
