"""Triton kernels: split-K ("flash-decoding") attention of decode rows over the paged KV pool.

Imports only triton (and the activation quantizer's Triton helpers), so Triton's CPU interpreter can run these
kernels on numpy buffers
(tests/kernels/attention/test_decode_interpret.py, test_decode_fused_interpret.py); decode.py launches them (as
native XLA kernels, ../triton_launch.py).

What one program computes. Grid (B, hkv, SPLITS): program (b, h, s) takes decode row b, KV head h and
the s-th share of the row's visible tokens, and folds them into an online softmax for all G = hq / hkv
query heads of that KV head (GQA), so each K/V tile is read from HBM once per step, not G times.

  visible tokens  [start, end): end = min(ctx_len, position + 1, W * block_size) (only written positions
                  exist, causal is implied), start = max(0, position - window + 1) with a window, else 0.
                  The walk starts AT `start`: tokens before the window, and the block-0 entries a sliding
                  table holds where blocks were handed back, are never loaded (a sliding layer costs
                  O(window) bytes, not O(context)).
  splits          the range is cut into BLOCK_N-token iterations, and split s walks iterations
                  [s * per, min((s + 1) * per, n)) with per = ceil(n / SPLITS): the split is over the
                  row's own length (device data), not the static table width, so a short row in an
                  engine with a long max_model_len still spreads over all splits; iterations past the
                  row leave a split empty (m = -inf, l = 0, acc = 0, which the combine weighs by 0).
  iteration       BLOCK_N consecutive tokens t; each token's block id is read from the table (t // bs),
                  its [dh] K and V rows gathered with int64 offsets (num_blocks * bs * hkv * dh may pass
                  2**31), masked past `end` (masked lanes are not loaded, so garbage or NaN in unread slots
                  cannot leak in). The token walk is independent of block_size: loads stay BLOCK_N rows wide
                  whether blocks hold 16 tokens or 256, and a window start inside a block wastes no lanes.
  math            scores = q @ K^T [G_PAD, BLOCK_N] by tl.dot, kept in log2 units (QK_SCALE is
                  scale * log2(e), so exp2 is the softmax's exp; a constexpr: one compiled kernel per model,
                  where a Python-float argument would reach the kernel as fp64 through jax-triton 0.3.1);
                  running max m, sum l and acc [G_PAD, dh] are fp32; acc += p @ V by tl.dot. An all-masked
                  tile leaves the state unchanged (m stays -inf without exp(-inf - -inf) = NaN: the
                  reference max is 0 while nothing is visible).

Why tl.dot with G padded to G_PAD = max(16, next power of two) query rows rather than broadcasting FMAs:
G is 1-8 for the models we run, and a broadcast q[:, None, :] * K[None] product is a [G, BLOCK_N, dh] fp32
temporary (G * 32 registers per thread at 4 warps for 64 x 128 tiles) plus a cross-lane reduction over dh
for every score. mma.sync with 16 rows costs 16 / G of useful tensor-core work, but tensor-core throughput
is ~100x what the HBM stream needs at decode (2 * G flops per K/V element loaded), the fp32 state stays
[16, dh] per program, and K/V tiles sit in shared memory in the layout mma wants (which also lets Triton
pipeline them with cp.async across iterations: num_stages).

Precision. bf16 (or fp16) q and pool: q @ K^T multiplies bf16 values exactly into an fp32 accumulator;
p is rounded to the pool dtype for p @ V (as flash attention does: ~2**-9 relative per weight, below the
bf16 output rounding). Any fp32 operand (DOT_FP32): everything is converted to fp32 and both dots run with
input_precision="ieee" (no TF32 rounding), matching the reference to fp32 rounding.

FP8 KV (EngineConfig.kv_cache_dtype="fp8"): values are stored rounded to e4m3 with no scale (as vLLM's fp8 cache
without calibrated scales). Both dots then run in fp16: e4m3 widens to fp16 exactly in one cvt per two values
(to bf16 Triton needs several instructions per value, which made the 8B's 32k-context decode slower than on a
bf16 pool), q is rounded to fp16 (exact for |q| in [2**-14, 65504] at bf16's 8 bits) and p to fp16 (finer than
bf16). The tiles hold twice the tokens (decode_launch_plan: the bytes of a bf16 tile). `load_kv_tile`
(decode_split.py) is the one place a tile enters the kernel, so a per-block or per-token scale would go there.

Outputs. paged_decode_partials_kernel writes unnormalized fp32 partials acc [B, hkv, SPLITS, G, dh] and
m, l [B, hkv, SPLITS, G] (m in log2 units) that paged_decode_combine_kernel (decode_combine_kernel.py)
merges with log-sum-exp weights (decode.combine_partials is the same merge in jnp).
paged_decode_kernel is the SPLITS = 1 case (large batches): it normalizes in-kernel and writes
[B, hq, dh] in the output dtype, so the step has one launch and no combine op.
paged_decode_rope_partials_kernel (steps whose rows all decode; the policy's attention.fused_rope_decode) is
the partials kernel with rope_write's work folded in: each program rotates its q heads and the row's new K, split 0
writes K / V to the pools, and the row's own token (its last visible one) is never read back from the pool,
where another program's write may not have landed: its score q . k_own is taken before the walk and its
weight times v_own is added after it (a [G] weight carried through the loop), so the loop keeps the plain
kernel's registers (114 vs 96 at 12/2 x 128; compile stats: tools/dev/compile_attention_kernels.py). It relies on
batch.py's contract that decode rows belong to different sequences: no row reads a token another row of
the same launch writes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.attention.decode_combine_kernel import (
    paged_decode_combine_kernel,
    paged_decode_combine_quant_kernel,
)
from ember.compiler.kernels.attention.decode_split import attend_split, visible_range


@triton.jit
def paged_decode_partials_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    ctx_ptr,
    pos_ptr,
    window_ptr,
    acc_ptr,
    m_ptr,
    l_ptr,
    QK_SCALE: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    DH: tl.constexpr,
    DH_PAD: tl.constexpr,
    BS: tl.constexpr,
    W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # q [B, HQ, DH]; k, v [num_blocks, BS, HKV, DH]; table [B, W] int32; ctx, pos [B] int32; window [1] int32
    # -> acc [B, HKV, SPLITS, G, DH], m, l [B, HKV, SPLITS, G] fp32
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    acc, m, l = attend_split(
        q_ptr,
        k_ptr,
        v_ptr,
        table_ptr,
        ctx_ptr,
        pos_ptr,
        window_ptr,
        b,
        h,
        split,
        QK_SCALE,
        HQ,
        HKV,
        G,
        G_PAD,
        DH,
        DH_PAD,
        BS,
        W,
        BLOCK_N,
        SPLITS,
        DOT_FP32,
    )
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, DH_PAD)
    row = ((b * HKV + h) * SPLITS + split) * G + g  # [G_PAD] partial row of each query head
    tl.store(m_ptr + row, m, mask=g < G)
    tl.store(l_ptr + row, l, mask=g < G)
    tl.store(acc_ptr + row[:, None] * DH + d[None, :], acc, mask=(g[:, None] < G) & (d[None, :] < DH))


@triton.jit
def _rotated(src_ptr, rows, ok, d, c, s, DH: tl.constexpr, INTERLEAVED: tl.constexpr):
    """RoPE of the head rows at element offsets `rows` [R] (columns d [DH]; c, s [DH] the cos / sin of each
    column's pair), fp32: rope_write's (a cos - b sin, b cos + a sin) per pair, as own * cos -/+ other * sin."""
    if INTERLEAVED:
        other_d = d ^ 1
        first = d % 2 == 0
    else:
        other_d = (d + DH // 2) % DH
        first = d < DH // 2
    own = tl.load(src_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    other = tl.load(src_ptr + rows[:, None] + other_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    return tl.where(first[None, :], own * c[None, :] - other * s[None, :], own * c[None, :] + other * s[None, :])


@triton.jit
def paged_decode_rope_partials_kernel(
    q_ptr,
    k_new_ptr,
    v_new_ptr,
    inv_freq_ptr,
    slots_ptr,
    k_pool_in,
    v_pool_in,
    table_ptr,
    ctx_ptr,
    pos_ptr,
    window_ptr,
    acc_ptr,
    m_ptr,
    l_ptr,
    k_ptr,
    v_ptr,
    QK_SCALE: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    DH: tl.constexpr,
    DH_PAD: tl.constexpr,
    BS: tl.constexpr,
    W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    WRITE_KV: tl.constexpr = True,
):
    # rope_write_kernel and paged_decode_partials_kernel in one launch, for steps whose rows all decode: q, k_new,
    # v_new [B, HQ | HKV, DH] unrotated (the projection's); inv_freq [DH / 2] fp32; slots [B] where the step's K/V
    # goes; k_pool_in / v_pool_in and k_ptr / v_ptr the same pools (aliased: written in place). Program
    # (b, h, split) rotates its G query heads and KV head h itself (cheap: [G + 1, DH] per program); split 0
    # writes the rotated K and V to the pools, and no program reads the row's own token (position pos[b]) from
    # the pool: its scores are taken here, its V row added after the walk (attend_split), so no program waits
    # for another's write. DH is a power of two (DH_PAD == DH).
    # -> acc, m, l as paged_decode_partials_kernel's: rope_write then the partials kernel up to fp32 rounding (the
    # own token's score and weighted value are summed outside the tensor-core dots; see attend_tile).
    # WRITE_KV=False leaves the pools alone (the interpreter check: the own token must come from registers,
    # which a sequential interpreter, running split 0 first, would not otherwise show).
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    d = tl.arange(0, DH)
    # every load that depends on nothing else is issued first (the pool stores below would keep later loads
    # behind them): the row's range, its own V row and slot, then the rotation's inputs
    visible = visible_range(ctx_ptr, pos_ptr, window_ptr, b, W * BS)
    v_own = tl.load(v_new_ptr + (b * HKV + h) * DH + d).to(v_ptr.dtype.element_ty)
    slot = tl.load(slots_ptr + b).to(tl.int64)  # pools can pass 2**31 elements
    if INTERLEAVED:
        pair = d // 2
    else:
        pair = d % (DH // 2)
    angle = tl.load(pos_ptr + b).to(tl.float32) * tl.load(inv_freq_ptr + pair)  # [DH]
    c = tl.cos(angle)
    s = tl.sin(angle)
    g = tl.arange(0, G_PAD)
    q = _rotated(q_ptr, (b * HQ + h * G + g) * DH, g < G, d, c, s, DH, INTERLEAVED)
    q = q.to(q_ptr.dtype.element_ty)  # rounded as rope_write's output
    one = tl.arange(0, 1)
    k_own = _rotated(k_new_ptr, (b * HKV + h) * DH + one, one >= 0, d, c, s, DH, INTERLEAVED)  # [1, DH]
    k_own = k_own.to(k_new_ptr.dtype.element_ty).to(k_ptr.dtype.element_ty)  # rounded as rope_write writes it
    if DOT_FP32:
        DOT_DTYPE: tl.constexpr = tl.float32
    elif k_ptr.dtype.element_ty.is_fp8():
        DOT_DTYPE: tl.constexpr = tl.float16  # e4m3 -> f16 is one cvt per two values (-> bf16: several)
    else:
        DOT_DTYPE: tl.constexpr = q_ptr.dtype.element_ty
    # the own token's scores [G_PAD] now, so neither the fp32 q nor k_own stays live through the walk
    s_own = tl.sum(q.to(DOT_DTYPE).to(tl.float32) * k_own.to(DOT_DTYPE).to(tl.float32), axis=1)
    if WRITE_KV and split == 0:
        tl.store(k_ptr + slot * (HKV * DH) + h * DH + d, tl.reshape(k_own, [DH]))
        tl.store(v_ptr + slot * (HKV * DH) + h * DH + d, v_own)
    acc, m, l = attend_split(
        q_ptr,
        k_ptr,
        v_ptr,
        table_ptr,
        ctx_ptr,
        pos_ptr,
        window_ptr,
        b,
        h,
        split,
        QK_SCALE,
        HQ,
        HKV,
        G,
        G_PAD,
        DH,
        DH_PAD,
        BS,
        W,
        BLOCK_N,
        SPLITS,
        DOT_FP32,
        q,
        s_own,
        v_own,
        visible,
        True,
    )
    row = ((b * HKV + h) * SPLITS + split) * G + g
    tl.store(m_ptr + row, m, mask=g < G)
    tl.store(l_ptr + row, l, mask=g < G)
    tl.store(acc_ptr + row[:, None] * DH + d[None, :], acc, mask=g[:, None] < G)


@triton.jit
def paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    ctx_ptr,
    pos_ptr,
    window_ptr,
    out_ptr,
    QK_SCALE: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    DH: tl.constexpr,
    DH_PAD: tl.constexpr,
    BS: tl.constexpr,
    W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # the single-split case: same inputs -> out [B, HQ, DH] in out's dtype (a row that sees nothing gets 0)
    b = tl.program_id(0)
    h = tl.program_id(1)
    acc, m, l = attend_split(
        q_ptr,
        k_ptr,
        v_ptr,
        table_ptr,
        ctx_ptr,
        pos_ptr,
        window_ptr,
        b,
        h,
        0,
        QK_SCALE,
        HQ,
        HKV,
        G,
        G_PAD,
        DH,
        DH_PAD,
        BS,
        W,
        BLOCK_N,
        1,
        DOT_FP32,
    )
    out = acc / tl.where(l > 0.0, l, 1.0)[:, None]
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, DH_PAD)
    ptrs = out_ptr + (b * HQ + h * G + g)[:, None] * DH + d[None, :]
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=(g[:, None] < G) & (d[None, :] < DH))


KERNELS = {
    "partials": paged_decode_partials_kernel,
    "rope_partials": paged_decode_rope_partials_kernel,
    "single": paged_decode_kernel,
    "combine": paged_decode_combine_kernel,
    "combine_quant": paged_decode_combine_quant_kernel,
}
