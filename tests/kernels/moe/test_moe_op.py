"""The plan's `moe` op (stacked gate / up / down per expert) against a per-token loop over its chosen experts."""

from __future__ import annotations

import numpy as np
import pytest

from ember.compiler.kernels.moe.op import moe


def _loop(x, router, gate, up, down, top_k, normalize):
    out = np.zeros_like(x, dtype=np.float64)
    for n, row in enumerate(x.astype(np.float64)):
        logits = router.astype(np.float64) @ row
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        chosen = np.argsort(-probs, kind="stable")[:top_k]
        weights = probs[chosen] / (probs[chosen].sum() if normalize else 1.0)
        for w, e in zip(weights, chosen):
            g, u = gate[e] @ row, up[e] @ row
            out[n] += w * (down[e] @ (g / (1 + np.exp(-g)) * u))
    return out


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("tokens,top_k", [(1, 1), (7, 2), (20, 3)])
def test_moe_matches_a_per_token_loop(tokens, top_k, normalize):
    rng = np.random.default_rng(tokens * 10 + top_k)
    e, d, f = 6, 16, 8
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    router = rng.standard_normal((e, d)).astype(np.float32)
    gate, up = (rng.standard_normal((e, f, d)).astype(np.float32) * 0.3 for _ in range(2))
    down = rng.standard_normal((e, d, f)).astype(np.float32) * 0.3
    got = np.asarray(moe(x, router, gate, up, down, top_k=top_k, normalize=normalize))
    np.testing.assert_allclose(got, _loop(x, router, gate, up, down, top_k, normalize), atol=2e-5, rtol=1e-4)
