"""paged_decode_attention: decode rows (one query token each) over the paged KV pool, split-K.

backend="triton"   decode_kernel.py as native XLA kernels (../triton/launch.py; NVIDIA GPUs only): the split
                   partials, then their combine (one launch; XLA's fusion of combine_partials was five at the
                   65 splits of a batch-1 engine with max_model_len 16,528)
backend="emulate"  the same split-K algorithm in plain jnp (same visible range, same per-split token
                   shares, same BLOCK_N iterations with an online softmax, same combine): runs anywhere,
                   so CPU tests check the algorithm against the reference `_attend` (and
                   test_decode_interpret.py the Triton kernel itself in the interpreter).

Both return [B, hq, dh] in q's dtype, and both are traceable inside one jitted step: shapes and the launch
plan are static (from q, the pool and the table width), lengths and the window are device data.

Combine (flash-decoding): split s of a row/head holds acc_s = sum_t exp2(x_t - m_s) v_t,
l_s = sum_t exp2(x_t - m_s) over its tokens (x in log2 units); with M = max_s m_s,
out = sum_s exp2(m_s - M) acc_s / sum_s exp2(m_s - M) l_s. Empty splits (m = -inf) weigh 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ember.compiler.kernels.config_override import overridden
from ember.compiler.kernels.gguf_gemv.act_quant import act_terms, packed_shapes
from ember.compiler.targets.policy import kernel_policy

LOG2E = math.log2(math.e)
BACKENDS = ("triton", "emulate")


@dataclass(frozen=True)
class DecodeAttentionConfig:
    """Launch knobs (H200 defaults; tools/dev/bench_attention.py --sweep measures the alternatives)."""

    block_n: int = 64  # tokens per loop iteration at dh <= 128 (scaled down for wider heads: same tile bytes)
    num_warps: int = 4
    num_stages: int = 2
    num_sms: int = 132
    # split until B * hkv * splits reaches num_sms * programs_per_sm: Triton 3.6 pipelines the K/V tiles of
    # this loop with one buffer (the next tile's cp.async is issued once the current one is consumed), so
    # each program keeps ~one BLOCK_N tile (32 KB at 64 x 128 bf16, K and V) in flight, and HBM wants
    # ~36 GB/s x ~1-2 µs ≈ 40-70 KB in flight per SM ...
    programs_per_sm: int = 4
    max_splits: int = 128  # ... but at most this many splits
    min_split_tokens: int = 256  # ... and at least this many tokens of the table width per split


def default_config() -> DecodeAttentionConfig:
    """DecodeAttentionConfig(), with the kernel policy's attention.decode_config ({"num_warps": 2}, read at trace
    time) overriding its fields: for side-by-side measurements of the launch knobs (config_override.py)."""
    return overridden(DecodeAttentionConfig(), kernel_policy().attention.decode_config, "attention.decode_config")


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def decode_launch_plan(
    batch: int,
    hq: int,
    hkv: int,
    dh: int,
    block_size: int,
    table_width: int,
    *,
    dot_fp32: bool,
    scale: float = 1.0,
    config: DecodeAttentionConfig = DecodeAttentionConfig(),
    splits: int | None = None,
    kv_itemsize: int = 2,
) -> dict:
    """Static launch parameters of one call: grid, splits, kernel constexprs. Pure; testable on CPU.

    splits (unless forced): more when B * hkv is small and the table is wide. The table width W (the
    engine's max context / block_size) is all that is static; the per-row share is set in the kernel from
    the row's own length, so a split count sized for W costs a short row only empty programs and a larger
    combine."""
    if hq % hkv:
        raise ValueError(f"hq={hq} is not a multiple of hkv={hkv}")
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    dh_pad = max(16, _next_pow2(dh))
    # wider heads take fewer tokens per tile, an FP8 pool (kv_itemsize 1) twice as many: the same tile bytes (at
    # 32k context the 8B's partials took 45.1 us per layer with 64-token FP8 tiles, 34.1 with 128, 36.2 on bf16
    # pools: docs/results/h200_kv_fp8_tiles_15d6c41.json)
    block_n = max(16, config.block_n * 128 // max(dh_pad, 128) * (2 if kv_itemsize == 1 else 1))
    if block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two, got {block_n}")
    max_tokens = table_width * block_size
    if splits is None:
        wanted = -(-config.num_sms * config.programs_per_sm // max(1, batch * hkv))
        by_length = -(-max_tokens // config.min_split_tokens)
        splits = max(1, min(wanted, by_length, config.max_splits))
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    g = hq // hkv
    meta = dict(
        QK_SCALE=float(scale) * LOG2E,
        HQ=hq,
        HKV=hkv,
        G=g,
        G_PAD=max(16, _next_pow2(g)),
        DH=dh,
        DH_PAD=dh_pad,
        BS=block_size,
        W=table_width,
        BLOCK_N=block_n,
        DOT_FP32=dot_fp32,
    )
    if splits > 1:
        meta["SPLITS"] = splits
    # one program per (row, KV head, split): B on x (up to 2**31 - 1), hkv and splits on y, z (<= 65535)
    return {"grid": (batch, hkv, splits), "splits": splits, "block_n": block_n, "meta": meta}


def paged_decode_attention(
    q,
    k_pool,
    v_pool,
    block_tables,
    ctx_lens,
    positions,
    window,
    *,
    scale: float,
    backend: str = "triton",
    config: DecodeAttentionConfig | None = None,
    splits: int | None = None,
    activations_for: str | None = None,
):
    """q [B, hq, dh]; k_pool, v_pool [num_blocks, bs, hkv, dh]; block_tables [B, W] int32; ctx_lens [B]
    (tokens in context, the row's own included, already in the pool); positions [B] (ctx_len - 1 for
    decode); window: scalar (0 = unlimited; else positions > p - window are seen); scale: a Python float.
    -> [B, hq, dh] in q's dtype. activations_for ("q4_k" / "q6_k": the packing of the projection reading the
    output): -> (out, (qa, da)) with the output rows [B, hq * dh] as that projection's int8 activations where
    the combine kernel made them (split launches, dh a power of two >= 32), else (out, None)."""
    config = config or default_config()
    b, _, dh = q.shape
    pool_dh = k_pool.shape[3]
    if pool_dh != dh or v_pool.shape != k_pool.shape or block_tables.shape[0] != b:
        raise ValueError(
            f"shapes do not match: q {q.shape}, pools {k_pool.shape} {v_pool.shape}, tables {block_tables.shape}"
        )
    plan = _launch_plan(q, k_pool, v_pool, block_tables, scale, config, splits)
    window = jnp.asarray(window).astype(jnp.int32)
    tables, ctx_lens, positions = (jnp.asarray(a).astype(jnp.int32) for a in (block_tables, ctx_lens, positions))
    if backend == "emulate":
        acc, m, l = split_k_partials_jnp(
            q,
            k_pool,
            v_pool,
            tables,
            ctx_lens,
            positions,
            window,
            qk_scale=plan["meta"]["QK_SCALE"],
            splits=plan["splits"],
            block_n=plan["block_n"],
        )
        out = combine_partials(acc, m, l, q.dtype)
        return out if activations_for is None else (out, None)
    if backend == "triton":
        out, activations = _triton_decode(
            q, k_pool, v_pool, tables, ctx_lens, positions, window, plan, config, activations_for
        )
        return out if activations_for is None else (out, activations)
    raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def _triton_decode(q, k_pool, v_pool, tables, ctx_lens, positions, window, plan, config, activations_for):
    # -> (out [B, hq, dh], (qa, da) or None)
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.compiler.kernels.triton.launch import triton_call  # Triton: imported on use (GPU-only)

    hkv, splits, meta = k_pool.shape[2], plan["splits"], plan["meta"]
    args = (q, k_pool, v_pool, tables, ctx_lens, positions, window.reshape(1))
    launch = dict(grid=plan["grid"], num_warps=config.num_warps, num_stages=config.num_stages, **meta)
    if splits == 1:  # one launch writes the output: nothing after it
        return triton_call(
            *args, kernel=KERNELS["single"], out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), **launch
        ), None
    acc, m, l = triton_call(*args, kernel=KERNELS["partials"], out_shape=_partials_shapes(q, hkv, splits), **launch)
    return _merge(acc, m, l, q, plan, config, activations_for)


def _launch_plan(q, k_pool, v_pool, block_tables, scale, config, splits=None) -> dict:
    # decode_launch_plan for these arrays: fp32 dots unless q has a 16-bit float dtype and both pools hold it (or
    # FP8 e4m3: the kernels' dots then run in fp16, decode_kernel.py)
    _, block_size, hkv, _ = k_pool.shape
    dot_fp32 = not (
        q.dtype in (jnp.bfloat16, jnp.float16)
        and k_pool.dtype == v_pool.dtype
        and k_pool.dtype in (q.dtype, jnp.float8_e4m3fn)
    )
    return decode_launch_plan(
        q.shape[0],
        q.shape[1],
        hkv,
        q.shape[2],
        block_size,
        block_tables.shape[1],
        dot_fp32=dot_fp32,
        scale=scale,
        config=config,
        splits=splits,
        kv_itemsize=jnp.dtype(k_pool.dtype).itemsize,
    )


def _partials_shapes(q, hkv: int, splits: int) -> tuple:
    # the partials kernels' fp32 outputs: acc [B, hkv, S, G, dh], m, l [B, hkv, S, G]
    b, hq, dh = q.shape
    rows = (b, hkv, splits, hq // hkv)
    return (
        jax.ShapeDtypeStruct((*rows, dh), jnp.float32),
        jax.ShapeDtypeStruct(rows, jnp.float32),
        jax.ShapeDtypeStruct(rows, jnp.float32),
    )


def _merge(acc, m, l, q, plan, config, activations_for):
    # the split partials -> (out [B, hq, dh] in q's dtype, (qa, da) or None): the combine kernel, or XLA's merge
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.compiler.kernels.triton.launch import triton_call

    b, hq, dh = q.shape
    merge = dict(grid=(b, hq), num_warps=config.num_warps, num_stages=1, **combine_meta(plan["meta"], plan["splits"]))
    out_shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
    if activations_for is None or dh < 32 or dh & (dh - 1):
        return triton_call(acc, m, l, kernel=KERNELS["combine"], out_shape=out_shape, **merge), None
    terms = act_terms()
    out, qa, da = triton_call(
        acc,
        m,
        l,
        kernel=KERNELS["combine_quant"],
        out_shape=(out_shape, *packed_shapes(b, hq * dh, terms)),
        Q6=activations_for == "q6_k",
        ASM=True,
        TERMS=terms,
        **merge,
    )
    return out, (qa, da)


def rope_decode_attention(
    q,
    k,
    v,
    positions,
    inv_freq,
    slots,
    k_pool,
    v_pool,
    block_tables,
    ctx_lens,
    window,
    *,
    style: str,
    scale: float,
    config: DecodeAttentionConfig | None = None,
    activations_for: str | None = None,
):
    """RoPE, the step's K/V write and the split partials in ONE Triton launch (then the combine), for steps whose
    rows all decode: q [B, hq, dh], k / v [B, hkv, dh] as the projections give them (unrotated), positions,
    slots [B] int32, inv_freq [dh / 2] -> (out, activations, k_pool, v_pool) as rope_write followed by
    paged_decode_attention(backend="triton", activations_for=...) give them: the pools bit for bit (the same
    rotation and roundings), the output to fp32 rounding before its own (the row's own token is scored and
    weighted outside the tensor-core dots: decode_kernel.paged_decode_rope_partials_kernel). None where it
    does not apply (one split: the single kernel normalizes in place; a head size that is not a power of
    two): the caller runs the two launches."""
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.compiler.kernels.rope.kv_write import STYLES
    from ember.compiler.kernels.triton.launch import triton_call

    config = config or default_config()
    dh = q.shape[2]
    if dh < 16 or dh & (dh - 1) or style not in STYLES:
        return None
    plan = _launch_plan(q, k_pool, v_pool, block_tables, scale, config)
    if plan["splits"] == 1:
        return None
    i32 = jnp.int32
    acc, m, l, k_pool, v_pool = triton_call(
        q,
        k,
        v,
        inv_freq.astype(jnp.float32),
        slots.astype(i32),
        k_pool,
        v_pool,
        block_tables.astype(i32),
        ctx_lens.astype(i32),
        positions.astype(i32),
        jnp.asarray(window).astype(i32).reshape(1),
        kernel=KERNELS["rope_partials"],
        out_shape=(
            *_partials_shapes(q, k_pool.shape[2], plan["splits"]),
            jax.ShapeDtypeStruct(k_pool.shape, k_pool.dtype),
            jax.ShapeDtypeStruct(v_pool.shape, v_pool.dtype),
        ),
        input_output_aliases={5: 3, 6: 4},
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        INTERLEAVED=style == "interleaved",
        WRITE_KV=True,
        **plan["meta"],
    )
    out, activations = _merge(acc, m, l, q, plan, config, activations_for)
    return out, activations, k_pool, v_pool


def combine_meta(meta: dict, splits: int) -> dict:
    """The combine kernel's constants, from the partials kernel's launch meta: up to 32 splits per tile."""
    return {
        **{k: meta[k] for k in ("HQ", "HKV", "G", "DH", "DH_PAD")},
        "SPLITS": splits,
        "SPLITS_PAD": _next_pow2(splits),
        "CHUNK": min(_next_pow2(splits), 32),
    }


def combine_partials(acc, m, l, dtype) -> jax.Array:
    """acc [B, hkv, S, G, dh], m, l [B, hkv, S, G] (m in log2 units) -> [B, hkv * G, dh] in `dtype`.
    A row/head whose splits are all empty gives 0 (no visible token: cannot happen for a decode row)."""
    b, hkv, _, g, dh = acc.shape
    m_max = jnp.max(m, axis=2, keepdims=True)
    weight = jnp.exp2(m - jnp.where(jnp.isfinite(m_max), m_max, 0.0))  # [B, hkv, S, G]; empty split -> 0
    num = jnp.sum(weight[..., None] * acc, axis=2)  # [B, hkv, G, dh]
    den = jnp.sum(weight * l, axis=2)
    out = num / jnp.where(den > 0, den, 1.0)[..., None]
    return out.reshape(b, hkv * g, dh).astype(dtype)


def visible_range(ctx_lens, positions, window, max_tokens: int):
    """[start, end) of the tokens each decode row's query sees: [B] int32 each (the kernel's _visible_range)."""
    end = jnp.maximum(jnp.minimum(jnp.minimum(ctx_lens, positions + 1), max_tokens), 0)
    start = jnp.where(window > 0, jnp.maximum(positions - window + 1, 0), 0)
    return jnp.minimum(start, end), end


def split_range(start, end, splits: int, block_n: int):
    """Iterations [it_lo, it_hi) of each split: [B, S] int32 each (iteration i covers tokens
    start + i * block_n ...). The kernel's per-split share, on the row's own length."""
    n_iters = -(-(end - start) // block_n)  # [B]
    per_split = -(-n_iters // splits)
    it_lo = jnp.arange(splits, dtype=jnp.int32)[None, :] * per_split[:, None]
    return it_lo, jnp.minimum(it_lo + per_split[:, None], n_iters[:, None])


def split_k_partials_jnp(
    q, k_pool, v_pool, tables, ctx_lens, positions, window, *, qk_scale: float, splits: int, block_n: int
):
    """The kernel's partials (acc [B, hkv, S, G, dh], m, l [B, hkv, S, G]) in jnp, all splits at once: a
    fori_loop over the static bound of iterations per split, each gathering [B, S, block_n] tokens."""
    b, hq, dh = q.shape
    _, bs, hkv, _ = k_pool.shape
    width = tables.shape[1]
    g = hq // hkv
    f32 = jnp.float32
    start, end = visible_range(ctx_lens, positions, window, width * bs)
    it_lo, it_hi = split_range(start, end, splits, block_n)
    tiles = (width * bs + block_n - 1) // block_n
    max_per_split = (tiles + splits - 1) // splits  # static loop bound
    qg = q.reshape(b, hkv, g, dh).astype(f32)
    lanes = jnp.arange(block_n, dtype=jnp.int32)

    def iteration(j, state):
        m, l, acc = state
        it = it_lo + j  # [B, S]
        t = start[:, None, None] + it[..., None] * block_n + lanes  # [B, S, N] token positions
        valid = (it < it_hi)[..., None] & (t < end[:, None, None])
        entry = jnp.clip(t // bs, 0, width - 1).reshape(b, -1)
        block = jnp.take_along_axis(tables, entry, axis=1).reshape(t.shape)
        offset = t % bs
        keep = valid[..., None, None]  # masked lanes are replaced, never multiplied (garbage may be NaN)
        k = jnp.where(keep, k_pool[block, offset], 0).astype(f32)  # [B, S, N, hkv, dh]
        v = jnp.where(keep, v_pool[block, offset], 0).astype(f32)
        s = jnp.einsum("bhgd,bsnhd->bhsgn", qg, k) * qk_scale
        s = jnp.where(valid[:, None, :, None, :], s, -jnp.inf)  # [B, hkv, S, G, N]
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_ref = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp2(m - m_ref)
        p = jnp.exp2(s - m_ref[..., None])
        l = l * alpha + jnp.sum(p, axis=-1)
        acc = acc * alpha[..., None] + jnp.einsum("bhsgn,bsnhd->bhsgd", p, v)
        return m_new, l, acc

    init = (
        jnp.full((b, hkv, splits, g), -jnp.inf, f32),
        jnp.zeros((b, hkv, splits, g), f32),
        jnp.zeros((b, hkv, splits, g, dh), f32),
    )
    m, l, acc = jax.lax.fori_loop(0, max_per_split, iteration, init)
    return acc, m, l
