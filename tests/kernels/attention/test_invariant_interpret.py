"""The deterministic plans' attention (compiler/kernels/attention/invariant.py: the prefill kernel with fixed
tiles and absolute KV splits) in Triton's CPU interpreter: a query's output is the same bits as a decode row
(a segment of one token) beside other rows, and inside prefill chunks of other lengths and offsets; and it
agrees with the jnp reference `_attend`.

The interpreter's dot is numpy's matmul, whose BLAS rounds a row differently by where it sits in the tile; a
GPU's MMA computes every output element alike. The invariance test runs the interpreter on a dot that sums
each element over K in order (`row_independent_dot`), so it checks what the kernel's tiling must ensure
(the same tiles, splits and masks for a query wherever it runs); tests/kernels/attention/
test_attention_invariant_gpu.py checks the same on the GPU's MMA."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

pytestmark = pytest.mark.interpret

HQ, HKV, DH, PAGE = 6, 2, 16, 8  # G = 3: packed tiles cut tokens' head groups in the middle
CONFIG = dict(block_m=16, block_n=16, num_warps=4, num_stages=1, split_tiles=1)  # 16 keys per split


def _pools(rng, num_blocks):
    shape = (num_blocks, PAGE, HKV, DH)
    k_pool = (rng.standard_normal(shape) * 2).astype(ml_dtypes.bfloat16)
    v_pool = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    return k_pool, v_pool


def run_invariant(q, k_pool, v_pool, tables, positions, window=0):
    """q [S * L, HQ, DH] as S segments of L tokens (tables [S, W], positions [S * L], padding rows 0) through the
    kernel with the invariant configuration -> fp32 [S * L, HQ, DH] (partials merged in split order)."""
    import jax.numpy as jnp

    from ember.compiler.kernels.attention.prefill import (
        PrefillAttentionConfig,
        chunk_info,
        combine_splits_in_order,
        launch_plan,
    )
    from ember.compiler.kernels.attention.prefill_kernel import prefill_attention_kernel

    segments, width = tables.shape
    rows = q.shape[0]
    plan = launch_plan(
        rows // segments,
        HQ,
        HKV,
        DH,
        PAGE,
        width,
        scale=DH**-0.5,
        config=PrefillAttentionConfig(**CONFIG),
        segments=segments,
    )
    info = np.asarray(chunk_info(jnp.asarray(positions).reshape(segments, -1), None, window))
    outs = [
        np.full((plan.splits, rows, HQ, DH), np.nan, np.float32),
        np.full((plan.splits, rows, HQ), np.nan, np.float32),
        np.full((plan.splits, rows, HQ), np.nan, np.float32),
    ]
    bufs = [HostBuffer(o) for o in outs]
    prefill_attention_kernel[plan.grid](
        HostBuffer(q), HostBuffer(k_pool), HostBuffer(v_pool), HostBuffer(tables.astype(np.int32)),
        HostBuffer(info.astype(np.int32)), *bufs, IEEE=False, **plan.meta,
    )  # fmt: skip
    return np.asarray(combine_splits_in_order(*(jnp.asarray(b.array) for b in bufs)))


@pytest.fixture
def row_independent_dot(monkeypatch):
    def matmul(a, b, dtype=None):  # [M, K] @ [K, N], each element summed over K in index order
        return (a.astype(dtype)[:, :, None] * b.astype(dtype)[None, :, :]).sum(axis=1, dtype=dtype)

    monkeypatch.setattr(np, "matmul", matmul)


def _sequence(rng, length, num_blocks):
    """A sequence of `length` tokens: its queries [length, HQ, DH] and a table of distinct blocks (1..)."""
    table = rng.permutation(np.arange(1, num_blocks))[: -(-length // PAGE)].astype(np.int32)
    return rng.standard_normal((length, HQ, DH)).astype(ml_dtypes.bfloat16), table


@pytest.mark.parametrize("window", [0, 11])
def test_a_query_gives_the_same_bits_as_a_decode_row_and_inside_any_chunk(window, row_independent_dot):
    rng = np.random.default_rng(window)
    num_blocks, width = 24, 8  # 64 keys per table: 4 splits
    k_pool, v_pool = _pools(rng, num_blocks)
    queries, table = _sequence(rng, 45, num_blocks)
    padded = lambda t: np.pad(t, (0, width - len(t)))  # noqa: E731
    probe = 37  # the query at position 37 (its split 2: keys 32..47)

    alone = run_invariant(queries[probe : probe + 1], k_pool, v_pool, padded(table)[None], np.array([probe]), window)
    # beside three other decode rows (other sequences, other lengths)
    others = [_sequence(rng, n, num_blocks) for n in (3, 60, 20)]
    rows = [o[0][-1:] for o in others[:2]] + [queries[probe : probe + 1]] + [others[2][0][-1:]]
    tables = np.stack([padded(o[1]) for o in others[:2]] + [padded(table), padded(others[2][1])])
    positions = np.array([2, 59, probe, 19])
    beside = run_invariant(np.concatenate(rows), k_pool, v_pool, tables, positions, window)[2]
    np.testing.assert_array_equal(beside, alone[0])
    # inside prefill chunks: 16 tokens from 29, 8 from 32 (the probe last but two), 40 from 0 padded to 48
    for start, length, chunk in ((29, 16, 16), (32, 8, 8), (0, 40, 48)):
        pos = np.zeros(chunk, np.int32)
        pos[:length] = np.arange(start, start + length)
        q = np.zeros((chunk, HQ, DH), ml_dtypes.bfloat16)
        q[:length] = queries[start : start + length]
        got = run_invariant(q, k_pool, v_pool, padded(table)[None], pos, window)[probe - start]
        np.testing.assert_array_equal(got, alone[0], err_msg=f"chunk of {length} from {start}")


def test_invariant_configuration_matches_the_reference():
    import jax.numpy as jnp

    from ember.compiler.kernels.attention.reference import _attend

    rng = np.random.default_rng(3)
    num_blocks, width = 20, 8
    k_pool, v_pool = _pools(rng, num_blocks)
    queries, table = _sequence(rng, 50, num_blocks)
    table = np.pad(table, (0, width - len(table)))
    positions = np.arange(50 - 13, 50)  # the last 13 tokens of a 50-token sequence, after a 37-token prefix
    got = run_invariant(queries[-13:], k_pool, v_pool, table[None], positions)
    f32 = lambda a: jnp.asarray(np.asarray(a, np.float32))  # noqa: E731
    keys = f32(k_pool)[table].reshape(-1, HKV, DH)
    values = f32(v_pool)[table].reshape(-1, HKV, DH)
    expected = np.asarray(_attend(f32(queries[-13:])[None], keys[None], values[None], positions[None], 0, DH**-0.5))
    np.testing.assert_allclose(got, expected[0], rtol=1e-2, atol=1e-2)
