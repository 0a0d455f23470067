"""The gated delta rule's references: the recurrence against a float64 numpy loop of its definition, the
chunked (WY) form against the recurrence at every length and chunk size, and a state carried across calls
equal to one call over the whole sequence."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.kernels.gated_delta.reference import (
    causal_conv1d,
    chunked_gated_delta,
    gated_rms_norm,
    recurrent_gated_delta,
)

H, DK, DV = 3, 16, 8


def _inputs(t: int, seed: int):
    rng = np.random.default_rng(seed)
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731  (Gated DeltaNet's L2 norm)
    q = unit(rng.standard_normal((t, H, DK))) / np.sqrt(DK)
    k = unit(rng.standard_normal((t, H, DK)))
    v = rng.standard_normal((t, H, DV))
    g = -np.exp(rng.uniform(-3, 1, (t, H)))  # log decay <= 0, some close to 0, some strong
    beta = 1 / (1 + np.exp(-rng.standard_normal((t, H))))
    state = rng.standard_normal((H, DK, DV)) * 0.3
    return [a.astype(np.float32) for a in (q, k, v, g, beta, state)]


def _definition(q, k, v, g, beta, state):
    s, out = state.astype(np.float64).copy(), []
    for t in range(q.shape[0]):
        s *= np.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", s, k[t]))
        s += k[t][:, :, None] * delta[:, None, :]
        out.append(np.einsum("hkv,hk->hv", s, q[t]))
    return np.stack(out), s


def test_the_recurrence_is_the_definition():
    args = _inputs(37, 0)
    out, state = recurrent_gated_delta(*map(jnp.asarray, args))
    want_out, want_state = _definition(*args)
    np.testing.assert_allclose(np.asarray(out), want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state), want_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t", [1, 5, 64, 100, 130])
@pytest.mark.parametrize("chunk", [16, 64])
def test_the_chunked_form_equals_the_recurrence(t, chunk):
    args = list(map(jnp.asarray, _inputs(t, t + chunk)))
    out, state = chunked_gated_delta(*args, chunk=chunk)
    want_out, want_state = recurrent_gated_delta(*args)
    assert out.shape == (t, H, DV) and state.shape == (H, DK, DV)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(state), np.asarray(want_state), rtol=2e-4, atol=2e-5)


def test_a_state_carried_across_calls_equals_one_call():
    """Chunked prefill of a prompt in two pieces, then decode steps: the same as the whole sequence at once."""
    q, k, v, g, beta, state = map(jnp.asarray, _inputs(90, 7))
    whole, final = recurrent_gated_delta(q, k, v, g, beta, state)
    first, carried = chunked_gated_delta(q[:50], k[:50], v[:50], g[:50], beta[:50], state, chunk=16)
    second, carried = chunked_gated_delta(q[50:80], k[50:80], v[50:80], g[50:80], beta[50:80], carried, chunk=16)
    third, carried = recurrent_gated_delta(q[80:], k[80:], v[80:], g[80:], beta[80:], carried)
    pieces = np.concatenate([np.asarray(first), np.asarray(second), np.asarray(third)])
    np.testing.assert_allclose(pieces, np.asarray(whole), rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(carried), np.asarray(final), rtol=2e-4, atol=2e-5)


def test_beta_zero_writes_nothing_and_zero_decay_keeps_the_state():
    q, k, v, g, beta, state = map(jnp.asarray, _inputs(9, 3))
    _, kept = recurrent_gated_delta(q, k, v, jnp.zeros_like(g), jnp.zeros_like(beta), state)
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(state))


def test_causal_conv1d_is_the_padded_convolution_and_carries_its_window():
    rng = np.random.default_rng(4)
    x, weight, bias = rng.standard_normal((10, 6)), rng.standard_normal((6, 4)), rng.standard_normal(6)
    padded = np.concatenate([np.zeros((3, 6)), x])
    want = np.stack([(padded[t : t + 4] * weight.T).sum(0) + bias for t in range(10)])
    want = want / (1 + np.exp(-want))
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    y, state = causal_conv1d(f32(x), f32(weight), jnp.zeros((3, 6), jnp.float32), bias=f32(bias))
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(state), x[-3:].astype(np.float32))
    first, carried = causal_conv1d(f32(x[:7]), f32(weight), jnp.zeros((3, 6), jnp.float32), bias=f32(bias))
    second, _ = causal_conv1d(f32(x[7:]), f32(weight), carried, bias=f32(bias))
    np.testing.assert_allclose(np.concatenate([first, second]), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_gated_rms_norm():
    rng = np.random.default_rng(5)
    x, z, w = rng.standard_normal((4, 32)), rng.standard_normal((4, 32)), rng.uniform(0.5, 1.5, 32)
    want = w * x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * z / (1 + np.exp(-z))
    got = gated_rms_norm(*(jnp.asarray(a, jnp.float32) for a in (x, z, w)), eps=1e-6)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
