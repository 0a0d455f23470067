"""Random-valued checkpoints at real shapes, for benchmarks on machines that cannot hold real weights.

Every tensor (named and shaped as the spec says for an HF checkpoint whose config.json is `config`)
is drawn by one generator, `random_tensor`: jax.random on the default device, seeded per tensor name,
scaled so activations stay finite through many layers (matrices ~ N(0, 1/fan_in), norm scales near 1,
biases near 0). Two ways to use it:

- `synthetic_model(spec, config, target=...)` builds the plan's parameters directly on the device in
  the plan's activation dtype: an 8B bf16 model in seconds, with no float32 copy on the host.
  `weight_format="fp8"` / `"fp8_block"` stores every layer's projections in FP8 instead (per-channel or
  128 x 128 block scales, compiler/kernels/dense_gemv/fp8.py; embedding and head stay in the activation dtype, as
  in FP8 checkpoints), for targets whose projections take them.
- `synthetic_checkpoint(spec, config)` is a Checkpoint for the normal loader (`load_model`): each
  tensor is drawn the same way and copied to the host as float32.

Both give the same values (bit for bit where the activation dtype is float32): same names, same seeds,
the same packing, tying and per-source transforms as `runtime/loading/weights.py`.
"""

from __future__ import annotations

import functools
import math
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.expr import evaluate
from ...compiler.spec import ModelSpec
from ...compiler.weight_transforms import apply_transform
from .checkpoint import Checkpoint
from .dims import resolve


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "kind"))
def _draw(key: jax.Array, *, shape: tuple[int, ...], dtype, kind: str) -> jax.Array:
    # drawn in float32 and cast inside one executable: no float32 copy of a big tensor is kept
    noise = jax.random.normal(key, shape, jnp.float32)
    if kind == "norm":
        value = 1.0 + 0.02 * noise
    elif kind == "bias":
        value = 0.02 * noise
    else:
        value = noise * (1.0 / math.sqrt(shape[-1]))
    return value.astype(dtype)


def random_tensor(name: str, shape: tuple[int, ...], *, seed: int = 0, dtype=jnp.float32) -> jax.Array:
    """The synthetic value of the checkpoint tensor `name`, on the default device."""
    key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(name.encode()))
    kind = "matrix" if len(shape) > 1 else "norm" if name.endswith("norm.weight") else "bias"
    return _draw(key, shape=tuple(int(n) for n in shape), dtype=jnp.dtype(dtype), kind=kind)


class _SyntheticSource:
    """What Checkpoint asks of an HF folder (config, tensor names and shapes, load), with drawn tensors."""

    def __init__(self, spec: ModelSpec, config: dict, seed: int):
        self.spec, self.config, self.seed = spec, config, seed
        self.generation_config: dict = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.tensor_names: tuple[str, ...] = ()

    def bind(self, ckpt: Checkpoint) -> None:
        dims = resolve(self.spec, ckpt).dims.as_dict()
        layers = int(dims["layers"])
        for entry in self.spec.weights.values():
            if not entry.hf or entry.optional:
                continue
            shape = tuple(int(evaluate(axis, dims)) for axis in entry.shape)
            for i in range(layers) if "{i}" in entry.hf else [None]:
                self.shapes[entry.hf.format(i=i)] = shape
        self.tensor_names = tuple(self.shapes)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def load(self, name: str) -> np.ndarray:
        return np.asarray(random_tensor(name, self.shapes[name], seed=self.seed))


def synthetic_checkpoint(spec: ModelSpec, config: dict, seed: int = 0) -> Checkpoint:
    source = _SyntheticSource(spec, config, seed)
    ckpt = Checkpoint(Path(f"<synthetic {spec.arch}>"), "hf", spec.hf_architectures[0], _hf=source)
    source.bind(ckpt)
    return ckpt


def synthetic_model(
    spec: ModelSpec,
    config: dict,
    *,
    target: str = "cpu",
    seed: int = 0,
    weight_format: str | None = None,
    kernel_policy: str | Path | None = None,
):
    """A Model whose parameters are drawn on the device, in the plan's activation dtype (weight_format:
    None, or one of FP8_FORMATS for the layers' projections)."""
    from ...compiler.kernels.dense_gemv.fp8 import FP8_FORMATS
    from ...compiler.targets import get_target
    from .model import Model, effective_policy, enable_compilation_cache
    from .plans import load_plan

    if weight_format is not None:
        if weight_format not in FP8_FORMATS:
            raise ValueError(f"unknown weight format {weight_format!r} (known: {', '.join(FP8_FORMATS)})")
        if not get_target(target).kernels["linear"].endswith("gguf_gemv.linear:linear"):
            raise ValueError(f"target {target!r} has no FP8 projections (its linear op takes float arrays)")
    enable_compilation_cache()
    ckpt = synthetic_checkpoint(spec, config, seed)
    resolved = resolve(spec, ckpt)
    plan = load_plan(spec, target)
    dtype = jnp.dtype(plan.manifest["activation_dtype"])
    params = _device_params(spec, plan.manifest, ckpt, resolved, dtype, seed, weight_format)
    return Model(spec, ckpt, resolved, plan, params, dtype, effective_policy(target, kernel_policy))


def _device_params(
    spec: ModelSpec, manifest: dict, ckpt: Checkpoint, resolved, dtype, seed: int, weight_format: str | None = None
):
    """The plan's Params (runtime/loading/weights.py's grouping) with every weight drawn on the device."""
    from .weights import Params, WeightLoader, layer_constant, place_constant

    loader = WeightLoader(spec, ckpt, resolved)  # its name mapping, ties and shapes; the (host) layer constants
    dims = resolved.dims.as_dict()

    def logical(name: str) -> jax.Array | None:  # one logical (GGUF-named) weight, as the loader maps it
        found = loader.locate(name)
        if found is None:  # an absent optional weight
            return None
        hf_name, transform, shape, _ = found
        if not transform:
            return random_tensor(hf_name, shape, seed=seed, dtype=dtype)
        # transforms run in float32, as the loader's do, then the result is cast
        value = random_tensor(hf_name, shape, seed=seed, dtype=jnp.float32)
        return jnp.asarray(apply_transform(transform, value, dims), dtype)

    packed = manifest["packed_weights"]

    def build(name: str, layer: int | None) -> jax.Array | None:
        prefix = "" if layer is None else f"blk.{layer}."
        if name in packed:
            return jnp.concatenate([logical(prefix + part) for part in packed[name]], axis=0)
        return logical(prefix + name)

    def layer_weight(name: str, layer: int):
        value = build(name, layer)
        if weight_format is None or value is None or value.ndim != 2:
            return value
        from ...compiler.kernels.dense_gemv.fp8 import quantize_fp8

        return quantize_fp8(value, blocked=weight_format == "fp8_block", dtype=str(dtype))

    layers = int(resolved.dims["layers"])
    globals_ = {name: build(name, None) for name in manifest["global_weights"]}
    per_layer = [{name: layer_weight(name, i) for name in manifest["layer_weights"]} for i in range(layers)]
    constants = [
        {
            name: place_constant(layer_constant(spec, resolved, loader, const, i))
            for name, const in manifest["layer_constants"].items()
        }
        for i in range(layers)
    ]
    return Params(globals_, per_layer, constants)
