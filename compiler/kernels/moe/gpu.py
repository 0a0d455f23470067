"""The `moe` op for GPU targets: op.moe's signature; steps of up to the policy's moe.gemv_max_rows rows take the
decode kernels (decode_kernels.py: the fused router, then the gate/up and down GEMVs reading only the chosen
experts' weights), larger steps the reference's router (one XLA matmul) and the grouped GEMM over the pairs
sorted by expert (grouped_kernels.py; policy moe.grouped), non-GPU backends the reference.

Expert stacks kept packed in a GGUF format (packed.py; WeightPolicy.packed_experts): steps of up to
moe.gemv_max_rows rows (every step of the deterministic plans) take packed_kernels.py's GEMVs, which read only
the chosen experts' blocks; larger steps (moe.grouped) the reference's router and the packed grouped GEMM
(packed_grouped_kernels.py: the grouped GEMM decoding the tile's expert's blocks per K tile, the same tile map
and combine; run in Triton's interpreter and lowered for sm_90, not yet on a GPU). Other cases (moe.grouped
off, a format the kernels do not decode) dequantize the whole stacks in the step to the activation dtype and
take the float path above.

x [N, d]; router [E, d]; gate, up [E, f, d]; down [E, d, f] -> [N, d] in x's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy

from . import op, reference
from .packed import dense_experts, is_packed_experts
from .packed_kernels import FORMAT_IDS

_FLOATS = (jnp.bfloat16, jnp.float16, jnp.float32)


def _launch(kernel, plan: dict, args: tuple, out_shape, *, num_stages: int, **meta):
    """One kernel launch from a launch plan entry {grid, num_warps, meta}; meta adds constants it lacks."""
    from ember.compiler.kernels.triton.launch import triton_call

    return triton_call(
        *args,
        kernel=kernel,
        out_shape=out_shape,
        grid=plan["grid"],
        num_warps=plan["num_warps"],
        num_stages=num_stages,
        **plan["meta"],
        **meta,
    )


def use_kernel(x, router, gate, up, down, act: str, *, any_rows: bool = False) -> bool:
    """Whether a kernel path runs: a GPU with Triton, the policy's moe.triton, plain float weights, silu; rows up to
    moe.gemv_max_rows, or more with moe.grouped (any_rows: any count)."""
    plain = all(isinstance(w, jax.Array | jax.core.Tracer) and w.dtype in _FLOATS for w in (router, gate, up, down))
    rows, policy = x.shape[0], kernel_policy().moe
    return plain and _triton_silu_rows(x, act) and (any_rows or rows <= policy.gemv_max_rows or policy.grouped)


def _triton_silu_rows(x, act: str) -> bool:
    """What every MoE kernel path needs: a GPU with Triton, the policy's moe.triton, silu, rows to compute."""
    return kernel_policy().moe.triton and triton_available() and act == "silu" and x.shape[0] > 0


def use_packed_kernel(x, router, gate, up, down, act: str, *, any_rows: bool = False) -> bool:
    """Whether the packed decode GEMVs run: a GPU with Triton, moe.triton, a float router, every stack packed
    in a format packed_kernels.py decodes, silu; rows up to moe.gemv_max_rows (any_rows: any count)."""
    packed = all(is_packed_experts(w) and w.format in FORMAT_IDS for w in (gate, up, down))
    return (
        packed
        and getattr(router, "dtype", None) in _FLOATS
        and _triton_silu_rows(x, act)
        and (any_rows or x.shape[0] <= kernel_policy().moe.gemv_max_rows)
    )


def use_packed_grouped(x, router, gate, up, down, act: str) -> bool:
    """Whether the packed grouped GEMM runs: what the packed GEMVs need (any row count), every stack in a format
    packed_grouped_kernels.py decodes, more than moe.gemv_max_rows rows, moe.grouped."""
    from .packed_grouped_kernels import FORMATS

    policy = kernel_policy().moe
    return (
        use_packed_kernel(x, router, gate, up, down, act, any_rows=True)
        and all(w.format in FORMATS for w in (gate, up, down))
        and x.shape[0] > policy.gemv_max_rows
        and policy.grouped
    )


