"""The layout of one engine step, shared by the runtime (which fills it) and the plans (which read it).

A step runs N tokens: first B decode rows (one token each, from B different sequences), then C = N - B
prefill tokens in P segments of L = C / P tokens each; segment s (rows B + s*L .. B + (s+1)*L - 1) is one
chunk of one sequence, its tokens first and padding after. P = 1 is the plain single-chunk step; P > 1
prefills several short prompts in one step. B or C may be zero. Every array has a static shape per
plan bucket; padding rows write their KV to slot 0 of the reserved block 0 and are never read.

KV lives in one paged pool per state kind (full attention; sliding window W; see the manifest's
"state"), so a sequence has one block table per kind and each token one slot per kind: the slot and
table arrays carry a leading axis K (state kinds, in manifest index order) and a layer reads row
`state` of them (`kind_view`). A sliding kind's table holds block 0 where a block fell out of the
window and was handed back; the window mask never lets a query read those positions.
"""

from __future__ import annotations

from typing import NamedTuple

import jax


class StepBatch(NamedTuple):
    tokens: jax.Array  # int32 [N]
    positions: jax.Array  # int32 [N]   position of each token in its sequence
    slots: jax.Array  # int32 [K, N]   flat KV slot (block * block_size + offset) each token writes, per kind
    dec_block_tables: jax.Array  # int32 [K, B, max_blocks]   KV blocks of each decode row's sequence
    dec_ctx_lens: jax.Array  # int32 [B]   tokens in context for each decode row, its own included
    pre_block_table: jax.Array  # int32 [K, P, max_blocks]   KV blocks of each prefill segment's sequence
    logit_rows: jax.Array  # int32 [R]   which of the N rows produce logits
    # int32 [S, N]: the state slot each token's request holds, per slot state kind (-1: padding); None for
    # plans without slot state
    state_slots: jax.Array | None = None

    @property
    def num_decode(self) -> int:
        return self.dec_ctx_lens.shape[0]

    @property
    def num_segments(self) -> int:
        return self.pre_block_table.shape[1]


def kind_view(batch: StepBatch, state) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(slots [N], dec_block_tables [B, max_blocks], pre_block_table [P, max_blocks]) of state kind `state`
    (a scalar per-layer constant, loaded in the activation dtype: traced, so one layer body serves layers of
    every kind)."""
    index = jax.numpy.asarray(state).astype("int32")
    pick = lambda a: jax.lax.dynamic_index_in_dim(a, index, axis=0, keepdims=False)
    return pick(batch.slots), pick(batch.dec_block_tables), pick(batch.pre_block_table)
