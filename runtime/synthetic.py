"""Random-valued checkpoints at real shapes, for benchmarks on machines that cannot hold real weights.

`synthetic_checkpoint(spec, config)` behaves like an HF checkpoint folder whose config.json is
`config` and whose every tensor (named and shaped as the spec says) is drawn from a seeded normal
distribution, scaled so activations stay finite through many layers.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from ..compiler.expr import evaluate
from ..compiler.spec import ModelSpec
from .checkpoint import Checkpoint
from .dims import resolve


class _SyntheticSource:
    def __init__(self, spec: ModelSpec, config: dict, seed: int):
        self.spec, self.config, self.seed = spec, config, seed
        self.generation_config: dict = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.tensor_names: tuple[str, ...] = ()

    def bind(self, ckpt: Checkpoint) -> None:
        dims = resolve(self.spec, ckpt).dims.as_dict()
        layers = int(dims["layers"])
        for template, entry in self.spec.weights.items():
            if not entry.hf or entry.optional:
                continue
            shape = tuple(int(evaluate(axis, dims)) for axis in entry.shape)
            for i in range(layers) if "{i}" in entry.hf else [None]:
                self.shapes[entry.hf.format(i=i)] = shape
        self.tensor_names = tuple(self.shapes)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def load(self, name: str) -> np.ndarray:
        shape = self.shapes[name]
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        if len(shape) == 1:  # norm scales and biases: near 1 / near 0
            return (1.0 + 0.02 * rng.standard_normal(shape) if name.endswith("norm.weight")
                    else 0.02 * rng.standard_normal(shape)).astype(np.float32)
        return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1])))


def synthetic_checkpoint(spec: ModelSpec, config: dict, seed: int = 0) -> Checkpoint:
    source = _SyntheticSource(spec, config, seed)
    ckpt = Checkpoint(Path(f"<synthetic {spec.arch}>"), "hf", spec.hf_architectures[0], _hf=source)
    source.bind(ckpt)
    return ckpt
