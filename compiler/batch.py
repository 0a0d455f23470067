"""The layout of one engine step, shared by the runtime (which fills it) and the plans (which read it).

A step runs N tokens: first B decode rows (one token each, from B different sequences), then C = N - B
tokens of one prefill chunk (a single sequence). B or C may be zero. Every array has a static shape
per plan bucket; padding rows write their KV to slot 0 of the reserved block 0 and are never read.
"""

from __future__ import annotations

from typing import NamedTuple

import jax


class StepBatch(NamedTuple):
    tokens: jax.Array  # int32 [N]
    positions: jax.Array  # int32 [N]   position of each token in its sequence
    slots: jax.Array  # int32 [N]   flat KV slot (block * block_size + offset) each token writes
    dec_block_tables: jax.Array  # int32 [B, max_blocks]   KV blocks of each decode row's sequence
    dec_ctx_lens: jax.Array  # int32 [B]   tokens in context for each decode row, its own included
    pre_block_table: jax.Array  # int32 [max_blocks]   KV blocks of the prefill chunk's sequence
    logit_rows: jax.Array  # int32 [R]   which of the N rows produce logits

    @property
    def num_decode(self) -> int:
        return self.dec_ctx_lens.shape[0]