def moe(x, router, gate, up, down, *, top_k: int, normalize: bool, act: str = "silu"):
    if use_packed_kernel(x, router, gate, up, down, act):
        return moe_decode_packed_triton(x, router, gate, up, down, top_k=top_k, normalize=normalize)
    if use_packed_grouped(x, router, gate, up, down, act):
        weights, chosen = reference.route(x, router, top_k=int(top_k), normalize=bool(normalize))
        return experts_packed_grouped_triton(x, weights, chosen, gate, up, down)
    gate, up, down = (dense_experts(w, x.dtype) for w in (gate, up, down))  # packed stacks: dequantized here
    if not use_kernel(x, router, gate, up, down, act):
        return op.moe(x, router, gate, up, down, top_k=top_k, normalize=normalize, act=act)
    if x.shape[0] <= kernel_policy().moe.gemv_max_rows:
        return moe_decode_triton(x, router, gate, up, down, top_k=top_k, normalize=normalize)
    weights, chosen = reference.route(x, router, top_k=int(top_k), normalize=bool(normalize))
    return experts_grouped_triton(x, weights, chosen, gate, up, down)


def moe_invariant(x, router, gate, up, down, *, top_k: int, normalize: bool, act: str = "silu"):
    """The deterministic plans' op: the decode kernels at every row count (each row routed and multiplied by its
    own programs, in fixed orders), so a prompt token's arithmetic is a decode row's; the reference off the GPU."""
    if use_packed_kernel(x, router, gate, up, down, act, any_rows=True):
        return moe_decode_packed_triton(x, router, gate, up, down, top_k=top_k, normalize=normalize)
    gate, up, down = (dense_experts(w, x.dtype) for w in (gate, up, down))
    if not use_kernel(x, router, gate, up, down, act, any_rows=True):
        return op.moe(x, router, gate, up, down, top_k=top_k, normalize=normalize, act=act)
    return moe_decode_triton(x, router, gate, up, down, top_k=top_k, normalize=normalize)


