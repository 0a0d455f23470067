"""The decode attention kernels' interpreter cases (test_decode_interpret.py, test_decode_fused_interpret.py):
random ragged pools and tables, the jnp reference, and the plain kernels (single, or partials then the combine)
launched on host buffers. Kernel modules are imported inside the functions, so importing this module (the main
CPU run collects the tests too) decorates no kernel."""

from __future__ import annotations

import math

import numpy as np
from interpreter import HostBuffer


def make_case(
    rng: np.random.Generator,
    hq: int,
    hkv: int,
    dh: int,
    block_size: int,
    window: int,
    batch: int = 4,
    max_ctx: int = 100,
    padding_row: bool = False,
) -> dict:
    """Random pools [blocks, block_size, hkv, dh], ragged contexts (row 0 at max_ctx), scattered blocks.
    tables [batch, width]: what the reference reads (every block real); trimmed: a sliding kind's tables
    (block 0 where a block lies wholly before the window). padding_row: the last row as the runtime pads a
    bucket (context 1, position 0, a table of block 0)."""
    width = -(-max_ctx // block_size) + 1  # one spare entry past the longest context
    ctx = rng.integers(1, max_ctx + 1, batch)
    ctx[0] = max_ctx
    blocks = 1 + rng.permutation(batch * width).reshape(batch, width)
    pools = [rng.standard_normal((1 + batch * width, block_size, hkv, dh)).astype(np.float32) for _ in range(2)]
    trimmed = blocks.copy()
    if window:
        for r in range(batch):
            dropped = max(0, ctx[r] - window) // block_size  # blocks wholly before position ctx - window + 1
            trimmed[r, :dropped] = 0
    if padding_row:
        ctx[-1], blocks[-1], trimmed[-1] = 1, 0, 0
    q = rng.standard_normal((batch, hq, dh)).astype(np.float32)
    return dict(
        q=q,
        k_pool=pools[0],
        v_pool=pools[1],
        tables=blocks.astype(np.int32),
        trimmed=trimmed.astype(np.int32),
        ctx=ctx.astype(np.int32),
        window=window,
    )


def reference(case: dict, dtype, pool_dtype=None) -> np.ndarray:
    """`_attend` on the inputs rounded to dtype (the pools to pool_dtype), in fp32: [batch, hq, dh]."""
    import jax.numpy as jnp

    from ember.compiler.kernels.attention.reference import _attend, _gather, _table_slots

    cast = lambda a, t=dtype: jnp.asarray(a.astype(t)).astype(jnp.float32)
    pools = (cast(case[name], pool_dtype or dtype) for name in ("k_pool", "v_pool"))
    slots = _table_slots(jnp.asarray(case["tables"]), case["k_pool"].shape[1])
    pos = jnp.asarray(case["ctx"] - 1)
    out = _attend(
        cast(case["q"])[:, None],
        *(_gather(pool, slots) for pool in pools),
        pos[:, None],
        jnp.int32(case["window"]),
        1.0 / math.sqrt(case["q"].shape[-1]),
    )
    return np.asarray(out[:, 0])


def partial_buffers(batch: int, hkv: int, splits: int, g: int, dh: int) -> list[HostBuffer]:
    """The partials kernel's NaN-filled outputs: acc [batch, hkv, splits, g, dh], m and l [batch, hkv, splits, g]."""
    shapes = ((batch, hkv, splits, g, dh), (batch, hkv, splits, g), (batch, hkv, splits, g))
    return [HostBuffer(np.full(shape, np.nan, np.float32)) for shape in shapes]


def rel_err(got: np.ndarray, expected: np.ndarray) -> float:
    """max |got - expected| / max |expected| (NaN when got holds one: every `err < tol` then fails)."""
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def run_kernel(
    case: dict, dtype, splits: int, block_n: int | None = None, nan_block0: bool = False, pool_dtype=None
) -> np.ndarray:
    """Launch the kernels the plan picks on host buffers: single when splits == 1, else partials then the combine
    kernel (asserted against decode.combine_partials on the same partials). pool_dtype: the pools' (default q's;
    float8 e4m3: the kernels' fp16 dots). nan_block0: the trimmed tables, with block 0 NaN-filled (a sliding
    kind's dropped entries point there, and the kernel must never read them). Returns [batch, hq, dh] fp32."""
    import jax.numpy as jnp

    from ember.compiler.kernels.attention.decode import (
        DecodeAttentionConfig,
        combine_meta,
        combine_partials,
        decode_launch_plan,
    )
    from ember.compiler.kernels.attention.decode_kernel import KERNELS

    q = case["q"].astype(dtype)
    batch, hq, dh = q.shape
    _, block_size, hkv, _ = case["k_pool"].shape
    k_pool, v_pool = (case[name].astype(pool_dtype or dtype) for name in ("k_pool", "v_pool"))  # copies
    tables = case["trimmed"] if nan_block0 else case["tables"]
    if nan_block0:
        k_pool[0], v_pool[0] = np.nan, np.nan
    config = DecodeAttentionConfig(block_n=block_n) if block_n else DecodeAttentionConfig()
    plan = decode_launch_plan(
        batch,
        hq,
        hkv,
        dh,
        block_size,
        tables.shape[1],
        dot_fp32=dtype == np.float32,
        scale=1.0 / math.sqrt(dh),
        config=config,
        splits=splits,
    )
    args = [
        HostBuffer(q),
        HostBuffer(k_pool),
        HostBuffer(v_pool),
        HostBuffer(tables),
        HostBuffer(case["ctx"]),
        HostBuffer(case["ctx"] - 1),
        HostBuffer(np.asarray([case["window"]], np.int32)),
    ]
    out = HostBuffer(np.full((batch, hq, dh), np.nan, dtype))
    if plan["splits"] == 1:
        KERNELS["single"][plan["grid"]](*args, out, **plan["meta"])
        return out.array.astype(np.float32)
    s = plan["splits"]
    parts = partial_buffers(batch, hkv, s, hq // hkv, dh)
    KERNELS["partials"][plan["grid"]](*args, *parts, **plan["meta"])
    KERNELS["combine"][(batch, hq)](*parts, out, **combine_meta(plan["meta"], s))
    merged = np.asarray(combine_partials(*(jnp.asarray(p.array) for p in parts), jnp.float32))
    got = out.array.astype(np.float32)
    # the combine kernel against the same merge in jnp: fp32 sums in another order, then the output dtype
    assert np.allclose(
        got, merged.astype(dtype).astype(np.float32), rtol=1e-2 if dtype != np.float32 else 1e-6, atol=1e-6
    ), f"combine kernel vs combine_partials ({s} splits): max diff {np.abs(got - merged).max():.3g}"
    return got
