"""Gated DeltaNet's mixer as one Triton kernel, token by token (the fused recurrent form): the GPU twin of
op.gated_delta for a step laid out as compiler/batch.py says (B decode rows of one token, then P prefill
segments of L tokens each, tokens first and padding after).

One program per (segment, value head, block of BV value columns). It reads its request's delta-rule state
S [dk, BV] (fp32) once, from the slot of the segment's first token (zeros when that token is at position 0),
then for each token of the segment: the causal conv1d of its q / k / v channels over the carried window and
the segment's earlier tokens, silu, the L2 norms of q and k (q scaled by dk^-1/2), beta = sigmoid(b) and
g = a_neg * softplus(a + dt_bias), and the delta rule; it writes S back to the same slot in place (the pool is
aliased to the output: each (slot, head, column block) belongs to one program) and o to its rows.

The conv window is read from the pool and never written here: programs of the value heads sharing a key head
read the same q / k channels, so one writing them while another reads would race. The kernel writes each
segment's new window [W - 1, C] to a small array instead (each channel by one program: q / k by the first
value head of their key head and column block 0), and the caller scatters it into the pool.

Padding tokens (slot -1) change nothing and get o = 0. Decode is the case L = 1 of the same loop; a prefill
segment runs its L tokens in sequence (chunked_kernel.py is the parallel form for long segments).
"""

from __future__ import annotations

import triton
import triton.language as tl

L2_EPS = 1e-6  # op.L2_EPS


@triton.jit
def _conv_tap(qkv_ptr, pool_ptr, t, m, slot, fresh, ch, ok, C: tl.constexpr, W: tl.constexpr):
    """Input m of the seen sequence [window (W - 1 rows), x_0, x_1, ...] at channels ch, fp32: a window row
    (zero when fresh) or token t's own qkv row for m >= W - 1 (t = the token at index m - (W - 1))."""
    from_window = tl.load(pool_ptr + slot * (W - 1) * C + m * C + ch, mask=ok & (m < W - 1) & (fresh == 0), other=0.0)
    from_x = tl.load(qkv_ptr + t * C + ch, mask=ok & (m >= W - 1), other=0.0)
    return from_window.to(tl.float32) + from_x.to(tl.float32)


@triton.jit
def _conv_row(qkv_ptr, pool_ptr, w_ptr, t, j, slot, fresh, ch, ok, C: tl.constexpr, W: tl.constexpr):
    """silu(conv1d) of token t (offset j in its segment) at channels ch, fp32 (chunked_kernel._conv_tile is the
    form for a tile of tokens)."""
    acc = tl.zeros([ch.shape[0]], tl.float32)
    for i in tl.static_range(W):
        m = j + i  # index in the seen sequence; token index m - (W - 1) of the segment
        tap = _conv_tap(qkv_ptr, pool_ptr, t - (W - 1) + i, m, slot, fresh, ch, ok, C, W)
        acc += tl.load(w_ptr + ch * W + i, mask=ok, other=0.0).to(tl.float32) * tap
    return acc * tl.sigmoid(acc)


