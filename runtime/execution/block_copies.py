"""The device side of the prefix cache's host tier (runtime/state/host_tier.py): KV blocks of the paged layers
copied out to the host in one gather, and host blocks written back in a few scatters.

Each paged layer holds (k, v) pools [num_blocks, block_size, hkv, dh]. A gather stacks the blocks of every layer
into one array [layers, 2, n, block_size, hkv, dh] and starts its copy to the host. A restore writes host entries
[layers, 2, block_size, hkv, dh] back into blocks in pieces of at most SCATTER_PIECE blocks: each piece is
stacked on the host ([n, layers, 2, ...], one memcpy per entry) and crosses the bus as ONE transfer. (Fewer
transfers did not make a restore cheaper: on an H100 a 16k-token prompt, ~1,000 blocks, restored in 0.45 s this
way and 0.47 s as one transfer per block, against 0.18 s to recompute it; the host-side copies are the next
suspect, docs/h200_log.md.) Gathers and scatters are jitted calls that donate the paged
layers' pools (the step's own state is donated the same way: nothing is copied whole). Few shapes are traced: a
gather's n is padded to a power of two (the padding reads block 0, the plans' padding block; the host tier never
reads those rows), a restore's pieces are SCATTER_PIECE blocks and then powers of two (n = 141: 64, 64, 8, 4, 1),
so no padding bytes cross the bus on a restore, which a waiting prefill is blocked on."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

SCATTER_PIECE = 64  # blocks per host -> device transfer of a restore (1,024 tokens at block size 16)


def _padded(n: int) -> int:
    return 1 << (n - 1).bit_length()


class BlockCopier:
    def __init__(self, layers: Sequence[int]):
        """layers: the indices, in a step's state list, of the paged layers whose blocks the host tier keeps."""
        self.layers = tuple(layers)

    def gather(self, kv: list, blocks: Sequence[int]) -> jax.Array:
        index = np.zeros(_padded(len(blocks)), np.int32)
        index[: len(blocks)] = blocks
        stacked = _gather([kv[i] for i in self.layers], jnp.asarray(index))  # its first len(blocks) rows count
        stacked.copy_to_host_async()
        return stacked

    def scatter(self, kv: list, blocks: Sequence[int], data: Sequence[np.ndarray]) -> list:
        pools, start = [kv[i] for i in self.layers], 0
        for size in _pieces(len(blocks)):
            index = np.asarray(blocks[start : start + size], np.int32)
            stacked = np.stack(data[start : start + size])  # [size, layers, 2, bs, hkv, dh]: one transfer
            pools = _scatter(pools, jnp.asarray(index), jax.device_put(stacked))
            start += size
        kv = list(kv)
        for i, layer in enumerate(self.layers):
            kv[layer] = pools[i]
        return kv

    def precompile(self, kv: list, max_gather: int, max_scatter: int) -> None:
        """Compile (ahead of time, nothing runs) every gather and scatter shape up to these block counts, so no
        step waits for one: log2 of each many small programs."""
        pools = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), [kv[i] for i in self.layers])
        if not pools:
            return
        block = pools[0][0].shape[1:]  # [bs, hkv, dh]
        for n in (1 << bit for bit in range((max(max_gather, 1) - 1).bit_length() + 1)):  # up to _padded(max)
            _gather.lower(pools, jax.ShapeDtypeStruct((n,), jnp.int32)).compile()
        largest = min(max(max_scatter, 1), SCATTER_PIECE)
        for n in (1 << bit for bit in range(largest.bit_length())):  # every piece size up to max_scatter
            data = jax.ShapeDtypeStruct((n, len(pools), 2, *block), pools[0][0].dtype)
            _scatter.lower(pools, jax.ShapeDtypeStruct((n,), jnp.int32), data).compile()


def _pieces(n: int) -> list[int]:
    """n as whole SCATTER_PIECEs, then the rest as distinct powers of two, largest first."""
    whole, rest = divmod(n, SCATTER_PIECE)
    return [SCATTER_PIECE] * whole + [1 << bit for bit in range(rest.bit_length() - 1, -1, -1) if rest >> bit & 1]


@jax.jit
def _gather(pools: list, index: jax.Array) -> jax.Array:
    # pools[i]: layer i's (k, v), each [num_blocks, bs, hkv, dh]; index int32 [n] -> [layers, 2, n, bs, hkv, dh]
    return jnp.stack([jnp.stack([k[index], v[index]]) for k, v in pools])


@partial(jax.jit, donate_argnums=0)
def _scatter(pools: list, index: jax.Array, data: jax.Array) -> list:
    # data: n host tier entries stacked [n, layers, 2, bs, hkv, dh], written into the blocks `index` (int32 [n],
    # distinct)
    return [
        (k.at[index].set(data[:, i, 0], unique_indices=True), v.at[index].set(data[:, i, 1], unique_indices=True))
        for i, (k, v) in enumerate(pools)
    ]
