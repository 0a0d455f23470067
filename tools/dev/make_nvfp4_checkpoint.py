"""Write an HF checkpoint in NVIDIA ModelOpt's NVFP4 layout from a float one, and its float twin (the NVFP4
weights dequantized, stored as F32), for the loader's tests: the twin's logits are what the NVFP4 checkpoint
must give wherever it is dequantized at load.

Every `*_proj.weight` matrix becomes `weight` (U8 [out, in/2]), `weight_scale` (F8_E4M3 [out, in/16]),
`weight_scale_2` (F32 [1]) and `input_scale` (F32 [1], unused by the loader), quantized by
compiler/kernels/nvfp4/reference.py's quantize_nvfp4; every other tensor is copied. config.json gets
`quantization_config` {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, ...} and the folder
an hf_quant_config.json, as ModelOpt's export writes them.

  python -m ember.tools.dev.make_nvfp4_checkpoint SOURCE_DIR OUT_DIR   (writes OUT_DIR/nvfp4, OUT_DIR/plain)
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from ember.compiler.kernels.nvfp4.reference import Nvfp4Weight, dequantize_nvfp4, quantize_nvfp4
from ember.runtime.loading.formats.safetensors_dir import open_hf_checkpoint

SAFETENSORS_DTYPES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.uint8): "U8",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
}
QUANTIZATION = {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        dtype = SAFETENSORS_DTYPES[np.asarray(array).dtype]
        header[name] = {"dtype": dtype, "shape": list(np.shape(array)), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def write_nvfp4_pair(source: Path, out: Path) -> tuple[Path, Path]:
    """(NVFP4 checkpoint dir, float twin dir) under `out` from the float HF checkpoint `source`."""
    original = open_hf_checkpoint(source)
    nvfp4, plain = {}, {}
    for name in original.tensor_names:
        w = original.load(name)
        if not name.endswith("_proj.weight"):
            nvfp4[name] = plain[name] = w
            continue
        packed, scales, scale_2 = quantize_nvfp4(w)
        nvfp4[name] = packed
        nvfp4[name + "_scale"] = scales
        nvfp4[name + "_scale_2"] = np.asarray([scale_2], np.float32)
        nvfp4[name.removesuffix("weight") + "input_scale"] = np.asarray([1.0], np.float32)
        row_scale = np.full(w.shape[0], scale_2, np.float32)
        plain[name] = np.asarray(dequantize_nvfp4(Nvfp4Weight(packed, scales.view(np.uint8), row_scale)))
    original.close()
    config = json.loads((source / "config.json").read_text())
    dirs = []
    for label, tensors in (("nvfp4", nvfp4), ("plain", plain)):
        folder = out / label
        folder.mkdir(parents=True, exist_ok=True)
        for extra in source.iterdir():  # tokenizer files and the like
            if extra.is_file() and extra.name not in ("config.json", "model.safetensors", "reference.npz"):
                shutil.copy(extra, folder / extra.name)
        written = dict(config)
        if label == "nvfp4":
            written["quantization_config"] = {"quant_method": "modelopt", **QUANTIZATION}
            producer = {"name": "modelopt", "version": "test"}
            (folder / "hf_quant_config.json").write_text(
                json.dumps({"producer": producer, "quantization": QUANTIZATION})
            )
        (folder / "config.json").write_text(json.dumps(written, indent=1))
        write_safetensors(folder / "model.safetensors", tensors)
        dirs.append(folder)
    return dirs[0], dirs[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(*write_nvfp4_pair(args.source, args.out))


if __name__ == "__main__":
    main()
