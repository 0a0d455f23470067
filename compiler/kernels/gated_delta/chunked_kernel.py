"""Gated DeltaNet's mixer over prefill segments in chunks of BT tokens (the WY / UT-transform form of
reference.chunked_gated_delta), as one Triton kernel: the parallel twin of recurrent_kernel.py for long segments.

One program per (segment, value head, block of BV value columns); the segment's tokens are rows start .. start + L
of the step's flat arrays (compiler/batch.py: P segments of L tokens, tokens first, padding after). The program
reads its request's state S [dk, BV] from the slot of the segment's first token (zeros at position 0), then per
chunk of BT tokens (all tiles in registers):

    q, k, v    the causal conv1d of the chunk's rows (taps reach back into the carried window or the
               previous chunk), silu, L2 norms of q and k, q * dk^-1/2; padding rows zeroed (they change nothing)
    g, beta    a_neg * softplus(a + dt_bias), sigmoid(b); cum = cumsum(g) inside the chunk
    A          beta_i exp(cum_i - cum_j) k_i . k_j below the diagonal;  T = (I + A)^-1 by forward substitution
    u, w       T (beta v),  T (beta exp(cum) k):  what the chunk writes, how the incoming state shows through
    v_new      u - w S;  o = exp(cum) q S + (q k^T * decay, causal) v_new
    S          exp(cum_last) S + (exp(cum_last - cum) k)^T v_new

and writes S back to the slot in place at the end, and the segment's new conv window as recurrent_kernel.py
does (one writer per channel; the caller scatters it). Matmuls accumulate in fp32 from fp32 operands
(PRECISION "tf32x3": three TF32 tensor-core products, about fp32's accuracy: the state carries across chunks and
plain TF32's 10-bit mantissa would drift from the reference; "ieee" (FMA dots) spilled ~40 KB a thread at the
checkpoints' shape against ~3 KB for tf32x3 at 8 warps: tools/dev/compile_hybrid_kernels.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .recurrent_kernel import _conv_tap, _l2_normalize, _log_decay, _segment_state, _write_window


@triton.jit
def _conv_tile(qkv_ptr, pool_ptr, w_ptr, start, j, slot, fresh, ch, ok_c, live, C: tl.constexpr, W: tl.constexpr):
    """silu(conv1d) of rows j [BT] (offsets in the segment) at channels ch [BK], fp32 [BT, BK]; 0 where not live."""
    acc = tl.zeros([j.shape[0], ch.shape[0]], tl.float32)
    for i in tl.static_range(W):
        m = j + i  # [BT] index in the seen sequence [window, x_0, ...]
        tap = _conv_tap(
            qkv_ptr, pool_ptr, (start + m - (W - 1))[:, None], m[:, None], slot, fresh, ch[None, :],
            ok_c[None, :] & live[:, None], C, W,
        )  # fmt: skip
        acc += tl.load(w_ptr + ch * W + i, mask=ok_c, other=0.0).to(tl.float32)[None, :] * tap
    return tl.where(live[:, None], acc * tl.sigmoid(acc), 0.0)


@triton.jit
def gated_delta_chunked_kernel(
    qkv_ptr,  # [N, C]
    b_ptr,  # [N, HV]
    a_ptr,  # [N, HV]
    w_ptr,  # [C, W]
    a_neg_ptr,  # [HV]
    dt_bias_ptr,  # [HV]
    slots_ptr,  # [N] int32, -1 padding
    positions_ptr,  # [N] int32
    conv_pool_ptr,  # [S, W - 1, C]
    delta_in_ptr,  # [S, HV, DK, DV] fp32 (aliased to delta_ptr)
    out_ptr,  # [N, HV * DV]
    window_ptr,  # [P, W - 1, C]
    delta_ptr,  # [S, HV, DK, DV] fp32
    L: tl.constexpr,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    W: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seg = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    C: tl.constexpr = 2 * HK * DK + HV * DV
    R: tl.constexpr = HV // HK
    start = seg * L
    valid, slot, fresh, offs_v, ok_k, ok_v, ch_q, ch_k, ch_v, state_offs, ok_s, s = _segment_state(
        slots_ptr, positions_ptr, delta_in_ptr, start, h, vb, HK, HV, DK, DV, BK, BV
    )
    a_neg = tl.load(a_neg_ptr + h).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    scale = 1.0 / tl.sqrt(DK * 1.0)
    rows = tl.arange(0, BT)
    lower = rows[:, None] > rows[None, :]  # strictly below the diagonal
    causal = rows[:, None] >= rows[None, :]
    eye = (rows[:, None] == rows[None, :]).to(tl.float32)

    n = start * 0  # real tokens of the segment (padding comes after them)
    for c0 in range(0, L, BT):
        j = c0 + rows  # [BT] offsets in the segment
        t = start + j
        live = (j < L) & valid
        live = live & (tl.load(slots_ptr + t, mask=j < L, other=-1) >= 0)
        n += tl.sum(live.to(tl.int32), axis=0)
        q = _conv_tile(qkv_ptr, conv_pool_ptr, w_ptr, start, j, slot, fresh, ch_q, ok_k, live, C, W)
        k = _conv_tile(qkv_ptr, conv_pool_ptr, w_ptr, start, j, slot, fresh, ch_k, ok_k, live, C, W)
        v = _conv_tile(qkv_ptr, conv_pool_ptr, w_ptr, start, j, slot, fresh, ch_v, ok_v, live, C, W)
        q = _l2_normalize(q, 1) * scale
        k = _l2_normalize(k, 1)
        bt = tl.load(b_ptr + t * HV + h, mask=live, other=0.0).to(tl.float32)
        beta = tl.where(live, tl.sigmoid(bt), 0.0)
        g = tl.where(live, _log_decay(tl.load(a_ptr + t * HV + h, mask=live, other=0.0), a_neg, dt_bias), 0.0)
        cum = tl.cumsum(g, axis=0)  # [BT]
        last = tl.sum(g, axis=0)
        diff = cum[:, None] - cum[None, :]
        decay = tl.exp(tl.where(causal, diff, float("-inf")))  # [BT, BT], 0 above the diagonal
        k_beta = k * beta[:, None]
        kk = tl.dot(k_beta, tl.trans(k), input_precision=PRECISION)
        a_mat = tl.where(lower, kk * decay, 0.0)
        solve = eye  # (I + A)^-1, row by row: row i = e_i - A[i, :] solve (rows < i are final)
        for i in range(1, BT):
            a_row = tl.sum(tl.where(rows[:, None] == i, a_mat, 0.0), axis=0)  # [BT]
            row = tl.sum(a_row[:, None] * solve, axis=0)  # [BT]
            solve = tl.where(rows[:, None] == i, solve - row[None, :], solve)
        u = tl.dot(solve, v * beta[:, None], input_precision=PRECISION)  # [BT, BV]
        w = tl.dot(solve, k_beta * tl.exp(cum)[:, None], input_precision=PRECISION)  # [BT, BK]
        v_new = u - tl.dot(w, s, input_precision=PRECISION)
        qk = tl.where(causal, tl.dot(q, tl.trans(k), input_precision=PRECISION) * decay, 0.0)
        o = tl.dot(q * tl.exp(cum)[:, None], s, input_precision=PRECISION) + tl.dot(
            qk, v_new, input_precision=PRECISION
        )
        carried = k * tl.exp(last - cum)[:, None]
        s = s * tl.exp(last) + tl.dot(tl.trans(carried), v_new, input_precision=PRECISION)
        o = tl.where(live[:, None], o, 0.0)
        tl.store(
            out_ptr + t[:, None] * (HV * DV) + h * DV + offs_v[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=(j < L)[:, None] & ok_v[None, :],
        )

    tl.store(delta_ptr + state_offs, s, mask=ok_s & valid)
    writes_qk = (h % R == 0) & (vb == 0)
    _write_window(
        qkv_ptr, conv_pool_ptr, window_ptr, seg, start, n, slot, fresh, ch_q, ch_k, ch_v, ok_k, ok_v, writes_qk, C, W
    )


def launch_plan(*, segments: int, segment_len: int, hk, hv, dk, dv, width, chunk: int = 64, precision="tf32x3") -> dict:
    """Grid and constants for `segments` prefill segments of `segment_len` tokens (the step's rows from 0)."""
    if hv % hk:
        raise ValueError(f"gated_delta kernel: value heads {hv} not a multiple of key heads {hk}")
    bk = max(16, triton.next_power_of_2(dk))
    bv = max(16, min(triton.next_power_of_2(dv), 32))
    meta = dict(L=segment_len, HK=hk, HV=hv, DK=dk, DV=dv, W=width, BK=bk, BV=bv, BT=chunk, PRECISION=precision)
    return {"grid": (segments, hv, triton.cdiv(dv, bv)), "num_warps": 8, "meta": meta}
