"""The MoE references against a float64 numpy loop over tokens and their chosen experts (Qwen3-MoE's
routing: softmax, top-k, optional renormalisation; the gated shared expert of Qwen3-Next)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.kernels.moe.reference import moe_mlp, route

E, D, F, FS = 8, 16, 12, 20


def _weights(seed: int):
    rng = np.random.default_rng(seed)
    return {
        "router": rng.standard_normal((E, D)),
        "gate_up": rng.standard_normal((E, 2 * F, D)) * 0.3,
        "down": rng.standard_normal((E, D, F)) * 0.3,
        "shared": (
            rng.standard_normal((2 * FS, D)) * 0.3,
            rng.standard_normal((D, FS)) * 0.3,
            rng.standard_normal((1, D)),
        ),
    }


def _silu(a):
    return a / (1 + np.exp(-a))


def _loop(x, w, top_k, normalize, shared):
    out = np.zeros_like(x, dtype=np.float64)
    for n, row in enumerate(x.astype(np.float64)):
        logits = w["router"] @ row
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        chosen = np.argsort(-probs, kind="stable")[:top_k]
        weights = probs[chosen] / (probs[chosen].sum() if normalize else 1.0)
        for e, weight in zip(chosen, weights):
            gate, up = np.split(w["gate_up"][e] @ row, 2)
            out[n] += weight * (w["down"][e] @ (_silu(gate) * up))
        if shared:
            gate_up, down, shared_gate = w["shared"]
            gate, up = np.split(gate_up @ row, 2)
            out[n] += (down @ (_silu(gate) * up)) / (1 + np.exp(-(shared_gate @ row)[0]))
    return out


@pytest.mark.parametrize(
    "top_k, normalize, shared", [(2, True, False), (3, False, False), (2, True, True), (1, False, True)]
)
def test_moe_mlp_is_the_loop_over_chosen_experts(top_k, normalize, shared):
    w = _weights(top_k)
    x = np.random.default_rng(9).standard_normal((11, D)).astype(np.float32)
    as_jnp = {k: (tuple(map(jnp.asarray, v)) if k == "shared" else jnp.asarray(v, jnp.float32)) for k, v in w.items()}
    got = moe_mlp(
        jnp.asarray(x),
        as_jnp["router"],
        as_jnp["gate_up"],
        as_jnp["down"],
        top_k=top_k,
        normalize=normalize,
        shared=as_jnp["shared"] if shared else None,
    )
    np.testing.assert_allclose(np.asarray(got), _loop(x, w, top_k, normalize, shared), rtol=1e-4, atol=1e-5)


def test_route_renormalises_the_top_k_and_orders_them():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((6, D)), jnp.float32)
    router = jnp.asarray(np.random.default_rng(2).standard_normal((E, D)), jnp.float32)
    weights, experts = route(x, router, top_k=3, normalize=True)
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)
    assert np.all(np.diff(np.asarray(weights), axis=-1) <= 0) and experts.dtype == jnp.int32
    assert all(len(set(row)) == 3 for row in np.asarray(experts).tolist())
