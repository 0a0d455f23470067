"""The cases of the decode attention kernels' checks (tools/dev/check_attention_kernels.py): random ragged
pools and tables, the jnp reference, and the plain kernels (single, or partials then the combine) launched on
host buffers. Kernel modules are imported inside the functions: TRITON_INTERPRET must be set first."""

from __future__ import annotations

import math

import numpy as np


def host_buffer(array: np.ndarray):
    """The interpreter's host buffer over `array` (check_quant_kernels.HostBuffer)."""
    from ember.tools.dev.check_quant_kernels import HostBuffer

    return HostBuffer(array)


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
    """Random pools, ragged contexts, scattered blocks. tables: what the reference reads (every block real);
    trimmed: a sliding kind's tables (block 0 where a block lies wholly before the window)."""
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
    if padding_row:  # what the runtime pads a bucket with: context 1, position 0, a table of block 0
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
    import jax.numpy as jnp

    from ember.compiler.kernels.attention.reference import _attend, _gather, _table_slots

    cast = lambda a, t=dtype: jnp.asarray(a.astype(t)).astype(jnp.float32)  # the same rounded inputs, fp32 math
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


def run_kernel(
    case: dict, dtype, splits: int, block_n: int | None = None, nan_block0: bool = False, pool_dtype=None
) -> np.ndarray:
    """Launch the kernels the plan picks on host buffers: single when splits == 1, else partials then the combine
    kernel (checked against decode.combine_partials on the same partials). pool_dtype: the pools' (default q's;
    float8 e4m3: the kernels' fp16 dots)."""
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
    k_pool, v_pool = (case[name].astype(pool_dtype or dtype) for name in ("k_pool", "v_pool"))
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
        host_buffer(q),
        host_buffer(k_pool),
        host_buffer(v_pool),
        host_buffer(tables),
        host_buffer(case["ctx"]),
        host_buffer(case["ctx"] - 1),
        host_buffer(np.asarray([case["window"]], np.int32)),
    ]
    g = hq // hkv
    if plan["splits"] == 1:
        out = host_buffer(np.full((batch, hq, dh), np.nan, dtype))
        KERNELS["single"][plan["grid"]](*args, out, **plan["meta"])
        return out.array.astype(np.float32)
    s = plan["splits"]
    outs = [
        host_buffer(np.full(shape, np.nan, np.float32))
        for shape in ((batch, hkv, s, g, dh), (batch, hkv, s, g), (batch, hkv, s, g))
    ]
    KERNELS["partials"][plan["grid"]](*args, *outs, **plan["meta"])
    out = host_buffer(np.full((batch, hq, dh), np.nan, dtype))
    KERNELS["combine"][(batch, hq)](*outs, out, **combine_meta(plan["meta"], s))
    merged = np.asarray(combine_partials(*(jnp.asarray(o.array) for o in outs), jnp.float32))
    got = out.array.astype(np.float32)
    # the combine kernel against the same merge in jnp: fp32 sums in another order, then the output dtype
    if not np.allclose(
        got, merged.astype(dtype).astype(np.float32), rtol=1e-2 if dtype != np.float32 else 1e-6, atol=1e-6
    ):
        raise AssertionError(f"combine kernel vs combine_partials: max diff {np.abs(got - merged).max():.3g}")
    return got
