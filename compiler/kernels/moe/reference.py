"""Mixture-of-Experts MLP references (the routed-experts layout of transformers' MoE checkpoints), in `jnp`.

route:       the router's softmax over experts (fp32), the top_k of it, renormalised to sum 1 when the
             checkpoint says so (`norm_topk_prob`)
experts:     every token through its top_k experts only, as one grouped matmul over tokens sorted by
             expert (`jax.lax.ragged_dot`: ragged groups, no padding to a capacity), then the weighted sum
shared:      a dense expert every token takes, scaled by sigmoid(x . shared_gate) (the hybrid checkpoints)

Weights: router [E, d]; gate_up [E, 2f, d] (gate rows first, then up, as a dense MLP's packed gate/up);
down [E, d, f]; shared expert gate_up [2f', d], down [d, f'], shared_gate [1, d].
Shapes: x [N, d] -> [N, d] in x's dtype; expert matmuls accumulate in fp32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.activation import gated_act_packed

_F32 = jnp.float32


def route(x, router, *, top_k: int, normalize: bool):
    """-> (weights [N, top_k] fp32, experts [N, top_k] int32), the larger weight first."""
    probs = jax.nn.softmax((x.astype(_F32) @ router.astype(_F32).T), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32)


def experts(x, weights, chosen, gate_up, down, *, act: str = "silu"):
    """sum_j weights[n, j] * expert_{chosen[n, j]}(x[n]): the token-expert pairs sorted by expert, one
    ragged matmul per projection over the groups."""
    n, top_k = chosen.shape
    num_experts = gate_up.shape[0]
    pairs = chosen.reshape(-1)  # [N * k]: pair p is token p // k's j-th expert
    order = jnp.argsort(pairs, stable=True)
    tokens = x.astype(_F32)[order // top_k]  # [N * k, d] grouped by expert
    sizes = jnp.bincount(pairs, length=num_experts).astype(jnp.int32)
    h = jax.lax.ragged_dot(tokens, jnp.swapaxes(gate_up, 1, 2).astype(_F32), sizes)  # [N * k, 2f]
    y = jax.lax.ragged_dot(gated_act_packed(h, act=act), jnp.swapaxes(down, 1, 2).astype(_F32), sizes)
    unsorted = jnp.zeros_like(y).at[order].set(y).reshape(n, top_k, -1)  # back to (token, j) order
    return jnp.einsum("nk,nkd->nd", weights, unsorted).astype(x.dtype)


def shared_expert(x, gate_up, down, shared_gate, *, act: str = "silu"):
    xf = x.astype(_F32)
    y = gated_act_packed(xf @ gate_up.astype(_F32).T, act=act) @ down.astype(_F32).T
    return (jax.nn.sigmoid(xf @ shared_gate.astype(_F32).T) * y).astype(x.dtype)


def moe_mlp(x, router, gate_up, down, *, top_k: int, normalize: bool, act: str = "silu", shared=None):
    """The whole MoE MLP: routed experts, plus the gated shared expert when `shared` = (gate_up, down, gate)."""
    weights, chosen = route(x, router, top_k=top_k, normalize=normalize)
    out = experts(x, weights, chosen, gate_up, down, act=act)
    return out if shared is None else out + shared_expert(x, *shared, act=act)
