"""Random GGUF checkpoints at real shapes with a llama.cpp quantization mix, for benchmarks of the
quantized kernels on machines that cannot hold the real file.

`synthetic_gguf_checkpoint(spec, config)` behaves like the GGUF file llama.cpp's `llama-quantize ...
Q4_K_M` would write for an HF checkpoint whose config.json is `config`: the same tensor names and
shapes, the same metadata keys for the spec's dimensions, and the same per-tensor storage type. Each
tensor's bytes are drawn when asked for (`raw`, or `load` to dequantize), seeded by its name.

The Q4_K_M type rule (learned from llama.cpp's src/llama-quant.cpp, checked against real files in
tests/test_synthetic_gguf.py):
  - 1-D tensors, norms and non-`weight` tensors stay F32;
  - output.weight — or token_embd.weight when there is no output.weight (tied) — is Q6_K
    (Q8_0 when its rows are not whole 256-blocks);
  - attn_v.weight and ffn_down.weight are Q6_K in the layers where use_more_bits(i, n) holds, i being
    the tensor's position among its kind in llama-quantize's processing order and n their count:
        i < n/8  or  i >= 7n/8  or  (i - n/8) % 3 == 2          (integer division)
    and Q4_K elsewhere; every other matrix is Q4_K;
  - a row length that is not a multiple of 256 falls back: Q4_K -> Q5_0, Q6_K -> Q8_0 (-> F16 if
    not a multiple of 32 either).
The processing order is the one subtlety: llama.cpp today sorts tensors by layer number
(`layer_order="numeric"`, e.g. the gemma-3-270m file), while older versions walked the converter's
file order, HF's sorted names, where layer 10 comes before layer 2 (`layer_order="lexicographic"`,
e.g. the Qwen2.5-Coder-1.5B file: attn_v is Q6_K in layers 0 1 5 6 7 8 9 10 13 16 19 21 24 27). Both
orders give the same number of Q6_K tensors, so the same bytes per token.

Values: bytes from `random_gguf_bytes(realistic=True)` (uniform codes, small positive fp16 scales),
then every fp16 scale multiplied so that the matrix's rms is ~1/sqrt(in) (measured on its first rows),
as runtime/loading/synthetic.py draws float matrices: activations stay O(1) through many layers, so two
kernels compared on such a model differ by their rounding, not by an amplified chaos.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ...compiler.expr import evaluate
from ...compiler.kernels.gguf_gemv.layout import FORMATS, SCALE_OFFSETS, random_gguf_bytes
from ...compiler.spec import ModelSpec
from .checkpoint import Checkpoint
from .dims import resolve
from .formats.dequant import dequantize
from .formats.gguf_reader import GGUFTensorInfo

SCHEMES = ("q4_k_m", "bf16")
LAYER_ORDERS = ("numeric", "lexicographic")
FILE_TYPE_Q4_K_M = 15  # general.file_type of a llama.cpp "Q4_K_M" file (LLAMA_FTYPE_MOSTLY_Q4_K_M)
FILE_TYPES = {"q4_k_m": FILE_TYPE_Q4_K_M, "bf16": 32}  # LLAMA_FTYPE_MOSTLY_BF16
_LAYER = re.compile(r"^blk\.(\d+)\.")
_RMS_SAMPLE_ROWS = 64
# fp16 scale offsets inside a block, for the formats drawn here that have no device layout
_LEGACY_SCALE_OFFSETS = {"Q5_0": (0,), "Q4_0": (0,)}


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def _fallback(type_name: str, row: int) -> str:
    if row % 256 == 0 or type_name not in ("Q4_K", "Q6_K"):
        return type_name
    smaller = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[type_name]
    return smaller if row % 32 == 0 else "F16"


def q4_k_m_types(shapes: dict[str, tuple[int, ...]], n_layers: int, *, layer_order: str = "numeric") -> dict[str, str]:
    """GGUF tensor name -> ggml type name ("Q4_K", "Q6_K", "F32", ...) of a llama.cpp Q4_K_M file.

    shapes: every tensor of the model, GGUF names, numpy order (rows first; a row is shape[-1])."""
    if layer_order not in LAYER_ORDERS:
        raise ValueError(f"layer_order must be one of {LAYER_ORDERS}, got {layer_order!r}")
    tied = "output.weight" not in shapes
    key = (lambda n: _layer(n)) if layer_order == "numeric" else (lambda n: str(_layer(n)))
    # position of each attn_v / ffn_down tensor among its kind, in llama-quantize's processing order
    position: dict[str, tuple[int, int]] = {}
    for kind, count in (("attn_v.weight", None), ("ffn_down", n_layers)):
        names = sorted((n for n in shapes if kind in n and _layer(n) is not None), key=key)
        position.update({n: (i, count or len(names)) for i, n in enumerate(names)})
    types = {}
    for name, shape in shapes.items():
        if len(shape) < 2 or not name.endswith("weight") or "_norm.weight" in name:
            types[name] = "F32"
        elif name == "output.weight" or (tied and name == "token_embd.weight"):
            types[name] = "Q6_K" if shape[-1] % 256 == 0 else "Q8_0"
        elif name in position:
            types[name] = _fallback("Q6_K" if _use_more_bits(*position[name]) else "Q4_K", shape[-1])
        else:
            types[name] = _fallback("Q4_K", shape[-1])
    return types


def bf16_types(shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """A llama.cpp BF16 file's types: every matrix BF16, vectors and norms F32."""
    return {name: "F32" if len(shape) < 2 or "_norm.weight" in name else "BF16" for name, shape in shapes.items()}


