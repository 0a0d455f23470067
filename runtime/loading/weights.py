"""Build a plan's parameters from a checkpoint: name mapping, transforms, tying, packing, stacking.

Parameters are grouped the way the generated plan reads them:
  globals   {logical name: array}                 (embedding, final norm, head)
  layers    [{layer-relative name: array}] one dict per layer
  constants [{constant name: array}] one dict per layer (values computed at load, e.g. rope freqs)

A target may keep GGUF formats packed on the device (`Target.quantized_formats`): such a weight is
fetched as its raw blocks (row transforms like unpermute_rotary move whole block rows: each row of a
GGUF matrix is whole blocks) and repacked into a `QuantizedWeight` (compiler/kernels/gguf_gemv/layout.py).
Packed parallel linears (q/k/v, gate/up) of one format are one QuantizedWeight over the concatenated
rows; parts of different formats (Q4_K q/k beside a Q6_K v) stay apart in a `WeightGroup`. FP8 matrices
of HF checkpoints (runtime/loading/fp8_checkpoint.py) are kept the same way when the target keeps "fp8", as an
`Fp8Weight`, and dequantized otherwise; NVFP4 matrices (runtime/loading/nvfp4_checkpoint.py) likewise as an
`Nvfp4Weight` where the target keeps "nvfp4". Every other tensor (norms, biases, formats not kept) is float.
With `dense_copy` (Target.dense_copies), each kept GGUF weight a step reads whole (not an embedding table it
only gathers from) also gets its dequantized copy: a `DenseBacked` pair, dequantized on the device.
GGUF expert stacks [E, out, in] in a format of `keep_experts` (WeightPolicy.packed_experts) stay packed as
compiler/kernels/moe/packed.py lays them out, with no dense copy; other stacks are dequantized.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.expr import evaluate
from ...compiler.kernels.dense_gemv.fp8 import BLOCK
from ...compiler.kernels.gguf_gemv.layout import (
    FORMATS,
    GGML_TYPE_FORMATS,
    QuantizedWeight,
    WeightGroup,
    pack,
)
from ...compiler.kernels.moe.packed import EXPERT_FORMATS, pack_experts
from ...compiler.spec import ModelSpec, gathered_only_weights
from ...compiler.weight_transforms import apply_transform, parse_transform
from .checkpoint import Checkpoint
from .dims import ResolvedModel, kind_field
from .formats.errors import CheckpointError
from .fp8_checkpoint import HostFp8, concat_rows, is_fp8, read_fp8
from .nvfp4_checkpoint import HostNvfp4, concat_nvfp4, is_nvfp4, read_nvfp4
from .prefetch import LOAD_WORKERS, prefetched

KEPT_FORMATS = (*FORMATS, "fp8", "nvfp4")  # what Target.quantized_formats may name

LAYER_PREFIX = "blk.{i}."


class Params(NamedTuple):
    globals: dict[str, Any]
    layers: list[dict[str, Any]]
    constants: list[dict[str, Any]]


# Transforms that only reorder a matrix's rows, so they apply to GGUF block rows unchanged.
ROW_TRANSFORMS = frozenset({"unpermute_rotary"})


class RawWeight(NamedTuple):
    """A GGUF matrix kept quantized, on the host: its blocks row by row, transforms applied."""

    blocks: np.ndarray  # uint8 [out, bytes per row] (an expert stack: [E * out, bytes per row])
    format: str  # layout format name ("q4_k", ...)
    shape: tuple[int, ...]  # (out, in) in elements, or (E, out, in) for an expert stack

    def packed(self) -> QuantizedWeight:
        if len(self.shape) == 3:
            return pack_experts(self.blocks, self.format, self.shape)
        return pack(self.blocks, self.format, self.shape)


class WeightLoader:
    """Fetch one logical weight (GGUF naming, HF layout conventions) from a checkpoint, as float32 —
    or, with `keep_formats`, as raw GGUF blocks (`fetch_raw`)."""

    def __init__(
        self,
        spec: ModelSpec,
        ckpt: Checkpoint,
        resolved: ResolvedModel,
        keep_formats: tuple[str, ...] = (),
        keep_experts: tuple[str, ...] = (),
    ):
        self.spec, self.ckpt, self.resolved = spec, ckpt, resolved
        self.dims = resolved.dims.as_dict()
        unknown = set(keep_formats) - set(KEPT_FORMATS)
        if unknown:
            raise ValueError(f"no device layout for {sorted(unknown)} (known: {', '.join(KEPT_FORMATS)})")
        if set(keep_experts) - set(EXPERT_FORMATS):
            raise ValueError(f"no expert layout for {sorted(set(keep_experts) - set(EXPERT_FORMATS))}")
        self.keep_formats = frozenset(keep_formats)
        self.keep_experts = frozenset(keep_experts)

    def template(self, logical: str) -> tuple[str, int | None]:
        """'blk.3.attn_q.weight' -> ('blk.{i}.attn_q.weight', 3)."""
        if logical.startswith("blk."):
            index, rest = logical[4:].split(".", 1)
            return LAYER_PREFIX + rest, int(index)
        return logical, None

    def locate(self, logical: str) -> tuple[str, str | None, tuple[int, ...], Any] | None:
        """(tensor name in the checkpoint, transform, expected shape, spec entry) after following ties;
        None for an absent optional weight."""
        template, layer = self.template(logical)
        entry = self.spec.weights.get(template)
        if entry is None:
            raise CheckpointError(self.ckpt.path, f"spec {self.spec.path.name} declares no weight {template!r}")
        if self.ckpt.format == "gguf":
            name = entry.gguf.replace("{i}", str(layer)) if entry.gguf else logical
            transform = entry.gguf_transform
        else:
            # {e}: one tensor per expert, stacked along a new first axis (GGUF's ffn_*_exps layout)
            name = entry.hf.replace("{i}", str(layer)) if entry.hf else None
            transform = entry.hf_transform
        if name is None or not self.ckpt.has_tensor(name.replace("{e}", "0")):
            if entry.tied_to is not None:
                return self.locate(entry.tied_to if layer is None else entry.tied_to.format(i=layer))
            if entry.optional:
                return None
            raise CheckpointError(
                self.ckpt.path, f"missing tensor {name or logical!r} (weight {logical!r} of {self.spec.path.name})"
            )
        expected = tuple(int(evaluate(axis, self.dims)) for axis in entry.shape)
        return name, transform, expected, entry

    def _check_shape(self, name: str, shape: tuple[int, ...], expected: tuple[int, ...], entry) -> None:
        if tuple(shape) != expected:
            raise CheckpointError(
                self.ckpt.path,
                f"tensor {name!r} has shape {list(shape)}, expected {list(expected)} ({', '.join(entry.shape)})",
            )

    def fetch(self, logical: str) -> np.ndarray | None:
        found = self.locate(logical)
        if found is None:
            return None
        name, transform, expected, entry = found
        if "{e}" in name:
            tensor = np.stack([self._load(name.replace("{e}", str(e))) for e in range(expected[0])])
        else:
            tensor = self._load(name)
        if transform:  # the shape checked is the transformed one (a transform may reshape or select rows)
            tensor = apply_transform(transform, tensor, self.dims)
        self._check_shape(name, tensor.shape, expected, entry)
        return np.ascontiguousarray(tensor, dtype=np.float32)

    def _load(self, name: str) -> np.ndarray:
        if is_nvfp4(self.ckpt, name):
            return read_nvfp4(self.ckpt, name).dequantized()
        return read_fp8(self.ckpt, name).dequantized() if is_fp8(self.ckpt, name) else self.ckpt.load(name)

    def fetch_raw(self, logical: str) -> RawWeight | None:
        """The weight's GGUF blocks when it is a matrix in a kept format (and its transform only moves
        rows), or an expert stack (one [E, out, in] tensor, no transform) in a format of keep_experts; None
        when it must be dequantized instead (or is an absent optional weight)."""
        if not (self.keep_formats or self.keep_experts) or self.ckpt.format != "gguf":
            return None
        found = self.locate(logical)
        if found is None:
            return None
        name, transform, expected, entry = found
        fmt = GGML_TYPE_FORMATS.get(self.ckpt.ggml_type(name))
        if len(expected) == 3 and "{e}" not in name and not transform and fmt in self.keep_experts:
            self._check_shape(name, self.ckpt.tensor_shape(name), expected, entry)
            blocks = self.ckpt.raw(name).reshape(expected[0] * expected[1], -1)  # whole blocks per row
            return RawWeight(np.ascontiguousarray(blocks), fmt, expected)
        if fmt not in self.keep_formats or len(expected) != 2:
            return None
        if transform and parse_transform(transform)[0] not in ROW_TRANSFORMS:
            return None
        self._check_shape(name, self.ckpt.tensor_shape(name), expected, entry)
        blocks = self.ckpt.raw(name).reshape(expected[0], -1)  # [out, bytes per row]: whole blocks per row
        if transform:
            blocks = apply_transform(transform, blocks, self.dims)
        return RawWeight(np.ascontiguousarray(blocks), fmt, expected)

    def fetch_fp8(self, logical: str) -> HostFp8 | None:
        """The weight's FP8 values and scales when it is stored in FP8, the target keeps "fp8", no transform
        changes it and (128-block scales) its rows fill whole blocks; else None (fetch dequantizes it)."""
        if "fp8" not in self.keep_formats or self.ckpt.format != "hf":
            return None
        found = self.locate(logical)
        if found is None or found[1] or "{e}" in found[0] or not is_fp8(self.ckpt, found[0]):
            return None
        name, _, expected, entry = found
        self._check_shape(name, self.ckpt.tensor_shape(name), expected, entry)
        weight = read_fp8(self.ckpt, name)
        return None if weight.blocked and expected[0] % BLOCK else weight

    def fetch_nvfp4(self, logical: str) -> HostNvfp4 | None:
        """The weight's NVFP4 codes and scales when it is stored so, the target keeps "nvfp4" and no transform
        changes it; else None (fetch dequantizes it)."""
        if "nvfp4" not in self.keep_formats or self.ckpt.format != "hf":
            return None
        found = self.locate(logical)
        if found is None or found[1] or "{e}" in found[0] or not is_nvfp4(self.ckpt, found[0]):
            return None
        weight = read_nvfp4(self.ckpt, found[0])
        self._check_shape(found[0], weight.weight().shape, found[2], found[3])
        return weight

    def fetch_kept(self, logical: str) -> RawWeight | HostFp8 | HostNvfp4 | np.ndarray | None:
        """fetch_raw / fetch_fp8 / fetch_nvfp4 where the format is kept, else fetch (float32)."""
        kept = self.fetch_raw(logical)
        if kept is None:
            kept = self.fetch_fp8(logical)
        if kept is None:
            kept = self.fetch_nvfp4(logical)
        return kept if kept is not None else self.fetch(logical)


def load_params(
    spec: ModelSpec,
    manifest: dict,
    ckpt: Checkpoint,
    resolved: ResolvedModel,
    to_device: Callable[[Any], Any] = np.asarray,
    progress=None,
    keep_formats: tuple[str, ...] = (),
    dense_copy: Callable[[Any], Any] | None = None,
    shard: Callable[[str, bool, Any], Any] | None = None,
    keep_experts: tuple[str, ...] = (),
) -> Params:
    """to_device places each value: a float array, or (with keep_formats) a QuantizedWeight or WeightGroup — see
    `device_placer`; dense_copy (`dense_copier`) then pairs a placed kept weight with its dense copy, except for
    weights the plan only gathers rows from and expert stacks kept packed (keep_experts); shard(name, layer,
    value) places over a mesh (sharding.py) instead."""
    loader = WeightLoader(spec, ckpt, resolved, keep_formats, keep_experts)
    gathered = gathered_only_weights(spec)
    placed: dict[tuple, Any] = {}  # (checkpoint tensor, transform) of a global weight -> its device value

    def place(name: str, value, source: tuple | None = None, layer: bool = False):
        # a global tied to another (an LM head that is the embedding table) shares its device arrays: one
        # copy of a 151936 x 1536 table is 467 MB in bf16
        if source is not None and source in placed:
            value = placed[source]
        else:
            value = to_device(value) if shard is None or value is None else shard(name, layer, value)
            if source is not None:
                placed[source] = value
        return value if dense_copy is None or name.split(".")[0] in gathered else dense_copy(value)

    def source_of(name: str) -> tuple | None:
        """The checkpoint tensor and transform a global weight of one tensor reads (None: a packed weight)."""
        if name in manifest["packed_weights"]:
            return None
        found = loader.locate(name)
        return None if found is None else (found[0], found[1])

    packed = manifest["packed_weights"]
    layers = int(resolved.dims["layers"])

    def build(name: str, layer: int | None) -> np.ndarray | QuantizedWeight | HostFp8 | WeightGroup | None:
        prefix = "" if layer is None else f"blk.{layer}."
        if name in packed:
            return _combine([loader.fetch_kept(prefix + part) for part in packed[name]])
        value = loader.fetch_kept(prefix + name)
        if isinstance(value, HostNvfp4) and name.split(".")[0] in gathered:  # only gathered from: float rows
            return value.dequantized()
        return value.packed() if isinstance(value, RawWeight) else value

    # host work (reading the file, repacking GGUF blocks: numpy, which releases the GIL) runs ahead on worker
    # threads while this thread places the values built before (device copies, dense copies)
    parts = [(name, None) for name in manifest["global_weights"]] + [(None, i) for i in range(layers)]

    def build_part(part: tuple[str | None, int | None]):
        name, layer = part
        if name is not None:
            return build(name, None)
        return {n: build(n, layer) for n in _body_weights(manifest, resolved, layer)}

    globals_, per_layer = {}, []
    for (name, _), value in zip(parts, prefetched(build_part, parts, LOAD_WORKERS)):
        if name is not None:
            globals_[name] = place(name, value, source_of(name) if value is not None else None)
        else:
            per_layer.append({n: place(n, v, layer=True) for n, v in value.items()})
        _tick(progress)
    constants = [
        {
            name: place_constant(layer_constant(spec, resolved, loader, const, i))
            for name, const in manifest["layer_constants"].items()
            if const.get("body", "layer") in ("layer", resolved.layer_kinds[i])
        }
        for i in range(layers)
    ]
    return Params(globals_, per_layer, constants)


def _body_weights(manifest: dict, resolved: ResolvedModel, layer: int) -> list[str]:
    """The weights a layer loads: its body's (a plan with [layer_axes] bodies), else every layer's."""
    bodies = manifest.get("body_weights")
    return bodies[resolved.layer_kinds[layer]] if bodies else manifest["layer_weights"]


def _combine(parts: list) -> np.ndarray | QuantizedWeight | WeightGroup:
    """One packed weight from its parts' rows (floats and/or RawWeights), in part order.

    Consecutive parts of one kind are concatenated (floats as floats; one format's GGUF rows, which is
    concatenating the packed planes along `out`), so Q4_K q + k beside a Q6_K v is two matmuls, not three;
    kinds that differ stay apart in a WeightGroup."""
    runs: list[tuple[str | None, list]] = []  # (format, or None for float; consecutive parts)
    for part in parts:
        kind = (
            part.format
            if isinstance(part, RawWeight)
            else ("fp8_block" if part.blocked else "fp8")
            if isinstance(part, HostFp8)
            else "nvfp4"
            if isinstance(part, HostNvfp4)
            else None
        )
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(part)
        else:
            runs.append((kind, [part]))
    merged = [
        np.concatenate(items, axis=0)
        if kind is None
        else concat_rows(items)
        if kind.startswith("fp8")
        else concat_nvfp4(items)
        if kind == "nvfp4"
        else RawWeight(
            np.concatenate([r.blocks for r in items]), kind, (sum(r.shape[0] for r in items), items[0].shape[1])
        ).packed()
        for kind, items in runs
    ]
    return merged[0] if len(merged) == 1 else WeightGroup(tuple(merged))


def place_constant(value) -> jax.Array:
    """A layer constant on the device at full precision whatever the activation dtype: integers (a sliding
    window, a state-kind index) as int32, floats (RoPE inverse frequencies) as float32. In bf16 a window
    of 1000 reads as 1000 ± 4 and an inverse frequency is off by up to 2^-9, which turns into radians of
    rotation error by position ~1000 (HF keeps inv_freq in float32 too)."""
    array = np.asarray(value)
    return jnp.asarray(array, jnp.int32 if np.issubdtype(array.dtype, np.integer) else jnp.float32)


def _tick(progress) -> None:
    if progress is not None:
        progress.update(1)


def layer_constant(spec, resolved, loader: WeightLoader, const: dict, layer: int) -> np.ndarray:
    module, function = const["function"].split(":")
    fn = getattr(importlib.import_module(module), function)
    kwargs = {key: _constant_arg(spec, resolved, loader, arg, layer) for key, arg in const["args"].items()}
    return np.asarray(fn(**kwargs))


def _constant_arg(spec, resolved, loader: WeightLoader, arg: dict, layer: int) -> Any:
    if "dim" in arg:
        return resolved.dims[arg["dim"]]
    if "kind" in arg:
        return kind_field(spec, resolved, layer, arg["kind"])
    if "per_kind" in arg:  # a literal chosen by the layer's kind (e.g. its KV state kind's index)
        return arg["per_kind"][resolved.layer_kinds[layer]]
    if "expr" in arg:
        return int(evaluate(arg["expr"], resolved.dims.as_dict()))
    if "weight" in arg:
        return loader.fetch(arg["weight"])
    return arg["value"]
