"""paged_attention_chunked (the cpu target's attention): agrees with the reference op, which gathers every
row's whole table, when the contexts span several chunks, the table is wider than any context, rows are
ragged, a prefill chunk joins decode rows, and with a sliding window."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_attention_blockwise import initial_pools, make_world, step

from ember.compiler.kernels.attention.chunked import CHUNK_BLOCKS, paged_attention_chunked
from ember.compiler.kernels.attention.reference import paged_attention

chunked = jax.jit(paged_attention_chunked, static_argnames="scale")
reference = jax.jit(paged_attention, static_argnames="scale")
BLOCK = 4
LONGEST = 3 * CHUNK_BLOCKS * BLOCK - 7  # contexts over three chunks


@pytest.mark.parametrize("window", [0, 9])
@pytest.mark.parametrize(
    "dec_positions, chunk, extra_width",
    [([0, 70, LONGEST - 1], (60, 10), 0), ([5], None, 40), ([], (LONGEST - 12, 12), 3), ([130, 2], (0, 7), 17)],
)
def test_matches_the_reference(window, dec_positions, chunk, extra_width):
    world = make_world(7, 4, 2, 16, BLOCK, len(dec_positions) + 1, max_len=LONGEST)
    decode = list(enumerate(dec_positions))
    pre = (len(decode), *chunk) if chunk else None
    prior = {s: p for s, p in decode} | ({pre[0]: pre[1]} if pre else {})
    pools = initial_pools(world, prior)
    rows = list(dec_positions) + ([chunk[0] + chunk[1] - 1] if chunk else [])
    width = max(p // BLOCK + 1 for p in rows) + extra_width
    got, got_pools = step(chunked, world, pools, decode, pre, window, width)
    want, want_pools = step(reference, world, pools, decode, pre, window, width)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for a, b in zip(got_pools, want_pools):
        assert np.array_equal(np.asarray(a), np.asarray(b))  # the same KV write
