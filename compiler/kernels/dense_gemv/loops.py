"""The FP8 GEMV's inner loops (dense_gemv/kernel.py's kernels call `program_sum`): the byte loop on CUDA cores, the
tensor-core loop and, from dense_gemv/words.py, the word loop, each summing one program's tile of output rows over
its split of `in`; dense_gemv/kernel.py's module docstring describes the three and the grid.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.dense_gemv.words import word_sum


@triton.jit
def _w_tile(w_ptr, rows, row_ok, cols, ok, K: tl.constexpr, W_BITCAST: tl.constexpr):
    """fp8 tile of rows x cols (broadcast against each other: rows [BLOCK_N, 1(, 1)], cols [1, ...]); masked
    (ok: a scalar, e.g. "inside the range") to 0."""
    mask = row_ok & (cols < K) & ok
    w = tl.load(w_ptr + rows * K + cols, mask=mask, other=0.0)
    if W_BITCAST:
        w = w.to(tl.float8e4nv, bitcast=True)
    return w


@triton.jit
def _cuda_core_sum(
    x_ptr,
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    i,
    i_ok,
    k_start,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCKED: tl.constexpr,
    PREFETCH: tl.constexpr,
    STEP_REDUCE: tl.constexpr,
    W_BITCAST: tl.constexpr,
):
    """sum_k x[i, k] * w[o, k] over the program's range -> [BLOCK_M, BLOCK_N] fp32 (block scales applied).
    Tiles are [BLOCK_N, C, 16]: each 16-byte chunk of a row one vector load. STEP_REDUCE sums every step's
    products over the chunk's 16 columns (in-thread adds: a [BLOCK_M, BLOCK_N, C] accumulator, 1/16 of the
    registers, so more programs fit per SM); otherwise acc [BLOCK_M, BLOCK_N, C, 16] takes FMAs."""
    KB: tl.constexpr = (K + 127) // 128  # scale blocks along `in`
    V: tl.constexpr = 16 if BLOCK_K >= 16 else BLOCK_K
    C: tl.constexpr = BLOCK_K // V
    j = tl.arange(0, C)[:, None] * V + tl.arange(0, V)[None, :]  # [C, V] column offsets of a step
    r3 = rows[:, None, None]
    ok3 = row_ok[:, None, None]
    if STEP_REDUCE:
        acc = tl.zeros((BLOCK_M, BLOCK_N, C), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, C, V), tl.float32)
    nxt = _w_tile(w_ptr, r3, ok3, (k_start + j)[None, :, :], True, K, W_BITCAST)
    for step in range(STEPS):
        cols = k_start + step * BLOCK_K + j  # [C, V]
        if PREFETCH:  # the next step's tile is in flight during this step's math (masked off after the last)
            w = nxt
            nxt = _w_tile(w_ptr, r3, ok3, (cols + BLOCK_K)[None, :, :], step + 1 < STEPS, K, W_BITCAST)
        else:
            w = _w_tile(w_ptr, r3, ok3, cols[None, :, :], True, K, W_BITCAST)
        wf = w.to(tl.float32)  # [BLOCK_N, C, V]
        if BLOCKED:  # the tile's rows share one scale row: a scale per column
            srow = (tl.program_id(0) * BLOCK_N) // 128
            wf = wf * tl.load(s_ptr + srow * KB + cols // 128, mask=cols < K, other=0.0)[None, :, :]
        xt = tl.load(
            x_ptr + i[:, None, None, None] * K + cols[None, None, :, :],
            mask=i_ok[:, None, None, None] & (cols < K)[None, None, :, :],
            other=0.0,
        ).to(tl.float32)
        if STEP_REDUCE:
            acc += tl.sum(xt * wf[None], axis=3)  # [BLOCK_M, BLOCK_N, C]
        else:
            acc += xt * wf[None]  # [BLOCK_M, BLOCK_N, C, V]
    if STEP_REDUCE:
        total = tl.sum(acc, axis=2)
    else:
        total = tl.sum(tl.sum(acc, axis=3), axis=2)
    return total


@triton.jit
def _dot_sum(
    x_ptr,
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    i,
    i_ok,
    k_start,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    KS: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCKED: tl.constexpr,
    IEEE: tl.constexpr,
    W_BITCAST: tl.constexpr,
):
    """The same sum on the tensor cores: x padded to BLOCK_M = 16 rows, SUB = BLOCK_K / KS dots per step."""
    KB: tl.constexpr = (K + 127) // 128
    SUB: tl.constexpr = BLOCK_K // KS
    j = tl.arange(0, KS)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(STEPS):
        for sub in tl.static_range(SUB):
            k0 = k_start + step * BLOCK_K + sub * KS
            cols = k0 + j
            w = _w_tile(w_ptr, rows[:, None], row_ok[:, None], cols[None, :], True, K, W_BITCAST)  # [BLOCK_N, KS]
            xt = tl.load(
                x_ptr + i[:, None] * K + cols[None, :], mask=i_ok[:, None] & (cols < K)[None, :], other=0.0
            )  # [BLOCK_M, KS]
            if IEEE:
                part = tl.dot(xt.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                part = tl.dot(xt, tl.trans(w.to(xt.dtype)))  # [BLOCK_M, BLOCK_N] fp32
            if BLOCKED:  # this 128-block's partial sum times scale[o // 128, k0 // 128]
                acc += part * tl.load(s_ptr + (rows // 128) * KB + k0 // 128, mask=row_ok, other=0.0)[None, :]
            else:
                acc += part
    return acc


@triton.jit
def tile_rows(tile, N: tl.constexpr, BLOCK_N: tl.constexpr, GATE_UP: tl.constexpr):
    """Row tile `tile`'s weight rows [BLOCK_N] and their mask. GATE_UP (a packed gate/up weight, N = 2 FFN
    rows): the first BLOCK_N / 2 are gate rows t H + [0, H), the rest the up rows FFN + t H + [0, H)
    (H = BLOCK_N / 2), so one tile holds both halves of its outputs."""
    if GATE_UP:
        H: tl.constexpr = BLOCK_N // 2
        j = tl.arange(0, BLOCK_N)
        local = tile * H + j % H
        return tl.where(j < H, local, N // 2 + local), local < N // 2
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, rows < N


@triton.jit
def program_sum(
    x_ptr,
    w_ptr,
    s_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    KS: tl.constexpr,
    K_PER_SPLIT: tl.constexpr,
    BLOCKED: tl.constexpr,
    USE_DOT: tl.constexpr,
    PREFETCH: tl.constexpr,
    STEP_REDUCE: tl.constexpr,
    WORDS: tl.constexpr,
    GATE_UP: tl.constexpr,
    IEEE: tl.constexpr,
    W_BITCAST: tl.constexpr,
    SCALED: tl.constexpr,
):
    """This program's scaled sums [BLOCK_M, BLOCK_N] fp32, its weight rows (tile_rows) and activation rows
    (+ masks). SCALED False: a plain float weight (bf16 / f16 / f32, dense_gemv/dispatch.py), no scale read."""
    STEPS: tl.constexpr = K_PER_SPLIT // BLOCK_K
    rows, row_ok = tile_rows(tl.program_id(0), N, BLOCK_N, GATE_UP)
    i = tl.arange(0, BLOCK_M)  # [BLOCK_M] activation rows
    i_ok = i < M
    k_start = tl.program_id(1) * K_PER_SPLIT
    if WORDS:
        acc = word_sum(
            x_ptr,
            w_ptr,
            s_ptr,
            rows,
            row_ok,
            i,
            i_ok,
            k_start,
            K,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            STEPS,
            BLOCKED,
            PREFETCH,
            not W_BITCAST,
        )
    elif USE_DOT:
        acc = _dot_sum(
            x_ptr,
            w_ptr,
            s_ptr,
            rows,
            row_ok,
            i,
            i_ok,
            k_start,
            M,
            N,
            K,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            KS,
            STEPS,
            BLOCKED,
            IEEE,
            W_BITCAST,
        )
    else:
        acc = _cuda_core_sum(
            x_ptr,
            w_ptr,
            s_ptr,
            rows,
            row_ok,
            i,
            i_ok,
            k_start,
            M,
            N,
            K,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            STEPS,
            BLOCKED,
            PREFETCH,
            STEP_REDUCE,
            W_BITCAST,
        )
    if SCALED and not BLOCKED:
        acc = acc * tl.load(s_ptr + rows, mask=row_ok, other=0.0)[None, :]
    return acc, rows, row_ok, i, i_ok
