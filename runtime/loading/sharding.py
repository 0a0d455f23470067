"""A model spread over a device mesh of one host: its plans, and where each weight and state array lives.

Tensor parallelism is XLA's SPMD partitioner at work (compiler/targets/mesh.py): the plan is the ordinary one,
compiled for the mesh (parallel linears kept apart, the manifest recording each weight's split:
compiler/sharding.py), its weights and KV pools are placed as arrays sharded over the mesh's one axis, and jit
partitions every step, inserting the all-reduces and gathers. Nothing here runs a collective itself.

- A weight the manifest splits is placed split from the host (each device receives its shard only); a split
  whose dimension does not divide by the mesh is kept whole, except a head count of at least as many heads as
  devices, which is an error (MeshError: the mesh must divide the attention heads).
- Kept quantized weights (GGUF blocks as planes or int8 blocks, FP8 and its scales) are split as the manifest
  says along whole blocks (compiler/kernels/kept_shards.py), and carry their split so their kernels run per
  shard; a split that would cut a block keeps that weight whole on every device, with a warning line (the step
  stays correct: XLA gathers the split activation it reads). NVFP4 weights are replicated.
- Paged KV pools [blocks, block_size, hkv, dh] are split over the KV heads when those divide by the mesh,
  replicated otherwise (fewer KV heads than devices); recurrent slot state is replicated.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ...compiler.expr import evaluate
from ...compiler.kernels.kept_shards import BlockBoundaryError, WeightSplit, place_split
from ...compiler.spec import ModelSpec
from ...compiler.targets.mesh import MESH_AXIS, MeshConfig
from .device_values import host_form
from .dims import Dims


class MeshError(ValueError):
    """A mesh this model or this host cannot take (too many devices, heads that do not divide)."""


def device_mesh(config: MeshConfig) -> Mesh:
    """The first `tensor_parallel` devices of the default backend as a one-axis mesh."""
    devices = jax.devices()
    if config.tensor_parallel > len(devices):
        raise MeshError(
            f"--tensor-parallel {config.tensor_parallel} needs {config.tensor_parallel} devices, "
            f"{len(devices)} {devices[0].platform} device(s) visible"
            + (
                " (on the cpu target: XLA_FLAGS=--xla_force_host_platform_device_count=N)"
                if devices[0].platform == "cpu"
                else ""
            )
        )
    return Mesh(np.array(devices[: config.tensor_parallel]), (MESH_AXIS,))


def split_axes(manifest: dict, dims: Dims, size: int) -> dict[str, dict[str, int]]:
    """{"global"|"layer": {weight: axis}} of the manifest's splits that hold for these dims and mesh size. The
    largest head count split (the query heads) must divide by the mesh; a smaller one (KV heads) may stay whole
    when there are fewer such heads than devices."""
    values = dims.as_dict()
    lengths = {
        split["divides"]: (int(evaluate(split["divides"], values)), split["kind"])
        for splits in manifest.get("weight_sharding", {}).values()
        for split in splits.values()
    }
    most_heads = max((n for n, kind in lengths.values() if kind == "heads"), default=0)
    for dim, (length, kind) in lengths.items():
        if kind == "heads" and length % size and (length == most_heads or length >= size):
            raise MeshError(f"--tensor-parallel {size} does not divide the model's {length} heads ({dim})")
        if kind == "experts" and length % size:
            raise MeshError(f"--expert-parallel: --tensor-parallel {size} does not divide the {length} experts")
    out: dict[str, dict[str, int]] = {"global": {}, "layer": {}}
    for section, splits in manifest.get("weight_sharding", {}).items():
        for name, split in splits.items():
            if lengths[split["divides"]][0] % size == 0:
                out[section][name] = split["axis"]
    return out


@dataclass(frozen=True)
class Placement:
    """Where a model's arrays live on its mesh."""

    config: MeshConfig
    mesh: Mesh
    splits: dict[str, dict[str, int]]  # {"global"|"layer": {weight name: split axis}}
    kv_heads_split: bool  # paged pools split over their KV heads (else replicated)
    # kept weights the manifest splits but left whole, and why (filled while loading)
    kept_whole: dict[str, str] = field(default_factory=dict, compare=False)

    def sharding(self, spec: tuple = ()) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def weight_sharding(self, name: str, layer: bool, ndim: int) -> NamedSharding:
        axis = self.splits["layer" if layer else "global"].get(name)
        if axis is None:
            return self.sharding()
        return self.sharding(tuple(MESH_AXIS if i == axis else None for i in range(ndim)))

    def paged_sharding(self) -> NamedSharding:
        """A paged pool [blocks, block_size, hkv, dh]."""
        return self.sharding((None, None, MESH_AXIS, None) if self.kv_heads_split else ())

    def shard(
        self, to_device: Callable[[Any], Any], dtype, kept_layout: str = "planes"
    ) -> Callable[[str, bool, Any], Any]:
        """load_params' `shard`: a float weight straight from the host to its shards; a kept quantized one split
        along whole blocks where the manifest splits it (`split_kept`), else replicated over the mesh: from the
        host too where its device form is made there (GGUF planes, FP8: device_values.host_form), else placed by
        `to_device` first (int8 blocks, repacked on the first device one weight at a time)."""

        def place(name: str, layer: bool, value):
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                return jax.device_put(np.asarray(value, dtype), self.weight_sharding(name, layer, value.ndim))
            axis = self.splits["layer" if layer else "global"].get(name)
            placed = host_form(value, dtype, kept_layout) if axis is not None else None
            placed = to_device(value) if placed is None else placed
            return self.replicate(placed) if axis is None else self.split_kept(name, placed, axis)

        return place

    def split_kept(self, name: str, weight, axis: int):
        """A kept weight split along `axis` in whole blocks, recording its WeightSplit; kept whole on every
        device (one warning line per weight name) where a shard would cut a block or the format is not split."""
        try:
            return place_split(weight, WeightSplit(self.mesh, axis))
        except BlockBoundaryError as error:
            if name not in self.kept_whole:
                self.kept_whole[name] = str(error)
                print(f"ember: warning: {name} kept whole on each device ({error})", file=sys.stderr)
            return self.replicate(weight)

    def replicate(self, tree):
        everywhere = self.sharding()
        placed = (jax.Array, np.ndarray)  # a host form (host_form) of a weight that could not split goes too
        return jax.tree.map(lambda a: jax.device_put(a, everywhere) if isinstance(a, placed) else a, tree)

    def shards(self, name: str, is_global: bool) -> int:
        """How many devices hold a part of the weight `name` (1: it is whole on each)."""
        return self.config.tensor_parallel if name in self.splits["global" if is_global else "layer"] else 1

    def split_count(self) -> int:
        return sum(len(section) for section in self.splits.values())

    def describe(self) -> str:
        """For the startup line: the mesh, how many weights are split (and how many kept weights stayed whole),
        what the KV pool does."""
        pools = "KV heads split" if self.kv_heads_split else "KV pool replicated"
        whole = f" ({len(self.kept_whole)} kept quantized whole: see the warnings)" if self.kept_whole else ""
        return f"{self.config.describe()}: {self.split_count()} weights split{whole}, {pools}"


