"""Facts about the served checkpoint that the Ollama and LM Studio model listings report: bytes on
disk, parameter count, quantization, a stable digest, and the architecture's config values under
GGUF's key names. Computed once per checkpoint (headers only: no tensor data is read)."""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# llama.cpp's `general.file_type` (enum llama_ftype) -> the name Ollama and LM Studio show.
_GGUF_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
}
# Spec dimension name -> the key GGUF metadata keeps it under (after "<arch>.").
_GGUF_DIM_KEYS = {
    "d": "embedding_length",
    "layers": "block_count",
    "hq": "attention.head_count",
    "hkv": "attention.head_count_kv",
    "dh": "attention.key_length",
    "ffn": "feed_forward_length",
    "vocab": "vocab_size",
    "eps": "attention.layer_norm_rms_epsilon",
    "theta": "rope.freq_base",
}


@dataclass(frozen=True)
class ModelFacts:
    format: str  # "gguf" | "safetensors"
    size_bytes: int  # the checkpoint's weight file(s)
    parameter_count: int
    quantization: str  # "Q4_K_M", "BF16", "F32", ...
    digest: str  # sha256 hex of the path and size: stable while the files are
    modified_at: float  # mtime of the newest weight file

    @property
    def parameter_size(self) -> str:
        return human_parameter_count(self.parameter_count)


_FACTS: dict[tuple[str, int], ModelFacts] = {}


def model_facts(model) -> ModelFacts:
    ckpt = model.checkpoint
    key = (str(ckpt.path), id(model))
    if key not in _FACTS:
        _FACTS[key] = _compute(ckpt)
    return _FACTS[key]


def _compute(ckpt) -> ModelFacts:
    path = Path(ckpt.path)
    gguf = getattr(ckpt, "_gguf", None)
    hf = getattr(ckpt, "_hf", None)
    if gguf is not None:
        files = [path]
        shapes = [info.shape for info in gguf.tensors.values()]
        quant = _GGUF_FILE_TYPES.get(ckpt.metadata.get("general.file_type")) or _dominant(
            {name: (info.type_name, info.nbytes) for name, info in gguf.tensors.items()}
        )
        fmt = "gguf"
    else:
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        names = tuple(getattr(hf, "tensor_names", ()) or ())
        shapes = [ckpt.tensor_shape(name) for name in names]
        quant = _hf_quantization(ckpt.config, hf, names)
        fmt = "safetensors"
    stats = [f.stat() for f in files if f.exists()]
    size = sum(s.st_size for s in stats)
    modified = max((s.st_mtime for s in stats), default=0.0)
    digest = hashlib.sha256(f"{path.resolve()}:{size}".encode()).hexdigest()
    params = sum(math.prod(shape) for shape in shapes)
    return ModelFacts(fmt, size, int(params), quant, digest, modified)


def _dominant(types_and_bytes: dict[str, tuple[str, int]]) -> str:
    """The tensor type holding the most bytes (a file without general.file_type)."""
    total: Counter = Counter()
    for type_name, nbytes in types_and_bytes.values():
        total[str(type_name).upper()] += int(nbytes)
    return total.most_common(1)[0][0] if total else "unknown"


def _hf_quantization(config: dict, hf, names: tuple[str, ...]) -> str:
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        bits = quant.get("bits")
        return f"{quant['quant_method']}".upper() + (f"-{bits}bit" if bits else "")
    counts: Counter = Counter()
    for name in names:
        try:
            entry = hf.entry(name)
        except Exception:  # a checkpoint view without entries: fall back to the config's dtype
            break
        counts[entry.dtype] += math.prod(entry.shape)
    if counts:
        return counts.most_common(1)[0][0]
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(dtype, dtype.upper() or "unknown")


def human_parameter_count(count: int) -> str:
    """Ollama's spelling: "8.0B", "1.5B", "494.03M", "12.50K"."""
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    if count >= 1_000_000:
        return f"{count / 1e6:.2f}M"
    if count >= 1_000:
        return f"{count / 1e3:.2f}K"
    return str(count)


def architecture_info(model, context_length: int) -> dict[str, Any]:
    """`general.*` and `<arch>.*` keys in GGUF's naming (Ollama's `model_info`). A GGUF checkpoint's
    own scalar metadata comes first; `<arch>.context_length` is the context this server accepts."""
    arch = model.spec.arch
    info: dict[str, Any] = {}
    metadata = model.checkpoint.metadata or {}
    for key, value in metadata.items():
        if isinstance(value, (str, int, float, bool)) and key != "tokenizer.chat_template":
            info[key] = value
    info["general.architecture"] = arch
    facts = model_facts(model)
    info["general.parameter_count"] = facts.parameter_count
    dims = model.dims.as_dict()
    for name, key in _GGUF_DIM_KEYS.items():
        value = dims.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            info.setdefault(f"{arch}.{key}", value)
    info[f"{arch}.context_length"] = int(context_length)
    return info
