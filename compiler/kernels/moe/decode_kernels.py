"""Mixture-of-Experts for steps of few rows (decode), as three Triton kernels: the GPU twins of reference.route
and reference.experts for bf16 (or fp32) stacked expert weights.

- moe_router_kernel, grid (rows,): the router's logits x . router[e] for every expert (fp32 sums over tiles
  of BD columns), the softmax, the top_k by repeated arg-max (ties to the lower expert index, as
  jax.lax.top_k orders them) and the renormalisation -> weights [rows, K] fp32, experts [rows, K] int32.
- moe_gate_up_kernel, grid (rows * K, F / BF): for pair p = (row, j), expert e = experts[row, j]'s gate and
  up rows f (only that expert's weights are read) against x[row] -> h[p, f] = silu(gate) * up, fp32.
- moe_down_kernel, grid (rows, D / BD): out[row, d] = sum_j weights[row, j] * down[e_j, d, :] . h[(row, j)],
  the K terms added in j order (no atomics, nothing the hardware orders): each row's result is the same
  whatever else the step holds, so the deterministic plans can take these kernels too.

Weights: router [E, D]; gate, up [E, F, D]; down [E, D, F] (GGUF's ffn_*_exps layout).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def moe_router_kernel(
    x_ptr,  # [rows, D]
    router_ptr,  # [E, D]
    weights_ptr,  # [rows, K] fp32
    experts_ptr,  # [rows, K] int32
    D: tl.constexpr,
    E: tl.constexpr,
    K: tl.constexpr,
    BE: tl.constexpr,
    BD: tl.constexpr,
    BK: tl.constexpr,
    NORMALIZE: tl.constexpr,
):
    row = tl.program_id(0)
    e = tl.arange(0, BE)
    ok_e = e < E
    acc = tl.zeros([BE], tl.float32)
    for d0 in range(0, D, BD):
        d = d0 + tl.arange(0, BD)
        ok_d = d < D
        x = tl.load(x_ptr + row * D + d, mask=ok_d, other=0.0).to(tl.float32)
        w = tl.load(router_ptr + e[:, None] * D + d[None, :], mask=ok_e[:, None] & ok_d[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    logits = tl.where(ok_e, acc, float("-inf"))
    p = tl.exp(logits - tl.max(logits, axis=0))
    p = p / tl.sum(p, axis=0)
    p = tl.where(ok_e, p, -1.0)
    slots = tl.arange(0, BK)
    chosen_w = tl.zeros([BK], tl.float32)
    chosen_e = tl.zeros([BK], tl.int32)
    for j in tl.static_range(K):
        best = tl.max(p, axis=0)
        index = tl.min(tl.where(p == best, e, BE), axis=0)  # the lowest expert among equals
        chosen_w = tl.where(slots == j, best, chosen_w)
        chosen_e = tl.where(slots == j, index, chosen_e)
        p = tl.where(e == index, -1.0, p)
    if NORMALIZE:
        chosen_w = chosen_w / tl.sum(tl.where(slots < K, chosen_w, 0.0), axis=0)
    tl.store(weights_ptr + row * K + slots, chosen_w, mask=slots < K)
    tl.store(experts_ptr + row * K + slots, chosen_e, mask=slots < K)


@triton.jit
def moe_gate_up_kernel(
    x_ptr,  # [rows, D]
    experts_ptr,  # [rows * K] int32
    gate_ptr,  # [E, F, D]
    up_ptr,  # [E, F, D]
    h_ptr,  # [rows * K, F] fp32
    D: tl.constexpr,
    F: tl.constexpr,
    K: tl.constexpr,
    BF: tl.constexpr,
    BD: tl.constexpr,
):
    pair = tl.program_id(0)
    f = tl.program_id(1) * BF + tl.arange(0, BF)
    ok_f = f < F
    row = pair // K
    expert = tl.load(experts_ptr + pair).to(tl.int64)
    base = expert * F * D + f[:, None] * D
    acc_g = tl.zeros([BF], tl.float32)
    acc_u = tl.zeros([BF], tl.float32)
    for d0 in range(0, D, BD):
        d = d0 + tl.arange(0, BD)
        ok_d = d < D
        x = tl.load(x_ptr + row * D + d, mask=ok_d, other=0.0).to(tl.float32)[None, :]
        ok = ok_f[:, None] & ok_d[None, :]
        acc_g += tl.sum(tl.load(gate_ptr + base + d[None, :], mask=ok, other=0.0).to(tl.float32) * x, axis=1)
        acc_u += tl.sum(tl.load(up_ptr + base + d[None, :], mask=ok, other=0.0).to(tl.float32) * x, axis=1)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + pair * F + f, h, mask=ok_f)


@triton.jit
def moe_down_kernel(
    h_ptr,  # [rows * K, F] fp32
    experts_ptr,  # [rows * K] int32
    weights_ptr,  # [rows * K] fp32
    down_ptr,  # [E, D, F]
    out_ptr,  # [rows, D]
    D: tl.constexpr,
    F: tl.constexpr,
    K: tl.constexpr,
    BD: tl.constexpr,
    BF: tl.constexpr,
):
    row = tl.program_id(0)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    ok_d = d < D
    out = tl.zeros([BD], tl.float32)
    for j in tl.static_range(K):
        pair = row * K + j
        expert = tl.load(experts_ptr + pair).to(tl.int64)
        base = expert * D * F + d[:, None] * F
        acc = tl.zeros([BD], tl.float32)
        for f0 in range(0, F, BF):
            f = f0 + tl.arange(0, BF)
            ok_f = f < F
            h = tl.load(h_ptr + pair * F + f, mask=ok_f, other=0.0)
            w = tl.load(down_ptr + base + f[None, :], mask=ok_d[:, None] & ok_f[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * h[None, :], axis=1)
        out += tl.load(weights_ptr + pair) * acc
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty), mask=ok_d)


def launch_plans(rows: int, d: int, f: int, experts: int, top_k: int) -> dict[str, dict]:
    """Grid, warps and constants of each kernel for `rows` rows (block sizes: GEMV tiles of ~4K elements,
    enough programs at one row to cover the GPU: d / 16 row blocks of the down projection)."""
    if top_k > experts:
        raise ValueError(f"moe kernels: top_k {top_k} > experts {experts}")
    be = triton.next_power_of_2(experts)
    bf_gate = min(triton.next_power_of_2(f), 32)
    bd_down = min(triton.next_power_of_2(d), 16)
    return {
        "router": {
            "grid": (rows,),
            "num_warps": 4,
            "meta": dict(
                D=d, E=experts, K=top_k, BE=be, BD=max(16, min(4096 // be, 128)), BK=triton.next_power_of_2(top_k)
            ),
        },
        "gate_up": {
            "grid": (rows * top_k, triton.cdiv(f, bf_gate)),
            "num_warps": 4,
            "meta": dict(D=d, F=f, K=top_k, BF=bf_gate, BD=min(triton.next_power_of_2(d), 128)),
        },
        "down": {
            "grid": (rows, triton.cdiv(d, bd_down)),
            "num_warps": 4,
            "meta": dict(D=d, F=f, K=top_k, BD=bd_down, BF=min(triton.next_power_of_2(f), 256)),
        },
    }
