"""The BlockStore of runtime/state/host_tier.py over a model's KV arrays (Model.new_kv's list of per-layer (k, v)
pools, each [num_blocks, block_size, hkv, dh]): the device side of a spill or a restore.

read(block)   slices the block out of every layer's k and v (dispatched now, so ordered before any later step
              that overwrites the block) and starts their copies to the host (`copy_to_host_async`); the
              handle's result() is the host arrays, a tuple of (k, v) per layer
write(block)  puts the host arrays on the device and writes them into the block of every layer: dispatched
              now, so ordered before the step that reads the block; result() waits for it to land

The arrays are functional values the executor replaces every step, so the store reads and replaces them
through `get` / `put` (the executor's current KV list).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np


class _Copy:
    """A copy JAX has dispatched: result() waits for it; cancel() cannot stop it (False)."""

    def __init__(self, arrays: Sequence[Any], to_host: bool):
        self.arrays, self.to_host = arrays, to_host

    def result(self):
        if self.to_host:
            return tuple(np.asarray(a) for a in self.arrays)
        jax.block_until_ready(self.arrays)
        return None

    def cancel(self) -> bool:
        return False


class KVArrayStore:
    """BlockStore over the paged layers `layers` of a KV list (module docstring)."""

    def __init__(self, get: Callable[[], list], put: Callable[[list], None], layers: Sequence[int]):
        self.get, self.put, self.layers = get, put, tuple(layers)

    def read(self, block: int) -> _Copy:
        kv = self.get()
        parts = [pool[block] for layer in self.layers for pool in kv[layer]]  # k, v of each layer
        for part in parts:
            part.copy_to_host_async()
        return _Copy(parts, to_host=True)

    def write(self, block: int, data) -> _Copy:
        kv = list(self.get())
        values = iter(data)
        for layer in self.layers:
            kv[layer] = tuple(pool.at[block].set(jax.device_put(next(values))) for pool in kv[layer])
        self.put(kv)
        return _Copy([a for layer in self.layers for a in kv[layer]], to_host=False)