class _ConfigView:
    """An HF config.json with no tensors: enough for `resolve` to compute the dimensions."""

    def __init__(self, config: dict):
        self.config, self.generation_config, self.tensor_names = config, {}, ()


def _metadata_and_shapes(spec: ModelSpec, config: dict, tied: bool | None, scheme: str = "q4_k_m"):
    ckpt = Checkpoint(Path("<config>"), "hf", spec.hf_architectures[0], _hf=_ConfigView(config))
    dims = resolve(spec, ckpt).dims.as_dict()
    arch = spec.gguf_architecture
    metadata = {
        "general.architecture": arch,
        "general.name": f"synthetic {spec.arch} {scheme.upper()}",
        "general.file_type": FILE_TYPES[scheme],
    }
    for name, source in spec.dims.items():
        if source.gguf and name in dims:
            key = source.gguf[0]
            metadata[key if key.startswith(("general.", "tokenizer.")) else f"{arch}.{key}"] = dims[name]
    if tied is None:
        tied = bool(config.get("tie_word_embeddings", False))
    shapes: dict[str, tuple[int, ...]] = {}
    layers = int(dims["layers"])
    for template, entry in spec.weights.items():
        if entry.optional or (entry.tied_to is not None and (tied or entry.hf is None)):
            continue
        shape = tuple(int(evaluate(axis, dims)) for axis in entry.shape)
        for i in range(layers) if "{i}" in template else [None]:
            shapes[template.format(i=i)] = shape
    return metadata, shapes, layers


