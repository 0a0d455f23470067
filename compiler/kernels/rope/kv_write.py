"""RoPE on q and k and the step's K/V write into the paged pools, as ONE Triton kernel (the h200 target's
`rope_attention` runs it before the attention kernels).

Why: XLA runs the rotation of q, the rotation of k, the state kind's slot pick and the two pool writes as
~5 kernels per layer (~9 µs at batch 1 on the H200, docs/results/h200_step_profile_*); one program per token
does all of it, reading q, k, v once.

Grid (N,): program t owns token t: q[t] [HQ, DH] rotated into q_out[t]; k[t] rotated and v[t] copied into
the pools at flat slot slots[t] (pool [blocks, block_size, HKV, DH] is contiguous, so slot s, head h starts
at (s * HKV + h) * DH), cast to the pool's dtype; the pools are aliased to the outputs (written in place).
Rotation, as rope.py's reference: angles = position * inv_freq[j] in fp32, and each rotated pair (a, b) —
(x[j], x[j + DH/2]) for "neox", (x[2j], x[2j + 1]) for "interleaved" — becomes (a cos - b sin, b cos + a sin)
in fp32, rounded once to the input's dtype (and from that to an FP8 pool's: two roundings, as the reference's
rotation followed by its write).
"""

from __future__ import annotations

import jax
import triton
import triton.language as tl

STYLES = ("neox", "interleaved")


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, dst_row, t, c, s, ja, jb, HEADS: tl.constexpr, BLOCK_H: tl.constexpr, DH: tl.constexpr
):
    """Rotate the HEADS heads of src[t] (pairs at columns ja, jb [1, DH/2]) into dst at element dst_row."""
    h = tl.arange(0, BLOCK_H)[:, None]
    ok = h < HEADS
    src = src_ptr + t * HEADS * DH + h * DH
    a = tl.load(src + ja, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(src + jb, mask=ok, other=0.0).to(tl.float32)
    out = dst_ptr + dst_row + h * DH
    # rounded to the source's dtype first, as the reference's rotation is, then to the destination's (an FP8 pool)
    dtype = src_ptr.dtype.element_ty
    tl.store(out + ja, (a * c - b * s).to(dtype).to(dst_ptr.dtype.element_ty), mask=ok)
    tl.store(out + jb, (b * c + a * s).to(dtype).to(dst_ptr.dtype.element_ty), mask=ok)


@triton.jit
def rope_write_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    positions_ptr,
    inv_freq_ptr,
    slots_ptr,
    k_pool_in,
    v_pool_in,
    q_out_ptr,
    k_pool_ptr,
    v_pool_ptr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    DH: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    t = tl.program_id(0)
    j = tl.arange(0, DH // 2)[None, :]
    if INTERLEAVED:
        ja, jb = 2 * j, 2 * j + 1
    else:
        ja, jb = j, j + DH // 2
    angle = tl.load(positions_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + j).to(tl.float32)  # [1, DH/2]
    c = tl.cos(angle)
    s = tl.sin(angle)
    slot = tl.load(slots_ptr + t).to(tl.int64)  # pools can pass 2**31 elements
    _rotate_heads(q_ptr, q_out_ptr, t * HQ * DH, t, c, s, ja, jb, HQ, BLOCK_HQ, DH)
    _rotate_heads(k_ptr, k_pool_ptr, slot * HKV * DH, t, c, s, ja, jb, HKV, BLOCK_HKV, DH)
    h = tl.arange(0, BLOCK_HKV)[:, None]
    cols = tl.arange(0, DH)[None, :]
    ok = h < HKV
    v = tl.load(v_ptr + t * HKV * DH + h * DH + cols, mask=ok, other=0.0)
    tl.store(v_pool_ptr + slot * HKV * DH + h * DH + cols, v.to(v_pool_ptr.dtype.element_ty), mask=ok)


def launch_plan(n: int, hq: int, hkv: int, dh: int, style: str) -> dict:
    """Grid, warps and compile-time constants of one launch (pure: testable anywhere)."""
    if style not in STYLES:
        raise ValueError(f"unknown rope style {style!r}; expected one of {STYLES}")
    if dh < 2 or dh & (dh - 1):
        raise ValueError(f"rope_write: head_dim must be a power of two >= 2, got {dh}")
    block = lambda heads: 1 << (heads - 1).bit_length()
    warps = 4 if (hq + 2 * hkv) * dh <= 8192 else 8
    return {
        "grid": (n,),
        "num_warps": warps,
        "meta": {
            "HQ": hq,
            "HKV": hkv,
            "DH": dh,
            "BLOCK_HQ": block(hq),
            "BLOCK_HKV": block(hkv),
            "INTERLEAVED": style == "interleaved",
        },
    }


def rope_write(q, k, v, positions, inv_freq, slots, k_pool, v_pool, *, style: str):
    """q [N, hq, dh], k/v [N, hkv, dh], positions/slots int32 [N], inv_freq [dh/2], pools [blocks, bs, hkv, dh]
    -> (rotated q [N, hq, dh] in q's dtype, k_pool, v_pool) with rotated k and v written at `slots`."""
    from ember.compiler.kernels.triton.launch import triton_call

    n, hq, dh = q.shape
    hkv = k.shape[1]
    plan = launch_plan(n, hq, hkv, dh, style)
    return triton_call(
        q,
        k,
        v,
        positions.astype("int32"),
        inv_freq.astype("float32"),
        slots.astype("int32"),
        k_pool,
        v_pool,
        kernel=rope_write_kernel,
        out_shape=(
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct(k_pool.shape, k_pool.dtype),
            jax.ShapeDtypeStruct(v_pool.shape, v_pool.dtype),
        ),
        input_output_aliases={6: 1, 7: 2},
        grid=plan["grid"],
        num_warps=plan["num_warps"],
        num_stages=1,
        **plan["meta"],
    )
