"""The plan's `gated_delta` op over a step's flat tokens and state slots: two sequences fed in interleaved
segments of any lengths (decode rows of one token, prefill chunks, padding between) give what the references
(causal conv1d, then the recurrent gated delta rule over each whole sequence) give."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.gated_delta.op import gated_delta, gates, l2_normalize
from ember.compiler.kernels.gated_delta.reference import causal_conv1d, chunked_gated_delta, recurrent_gated_delta

HK, HV, DK, DV, W = 2, 4, 8, 6, 4
C = 2 * HK * DK + HV * DV


def _sequence(t, seed):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((t, C)).astype(np.float32),
        rng.standard_normal((t, HV)).astype(np.float32),
        rng.standard_normal((t, HV)).astype(np.float32),
    )


def _weights(seed=7):
    rng = np.random.default_rng(seed)
    conv = (rng.standard_normal((C, 1, W)) * 0.5).astype(np.float32)
    a_neg = -rng.uniform(0.5, 2, HV).astype(np.float32)  # -exp(A_log)
    dt_bias = rng.uniform(-3, -1, HV).astype(np.float32)
    return conv, a_neg, dt_bias


def _expected(qkv, b, a, conv, a_neg, dt_bias, chunked=False):
    mixed, _ = causal_conv1d(jnp.asarray(qkv), jnp.asarray(conv[:, 0]), jnp.zeros((W - 1, C)))
    q = l2_normalize(mixed[:, : HK * DK].reshape(-1, HK, DK)) * DK**-0.5
    k = l2_normalize(mixed[:, HK * DK : 2 * HK * DK].reshape(-1, HK, DK))
    v = mixed[:, 2 * HK * DK :].reshape(-1, HV, DV)
    q, k = jnp.repeat(q, HV // HK, axis=1), jnp.repeat(k, HV // HK, axis=1)
    beta, g = gates(jnp.asarray(b), jnp.asarray(a), a_neg, dt_bias)
    rule = chunked_gated_delta if chunked else recurrent_gated_delta
    out, _ = rule(q, k, v, g, beta, jnp.zeros((HV, DK, DV)))
    return np.asarray(out).reshape(len(qkv), -1)


@pytest.mark.parametrize("cuts", [(7, 33), (1, 1, 1, 9), (65, 3)])
def test_segments_over_slots_equal_the_whole_sequence(cuts):
    total = sum(cuts)
    conv, a_neg, dt_bias = _weights()
    seqs = [_sequence(total, 1), _sequence(total, 2)]
    pools = (jnp.full((3, W - 1, C), 9.0), jnp.full((3, HV, DK, DV), 9.0))  # stale values: position 0 resets
    got = [[], []]
    start = 0
    for cut in cuts:  # each step: sequence 0's next chunk, a padding row, sequence 1's next chunk
        rows = [(0, p) for p in range(start, start + cut)] + [(-1, 0)] + [(1, p) for p in range(start, start + cut)]
        pick = lambda arr, s, p: arr[s][p] if s >= 0 else np.zeros_like(arr[0][0])  # noqa: E731
        qkv, b, a = (np.stack([pick([sq[i] for sq in seqs], s, p) for s, p in rows]) for i in range(3))
        slots = np.array([[2 if s == 0 else (-1 if s < 0 else 0) for s, _ in rows]], np.int32)
        batch = StepBatch(
            tokens=None,
            positions=jnp.asarray([p for _, p in rows], jnp.int32),
            slots=None,
            dec_block_tables=None,
            dec_ctx_lens=None,
            pre_block_table=None,
            logit_rows=None,
            state_slots=jnp.asarray(slots),
        )
        out, *pools = gated_delta(
            qkv, b, a, 0, conv, a_neg, dt_bias, *pools, batch, hk=HK, hv=HV, dk=DK, dv=DV, kernel=W
        )
        out = np.asarray(out)
        got[0].append(out[:cut])
        got[1].append(out[cut + 1 :])
        start += cut
    for s in (0, 1):
        want = _expected(*seqs[s], conv, a_neg, dt_bias)
        np.testing.assert_allclose(np.concatenate(got[s]), want, atol=2e-5)
    # the chunked form (what prefill kernels run) gives the same outputs
    np.testing.assert_allclose(_expected(*seqs[1], conv, a_neg, dt_bias, chunked=True), want, atol=2e-5)
    assert np.all(np.asarray(pools[0][1]) == 9.0)  # the unused slot is untouched
