"""The prefill (chunk) attention kernel (compiler/kernels/attention/prefill_kernel.py) in Triton's CPU interpreter
against the jnp reference `_attend`, at small shapes: ragged chunks after a prefix, GQA groups that tiles cut in
the middle, sliding windows with dropped blocks, KV splits (merged by prefill.combine_splits), an all-padding
chunk, and several chunks (one per sequence) in one launch. fp32 and bf16."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

pytestmark = pytest.mark.interpret

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# error relative to max(1, |expected|): bf16 rounds outputs of magnitude ~4 by up to 1.6e-2
TOLERANCE = {"float32": 2e-5, "bfloat16": 1e-2}


def random_case(rng, *, chunk, num_tokens, start, hq, hkv, dh, page, window, dtype, spare_blocks=2):
    """A sequence whose first start + num_tokens positions are in the pool [blocks, page, hkv, dh] (garbage
    elsewhere, block 0 included), a table of just enough blocks (+1 spare), the chunk's queries [chunk, hq, dh]
    and positions (padding 0). Sliding windows: blocks wholly before the first query's window are handed back
    (table entry 0)."""
    width = (start + chunk) // page + 2
    num_blocks = width + spare_blocks
    pool_shape = (num_blocks, page, hkv, dh)
    k_pool = (rng.standard_normal(pool_shape) * 2).astype(dtype)
    v_pool = rng.standard_normal(pool_shape).astype(dtype)
    table = rng.permutation(np.arange(1, num_blocks))[:width].astype(np.int32)
    if window > 0:
        table[: max(0, start - window + 1) // page] = 0
    q = rng.standard_normal((chunk, hq, dh)).astype(dtype)
    positions = np.zeros(chunk, np.int32)
    positions[:num_tokens] = np.arange(start, start + num_tokens)
    return q, k_pool, v_pool, table, positions


def reference_output(q, k_pool, v_pool, table, positions, window, scale) -> np.ndarray:
    """`_attend` over the table's blocks in fp32: [chunk, hq, dh]."""
    import jax.numpy as jnp

    from ember.compiler.kernels.attention.reference import _attend

    f32 = lambda a: jnp.asarray(np.asarray(a, np.float32))
    dh, hkv = q.shape[-1], k_pool.shape[2]
    keys = f32(k_pool)[table].reshape(-1, hkv, dh)
    values = f32(v_pool)[table].reshape(-1, hkv, dh)
    out = _attend(f32(q)[None], keys[None], values[None], jnp.asarray(positions)[None], window, scale)[0]
    return np.asarray(out)


def run_prefill(q, k_pool, v_pool, tables, info, *, chunk, hq, hkv, dh, page, bm, bn, splits) -> np.ndarray:
    """Launch the kernel with the plan of PrefillAttentionConfig(bm, bn, splits) over len(info) segments of
    `chunk` rows (tables [segments, width] or one [width]; info [segments, 3] = first position, valid tokens,
    window); returns out [segments * chunk, hq, dh] in fp32, the KV splits merged by combine_splits."""
    from ember.compiler.kernels.attention.prefill import PrefillAttentionConfig, combine_splits, launch_plan
    from ember.compiler.kernels.attention.prefill_kernel import prefill_attention_kernel

    segments = 1 if info.ndim == 1 else len(info)
    plan = launch_plan(
        chunk,
        hq,
        hkv,
        dh,
        page,
        tables.shape[-1],
        scale=dh**-0.5,
        segments=segments,
        config=PrefillAttentionConfig(block_m=bm, block_n=bn, kv_splits=splits),
    )
    rows = segments * chunk
    if plan.splits == 1:  # out [rows, hq, dh]; the m / l outputs unused
        outs = [np.full((rows, hq, dh), np.nan, q.dtype), np.zeros(1, np.float32), np.zeros(1, np.float32)]
    else:  # fp32 partials [splits, rows, hq, dh] and their m / l [splits, rows, hq]
        outs = [
            np.full((plan.splits, rows, hq, dh), np.nan, np.float32),
            np.full((plan.splits, rows, hq), np.nan, np.float32),
            np.full((plan.splits, rows, hq), np.nan, np.float32),
        ]
    bufs = [HostBuffer(o) for o in outs]
    prefill_attention_kernel[plan.grid](
        HostBuffer(q),
        HostBuffer(k_pool),
        HostBuffer(v_pool),
        HostBuffer(tables.astype(np.int32)),
        HostBuffer(info.astype(np.int32)),
        *bufs,
        IEEE=q.dtype == np.float32,
        **plan.meta,
    )
    got = bufs[0].array.astype(np.float32)
    return np.asarray(combine_splits(got, bufs[1].array, bufs[2].array)) if plan.splits > 1 else got


def relative_error(got, expected, valid: int) -> float:
    """max |got - expected| / (1 + |expected|) over the first `valid` rows (0 for none)."""
    return float((np.abs(got - expected) / (1 + np.abs(expected)))[:valid].max()) if valid else 0.0