class _SyntheticGGUF:
    """What Checkpoint asks of a GGUFFile (metadata, tensors, raw, load), with drawn tensors."""

    def __init__(self, path: Path, metadata: dict, types: dict[str, str], shapes: dict, seed: int):
        self.path, self.metadata, self.seed = path, metadata, seed
        self.tensors: dict[str, GGUFTensorInfo] = {}
        for name, type_name in types.items():
            ggml_type = int(GGMLQuantizationType[type_name])
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            nbytes = int(np.prod(shapes[name])) // block * block_bytes
            self.tensors[name] = GGUFTensorInfo(name, shapes[name], ggml_type, type_name, 0, nbytes)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's GGUF bytes (uint8, 1-D), drawn from a generator seeded by its name."""
        info = self.tensors[name]
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        shape, type_name = info.shape, info.type_name
        if type_name == "F32":
            noise = rng.standard_normal(shape, dtype=np.float32)
            if len(shape) == 1:  # norm scales near 1, biases near 0 (runtime/loading/synthetic.py's rule)
                values = 1.0 + 0.02 * noise if name.endswith("norm.weight") else 0.02 * noise
            else:
                values = noise / np.float32(np.sqrt(shape[-1]))
            return np.ascontiguousarray(values, "<f4").view(np.uint8).reshape(-1)
        if type_name in ("F16", "BF16"):
            values = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))
            return values.astype("<f2" if type_name == "F16" else ml_dtypes.bfloat16).view(np.uint8).reshape(-1)
        fmt = type_name.lower()
        if fmt in FORMATS:
            raw = random_gguf_bytes(rng, fmt, shape, realistic=True)
            offsets = SCALE_OFFSETS[fmt]
        elif type_name in _LEGACY_SCALE_OFFSETS:
            raw = self._legacy_bytes(rng, info)
            offsets = _LEGACY_SCALE_OFFSETS[type_name]
        else:
            raise ValueError(f"synthetic GGUF cannot draw {type_name} tensors")
        return self._rescaled(raw, info, offsets)

    @staticmethod
    def _legacy_bytes(rng: np.random.Generator, info: GGUFTensorInfo) -> np.ndarray:
        _, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
        raw = np.frombuffer(rng.bytes(info.nbytes), np.uint8).reshape(-1, block_bytes).copy()
        scale = np.abs(rng.normal(0.0, 0.01, raw.shape[0])).astype("<f2")
        raw[:, 0:2] = scale.view(np.uint8).reshape(-1, 2)
        return raw.reshape(-1)

    @staticmethod
    def _rescaled(raw: np.ndarray, info: GGUFTensorInfo, offsets: tuple[int, ...]) -> np.ndarray:
        """Multiply every fp16 scale so that the matrix's rms is ~1/sqrt(in) (values are linear in them)."""
        rows, inner = info.shape[0], info.shape[-1]
        sample = min(rows, _RMS_SAMPLE_ROWS)
        row_bytes = info.nbytes // rows
        values = dequantize(raw[: sample * row_bytes], info.ggml_type, (sample, inner))
        rms = float(np.sqrt(np.mean(np.square(values, dtype=np.float64))))
        if rms == 0.0:
            return raw
        factor = np.float32(1.0 / (np.sqrt(inner) * rms))
        _, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
        blocks = raw.reshape(-1, block_bytes)
        for start in offsets:
            field = np.ascontiguousarray(blocks[:, start : start + 2]).view("<f2")
            blocks[:, start : start + 2] = (field.astype(np.float32) * factor).astype("<f2").view(np.uint8)
        return raw

    def load(self, name: str) -> np.ndarray:
        info = self.tensors[name]
        return dequantize(self.raw(name), info.ggml_type, info.shape)

    def close(self) -> None:
        pass


def synthetic_gguf_checkpoint(
    spec: ModelSpec,
    config: dict,
    *,
    scheme: str = "q4_k_m",
    seed: int = 0,
    layer_order: str = "numeric",
    tied: bool | None = None,
    types: dict[str, str] | None = None,
) -> Checkpoint:
    """A GGUF Checkpoint of random weights at the shapes `config` (HF config.json keys) gives.

    tied: whether the file lacks output.weight (None: config's tie_word_embeddings, default False;
    specs whose head has no HF name are always tied). types: per-tensor overrides of the scheme's
    choice (ggml type names), e.g. to put a format a test needs at a given tensor."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r} (known: {', '.join(SCHEMES)})")
    metadata, shapes, layers = _metadata_and_shapes(spec, config, tied, scheme)
    chosen = q4_k_m_types(shapes, layers, layer_order=layer_order) if scheme == "q4_k_m" else bf16_types(shapes)
    for name, type_name in (types or {}).items():
        if name not in chosen:
            raise ValueError(f"type override for {name!r}: the model has no such tensor")
        chosen[name] = type_name
    path = Path(f"<synthetic {spec.arch} {scheme}>")
    source = _SyntheticGGUF(path, metadata, chosen, shapes, seed)
    return Checkpoint(path, "gguf", spec.gguf_architecture, _gguf=source)
