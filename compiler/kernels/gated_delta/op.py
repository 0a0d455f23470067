"""The `gated_delta` op as a plan calls it: Gated DeltaNet's mixer over a step's flat tokens, with its state in
slots (one per request) carried between steps.

A step's tokens are segments (decode rows of one token, prefill chunks of many), each of one request. Every
token names its request's slot (`batch.state_slots[kind]`, -1 for padding); a token at position 0 starts from a
zero state. This reference scans the tokens in order: each reads its slot's conv window and delta-rule matrix,
advances them by one token and writes them back, so a segment continues where its request's last step left off
(the GPU kernels load a segment's state once, at its first token, and run the chunked form).

qkv [N, 2 hk dk + hv dv] (the input projection's q, k, v, before the conv), b, a [N, hv];
conv_weight [C, W] (or [C, 1, W]); a_neg, dt_bias [hv]; conv_state [S, W - 1, C], delta_state [S, hv, dk, dv] (fp32)
-> (out [N, hv * dv] in qkv's dtype, conv_state, delta_state).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.fixed_order import fixed_order_sum

from .reference import gated_rms_norm

_F32 = jnp.float32
L2_EPS = 1e-6


def l2_normalize(x, eps: float = L2_EPS):
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gates(b, a, a_neg, dt_bias):
    """beta = sigmoid(b), g = a_neg * softplus(a + dt_bias) (fp32), each [..., hv]; a_neg = -exp(A_log) (GGUF's
    ssm_a: HF checkpoints' A_log gets the neg_exp transform at load)."""
    beta = jax.nn.sigmoid(b.astype(_F32))
    g = a_neg.astype(_F32) * jax.nn.softplus(a.astype(_F32) + dt_bias.astype(_F32))
    return beta, g


def gated_delta(
    qkv, b, a, state, conv_weight, a_neg, dt_bias, conv_state, delta_state, batch: StepBatch, *, hk, hv, dk, dv, kernel
):
    # state: int32 scalar, the layer's slot kind (row of batch.state_slots)
    del kernel  # the conv window's width comes with its weight
    weight = conv_weight.reshape(conv_weight.shape[0], -1).astype(_F32)  # [C, W]
    slots = jax.lax.dynamic_index_in_dim(batch.state_slots, jnp.asarray(state, jnp.int32), 0, keepdims=False)
    beta, g = gates(b, a, a_neg, dt_bias)
    repeat = hv // hk

    def step(carry, inputs):
        conv_pool, delta_pool = carry
        x_t, beta_t, g_t, slot, position = inputs
        valid = slot >= 0
        index = jnp.maximum(slot, 0)
        fresh = position == 0
        window = jnp.where(fresh, 0.0, conv_pool[index])  # [W - 1, C]
        s = jnp.where(fresh, 0.0, delta_pool[index])  # [hv, dk, dv]
        seen = jnp.concatenate([window, x_t[None].astype(_F32)])  # [W, C]
        mixed = jax.nn.silu(jnp.sum(seen.T * weight, axis=-1))  # [C]
        q = l2_normalize(mixed[: hk * dk].reshape(hk, dk)) * (dk**-0.5)
        k = l2_normalize(mixed[hk * dk : 2 * hk * dk].reshape(hk, dk))
        v = mixed[2 * hk * dk :].reshape(hv, dv)
        q, k = jnp.repeat(q, repeat, axis=0), jnp.repeat(k, repeat, axis=0)  # value head j reads key head j // r
        s = s * jnp.exp(g_t)[:, None, None]
        remembered = jnp.einsum("hkv,hk->hv", s, k)
        s = s + k[:, :, None] * (beta_t[:, None] * (v - remembered))[:, None, :]
        out = jnp.einsum("hkv,hk->hv", s, q)
        conv_pool = conv_pool.at[index].set(jnp.where(valid, seen[1:], conv_pool[index]))
        delta_pool = delta_pool.at[index].set(jnp.where(valid, s, delta_pool[index]))
        return (conv_pool, delta_pool), out.reshape(-1)

    (conv_state, delta_state), out = jax.lax.scan(
        step, (conv_state, delta_state), (qkv, beta, g, slots, batch.positions)
    )
    return out.astype(qkv.dtype), conv_state, delta_state


def gated_rms_norm_heads(x, gate, weight, *, eps, heads):
    """gated_rms_norm per head: x, gate [N, heads * n], weight [n] -> [N, heads * n]."""
    n = x.shape[0]
    out = gated_rms_norm(x.reshape(n, heads, -1), gate.reshape(n, heads, -1), weight, eps=eps)
    return out.reshape(n, -1)


def gated_rms_norm_heads_invariant(x, gate, weight, *, eps, heads):
    """gated_rms_norm_heads with the mean of squares summed in a fixed order: a row's bits do not depend on
    how many rows the array holds (XLA CPU's mean over [N, heads, n] does: the engine's logprobs moved in the
    last bits beside other requests on a tiny hybrid checkpoint)."""
    n = x.shape[0]
    xf = x.reshape(n, heads, -1).astype(_F32)
    mean_square = fixed_order_sum(xf * xf, axis=-1)[..., None] / xf.shape[-1]
    normed = (xf * jax.lax.rsqrt(mean_square + eps)).astype(x.dtype)
    gated = weight * normed * jax.nn.silu(gate.reshape(n, heads, -1).astype(_F32))
    return gated.astype(x.dtype).reshape(n, -1)
