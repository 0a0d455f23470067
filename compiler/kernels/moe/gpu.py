"""The `moe` op for GPU targets: op.moe's signature; steps of up to the policy's moe.gemv_max_rows rows take the
decode kernels (decode_kernels.py: the fused router, then the gate/up and down GEMVs reading only the chosen
experts' weights), larger steps and non-GPU backends the reference (its grouped ragged matmul).

x [N, d]; router [E, d]; gate, up [E, f, d]; down [E, d, f] -> [N, d] in x's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy

from . import op

_FLOATS = (jnp.bfloat16, jnp.float16, jnp.float32)


def use_kernel(x, router, gate, up, down, act: str) -> bool:
    policy = kernel_policy().moe
    plain = all(isinstance(w, jax.Array | jax.core.Tracer) and w.dtype in _FLOATS for w in (router, gate, up, down))
    return policy.triton and triton_available() and act == "silu" and plain and 0 < x.shape[0] <= policy.gemv_max_rows


def moe(x, router, gate, up, down, *, top_k: int, normalize: bool, act: str = "silu"):
    if not use_kernel(x, router, gate, up, down, act):
        return op.moe(x, router, gate, up, down, top_k=top_k, normalize=normalize, act=act)
    return moe_decode_triton(x, router, gate, up, down, top_k=top_k, normalize=normalize)


def route_triton(x, router, *, top_k: int, normalize: bool):
    """The router kernel's launch -> (weights [N, top_k] fp32, experts [N, top_k] int32), as reference.route."""
    from ember.compiler.kernels.triton.launch import triton_call

    from .decode_kernels import launch_plans, moe_router_kernel

    n, d = x.shape
    plan = launch_plans(n, d, 1, router.shape[0], int(top_k))["router"]
    return triton_call(
        x,
        router,
        kernel=moe_router_kernel,
        out_shape=(jax.ShapeDtypeStruct((n, top_k), jnp.float32), jax.ShapeDtypeStruct((n, top_k), jnp.int32)),
        grid=plan["grid"],
        num_warps=plan["num_warps"],
        num_stages=1,
        NORMALIZE=bool(normalize),
        **plan["meta"],
    )


def experts_triton(x, weights, chosen, gate, up, down):
    """The expert GEMVs' launches: weights [N, k] fp32, chosen [N, k] int32 -> [N, d] in x's dtype."""
    from ember.compiler.kernels.triton.launch import triton_call

    from .decode_kernels import launch_plans, moe_down_kernel, moe_gate_up_kernel

    n, d = x.shape
    top_k = chosen.shape[1]
    experts, f, _ = gate.shape
    plans = launch_plans(n, d, f, experts, top_k)
    pairs = chosen.reshape(-1).astype(jnp.int32)
    h = triton_call(
        x, pairs, gate, up,
        kernel=moe_gate_up_kernel,
        out_shape=jax.ShapeDtypeStruct((n * top_k, f), jnp.float32),
        grid=plans["gate_up"]["grid"],
        num_warps=plans["gate_up"]["num_warps"],
        num_stages=2,
        **plans["gate_up"]["meta"],
    )  # fmt: skip
    return triton_call(
        h, pairs, weights.reshape(-1).astype(jnp.float32), down,
        kernel=moe_down_kernel,
        out_shape=jax.ShapeDtypeStruct((n, d), x.dtype),
        grid=plans["down"]["grid"],
        num_warps=plans["down"]["num_warps"],
        num_stages=2,
        **plans["down"]["meta"],
    )  # fmt: skip


def moe_decode_triton(x, router, gate, up, down, *, top_k: int, normalize: bool):
    """The three decode kernels, whatever the backend being traced for."""
    weights, chosen = route_triton(x, router, top_k=top_k, normalize=normalize)
    return experts_triton(x, weights, chosen, gate, up, down)
