"""The gated delta rule (Gated DeltaNet's linear attention with a recurrent state), in `jnp`: the token-by-token
recurrence and the chunked (WY) form that prefill kernels use, which must agree with it.

Per head, with a state S [dk, dv] carried from token to token (q, k L2-normalised and q scaled by 1/sqrt(dk)
by the caller; g the log of the decay, g <= 0; beta in (0, 1)):

    S   <- exp(g_t) * S
    S   <- S + k_t (beta_t * (v_t - S^T k_t))^T        the delta rule: v_t written at k_t, at rate beta_t
    o_t  = S^T q_t

Shapes: q, k [T, H, dk], v [T, H, dv], g, beta [T, H], state [H, dk, dv] (fp32) -> (o [T, H, dv], state).
Everything runs in fp32. The chunked form splits T into chunks of C tokens; inside a chunk the updates are
a lower-triangular system solved by forward substitution (the WY representation), between chunks the state
carries over, so its cost is matmuls of C × C and C × dk instead of T sequential rank-one updates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def recurrent_gated_delta(q, k, v, g, beta, state):
    """One token at a time (decode, and the definition the chunked form is checked against)."""

    def step(s, inputs):
        q_t, k_t, v_t, g_t, b_t = inputs  # [H, dk], [H, dk], [H, dv], [H], [H]
        s = s * jnp.exp(g_t)[:, None, None]
        remembered = jnp.einsum("hkv,hk->hv", s, k_t)
        s = s + k_t[:, :, None] * (b_t[:, None] * (v_t - remembered))[:, None, :]
        return s, jnp.einsum("hkv,hk->hv", s, q_t)

    inputs = tuple(a.astype(_F32) for a in (q, k, v, g, beta))
    state, out = jax.lax.scan(step, state.astype(_F32), inputs)
    return out, state


def chunked_gated_delta(q, k, v, g, beta, state, *, chunk: int = 64):
    """The same result in chunks of `chunk` tokens (T is padded to a multiple with tokens that change
    nothing: g = 0 keeps the state, beta = 0 and k = 0 write nothing)."""
    t, h, dk = k.shape
    dv = v.shape[-1]
    pad = -t % chunk
    padded = [jnp.pad(a.astype(_F32), [(0, pad)] + [(0, 0)] * (a.ndim - 1)) for a in (q, k, v, g, beta)]
    n = (t + pad) // chunk
    # [n, H, C, ...] per chunk and head
    q_c, k_c, v_c = (a.reshape(n, chunk, h, -1).transpose(0, 2, 1, 3) for a in padded[:3])
    g_c, b_c = (a.reshape(n, chunk, h).transpose(0, 2, 1) for a in padded[3:])
    cum = jnp.cumsum(g_c, axis=-1)  # [n, H, C] log decay from the chunk's start through token i
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    # decay from token j to token i (i >= j) inside a chunk; masked to 0 above the diagonal before exp
    decay = jnp.exp(jnp.where(lower, cum[..., :, None] - cum[..., None, :], -jnp.inf))  # [n, H, C, C]
    k_beta = k_c * b_c[..., None]
    # (I + A) w = rhs with A strictly lower: A[i, j] = beta_i exp(cum_i - cum_j) k_i . k_j
    a = jnp.einsum("nhik,nhjk->nhij", k_beta, k_c) * decay * ~jnp.eye(chunk, dtype=bool)
    solve = _unit_lower_inverse(a)  # (I + A)^-1
    u = solve @ (v_c * b_c[..., None])  # [n, H, C, dv]: what the chunk writes, before the incoming state
    w = solve @ (k_beta * jnp.exp(cum)[..., None])  # [n, H, C, dk]: how the incoming state shows through
    causal = jnp.einsum("nhik,nhjk->nhij", q_c, k_c) * decay  # [n, H, C, C], zero above the diagonal
    last = cum[..., -1]  # [n, H]

    def step(s, c):
        q_i, k_i, u_i, w_i, causal_i, cum_i, last_i = c
        v_new = u_i - w_i @ s  # [H, C, dv]
        out = (q_i * jnp.exp(cum_i)[..., None]) @ s + causal_i @ v_new
        carried = k_i * jnp.exp(last_i[:, None] - cum_i)[..., None]  # [H, C, dk]
        s = s * jnp.exp(last_i)[:, None, None] + jnp.swapaxes(carried, -1, -2) @ v_new
        return s, out

    state, out = jax.lax.scan(step, state.astype(_F32), (q_c, k_c, u, w, causal, cum, last))
    out = out.transpose(0, 2, 1, 3).reshape(n * chunk, h, dv)[:t]
    return out, state


def _unit_lower_inverse(a):
    """(I + A)^-1 for strictly lower-triangular A [..., C, C], by forward substitution row by row."""
    c = a.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(c, dtype=a.dtype), a.shape)

    def row(i, inv):
        # row i of the inverse: e_i - sum_{j<i} A[i, j] inv[j]
        return inv.at[..., i, :].set(eye[..., i, :] - jnp.einsum("...j,...jc->...c", a[..., i, :], inv))

    return jax.lax.fori_loop(0, c, row, eye)


def causal_conv1d(x, weight, state, *, bias=None, activation: str | None = "silu"):
    """The short depthwise causal convolution before Gated DeltaNet's q/k/v split, with its carried window.

    x [T, C]; weight [C, W] (tap W - 1 multiplies the newest input); state [W - 1, C], the W - 1 inputs
    before x (zeros for a new sequence) -> (y [T, C] in x's dtype, state [W - 1, C]: the last W - 1 inputs).
    y_t = act(sum_i weight[:, i] * window_t[i] + bias), window_t the W inputs ending at x_t."""
    width = weight.shape[1]
    seen = jnp.concatenate([state.astype(_F32), x.astype(_F32)])  # [W - 1 + T, C]
    t = x.shape[0]
    y = sum(seen[i : i + t] * weight[:, i].astype(_F32) for i in range(width))
    if bias is not None:
        y = y + bias.astype(_F32)
    if activation == "silu":
        y = jax.nn.silu(y)
    return y.astype(x.dtype), seen[t:].astype(state.dtype)


def gated_rms_norm(x, gate, weight, *, eps):
    """RMSNorm of x times silu(gate) (Gated DeltaNet's output norm): statistics in fp32, the normed value
    rounded to x's dtype before the weight, as the hybrid checkpoints' transformers code does. x, gate [..., n], weight [n]."""
    xf = x.astype(_F32)
    normed = (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)
    return (weight * normed * jax.nn.silu(gate.astype(_F32))).astype(x.dtype)