CASES = [  # chunk, valid, start, hq, hkv, dh, page, window, block_m, block_n, splits
    (32, 32, 0, 4, 1, 32, 16, 0, 32, 16, 1),
    (48, 37, 21, 8, 2, 32, 16, 0, 32, 32, 1),  # ragged chunk after a prefix; padding rows
    (48, 37, 21, 12, 2, 16, 16, 0, 64, 16, 1),  # G = 6: tiles cut tokens in the middle of a group
    (32, 30, 70, 8, 1, 32, 32, 24, 16, 16, 1),  # sliding window, dropped blocks, page 32 > BLOCK_N
    (16, 9, 90, 4, 4, 64, 16, 0, 16, 32, 3),  # G = 1, KV splits over a long prefix
    (16, 16, 50, 16, 2, 16, 16, 20, 128, 16, 4),  # window + splits (some empty)
    (32, 0, 0, 4, 2, 16, 16, 0, 32, 16, 1),  # an all-padding chunk: zeros, finite
    (16, 16, 40, 2, 2, 16, 16, 10, 16, 16, 1),  # window edge on a tile's last key (40 - 10 + 1 = 31)
]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[f"C{c[0]}-valid{c[1]}-start{c[2]}-hq{c[3]}-window{c[7]}" for c in CASES])
def test_prefill_kernel_matches_reference(case, dtype_name):
    chunk, valid, start, hq, hkv, dh, page, window, bm, bn, splits = case
    rng = np.random.default_rng(list(case))
    heads = dict(hq=hq, hkv=hkv, dh=dh, page=page, window=window, dtype=DTYPES[dtype_name])
    q, k_pool, v_pool, table, positions = random_case(rng, chunk=chunk, num_tokens=valid, start=start, **heads)
    info = np.array([positions[0], valid, window], np.int32)
    got = run_prefill(
        q, k_pool, v_pool, table, info, chunk=chunk, hq=hq, hkv=hkv, dh=dh, page=page, bm=bm, bn=bn, splits=splits
    )
    expected = reference_output(q, k_pool, v_pool, table, positions, window, dh**-0.5)
    err = relative_error(got, expected, valid)
    assert np.isfinite(got).all(), f"non-finite outputs ({np.isnan(got).sum()} NaN); err={err:.1e}"
    assert err < TOLERANCE[dtype_name], f"err={err:.1e} (tolerance {TOLERANCE[dtype_name]:.0e})"


SEGMENT_CASES = [  # per segment (valid, start); shared: chunk, hq, hkv, dh, page, window, block_m, block_n, splits
    (((16, 0), (9, 30), (0, 0)), 16, 8, 2, 32, 16, 0, 32, 16, 1),  # 3 prompts, one ragged, one empty segment
    (((16, 40), (5, 7)), 16, 4, 1, 16, 16, 10, 16, 16, 2),  # sliding window + KV splits
]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("segment_case", SEGMENT_CASES, ids=["3-segments", "2-segments-window-splits"])
def test_prefill_segments_in_one_launch(segment_case, dtype_name):
    """Several chunks (one per sequence) in one launch, SEGMENTS > 1 over one shared pool: each segment's rows
    against the reference over its own table."""
    segments, chunk, hq, hkv, dh, page, window, bm, bn, splits = segment_case
    rng = np.random.default_rng([len(segments), window, splits])
    heads = dict(hq=hq, hkv=hkv, dh=dh, page=page, window=window, dtype=DTYPES[dtype_name])
    cases = [random_case(rng, chunk=chunk, num_tokens=valid, start=start, **heads) for valid, start in segments]
    offsets = np.cumsum([0] + [c[1].shape[0] for c in cases])
    k_pool = np.concatenate([c[1] for c in cases])
    v_pool = np.concatenate([c[2] for c in cases])
    width = max(len(c[3]) for c in cases)
    tables = np.zeros((len(cases), width), np.int32)
    for s, c in enumerate(cases):  # each table into its own part of the pool (block 0 stays block 0)
        tables[s, : len(c[3])] = np.where(c[3] > 0, c[3] + offsets[s], 0)
    q = np.concatenate([c[0] for c in cases])
    positions = np.concatenate([c[4] for c in cases])
    info = np.array([[c[4][0], valid, window] for c, (valid, _) in zip(cases, segments)], np.int32)
    got = run_prefill(
        q, k_pool, v_pool, tables, info, chunk=chunk, hq=hq, hkv=hkv, dh=dh, page=page, bm=bm, bn=bn, splits=splits
    )
    errors = []
    for s, (valid, _) in enumerate(segments):
        rows = slice(s * chunk, (s + 1) * chunk)
        expected = reference_output(q[rows], k_pool, v_pool, tables[s], positions[rows], window, dh**-0.5)
        errors.append(relative_error(got[rows], expected, valid))
    assert np.isfinite(got).all(), f"non-finite outputs ({np.isnan(got).sum()} NaN); errors {errors}"
    assert max(errors) < TOLERANCE[dtype_name], (
        f"per-segment err {', '.join(f'{e:.1e}' for e in errors)} (tolerance {TOLERANCE[dtype_name]:.0e})"
    )
