"""What a model's weights will take on the device, worked out from the checkpoint's headers before anything is
read or allocated, and the check that refuses a load that cannot fit (issue: fail before the first
allocation, saying how many GB are needed and how many are free).

A weight costs on the device what the loader will place (runtime/loading/weights.py): a matrix in a format
the target keeps (GGUF blocks, FP8, NVFP4) its stored bytes (plus a dense copy in the activation dtype where
the policy asks for dense copies and the plan reads it whole; with the cpu target's kept layout "int8_blocks" a
GGUF matrix costs its int8 codes and float32 block scales and offsets instead), anything else its elements in the activation
dtype. A global weight tied to another (an LM head that is the embedding table) is counted once, as the
loader shares it. The estimate is within the few bytes a layout adds (FP8 per-channel scales widened to
float32, NVFP4's per-row scale).
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np

from ...compiler.kernels.gguf_gemv.layout import GGML_TYPE_FORMATS
from ...compiler.spec import gathered_only_weights
from ...compiler.targets.policy import CPU_BLOCK_LAYOUTS
from ...compiler.weight_transforms import parse_transform
from .formats.errors import CheckpointError
from .weights import ROW_TRANSFORMS, WeightLoader

GB = 1e9


class InsufficientMemoryError(CheckpointError):
    """The model's weights need more device memory than is free."""


def _stored_bytes(ckpt, name: str) -> int:
    if ckpt.format == "gguf":
        return int(ckpt._gguf.tensors[name].nbytes)
    entry = ckpt._hf.entry(name)
    return entry.end - entry.begin


# the cpu target's int8 blocks (compiler/kernels/cpu_gemv/layout.py): elements per float32 scale, and whether the
# format has a float32 offset per block too
INT8_BLOCKS = {"q4_k": (32, True), "q6_k": (16, False), "q8_0": (32, False), "q5_0": (32, False)}


