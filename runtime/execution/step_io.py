"""A step's inputs and outputs cross the host/device boundary as one buffer each way.

A step has ~23 small input arrays (StepBatch + SamplingBatch) and 4 outputs. Moving each one on its
own costs a transfer and a Python dispatch apiece: on the H200 that was ~8 ms of host time around a
1.9 ms batch-1 step (docs/results/h200_step_profile_reference.json). So the host packs every input
into one int32 word buffer (float32 and uint32 as their bits, bools as 0/1), the jitted step unpacks it
with static slices (free inside the executable), and the step's results come back as one int32 array.

`IoLayout` (the fields' shapes and dtypes) is static per compiled step shape: a hashable tuple.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.kernels.sampling import SampleResult

_WORD = np.int32
_KINDS = {
    np.dtype(np.int32): "i32",
    np.dtype(np.float32): "f32",
    np.dtype(np.uint32): "u32",
    np.dtype(np.bool_): "bool",
}


class IoLayout(NamedTuple):
    fields: tuple[tuple[tuple[int, ...], str], ...]  # (shape, kind) of each array, in order

    @property
    def words(self) -> int:
        return sum(int(np.prod(shape, dtype=np.int64)) for shape, _ in self.fields)


def pack_arrays(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, IoLayout]:
    """Host side: the arrays' contents as one flat int32 buffer, and the layout to unpack it."""
    fields, parts = [], []
    for array in arrays:
        if array is None:  # an absent optional field (StepBatch.state_slots of a plan without slot state)
            fields.append(((), "none"))
            continue
        array = np.asarray(array)
        kind = _KINDS.get(array.dtype)
        if kind is None:
            raise TypeError(f"cannot pack an array of dtype {array.dtype}")
        fields.append((tuple(array.shape), kind))
        flat = array.reshape(-1)
        parts.append(flat.astype(_WORD) if kind == "bool" else flat.view(_WORD))
    buffer = np.concatenate(parts) if parts else np.zeros(0, _WORD)
    return buffer, IoLayout(tuple(fields))


def unpack_arrays(buffer: jax.Array, layout: IoLayout) -> list[jax.Array]:
    """Device side (inside jit): the arrays of `layout` from the flat int32 buffer."""
    out, offset = [], 0
    for shape, kind in layout.fields:
        if kind == "none":
            out.append(None)
            continue
        size = int(np.prod(shape, dtype=np.int64))
        words = jax.lax.slice(buffer, (offset,), (offset + size,)).reshape(shape)
        offset += size
        if kind == "f32":
            words = jax.lax.bitcast_convert_type(words, jnp.float32)
        elif kind == "u32":
            words = jax.lax.bitcast_convert_type(words, jnp.uint32)
        elif kind == "bool":
            words = words != 0
        out.append(words)
    return out


def pack_result(result: SampleResult) -> jax.Array:
    """Device side: [R, 2 + 2K] int32 = token, logprob bits, K top ids, K top logprob bits."""
    bits = lambda a: jax.lax.bitcast_convert_type(a.astype(jnp.float32), jnp.int32)
    return jnp.concatenate(
        [
            result.tokens[:, None].astype(jnp.int32),
            bits(result.logprob)[:, None],
            result.top_ids.astype(jnp.int32),
            bits(result.top_logprobs),
        ],
        axis=1,
    )


def unpack_result(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host side: (tokens [R], logprob [R], top_ids [R, K], top_logprobs [R, K]) from pack_result's array."""
    packed = np.ascontiguousarray(packed, dtype=_WORD)
    k = (packed.shape[1] - 2) // 2
    return (
        packed[:, 0].copy(),
        packed[:, 1].copy().view(np.float32),
        packed[:, 2 : 2 + k].copy(),
        packed[:, 2 + k :].copy().view(np.float32),
    )
