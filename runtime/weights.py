"""Build a plan's parameters from a checkpoint: name mapping, transforms, tying, packing, stacking.

Parameters are grouped the way the generated plan reads them:
  globals   {logical name: array}                 (embedding, final norm, head)
  layers    [{layer-relative name: array}] one dict per layer
  constants [{constant name: array}] one dict per layer (values computed at load, e.g. rope freqs)
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

import numpy as np

from ..compiler.expr import evaluate
from ..compiler.spec import ModelSpec
from ..compiler.weight_transforms import apply_transform
from .checkpoint import Checkpoint
from .dims import ResolvedModel, kind_field
from .loader.errors import CheckpointError

LAYER_PREFIX = "blk.{i}."


class Params(NamedTuple):
    globals: dict[str, Any]
    layers: list[dict[str, Any]]
    constants: list[dict[str, Any]]


class WeightLoader:
    """Fetch one logical weight (GGUF naming, HF layout conventions) from a checkpoint, as float32."""

    def __init__(self, spec: ModelSpec, ckpt: Checkpoint, resolved: ResolvedModel):
        self.spec, self.ckpt, self.resolved = spec, ckpt, resolved
        self.dims = resolved.dims.as_dict()

    def template(self, logical: str) -> tuple[str, int | None]:
        """'blk.3.attn_q.weight' -> ('blk.{i}.attn_q.weight', 3)."""
        if logical.startswith("blk."):
            index, rest = logical[4:].split(".", 1)
            return LAYER_PREFIX + rest, int(index)
        return logical, None

    def fetch(self, logical: str) -> np.ndarray | None:
        template, layer = self.template(logical)
        entry = self.spec.weights.get(template)
        if entry is None:
            raise CheckpointError(self.ckpt.path, f"spec {self.spec.path.name} declares no weight {template!r}")
        if self.ckpt.format == "gguf":
            name, transform = logical, entry.gguf_transform
        else:
            name = entry.hf.format(i=layer) if entry.hf else None
            transform = entry.hf_transform
        if name is None or not self.ckpt.has_tensor(name):
            if entry.tied_to is not None:
                return self.fetch(entry.tied_to if layer is None else entry.tied_to.format(i=layer))
            if entry.optional:
                return None
            raise CheckpointError(self.ckpt.path, f"missing tensor {name or logical!r} "
                                                  f"(weight {logical!r} of {self.spec.path.name})")
        tensor = self.ckpt.load(name)
        expected = tuple(int(evaluate(axis, self.dims)) for axis in entry.shape)
        if tuple(tensor.shape) != expected:
            raise CheckpointError(self.ckpt.path, f"tensor {name!r} has shape {list(tensor.shape)}, "
                                                  f"expected {list(expected)} ({', '.join(entry.shape)})")
        if transform:
            tensor = apply_transform(transform, tensor, self.dims)
        return np.ascontiguousarray(tensor, dtype=np.float32)


def load_params(spec: ModelSpec, manifest: dict, ckpt: Checkpoint, resolved: ResolvedModel,
                to_device: Callable[[np.ndarray], Any] = np.asarray, progress=None) -> Params:
    loader = WeightLoader(spec, ckpt, resolved)
    packed = manifest["packed_weights"]
    layers = int(resolved.dims["layers"])

    def build(name: str, layer: int | None) -> np.ndarray | None:
        prefix = "" if layer is None else f"blk.{layer}."
        if name in packed:
            parts = [loader.fetch(prefix + part) for part in packed[name]]
            return np.concatenate(parts, axis=0)
        return loader.fetch(prefix + name)

    globals_ = {}
    for name in manifest["global_weights"]:
        globals_[name] = to_device(build(name, None))
        _tick(progress)
    per_layer = []
    for i in range(layers):
        per_layer.append({name: to_device(build(name, i)) for name in manifest["layer_weights"]})
        _tick(progress)
    constants = [{name: to_device(_layer_constant(spec, resolved, loader, const, i))
                  for name, const in manifest["layer_constants"].items()} for i in range(layers)]
    return Params(globals_, per_layer, constants)


def _tick(progress) -> None:
    if progress is not None:
        progress.update(1)


def _layer_constant(spec, resolved, loader: WeightLoader, const: dict, layer: int) -> np.ndarray:
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