@triton.jit
def _segment_state(
    slots_ptr, positions_ptr, delta_in_ptr, start, h, vb,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """What both kernels read first for a segment starting at row `start`, value head h, column block vb: its
    slot (valid: not padding; fresh: position 0), the q / k / v channels of the head, and the state S [BK, BV]
    (fp32, zeros when fresh) with its offsets and mask for the write back."""
    R: tl.constexpr = HV // HK
    kh = h // R
    slot_raw = tl.load(slots_ptr + start)
    valid = slot_raw >= 0
    slot = tl.maximum(slot_raw, 0)
    fresh = (tl.load(positions_ptr + start) == 0).to(tl.int32)
    offs_k = tl.arange(0, BK)
    offs_v = vb * BV + tl.arange(0, BV)
    ok_k = offs_k < DK
    ok_v = offs_v < DV
    ch_q = kh * DK + offs_k
    ch_k = HK * DK + kh * DK + offs_k
    ch_v = 2 * HK * DK + h * DV + offs_v
    state_offs = ((slot * HV + h) * DK + offs_k[:, None]) * DV + offs_v[None, :]
    ok_s = ok_k[:, None] & ok_v[None, :]
    s = tl.load(delta_in_ptr + state_offs, mask=ok_s & valid & (fresh == 0), other=0.0)  # [BK, BV]
    return valid, slot, fresh, offs_v, ok_k, ok_v, ch_q, ch_k, ch_v, state_offs, ok_s, s


@triton.jit
def _l2_normalize(x, AXIS: tl.constexpr):
    """x / sqrt(sum(x^2) + eps) along AXIS (the head dim), fp32."""
    return x / tl.sqrt(tl.sum(x * x, axis=AXIS, keep_dims=True) + 1e-6)


@triton.jit
def _log_decay(a, a_neg, dt_bias):
    """g = a_neg * softplus(a + dt_bias) (softplus linear above 20), fp32."""
    x = a.to(tl.float32) + dt_bias
    return a_neg * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _write_window(
    qkv_ptr, pool_ptr, window_ptr, seg, start, n, slot, fresh, ch_q, ch_k, ch_v, ok_k, ok_v, writes_qk,
    C: tl.constexpr, W: tl.constexpr,
):  # fmt: skip
    """The segment's new conv window seen[n .. n + W - 2] (n = its real tokens) to window_ptr[seg]; q / k only
    where writes_qk (one writer per channel)."""
    for r in tl.static_range(W - 1):
        m = n + r
        tap_t = start + m - (W - 1)
        row = window_ptr + (seg * (W - 1) + r) * C
        xq = _conv_tap(qkv_ptr, pool_ptr, tap_t, m, slot, fresh, ch_q, ok_k, C, W)
        xk = _conv_tap(qkv_ptr, pool_ptr, tap_t, m, slot, fresh, ch_k, ok_k, C, W)
        xv = _conv_tap(qkv_ptr, pool_ptr, tap_t, m, slot, fresh, ch_v, ok_v, C, W)
        dtype = window_ptr.dtype.element_ty
        tl.store(row + ch_q, xq.to(dtype), mask=ok_k & writes_qk)
        tl.store(row + ch_k, xk.to(dtype), mask=ok_k & writes_qk)
        tl.store(row + ch_v, xv.to(dtype), mask=ok_v)


@triton.jit
def gated_delta_recurrent_kernel(
    qkv_ptr,  # [N, C] the input projection's q, k, v (before the conv)
    b_ptr,  # [N, HV]
    a_ptr,  # [N, HV]
    w_ptr,  # [C, W] conv taps (tap W - 1 multiplies the newest input)
    a_neg_ptr,  # [HV]
    dt_bias_ptr,  # [HV]
    slots_ptr,  # [N] int32, -1 padding
    positions_ptr,  # [N] int32
    conv_pool_ptr,  # [S, W - 1, C]
    delta_in_ptr,  # [S, HV, DK, DV] fp32 (aliased to delta_ptr)
    out_ptr,  # [N, HV * DV]
    window_ptr,  # [B + P, W - 1, C] each segment's new conv window
    delta_ptr,  # [S, HV, DK, DV] fp32
    B: tl.constexpr,
    L: tl.constexpr,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    W: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    seg = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    C: tl.constexpr = 2 * HK * DK + HV * DV
    R: tl.constexpr = HV // HK
    start = tl.where(seg < B, seg, B + (seg - B) * L)
    length = tl.where(seg < B, 1, L)
    valid, slot, fresh, offs_v, ok_k, ok_v, ch_q, ch_k, ch_v, state_offs, ok_s, s = _segment_state(
        slots_ptr, positions_ptr, delta_in_ptr, start, h, vb, HK, HV, DK, DV, BK, BV
    )
    a_neg = tl.load(a_neg_ptr + h).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    scale = 1.0 / tl.sqrt(DK * 1.0)

    n = start * 0  # the segment's real tokens so far (padding comes after them)
    for j in range(0, length):
        t = start + j
        live = (tl.load(slots_ptr + t) >= 0) & valid
        q = _conv_row(qkv_ptr, conv_pool_ptr, w_ptr, t, j, slot, fresh, ch_q, ok_k, C, W)
        k = _conv_row(qkv_ptr, conv_pool_ptr, w_ptr, t, j, slot, fresh, ch_k, ok_k, C, W)
        v = _conv_row(qkv_ptr, conv_pool_ptr, w_ptr, t, j, slot, fresh, ch_v, ok_v, C, W)
        q = _l2_normalize(q, 0) * scale
        k = _l2_normalize(k, 0)
        beta = tl.sigmoid(tl.load(b_ptr + t * HV + h).to(tl.float32))
        decay = tl.exp(_log_decay(tl.load(a_ptr + t * HV + h), a_neg, dt_bias))
        s_new = s * decay
        remembered = tl.sum(s_new * k[:, None], axis=0)  # [BV]
        s_new = s_new + k[:, None] * (beta * (v - remembered))[None, :]
        o = tl.sum(s_new * q[:, None], axis=0)
        s = tl.where(live, s_new, s)
        o = tl.where(live, o, 0.0)
        tl.store(out_ptr + t * (HV * DV) + h * DV + offs_v, o.to(out_ptr.dtype.element_ty), mask=ok_v)
        n += live.to(tl.int32)

    tl.store(delta_ptr + state_offs, s, mask=ok_s & valid)

    writes_qk = (h % R == 0) & (vb == 0)
    _write_window(
        qkv_ptr, conv_pool_ptr, window_ptr, seg, start, n, slot, fresh, ch_q, ch_k, ch_v, ok_k, ok_v, writes_qk, C, W
    )


def launch_plan(*, decode_rows: int, segments: int, segment_len: int, hk, hv, dk, dv, width) -> dict:
    """Grid and compile-time constants for a step of `decode_rows` rows then `segments` segments of
    `segment_len` tokens."""
    if hv % hk:
        raise ValueError(f"gated_delta kernel: value heads {hv} not a multiple of key heads {hk}")
    bk = triton.next_power_of_2(dk)
    bv = min(triton.next_power_of_2(dv), 32)
    rows = decode_rows + segments
    meta = dict(B=decode_rows, L=max(segment_len, 1), HK=hk, HV=hv, DK=dk, DV=dv, W=width, BK=bk, BV=bv)
    return {"grid": (rows, hv, triton.cdiv(dv, bv)), "num_warps": 4, "meta": meta}