def make_placement(config: MeshConfig, manifest: dict, dims: Dims) -> Placement:
    mesh = device_mesh(config)
    size = config.tensor_parallel
    splits = split_axes(manifest, dims, size)
    kv_axes = {tuple(state["axes"]) for state in manifest["state"].values() if state["layout"] == "paged"}
    kv_heads = {int(dims[axes[0]]) for axes in kv_axes}
    return Placement(config, mesh, splits, bool(kv_heads) and all(h % size == 0 for h in kv_heads))


_PLAN_DIRS: dict[tuple, Path] = {}


def mesh_plans(spec: ModelSpec, target: str, config: MeshConfig) -> Path:
    """A generated-plans root holding the plans of `spec` compiled for (target, mesh), compiled once per process
    into a temporary folder (removed at exit): generated/ keeps only the one-device plans."""
    from ...compiler.build import compile_spec

    key = (str(spec.path), spec.source_sha256, target, config)
    if key not in _PLAN_DIRS:
        root = Path(tempfile.mkdtemp(prefix=f"ember-plans-{config.tag()}-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        compile_spec(spec.path, target, out_root=root, mesh=config)
        _PLAN_DIRS[key] = root
    return _PLAN_DIRS[key]


def constrain_state(placement: Placement, paged: tuple[bool, ...]) -> Callable[[list], list]:
    """Inside a traced step: each layer's state (paged pools or slot arrays, `paged` per layer) kept in its
    placement, so the KV pools a step returns are laid out as the ones it was given (they are donated)."""

    def constrain(kv: list) -> list:
        return [
            tuple(
                jax.lax.with_sharding_constraint(a, placement.paged_sharding() if is_paged else placement.sharding())
                for a in arrays
            )
            for arrays, is_paged in zip(kv, paged)
        ]

    return constrain
