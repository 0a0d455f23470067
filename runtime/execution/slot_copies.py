"""The device side of recurrent-state snapshots: copy slots within the slot state kinds' arrays (a step's
SlotCopies, runtime/scheduling/prefix_snapshots.py). Each layer of a slot kind holds arrays [slots, ...]; live
slots and snapshot slots are entries of the same arrays, so a save or a restore is one gather and one scatter
per array, in a jitted call that donates the slot layers' arrays (the paged pools are not touched)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ..scheduling.scheduled_step import SlotCopy


class SlotCopier:
    def __init__(self, layer_state_kinds: Sequence[str | None], slot_kinds: Sequence[str]):
        """layer_state_kinds: each layer's state kind (Model.layer_state_kinds); slot_kinds: the plan's slot
        kinds in index order (SlotCopy.kind indexes them)."""
        index = {name: i for i, name in enumerate(slot_kinds)}
        self.layers = tuple(i for i, kind in enumerate(layer_state_kinds) if kind in index)
        self.layer_kind = tuple(index[layer_state_kinds[i]] for i in self.layers)
        self.num_kinds = len(slot_kinds)

    def apply(self, kv: list, copies: Sequence[SlotCopy]) -> list:
        """kv (a step's state list, donated) with `copies` applied; copies of one call have distinct
        destinations and no destination is another copy's source (saves, or restores, of one step)."""
        if not copies:
            return kv
        # int32 [kinds, n]: n padded to a power of two (few traced shapes); padding writes past the end (dropped)
        n = 1 << (max(sum(c.kind == k for c in copies) for k in range(self.num_kinds)) - 1).bit_length()
        src = np.zeros((self.num_kinds, n), np.int32)
        dst = np.full((self.num_kinds, n), np.iinfo(np.int32).max, np.int32)
        filled = [0] * self.num_kinds
        for c in copies:
            src[c.kind, filled[c.kind]], dst[c.kind, filled[c.kind]] = c.src, c.dst
            filled[c.kind] += 1
        arrays = _copy(self.layer_kind, [kv[i] for i in self.layers], jnp.asarray(src), jnp.asarray(dst))
        kv = list(kv)
        for i, layer in enumerate(self.layers):
            kv[layer] = arrays[i]
        return kv


@partial(jax.jit, static_argnums=0, donate_argnums=1)
def _copy(layer_kind: tuple[int, ...], arrays: list, src: jax.Array, dst: jax.Array) -> list:
    # arrays[i]: layer i's tuple of [slots, ...] arrays; src/dst int32 [kinds, n]
    return [
        tuple(a.at[dst[kind]].set(a[src[kind]], mode="drop") for a in layer) for layer, kind in zip(arrays, layer_kind)
    ]
