"""One view over the two checkpoint formats: an HF folder (safetensors) or a GGUF file.

The rest of the runtime asks a checkpoint for config values and for tensors by their *source* name;
which spec it needs follows from its declared architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .formats.errors import CheckpointError
from .formats.gguf_reader import GGUFFile
from .formats.safetensors_dir import open_hf_checkpoint

MISSING = object()


@dataclass
class Checkpoint:
    path: Path
    format: str  # "hf" | "gguf"
    architecture: str  # HF architectures[0] or GGUF general.architecture
    _gguf: GGUFFile | None = None
    _hf: Any = None

    @property
    def config(self) -> dict:
        return self._hf.config if self._hf is not None else {}

    @property
    def metadata(self) -> dict:
        return self._gguf.metadata if self._gguf is not None else {}

    @property
    def generation_config(self) -> dict:
        return self._hf.generation_config if self._hf is not None else {}

    def has_tensor(self, name: str) -> bool:
        return name in (self._gguf.tensors if self._gguf is not None else self._hf.tensor_names)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        if self._gguf is not None:
            return tuple(self._gguf.tensors[name].shape)
        return tuple(self._hf.tensor_shape(name))  # header only: no tensor data is read

    def load(self, name: str) -> np.ndarray:
        """float32 [numpy shape] of a tensor by its name in this checkpoint."""
        return (self._gguf or self._hf).load(name)

    def storage_dtype(self, name: str) -> str | None:
        """An HF tensor's safetensors dtype ("BF16", "F8_E4M3", ...); None for GGUF checkpoints (ggml_type)."""
        if self._hf is None or not hasattr(self._hf, "entry"):
            return None
        return self._hf.entry(name).dtype

    def load_fp8(self, name: str) -> np.ndarray:
        """An HF F8_E4M3 tensor's values, unscaled (float8_e4m3fn)."""
        if self._hf is None:
            raise CheckpointError(self.path, f"tensor {name!r}: FP8 tensors exist only in HF checkpoints here")
        return self._hf.load_fp8(name)

    def load_u8(self, name: str) -> np.ndarray:
        """An HF U8 tensor's stored bytes (NVFP4's packed codes)."""
        if self._hf is None:
            raise CheckpointError(self.path, f"tensor {name!r}: U8 tensors exist only in HF checkpoints here")
        return self._hf.load_u8(name)

    def ggml_type(self, name: str) -> int | None:
        """The GGUF storage type id of a tensor (12 = Q4_K, ...); None for HF checkpoints."""
        return self._gguf.tensors[name].ggml_type if self._gguf is not None else None

    def raw(self, name: str) -> np.ndarray:
        """A GGUF tensor's stored bytes (uint8, 1-D; rows of whole quant blocks), not dequantized."""
        if self._gguf is None:
            raise CheckpointError(self.path, f"tensor {name!r}: raw GGUF blocks exist only in GGUF checkpoints")
        return self._gguf.raw(name)

    def tensor_bytes(self) -> int:
        """Bytes of every tensor as stored (GGUF blocks, safetensors data): what the weights cost on disk."""
        if self._gguf is not None:
            return sum(int(info.nbytes) for info in self._gguf.tensors.values())
        return sum(self._hf.entry(name).end - self._hf.entry(name).begin for name in self._hf.tensor_names)

    def lookup(self, key: str) -> Any:
        """A config value: a dotted path into config.json, or a GGUF metadata key; MISSING if absent."""
        if self._gguf is not None:
            return self._gguf.metadata.get(key, MISSING)
        node: Any = self._hf.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node or node[part] is None:
                return MISSING
            node = node[part]
        return node


def open_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    if path.is_dir():
        hf = open_hf_checkpoint(path)
        archs = hf.config.get("architectures") or []
        if not archs or not isinstance(archs, list):
            raise CheckpointError(path / "config.json", "has no 'architectures' list naming the model class")
        return Checkpoint(path, "hf", archs[0], _hf=hf)
    if path.is_file():
        gguf = GGUFFile(path)
        arch = gguf.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointError(path, "GGUF metadata has no general.architecture")
        return Checkpoint(path, "gguf", arch, _gguf=gguf)
    raise CheckpointError(path, "no such file or folder")


def is_missing(value: Any) -> bool:
    return value is MISSING
