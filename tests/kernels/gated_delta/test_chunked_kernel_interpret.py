"""gated_delta/chunked_kernel.py (the WY form over chunks) in Triton's CPU interpreter against op.gated_delta (the
reference token scan, which tests/kernels/gated_delta/test_gated_delta_reference.py holds equal to the jnp chunked
form): prefill segments of chunk-unaligned lengths over different slots, fresh or continuing from the pools,
then a second step continuing them. Chunks of 16 tokens here (64 on the GPU) to keep the interpreter fast."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from gated_delta_support import step_batch
from interpreter import HostBuffer
from test_recurrent_kernel_interpret import SLOTS

from ember.compiler.kernels.gated_delta import op
from ember.compiler.kernels.gated_delta.chunked_kernel import gated_delta_chunked_kernel, launch_plan
from ember.compiler.kernels.gated_delta.gpu import scatter_windows

pytestmark = pytest.mark.interpret


def run_chunked(qkv, b, a, conv, a_neg, dt_bias, slots, positions, conv_pool, delta_pool, segments, seg_len, dims):
    hk, hv, dk, dv, width = dims
    plan = launch_plan(segments=segments, segment_len=seg_len, hk=hk, hv=hv, dk=dk, dv=dv, width=width, chunk=16)
    n, c = qkv.shape
    out = HostBuffer(np.full((n, hv * dv), np.nan, np.float32))
    windows = HostBuffer(np.full((segments, width - 1, c), np.nan, np.float32))
    delta = HostBuffer(np.array(delta_pool, np.float32))
    args = [qkv, b, a, conv.reshape(c, width), a_neg, dt_bias, slots, positions, conv_pool]
    gated_delta_chunked_kernel[plan["grid"]](
        *(HostBuffer(np.asarray(x)) for x in args), delta, out, windows, delta, **plan["meta"]
    )
    layout = (0, segments, seg_len)
    new_conv = scatter_windows(jnp.asarray(conv_pool), jnp.asarray(windows.array), jnp.asarray(slots), layout)
    return out.array, np.asarray(new_conv), delta.array


@pytest.mark.parametrize(
    "lengths, seg_len, dims",
    [
        ((18, 0), 18, (1, 2, 8, 8, 4)),  # GQA 1:2, an empty segment, two chunks (the second partial)
        pytest.param((3, 16), 19, (2, 2, 4, 12, 3), marks=pytest.mark.slow),  # 1:1, width 3, a whole chunk
    ],
)
def test_chunked_kernel_matches_the_reference_scan(lengths, seg_len, dims):
    rng = np.random.default_rng(seg_len)
    hk, hv, dk, dv, width = dims
    c = 2 * hk * dk + hv * dv
    conv = (rng.standard_normal((c, 1, width)) * 0.5).astype(np.float32)
    a_neg = -rng.uniform(0.5, 2, hv).astype(np.float32)
    dt_bias = rng.uniform(-3, -1, hv).astype(np.float32)
    pools = [
        rng.standard_normal((SLOTS, width - 1, c)).astype(np.float32),
        (rng.standard_normal((SLOTS, hv, dk, dv)) * 0.3).astype(np.float32),
    ]
    ref_pools = [jnp.asarray(p) for p in pools]
    layout = (0, len(lengths), seg_len)
    for call in range(2):  # the first call starts segment 1 fresh and continues the others from the pools
        slots, positions = [], []
        for s, real in enumerate(lengths):
            first = 0 if (call == 0 and s == 1) else 5 + call * 30
            slots += [s + 1] * real + [-1] * (seg_len - real)
            positions += list(range(first, first + real)) + [0] * (seg_len - real)
        slots, positions = np.asarray(slots, np.int32), np.asarray(positions, np.int32)
        n = len(slots)
        qkv = rng.standard_normal((n, c)).astype(np.float32)
        b, a = (rng.standard_normal((n, hv)).astype(np.float32) for _ in range(2))
        want, *ref_pools = op.gated_delta(
            jnp.asarray(qkv), jnp.asarray(b), jnp.asarray(a), 0, jnp.asarray(conv), jnp.asarray(a_neg),
            jnp.asarray(dt_bias), *ref_pools, step_batch(positions, slots, layout),
            hk=hk, hv=hv, dk=dk, dv=dv, kernel=width,
        )  # fmt: skip
        out, *pools = run_chunked(
            qkv, b, a, conv, a_neg, dt_bias, slots, positions, *pools, len(lengths), seg_len, dims
        )
        real = slots >= 0
        np.testing.assert_allclose(out[real], np.asarray(want)[real], atol=5e-5, rtol=1e-4)
        assert np.all(out[~real] == 0)
        for got, ref in zip(pools, ref_pools):
            np.testing.assert_allclose(got, np.asarray(ref), atol=5e-5, rtol=1e-4)
