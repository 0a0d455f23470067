"""Mixture-of-Experts decode GEMVs over expert stacks kept packed in GGUF formats (packed.py's layout): the
twins of decode_kernels.py's gate/up and down kernels, reading only the chosen experts' blocks and decoding
them in registers with the dense decode GEMVs' helpers (compiler/kernels/gguf_gemv/rows_*.py: the same loads,
code extraction and scale decoding, one expert's planes at a time).

- moe_packed_gate_up_kernel, grid (rows * K, cdiv(F, BF)): pair p = (row, j), expert e = experts[p]:
  h[p, f] = silu(gate_e[f] . x[row]) * (up_e[f] . x[row]), fp32 (gate and up may differ in format).
- moe_packed_down_kernel, grid (rows, cdiv(D, BD)): out[row, d] = sum_j weights[row, j] * down_{e_j}[d] . h[(row, j)],
  the K terms added in j order (no atomics): a row's result does not depend on the rest of the step.

A weight is passed as 4 plane pointers (PLANES: the format's planes, padded with its first) and a format id
(FORMAT_IDS); products and sums are fp32, activations read in their own dtype and widened.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.rows_common import accumulate_rows, field_to
from ember.compiler.kernels.gguf_gemv.rows_kernel import q4_k_load, q4_k_sub_scales
from ember.compiler.kernels.gguf_gemv.rows_q6_k import q6_k_load, q6_k_nibble_weights
from ember.compiler.kernels.gguf_gemv.rows_q8_0 import block_load

# format -> the kernels' FMT id, and its planes in the pointer order the kernels take
FORMAT_IDS = {"q4_k": 0, "q6_k": 1, "q8_0": 2, "q5_0": 3}
PLANES = {
    "q4_k": ("qs", "scales", "d", "dmin"),
    "q6_k": ("ql", "qh", "scales", "d"),
    "q8_0": ("qs", "d"),
    "q5_0": ("qs", "qh", "d"),
}


@triton.jit
def _frame(rows):
    """The super-block kernels' 4-D frame for a row tile: r4 [1, BLOCK_N, 1, 1], n4 [1, 1, 8, 1] (sub-block),
    q4 [1, 1, 1, 4] (word in it), w4 = 4 n4 + q4 (word index), e4 = 32 n4 + q4 (its element at nibble 0)."""
    n4 = tl.arange(0, 8)[None, None, :, None]
    q4 = tl.arange(0, 4)[None, None, None, :]
    return rows[None, :, None, None], n4, q4, n4 * 4 + q4, n4 * 32 + q4


@triton.jit
def _q4_k_dot(x_ptr, qs_ptr, scales_ptr, d_ptr, dmin_ptr, expert, rows, N: tl.constexpr, K: tl.constexpr):
    """x[0:K] . W_expert[rows] for a Q4_K stack -> fp32 [BLOCK_N] (rows past N: 0)."""
    UNITS: tl.constexpr = K // 256
    base = expert * (UNITS * N)  # the expert's first (unit, row)
    r4, n4, q4, w4, e4 = _frame(rows)
    one = 0x3F800000 | tl.program_id(2)  # 1.0's bits in a register (rows_kernel.py: one LOP3 per nibble)
    acc = tl.zeros((1, rows.shape[0], 8, 4), tl.float32)
    for u in range(UNITS):
        words, s0, s1, s2, d, dmin = q4_k_load(
            qs_ptr + base * 32, scales_ptr + base * 3, d_ptr + base, dmin_ptr + base, u, UNITS, r4, r4 < N, w4, N,
            False,
        )  # fmt: skip
        scale, minimum = q4_k_sub_scales(s0, s1, s2, d, dmin, n4)  # [1, BLOCK_N, 8, 1]
        s = scale * 16.0
        m = s + minimum
        for i in tl.static_range(8):  # nibble i: elements 32n + 4i + q
            w = s * (field_to(words, 4 * i, 19, 0x00780000) | one).to(tl.float32, bitcast=True) - m
            acc, _, _, _ = accumulate_rows(acc, acc, acc, acc, w, x_ptr, u, True, 4 * i, e4, K, 256, 1, False)
    return tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=0)


@triton.jit
def _q6_k_dot(x_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, expert, rows, N: tl.constexpr, K: tl.constexpr):
    """x[0:K] . W_expert[rows] for a Q6_K stack -> fp32 [BLOCK_N] (rows past N: 0)."""
    UNITS: tl.constexpr = K // 256
    base = expert * (UNITS * N)
    r4, n4, q4, w4, e4 = _frame(rows)
    acc = tl.zeros((1, rows.shape[0], 8, 4), tl.float32)
    for u in range(UNITS):
        ql, qh0, qh1, sc0, sc1, d = q6_k_load(
            ql_ptr + base * 32, qh_ptr + base * 16, scales_ptr + base * 16, d_ptr + base, u, UNITS, r4, r4 < N,
            n4, w4, N, False,
        )  # fmt: skip
        ds0 = d * sc0.to(tl.float32)
        ds1 = d * sc1.to(tl.float32)
        for i in tl.static_range(8):  # nibble i = 2j + h: elements 32n + 16h + 4j + q
            w = q6_k_nibble_weights(ql, qh0, qh1, ds0, ds1, q4, i)
            acc, _, _, _ = accumulate_rows(
                acc, acc, acc, acc, w, x_ptr, u, True, 16 * (i % 2) + 4 * (i // 2), e4, K, 256, 1, False
            )
    return tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=0)


@triton.jit
def _block_dot(x_ptr, p0, p1, p2, expert, rows, N: tl.constexpr, K: tl.constexpr, Q5: tl.constexpr):
    """x[0:K] . W_expert[rows] for a Q8_0 (planes qs, d) or Q5_0 (qs, qh, d) stack, 8 blocks of 32 a step."""
    UNITS: tl.constexpr = K // 32
    base = expert * (UNITS * N)
    if Q5:
        qs_ptr = p0 + base * 16
        qh_ptr = p1 + base
        d_ptr = p2 + base
    else:
        qs_ptr = p0 + base * 32
        qh_ptr = p0
        d_ptr = p1 + base
    r3 = rows[None, :, None]
    j3 = tl.arange(0, 32)[None, None, :]
    acc = tl.zeros((8, rows.shape[0], 32), tl.float32)
    for u0 in range(0, UNITS, 8):
        u3 = u0 + tl.arange(0, 8)[:, None, None]
        q, d = block_load(qs_ptr, qh_ptr, d_ptr, u3, UNITS, r3, r3 < N, j3, N, Q5)  # 0 past UNITS and N
        w = d * q.to(tl.float32)  # [8, BLOCK_N, 32]
        acc, _, _, _ = accumulate_rows(acc, acc, acc, acc, w, x_ptr, u3, u3 < UNITS, 0, j3, K, 32, 1, True)
    return tl.sum(tl.sum(acc, axis=2), axis=0)


@triton.jit
def packed_dot(x_ptr, p0, p1, p2, p3, expert, rows, FMT: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """x[0:K] (any float dtype) . W_expert[rows, :] of a packed [E, N, K] stack of format FMT -> fp32 [BLOCK_N]."""
    if FMT == 0:
        y = _q4_k_dot(x_ptr, p0, p1, p2, p3, expert, rows, N, K)
    elif FMT == 1:
        y = _q6_k_dot(x_ptr, p0, p1, p2, p3, expert, rows, N, K)
    else:
        y = _block_dot(x_ptr, p0, p1, p2, expert, rows, N, K, FMT == 3)
    return y


@triton.jit
def moe_packed_gate_up_kernel(
    x_ptr,  # [rows, D]
    experts_ptr,  # [rows * K] int32
    g0, g1, g2, g3,  # gate [E, F, D] planes
    u0, u1, u2, u3,  # up [E, F, D] planes
    h_ptr,  # [rows * K, F] fp32
    D: tl.constexpr,
    F: tl.constexpr,
    K: tl.constexpr,
    BF: tl.constexpr,
    GATE_FMT: tl.constexpr,
    UP_FMT: tl.constexpr,
):  # fmt: skip
    pair = tl.program_id(0)
    f = tl.program_id(1) * BF + tl.arange(0, BF)
    x_row = x_ptr + (pair // K) * D
    expert = tl.load(experts_ptr + pair).to(tl.int64)
    g = packed_dot(x_row, g0, g1, g2, g3, expert, f, GATE_FMT, F, D)
    u = packed_dot(x_row, u0, u1, u2, u3, expert, f, UP_FMT, F, D)
    tl.store(h_ptr + pair * F + f, g * tl.sigmoid(g) * u, mask=f < F)


@triton.jit
def moe_packed_down_kernel(
    h_ptr,  # [rows * K, F] fp32
    experts_ptr,  # [rows * K] int32
    weights_ptr,  # [rows * K] fp32
    p0, p1, p2, p3,  # down [E, D, F] planes
    out_ptr,  # [rows, D]
    D: tl.constexpr,
    F: tl.constexpr,
    K: tl.constexpr,
    BD: tl.constexpr,
    DOWN_FMT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    out = tl.zeros([BD], tl.float32)
    for j in tl.static_range(K):  # fixed order: batch-invariant
        pair = row * K + j
        expert = tl.load(experts_ptr + pair).to(tl.int64)
        out += tl.load(weights_ptr + pair) * packed_dot(h_ptr + pair * F, p0, p1, p2, p3, expert, d, DOWN_FMT, D, F)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


def launch_plans(
    rows: int, d: int, f: int, top_k: int, formats: tuple[str, str, str], *, bf: int = 32, bd: int = 16
) -> dict[str, dict]:
    """Grid, warps and constants of the two kernels; formats = (gate, up, down). Tiles of bf = 32 gate/up rows
    and bd = 16 down rows (decode_kernels.py's first guesses; not measured on packed weights yet)."""
    bf = min(triton.next_power_of_2(f), bf)
    bd = min(triton.next_power_of_2(d), bd)
    gate, up, down = (FORMAT_IDS[fmt] for fmt in formats)
    return {
        "gate_up": {
            "grid": (rows * top_k, triton.cdiv(f, bf)),
            "num_warps": 4,
            "meta": dict(D=d, F=f, K=top_k, BF=bf, GATE_FMT=gate, UP_FMT=up),
        },
        "down": {
            "grid": (rows, triton.cdiv(d, bd)),
            "num_warps": 4,
            "meta": dict(D=d, F=f, K=top_k, BD=bd, DOWN_FMT=down),
        },
    }


def plane_args(planes: dict, fmt: str) -> tuple:
    """A weight's planes in the kernels' pointer order, padded to 4 with its first plane (never read)."""
    names = PLANES[fmt]
    return tuple(planes[name] for name in names) + (planes[names[0]],) * (4 - len(names))
