"""The device side of the host tier's recurrent-state snapshots (runtime/state/host_tier.py, family SNAPSHOTS):
snapshot slots of the slot layers copied out to the host, and host snapshots written back into snapshot slots.

A slot layer holds its state arrays, each [slots, ...] (a Gated DeltaNet layer: its conv window and its delta-rule
matrix); one snapshot is the same slot of every slot layer. A gather lays each gathered slot out as one row of
bytes, every array of every slot layer end to end in layer order ([n, snapshot_bytes] uint8, a bit cast: nothing is
rounded), so a host snapshot is a row of a piece like a host KV block, and the tier's pieces, compaction and LRU
serve both. As for blocks (block_copies.py): pieces of at most PIECE rows then powers of two, each the output of a
gather jitted to leave it in pinned host memory, and a restore moves each piece holding restored rows back whole
and drops the rows it does not want at distinct slots past the arrays. Snapshots leave a few at a time (a save's
LRU eviction, the snapshots of evicted KV blocks), so most pieces are one row."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ember.runtime.state.host_tier import HostEntry

from .block_copies import PINNED, piece_destinations, piece_sizes_up_to, placement_of, spans, take_rows


class SnapshotCopier:
    def __init__(self, layers: Sequence[int]):
        """layers: the indices, in a step's state list, of the slot layers (every slot kind's: one snapshot slot
        index serves them all)."""
        self.layers = tuple(layers)

    def gather(self, kv: list, slots: Sequence[int]) -> list[jax.Array]:
        arrays = [kv[i] for i in self.layers]
        gather = _gather_into(placement_of(arrays[0][0], PINNED))
        return [
            gather(arrays, jnp.asarray(np.asarray(slots[start : start + size], np.int32)))
            for start, size in spans(len(slots))
        ]

    def scatter(self, kv: list, slots: Sequence[int], entries: Sequence[HostEntry]) -> list:
        arrays = [kv[i] for i in self.layers]
        num_slots = arrays[0][0].shape[0]
        device = placement_of(arrays[0][0], None)
        for piece, destinations in piece_destinations(slots, entries):
            data = jax.device_put(piece.array, device)  # [rows, snapshot_bytes] uint8, one transfer
            # rows not restored go to distinct slots past the arrays, dropped by the scatter
            index = [num_slots + row if slot is None else slot for row, slot in enumerate(destinations)]
            arrays = _scatter(arrays, jnp.asarray(np.asarray(index, np.int32)), data)
        kv = list(kv)
        for i, layer in enumerate(self.layers):
            kv[layer] = arrays[i]
        return kv

    def take_rows(self, array, rows: Sequence[int]):
        return take_rows(array, rows)

    def precompile(self, kv: list, max_snapshots: int) -> None:
        """Compile (ahead of time, nothing runs) the gather and the scatter of every piece size a copy of up to
        `max_snapshots` snapshots takes."""
        if not self.layers:
            return
        arrays = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), [kv[i] for i in self.layers]
        )
        gather = _gather_into(placement_of(kv[self.layers[0]][0], PINNED))
        device = placement_of(kv[self.layers[0]][0], None)
        width = sum(_row_bytes(a) for layer in arrays for a in layer)
        for n in piece_sizes_up_to(max_snapshots):
            gather.lower(arrays, jax.ShapeDtypeStruct((n,), jnp.int32)).compile()
            data = jax.ShapeDtypeStruct((n, width), jnp.uint8, sharding=device)
            _scatter.lower(arrays, jax.ShapeDtypeStruct((n,), jnp.int32), data).compile()


def _row_bytes(array) -> int:
    """Bytes of one slot of a slot array [slots, ...]."""
    return math.prod(array.shape[1:]) * jnp.dtype(array.dtype).itemsize


def _gather(arrays: list, index: jax.Array) -> jax.Array:
    # arrays[i]: slot layer i's state arrays, each [slots, ...]; index int32 [n] -> [n, snapshot_bytes] uint8
    rows = [jax.lax.bitcast_convert_type(a[index], jnp.uint8).reshape(index.shape[0], -1) for ly in arrays for a in ly]
    return jnp.concatenate(rows, axis=1)


@functools.cache
def _gather_into(sharding) -> jax.stages.Wrapped:
    """_gather jitted to leave its output in `sharding` (pinned host memory: XLA copies it out as it ends)."""
    return jax.jit(_gather, out_shardings=sharding)


@functools.partial(jax.jit, donate_argnums=0)
def _scatter(arrays: list, index: jax.Array, data: jax.Array) -> list:
    # data: a piece's rows [n, snapshot_bytes] uint8, written into the slots `index` (int32 [n], distinct; a row
    # whose index is past the arrays is dropped); each array's bytes cast back to its dtype and shape
    out, offset = [], 0
    for layer in arrays:
        written = []
        for a in layer:
            size, itemsize = _row_bytes(a), jnp.dtype(a.dtype).itemsize
            part = data[:, offset : offset + size].reshape(data.shape[0], *a.shape[1:], *((itemsize,) * (itemsize > 1)))
            values = jax.lax.bitcast_convert_type(part, a.dtype)
            written.append(a.at[index].set(values, mode="drop", unique_indices=True))
            offset += size
        out.append(tuple(written))
    return out
