"""The device side of the prefix cache's host tier (runtime/state/host_tier.py): KV blocks of the paged layers
copied out to the host, and host blocks written back, in pieces.

Each paged layer holds (k, v) pools [num_blocks, block_size, hkv, dh]. A gather stacks the blocks of every layer
block-major, [n, layers, 2, block_size, hkv, dh], in pieces of at most PIECE blocks, and starts each piece's copy
to the host: a host entry is then a row of its piece, taken without a copy. A restore writes entries back in
pieces of at most PIECE blocks; a piece crosses the bus as ONE transfer, from a view of the host rows when its
entries are consecutive rows of one gather piece (a chain spilled together and restored in order) and stacked
otherwise (host_tier.stacked). Pieces are PIECE blocks and then powers of two (n = 141: 64, 64, 8, 4, 1), so few
shapes are traced and no padding crosses the bus either way. (Fewer transfers alone did not make a restore
cheaper: on an H100 a 16k-token prompt, ~1,000 blocks, restored in 0.45 s as 17 stacked pieces and 0.47 s as
one transfer per block, against 0.18 s to recompute it; the per-entry host copies, which views now avoid, were
the next suspect: docs/h200_log.md.) Gathers and scatters are jitted calls that donate the paged layers' pools
(the step's own state is donated the same way: nothing is copied whole)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from itertools import accumulate

import jax
import jax.numpy as jnp
import numpy as np

from ember.runtime.state.host_tier import HostEntry, stacked

PIECE = 64  # blocks per device <-> host transfer (1,024 tokens at block size 16)


class BlockCopier:
    def __init__(self, layers: Sequence[int]):
        """layers: the indices, in a step's state list, of the paged layers whose blocks the host tier keeps."""
        self.layers = tuple(layers)

    def gather(self, kv: list, blocks: Sequence[int]) -> list[jax.Array]:
        pools, pieces = [kv[i] for i in self.layers], []
        for start, size in spans(len(blocks)):
            piece = _gather(pools, jnp.asarray(np.asarray(blocks[start : start + size], np.int32)))
            piece.copy_to_host_async()
            pieces.append(piece)
        return pieces

    def scatter(self, kv: list, blocks: Sequence[int], entries: Sequence[HostEntry]) -> list:
        pools = [kv[i] for i in self.layers]
        for start, size in spans(len(blocks)):
            index = np.asarray(blocks[start : start + size], np.int32)
            data = jax.device_put(stacked(entries[start : start + size]))  # [size, layers, 2, bs, hkv, dh]
            pools = _scatter(pools, jnp.asarray(index), data)
        kv = list(kv)
        for i, layer in enumerate(self.layers):
            kv[layer] = pools[i]
        return kv

    def precompile(self, kv: list, max_gather: int, max_scatter: int) -> None:
        """Compile (ahead of time, nothing runs) every gather and scatter piece up to these block counts, so no
        step waits for one: log2(PIECE) + 1 small programs each."""
        pools = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), [kv[i] for i in self.layers])
        if not pools:
            return
        block = pools[0][0].shape[1:]  # [bs, hkv, dh]
        for n in _piece_sizes_up_to(max_gather):
            _gather.lower(pools, jax.ShapeDtypeStruct((n,), jnp.int32)).compile()
        for n in _piece_sizes_up_to(max_scatter):
            data = jax.ShapeDtypeStruct((n, len(pools), 2, *block), pools[0][0].dtype)
            _scatter.lower(pools, jax.ShapeDtypeStruct((n,), jnp.int32), data).compile()


def _pieces(n: int) -> list[int]:
    """n as whole PIECEs, then the rest as distinct powers of two, largest first."""
    whole, rest = divmod(n, PIECE)
    return [PIECE] * whole + [1 << bit for bit in range(rest.bit_length() - 1, -1, -1) if rest >> bit & 1]


def spans(n: int) -> list[tuple[int, int]]:
    """(start, size) of each piece of n blocks, in order."""
    sizes = _pieces(n)
    return list(zip(accumulate(sizes[:-1], initial=0), sizes))


def _piece_sizes_up_to(count: int) -> list[int]:
    """Every piece size a copy of up to `count` blocks can take."""
    return [1 << bit for bit in range(min(max(count, 1), PIECE).bit_length())]


@jax.jit
def _gather(pools: list, index: jax.Array) -> jax.Array:
    # pools[i]: layer i's (k, v), each [num_blocks, bs, hkv, dh]; index int32 [n] -> [n, layers, 2, bs, hkv, dh]
    return jnp.stack([jnp.stack([k[index], v[index]], axis=1) for k, v in pools], axis=1)


@partial(jax.jit, donate_argnums=0)
def _scatter(pools: list, index: jax.Array, data: jax.Array) -> list:
    # data: n host tier entries [n, layers, 2, bs, hkv, dh], written into the blocks `index` (int32 [n], distinct)
    return [
        (k.at[index].set(data[:, i, 0], unique_indices=True), v.at[index].set(data[:, i, 1], unique_indices=True))
        for i, (k, v) in enumerate(pools)
    ]