def _experts_grouped(x, weights, chosen, plan: dict, experts: int, f: int, gate_up: tuple, down: tuple):
    """The grouped GEMM's two launches and the combine, float or packed: plan from a launch_plan; gate_up =
    (kernel, its weight arguments), down likewise. weights [N, k] fp32, chosen [N, k] int32 -> [N, d] in x's
    dtype, the k terms of a row added in j order."""
    from .grouped_kernels import tile_map

    n, d = x.shape
    top_k = chosen.shape[1]
    order, tile_expert, tile_start, tile_size = tile_map(chosen, experts, plan["block_m"])
    tiles = (tile_expert, tile_start, tile_size)
    m = n * top_k
    h = _launch(
        gate_up[0], plan["gate_up"], (x, order // top_k, *tiles, *gate_up[1]),
        jax.ShapeDtypeStruct((m, f), jnp.float32), num_stages=3,
    )  # fmt: skip
    y = _launch(
        down[0], plan["down"], (h, weights.reshape(-1).astype(jnp.float32)[order], *tiles, *down[1]),
        jax.ShapeDtypeStruct((m, d), jnp.float32), num_stages=3,
    )  # fmt: skip
    terms = jnp.zeros_like(y).at[order].set(y).reshape(n, top_k, d)  # back to (token, j) order
    out = terms[:, 0]
    for j in range(1, top_k):  # a fixed order of adds, whatever the tiles held
        out = out + terms[:, j]
    return out.astype(x.dtype)


def experts_grouped_triton(x, weights, chosen, gate, up, down):
    """The grouped GEMM over float stacks: gate, up [E, f, d], down [E, d, f]."""
    from .grouped_kernels import launch_plan, moe_grouped_down_kernel, moe_grouped_gate_up_kernel

    experts, f, _ = gate.shape
    plan = launch_plan(x.shape[0], x.shape[1], f, experts, chosen.shape[1])
    kernels = (moe_grouped_gate_up_kernel, (gate, up)), (moe_grouped_down_kernel, (down,))
    return _experts_grouped(x, weights, chosen, plan, experts, f, *kernels)


def experts_packed_grouped_triton(x, weights, chosen, gate, up, down):
    """The grouped GEMM over packed stacks (packed_grouped_kernels.py): gate, up [E, f, d], down [E, d, f], each
    in any format the kernels decode; the same tile map and combine as experts_grouped_triton."""
    from .packed_grouped_kernels import (
        launch_plan,
        moe_packed_grouped_down_kernel,
        moe_packed_grouped_gate_up_kernel,
        stack_args,
    )

    experts, f, _ = gate.shape
    (g_planes, g_strides), (u_planes, u_strides), (d_planes, d_strides) = (stack_args(w) for w in (gate, up, down))
    formats = (gate.format, up.format, down.format)
    strides = (g_strides, u_strides, d_strides)
    plan = launch_plan(x.shape[0], x.shape[1], f, experts, chosen.shape[1], formats, x.dtype.name, strides)
    kernels = (moe_packed_grouped_gate_up_kernel, (*g_planes, *u_planes)), (moe_packed_grouped_down_kernel, d_planes)
    return _experts_grouped(x, weights, chosen, plan, experts, f, *kernels)


def route_triton(x, router, *, top_k: int, normalize: bool):
    """The router kernel's launch -> (weights [N, top_k] fp32, experts [N, top_k] int32), as reference.route."""
    from .decode_kernels import launch_plans, moe_router_kernel

    n, d = x.shape
    plan = launch_plans(n, d, 1, router.shape[0], int(top_k))["router"]
    out_shape = (jax.ShapeDtypeStruct((n, top_k), jnp.float32), jax.ShapeDtypeStruct((n, top_k), jnp.int32))
    return _launch(moe_router_kernel, plan, (x, router), out_shape, num_stages=1, NORMALIZE=bool(normalize))


def experts_triton(x, weights, chosen, gate, up, down):
    """The expert GEMVs' launches: weights [N, k] fp32, chosen [N, k] int32 -> [N, d] in x's dtype."""
    from .decode_kernels import launch_plans, moe_down_kernel, moe_gate_up_kernel

    n, d = x.shape
    top_k = chosen.shape[1]
    experts, f, _ = gate.shape
    plans = launch_plans(n, d, f, experts, top_k)
    pairs = chosen.reshape(-1).astype(jnp.int32)
    h = _launch(
        moe_gate_up_kernel, plans["gate_up"], (x, pairs, gate, up),
        jax.ShapeDtypeStruct((n * top_k, f), jnp.float32), num_stages=2,
    )  # fmt: skip
    return _launch(
        moe_down_kernel, plans["down"], (h, pairs, weights.reshape(-1).astype(jnp.float32), down),
        jax.ShapeDtypeStruct((n, d), x.dtype), num_stages=2,
    )  # fmt: skip


def moe_decode_triton(x, router, gate, up, down, *, top_k: int, normalize: bool):
    """The three decode kernels, whatever the backend being traced for."""
    weights, chosen = route_triton(x, router, top_k=top_k, normalize=normalize)
    return experts_triton(x, weights, chosen, gate, up, down)


def experts_packed_triton(x, weights, chosen, gate, up, down):
    """The packed expert GEMVs' launches (packed_kernels.py): weights [N, k] fp32, chosen [N, k] int32, packed
    gate, up [E, f, d] and down [E, d, f] stacks -> [N, d] in x's dtype."""
    from .packed_kernels import launch_plans, moe_packed_down_kernel, moe_packed_gate_up_kernel, plane_args

    n, d = x.shape
    top_k = chosen.shape[1]
    f = gate.shape[1]
    plans = launch_plans(n, d, f, top_k, (gate.format, up.format, down.format))
    pairs = chosen.reshape(-1).astype(jnp.int32)
    gate_up = (*plane_args(gate.planes, gate.format), *plane_args(up.planes, up.format))
    h = _launch(
        moe_packed_gate_up_kernel, plans["gate_up"], (x, pairs, *gate_up),
        jax.ShapeDtypeStruct((n * top_k, f), jnp.float32), num_stages=2,
    )  # fmt: skip
    return _launch(
        moe_packed_down_kernel, plans["down"],
        (h, pairs, weights.reshape(-1).astype(jnp.float32), *plane_args(down.planes, down.format)),
        jax.ShapeDtypeStruct((n, d), x.dtype), num_stages=2,
    )  # fmt: skip


def moe_decode_packed_triton(x, router, gate, up, down, *, top_k: int, normalize: bool):
    """The router kernel, then the packed expert GEMVs."""
    weights, chosen = route_triton(x, router, top_k=top_k, normalize=normalize)
    return experts_packed_triton(x, weights, chosen, gate, up, down)
