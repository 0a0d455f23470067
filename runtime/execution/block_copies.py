"""The device side of the prefix cache's host tier for KV blocks (runtime/state/host_tier.py, family BLOCKS): KV
blocks of the paged layers copied out to the host, and host blocks written back, in pieces (recurrent-state
snapshots: snapshot_copies.py, which shares the pieces' helpers below).

Each paged layer holds (k, v) pools [num_blocks, block_size, hkv, dh]. A gather stacks the blocks of every layer
block-major, [n, layers, 2, block_size, hkv, dh], in pieces of at most PIECE blocks (PIECE blocks and then powers
of two: n = 141 goes as 64, 64, 8, 4, 1, so few shapes are traced and no padding crosses the bus), each piece an
output of its jitted gather in the host's pinned memory: the copy out is a DMA transfer XLA issues, and a host
entry is a row of its piece. A restore moves each piece holding restored entries back whole (ONE DMA transfer
from pinned memory) and writes the restored rows into their blocks; rows the restore does not want go to
distinct out-of-range blocks, which the scatter drops, so a scatter has one shape per piece size too. (On an H100
a 16k-token prompt, ~1,000 blocks, restored from pageable host memory in 0.45 s as 17 stacked pieces, 0.47 s as
one transfer per block, and 0.21 s once the host copies were gone, against 0.19 s to recompute it:
docs/h200_log.md.) Gathers and scatters are jitted calls that donate the paged layers' pools (the step's own
state is donated the same way: nothing is copied whole)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from itertools import accumulate

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from ember.runtime.state.host_tier import HostEntry

PIECE = 64  # blocks per device <-> host transfer (1,024 tokens at block size 16)
PINNED = "pinned_host"


class BlockCopier:
    def __init__(self, layers: Sequence[int]):
        """layers: the indices, in a step's state list, of the paged layers whose blocks the host tier keeps."""
        self.layers = tuple(layers)

    def gather(self, kv: list, blocks: Sequence[int]) -> list[jax.Array]:
        pools = [kv[i] for i in self.layers]
        gather = _gather_into(placement_of(pools[0][0], PINNED))
        return [
            gather(pools, jnp.asarray(np.asarray(blocks[start : start + size], np.int32)))
            for start, size in spans(len(blocks))
        ]

    def scatter(self, kv: list, blocks: Sequence[int], entries: Sequence[HostEntry]) -> list:
        pools = [kv[i] for i in self.layers]
        num_blocks = pools[0][0].shape[0]
        device = placement_of(pools[0][0], None)
        for piece, destinations in piece_destinations(blocks, entries):
            data = jax.device_put(piece.array, device)  # [rows, layers, 2, bs, hkv, dh], one transfer
            # rows not restored go to distinct blocks past the pool, dropped by the scatter
            index = [num_blocks + row if block is None else block for row, block in enumerate(destinations)]
            pools = _scatter(pools, jnp.asarray(np.asarray(index, np.int32)), data)
        kv = list(kv)
        for i, layer in enumerate(self.layers):
            kv[layer] = pools[i]
        return kv

    def take_rows(self, array, rows: Sequence[int]):
        return take_rows(array, rows)

    def precompile(self, kv: list, max_blocks: int) -> None:
        """Compile (ahead of time, nothing runs) the gather and the scatter of every piece size a copy of up to
        `max_blocks` blocks takes (a restore moves the pieces a gather made), so no step waits for one:
        log2(PIECE) + 1 small programs each."""
        if not self.layers:
            return
        # the pools as the steps leave them (committed to their device), the pieces as scatter moves them there
        pools = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), [kv[i] for i in self.layers]
        )
        gather = _gather_into(placement_of(kv[self.layers[0]][0], PINNED))
        device = placement_of(kv[self.layers[0]][0], None)
        block = pools[0][0].shape[1:]  # [bs, hkv, dh]
        for n in piece_sizes_up_to(max_blocks):
            gather.lower(pools, jax.ShapeDtypeStruct((n,), jnp.int32)).compile()
            data = jax.ShapeDtypeStruct((n, len(pools), 2, *block), pools[0][0].dtype, sharding=device)
            _scatter.lower(pools, jax.ShapeDtypeStruct((n,), jnp.int32), data).compile()


def take_rows(array, rows: Sequence[int]):
    """These rows of a piece's array as a new host array in the same memory (compacting a thinned piece), padded to a
    power of two rows with copies of the last (a piece size the scatter was compiled for)."""
    rows = list(rows) + [rows[-1]] * ((1 << (len(rows) - 1).bit_length()) - len(rows))
    taken = np.asarray(array)[np.asarray(rows, np.int64)]
    return jax.device_put(taken, array.sharding) if isinstance(array, jax.Array) else taken


def piece_destinations(blocks: Sequence[int], entries: Sequence[HostEntry]) -> list:
    """(piece, [destination block or None per piece row]) for each piece the entries are rows of, in order of
    first use (each entry is a distinct row: the tier hands an entry out once)."""
    by_piece: dict[int, tuple] = {}
    for block, entry in zip(blocks, entries):
        _, destinations = by_piece.setdefault(id(entry.piece), (entry.piece, [None] * entry.piece.rows))
        destinations[entry.index] = block
    return list(by_piece.values())


def placement_of(pool: jax.Array, memory_kind: str | None):
    """Where a piece of `pool`'s blocks lives: the pool's device (a pool split over a mesh: every device of it),
    in `memory_kind` (None: device memory)."""
    sharding = pool.sharding
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(), memory_kind=memory_kind)
    return SingleDeviceSharding(next(iter(sharding.device_set)), memory_kind=memory_kind)


def _pieces(n: int) -> list[int]:
    """n as whole PIECEs, then the rest as distinct powers of two, largest first."""
    whole, rest = divmod(n, PIECE)
    return [PIECE] * whole + [1 << bit for bit in range(rest.bit_length() - 1, -1, -1) if rest >> bit & 1]


def spans(n: int) -> list[tuple[int, int]]:
    """(start, size) of each piece of n blocks, in order."""
    sizes = _pieces(n)
    return list(zip(accumulate(sizes[:-1], initial=0), sizes))


def piece_sizes_up_to(count: int) -> list[int]:
    """Every piece size a copy of up to `count` blocks can take."""
    return [1 << bit for bit in range(min(max(count, 1), PIECE).bit_length())]


def _gather(pools: list, index: jax.Array) -> jax.Array:
    # pools[i]: layer i's (k, v), each [num_blocks, bs, hkv, dh]; index int32 [n] -> [n, layers, 2, bs, hkv, dh]
    return jnp.stack([jnp.stack([k[index], v[index]], axis=1) for k, v in pools], axis=1)


@functools.cache
def _gather_into(sharding) -> jax.stages.Wrapped:
    """_gather jitted to leave its output in `sharding` (pinned host memory: XLA copies it out as it ends)."""
    return jax.jit(_gather, out_shardings=sharding)


@functools.partial(jax.jit, donate_argnums=0)
def _scatter(pools: list, index: jax.Array, data: jax.Array) -> list:
    # data: a piece's rows [n, layers, 2, bs, hkv, dh], written into the blocks `index` (int32 [n], distinct;
    # a row whose index is past the pool is dropped)
    return [
        (
            k.at[index].set(data[:, i, 0], mode="drop", unique_indices=True),
            v.at[index].set(data[:, i, 1], mode="drop", unique_indices=True),
        )
        for i, (k, v) in enumerate(pools)
    ]
