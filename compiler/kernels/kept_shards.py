"""Weights kept quantized, split over a device mesh along whole blocks, and their kernels run per shard.

A kept weight is a logical [out, in] matrix (an expert stack [E, out, in]) stored as several arrays: codes and
block scales. Splitting it over the mesh splits every array along the axis that holds the split logical axis,
so each device holds whole rows of blocks (a column-parallel split of `out`) or whole blocks of `in` (a
row-parallel split):

  BlockQ8Weight (cpu_gemv/layout.py)   codes [out, in], scale / offset [out, in / block] (offset [0]: none)
      out: axis 0 of each;  in: axis 1 of each, each shard a multiple of 32 elements (the kernel's activation
      chunk, so every shard quantizes its activations as the whole weight's call does)
  QuantizedWeight planes (gguf_gemv/layout.py, block-major [in / block, out, ...])
      out: plane axis 1;  in: plane axis 0 (whole GGUF blocks: 256 elements for the K formats, 32 for Q8_0 / Q5_0)
  packed expert stack (moe/packed.py, planes [E, in / block, out, ...])
      E: plane axis 0;  out: plane axis 2;  in: plane axis 1 (whole blocks)
  Fp8Weight (dense_gemv/fp8.py)        values [out, in]; scale [out] per channel or [out / 128, in / 128] blocks
      out: values axis 0, scale axis 0 (blocks: each shard a multiple of 128 rows);
      in: values axis 1, a per-channel scale whole, block scales axis 1 (each shard a multiple of 128)

A split that would cut a block (or does not divide) raises BlockBoundaryError: the loader then keeps that weight
whole on every device and says so (runtime/loading/sharding.py). NVFP4 weights and WeightGroups are not split.

XLA cannot partition a kernel that is a custom call (the cpu target's native int8-block kernel, the h200 Triton
kernels): given split operands it would gather them whole first. So a split weight carries its `WeightSplit`
(the mesh and the logical axis, a static field of the weight's pytree), and the projections that read it call
`per_shard`: the kernel runs inside `shard_map` on each device's blocks, a column split's outputs staying split
along their last axis, a row split's partial sums added across the mesh (one psum).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ember.compiler.kernels.cpu_gemv.layout import BlockQ8Weight
from ember.compiler.kernels.dense_gemv.fp8 import BLOCK as FP8_BLOCK
from ember.compiler.kernels.dense_gemv.fp8 import Fp8Weight
from ember.compiler.kernels.gguf_gemv.layout import FORMATS, QuantizedWeight

ACTIVATION_CHUNK = 32  # cpu_gemv/matmul.py CHUNK: the int8-block kernel quantizes x per 32 elements


class BlockBoundaryError(ValueError):
    """A mesh split of a kept weight that would cut one of its blocks, does not divide its axis, or is of a
    layout that is not split (NVFP4, a WeightGroup)."""


@dataclass(frozen=True)
class WeightSplit:
    """Where a kept weight is split: over `mesh` (one axis), along the logical weight's `axis` (0: out, a
    column-parallel projection; 1: in, a row-parallel one; an expert stack's axes are (E, out, in))."""

    mesh: Mesh
    axis: int

    @property
    def size(self) -> int:
        return int(self.mesh.devices.size)

    @property
    def name(self) -> str:
        return self.mesh.axis_names[0]


def _spec(ndim: int, axis: int | None, name: str) -> PartitionSpec:
    return PartitionSpec(*(name if i == axis else None for i in range(ndim)))