def _int8_block_bytes(fmt: str, shape: tuple[int, ...], nibbles: bool = False) -> int:
    elements = int(np.prod(shape))
    block, offsets = INT8_BLOCKS[fmt]
    codes = elements // 2 if nibbles and fmt == "q4_k" else elements  # Q4_K's codes two per byte
    return codes + 4 * (elements // block) * (2 if offsets else 1)


def _kept_bytes(
    loader: WeightLoader, name: str, transform, shape: tuple[int, ...], kept_layout: str = "planes"
) -> int | None:
    """Device bytes of tensor `name` where the loader keeps it in its stored format (or, kept_layout
    "int8_blocks" / "nibble_blocks", as codes + block scales), else None."""
    ckpt, keep = loader.ckpt, loader.keep_formats
    if len(shape) == 3 and "{e}" not in name and ckpt.format == "gguf" and not transform:  # an expert stack
        return _stored_bytes(ckpt, name) if GGML_TYPE_FORMATS.get(ckpt.ggml_type(name)) in loader.keep_experts else None
    if len(shape) != 2 or "{e}" in name:
        return None
    if ckpt.format == "gguf":
        fmt = GGML_TYPE_FORMATS.get(ckpt.ggml_type(name))
        if fmt in keep and (not transform or parse_transform(transform)[0] in ROW_TRANSFORMS):
            if kept_layout in CPU_BLOCK_LAYOUTS:
                return _int8_block_bytes(fmt, shape, nibbles=kept_layout == "nibble_blocks")
            return _stored_bytes(ckpt, name)
        return None
    if transform:
        return None
    dtype = ckpt.storage_dtype(name)
    if dtype == "F8_E4M3" and "fp8" in keep:
        return _stored_bytes(ckpt, name) + 4 * shape[0]  # + float32 scales, per channel at most
    if dtype == "U8" and "nvfp4" in keep and ckpt.has_tensor(name + "_scale"):
        return _stored_bytes(ckpt, name) + _stored_bytes(ckpt, name + "_scale") + 4 * shape[0]
    return None


def _weights(manifest: dict, resolved) -> Iterator[tuple[str, str, bool]]:
    """(logical name, the manifest's weight name, global?) of every checkpoint tensor the plan loads."""
    packed = manifest["packed_weights"]
    bodies = manifest.get("body_weights")
    names = [(None, n) for n in manifest["global_weights"]]
    for layer in range(int(resolved.dims["layers"])):
        layer_names = bodies[resolved.layer_kinds[layer]] if bodies else manifest["layer_weights"]
        names += [(layer, n) for n in layer_names]
    for layer, name in names:
        prefix = "" if layer is None else f"blk.{layer}."
        for part in packed.get(name, [name]):
            yield prefix + part, name, layer is None


def planned_weight_bytes(
    spec,
    manifest: dict,
    ckpt,
    resolved,
    dtype,
    keep_formats,
    dense_copies: bool,
    shards=None,
    keep_experts=(),
    kept_layout: str = "planes",
) -> int:
    """Device bytes the loader will place for the model's weights (module docstring); on a device mesh, `shards`
    (name, global?) -> how many devices split that weight (runtime/loading/sharding.py Placement.shards),
    and the bytes are one device's. keep_experts: the formats of expert stacks kept packed (no dense copy).
    kept_layout: the policy's (WeightPolicy.kept_layout) for the kept GGUF matrices."""
    loader = WeightLoader(spec, ckpt, resolved, tuple(keep_formats), tuple(keep_experts))
    gathered = gathered_only_weights(spec)
    itemsize = np.dtype(dtype).itemsize
    total, seen = 0, set()
    for logical, weight_name, is_global in _weights(manifest, resolved):
        found = loader.locate(logical)
        if found is None:
            continue
        name, transform, expected, _ = found
        if is_global and (name, transform) in seen:
            continue
        seen.add((name, transform))
        elements = int(np.prod(expected))
        kept = _kept_bytes(loader, name, transform, expected, kept_layout)
        if kept is None:
            total += elements * itemsize // (1 if shards is None else shards(weight_name, is_global))
            continue
        # a kept weight split over a mesh holds whole blocks per device: its share (one kept whole because a
        # shard would cut a block is counted short here; the warning at load names it)
        share = 1 if shards is None else shards(weight_name, is_global)
        total += kept // share
        if dense_copies and weight_name.split(".")[0] not in gathered and ckpt.format == "gguf" and len(expected) == 2:
            total += elements * itemsize // share
    return total


def free_device_bytes(device=None) -> int | None:
    """Bytes free on `device` by JAX's allocator statistics (a GPU), or None where it reports no limit: on the
    cpu target the "device" is the host's memory, shared with every other process and partly reclaimable, so
    its free figure (MemAvailable) would refuse loads that succeed (a test process holding other models: 6.1 GB
    "free" for the 7.1 GB fp32 1.5B); there only an explicit `free_bytes` is checked."""
    device = device or jax.local_devices()[0]  # one this process can ask (a process group: not device 0)
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return None


def keeps_dense_copies(planned, weights, free: int | None) -> tuple[bool, int]:
    """(whether the dense copies stay, the weights' device bytes then): planned(copies) -> bytes. They go where the
    weights with them would take more than weights.dense_copies_max_share of `free` (None: no limit known, the
    policy stands) and leaving them out saves bytes."""
    needed = planned(weights.dense_copies)
    if free is None or not weights.dense_copies or needed <= weights.dense_copies_max_share * free:
        return weights.dense_copies, needed
    without = planned(False)
    return (True, needed) if without >= needed else (False, without)


def check_fits(needed: int, free: int, what: str) -> None:
    """Raise InsufficientMemoryError naming both figures when `needed` bytes exceed `free`."""
    if needed > free:
        raise InsufficientMemoryError(
            what,
            f"the weights need {needed / GB:.2f} GB on the device but only {free / GB:.2f} GB is free; "
            "use a smaller or more quantized checkpoint, or a target that keeps its format packed",
        )
