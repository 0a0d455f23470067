"""A projection's output left as its split-K partial sums, for a reader that adds them itself.

A decode GEMV split along `in` writes fp32 partials [splits, rows_pad, n] that an XLA fusion sums and rounds
to the activation dtype: one launch per projection. Where the carry_split_k_partials pass marks a
`gated_linear` (the down projection; or the `gated_mlp` fuse_gated_mlp makes of it) `partials=True`, its
output is the residual-add operand the next layer's norm reads (defer_residual_add), and the norm kernel
(norm/quant_kernel.py) sums the partials as it loads them: that launch is gone. Every other reader takes
`materialized(y)`: the same sum XLA would have made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class SplitKPartials:
    parts: jax.Array  # [splits, rows_pad, n] float32; rows past `rows` are padding
    rows: int  # the projection's activation rows (static)
    dtype: Any  # the output's dtype, which the sum is rounded to once (static)

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, int(self.parts.shape[2])

    @property
    def bytes_per_row(self) -> int:
        """What a reader summing one row's partials loads."""
        return int(self.parts.shape[0] * self.parts.shape[2]) * self.parts.dtype.itemsize

    def tree_flatten(self):
        return (self.parts,), (self.rows, self.dtype)

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(children[0], *static)


def materialized(y):
    """y as an array: a SplitKPartials summed in split order and rounded to its dtype; anything else as is."""
    if not isinstance(y, SplitKPartials):
        return y
    return jnp.sum(y.parts[:, : y.rows], axis=0).astype(y.dtype)