def _divides(what: str, length: int, size: int, unit: int = 1) -> None:
    """length split `size` ways must give each device a whole number of `unit`s."""
    if length % size or (length // size) % unit:
        raise BlockBoundaryError(
            f"{what} of {length} split {size} ways would cut a block of {unit}"
            if length % size == 0
            else f"{what} of {length} does not divide by {size}"
        )


def leaf_specs(w, axis: int, size: int, name: str) -> list[PartitionSpec]:
    """The PartitionSpec of each of w's arrays (in jax.tree.leaves order) for the logical split `axis` over
    `size` devices of mesh axis `name`; BlockBoundaryError where a shard would not hold whole blocks."""
    if isinstance(w, BlockQ8Weight):
        out, inner = w.shape
        if axis == 0:
            _divides("rows", out, size)
        else:
            _divides("the input", inner, size, max(w.block, ACTIVATION_CHUNK))
        return [_spec(a.ndim, axis if a.size else None, name) for a in jax.tree.leaves(w)]
    if isinstance(w, QuantizedWeight):
        block = FORMATS[w.format][0]
        experts = len(w.shape) == 3
        *lead, out, inner = w.shape
        if experts and axis == 0:
            _divides("experts", w.shape[0], size)
            plane_axis = 0
        elif axis == len(w.shape) - 2:  # out
            _divides("rows", out, size)
            plane_axis = len(lead) + 1  # planes [(E,) in / block, out, ...]
        else:  # in: whole GGUF blocks per device
            _divides(f"the input ({w.format})", inner, size, block)
            plane_axis = len(lead)
        return [_spec(a.ndim, plane_axis, name) for a in jax.tree.leaves(w)]
    if isinstance(w, Fp8Weight):
        out, inner = w.shape
        unit = FP8_BLOCK if w.blocked else 1
        if axis == 0:
            _divides("rows", out, size, unit)
            scale = _spec(w.scale.ndim, 0, name)
        else:
            _divides("the input", inner, size, unit)
            scale = _spec(w.scale.ndim, 1 if w.blocked else None, name)
        return [_spec(2, axis, name), scale]
    raise BlockBoundaryError(f"{type(w).__name__} weights are not split over a mesh")


def shardings(w, split: WeightSplit) -> list[NamedSharding]:
    """Each of w's arrays' NamedSharding for `split` (leaf_specs on its mesh)."""
    return [NamedSharding(split.mesh, s) for s in leaf_specs(w, split.axis, split.size, split.name)]


def place_split(w, split: WeightSplit):
    """w (its arrays anywhere) with each array placed split over the mesh and the split recorded on it."""
    leaves, treedef = jax.tree.flatten(w)
    placed = [jax.device_put(a, s) for a, s in zip(leaves, shardings(w, split))]
    return jax.tree.unflatten(treedef, placed)._replace(split=split)


def dense_like(dense: jax.Array, split: WeightSplit | None) -> jax.Array:
    """A kept weight's dense [out, in] copy placed split as the weight is (None: as it is)."""
    if split is None:
        return dense
    return jax.device_put(dense, NamedSharding(split.mesh, _spec(dense.ndim, split.axis, split.name)))


def local_weight(w):
    """The weight as one device holds it inside shard_map: its shape divided along the split, no split."""
    if isinstance(w, QuantizedWeight):
        shape = list(w.shape)
        shape[w.split.axis] //= w.split.size
        return w._replace(shape=tuple(shape), split=None)
    return w._replace(split=None)


def per_shard(matmul: Callable, x: jax.Array, w) -> jax.Array:
    """matmul(x, w) -> [N, out] for a split weight w, with matmul run on each device's shard of w: a column
    split gives each device whole x and its rows of w, the output split along `out`; a row split gives each
    device its slice of x's `in` and the partial sums are added over the mesh."""
    split = w.split
    if len(w.shape) != 2:
        raise ValueError(f"per_shard takes an [out, in] weight, not {tuple(w.shape)}")
    local = local_weight(w)
    leaves, treedef = jax.tree.flatten(local)
    w_specs = leaf_specs(w, split.axis, split.size, split.name)
    column = split.axis == 0
    x_spec = _spec(x.ndim, None if column else x.ndim - 1, split.name)

    # empty arrays (a BlockQ8Weight's absent offsets) are made inside instead of passed: an empty operand of
    # the native kernel crashed XLA's CPU runtime inside shard_map
    passed = [i for i, leaf in enumerate(leaves) if leaf.size]

    def body(x_shard, *passed_leaves):
        given = dict(zip(passed, passed_leaves))
        local_leaves = [given[i] if i in given else jnp.zeros(leaf.shape, leaf.dtype) for i, leaf in enumerate(leaves)]
        y = matmul(x_shard, jax.tree.unflatten(treedef, local_leaves))
        return y if column else jax.lax.psum(y, split.name)

    out_spec = _spec(x.ndim, x.ndim - 1, split.name) if column else PartitionSpec()
    in_specs = (x_spec, *(w_specs[i] for i in passed))
    # check_vma off: the kernels are custom calls with no rule for JAX's varying-axes check
    run = jax.shard_map(body, mesh=split.mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
    return run(x, *(leaves[i] for i in passed))


def device_bytes(w) -> int:
    """Bytes of w's arrays held on one device (the largest share), for the per-device weight budget."""
    total = 0
    for leaf in jax.tree.leaves(w):
        shard = leaf.sharding.shard_shape(leaf.shape) if hasattr(leaf, "sharding") else leaf.shape
        total += int(np.prod(shard)) * leaf.dtype.itemsize
    return total
