"""gated_delta/recurrent_kernel.py in Triton's CPU interpreter against op.gated_delta (the reference token scan):
steps of decode rows and prefill segments over different slots, padding rows and segments, requests starting
fresh (position 0, stale pool values ignored) or continuing, the state carried across calls."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from gated_delta_support import step_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from interpreter import HostBuffer

from ember.compiler.kernels.gated_delta import op
from ember.compiler.kernels.gated_delta.gpu import scatter_windows
from ember.compiler.kernels.gated_delta.recurrent_kernel import gated_delta_recurrent_kernel, launch_plan

pytestmark = pytest.mark.interpret

SLOTS = 5


def run_kernel(qkv, b, a, conv, a_neg, dt_bias, slots, positions, conv_pool, delta_pool, layout, dims):
    hk, hv, dk, dv, width = dims
    plan = launch_plan(
        decode_rows=layout[0], segments=layout[1], segment_len=layout[2], hk=hk, hv=hv, dk=dk, dv=dv, width=width
    )
    n, c = qkv.shape
    out = HostBuffer(np.full((n, hv * dv), np.nan, np.float32))
    windows = HostBuffer(np.full((layout[0] + layout[1], width - 1, c), np.nan, np.float32))
    delta = HostBuffer(np.array(delta_pool, np.float32))  # in and out: the same buffer, as the launch aliases them
    args = [qkv, b, a, conv.reshape(c, width), a_neg, dt_bias, slots, positions, conv_pool]
    gated_delta_recurrent_kernel[plan["grid"]](
        *(HostBuffer(np.asarray(x)) for x in args), delta, out, windows, delta, **plan["meta"]
    )
    new_conv = scatter_windows(jnp.asarray(conv_pool), jnp.asarray(windows.array), jnp.asarray(slots), layout)
    return out.array, np.asarray(new_conv), delta.array


def _step(rng, dims, lengths, decode_rows, seg_len, continuing):
    """A step: `decode_rows` rows then len(lengths) segments of seg_len tokens (lengths[i] real, then padding),
    every request on its own slot; a row with length 0 / a decode row drawn as padding has slot -1."""
    hk, hv, dk, dv, width = dims
    c = 2 * hk * dk + hv * dv
    order = rng.permutation(SLOTS)
    slots, positions = [], []
    for i in range(decode_rows):
        slots.append(int(order[i]) if i != 1 else -1)  # the second decode row is padding
        positions.append(int(rng.integers(0, 9)) if continuing else 0)
    for s, real in enumerate(lengths):
        slot = int(order[decode_rows + s])
        first = int(rng.integers(1, 9)) if continuing else 0
        slots += [slot] * real + [-1] * (seg_len - real)
        positions += list(range(first, first + real)) + [0] * (seg_len - real)
    n = len(slots)
    qkv = rng.standard_normal((n, c)).astype(np.float32)
    b = rng.standard_normal((n, hv)).astype(np.float32)
    a = rng.standard_normal((n, hv)).astype(np.float32)
    return qkv, b, a, np.asarray(slots, np.int32), np.asarray(positions, np.int32)


@settings(max_examples=2, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    decode_rows=st.integers(0, 2),
    lengths=st.lists(st.integers(0, 4), min_size=0, max_size=2),
    grouped=st.booleans(),
)
def test_kernel_matches_the_reference_scan(seed, decode_rows, lengths, grouped):
    """Two calls: the second continues the requests of the first from the pools the first left."""
    rng = np.random.default_rng(seed)
    dims = (1, 2, 8, 8, 4) if grouped else (2, 2, 4, 12, 3)  # (hk, hv, dk, dv, width): GQA 1:2, or 1:1
    hk, hv, dk, dv, width = dims
    c = 2 * hk * dk + hv * dv
    seg_len = max(lengths, default=0) + 1
    if decode_rows + len(lengths) == 0:
        decode_rows = 1
    layout = (decode_rows, len(lengths), seg_len if lengths else 0)
    conv = (rng.standard_normal((c, 1, width)) * 0.5).astype(np.float32)
    a_neg = -rng.uniform(0.5, 2, hv).astype(np.float32)
    dt_bias = rng.uniform(-3, -1, hv).astype(np.float32)
    pools = [
        rng.standard_normal((SLOTS, width - 1, c)).astype(np.float32),
        rng.standard_normal((SLOTS, hv, dk, dv)).astype(np.float32) * 0.3,
    ]
    ref_pools = [jnp.asarray(p) for p in pools]
    for call in range(2):
        qkv, b, a, slots, positions = _step(rng, dims, lengths, decode_rows, seg_len, continuing=call > 0)
        want, *ref_pools = op.gated_delta(
            jnp.asarray(qkv), jnp.asarray(b), jnp.asarray(a), 0, jnp.asarray(conv), jnp.asarray(a_neg),
            jnp.asarray(dt_bias), *ref_pools, step_batch(positions, slots, layout),
            hk=hk, hv=hv, dk=dk, dv=dv, kernel=width,
        )  # fmt: skip
        out, *pools = run_kernel(qkv, b, a, conv, a_neg, dt_bias, slots, positions, *pools, layout, dims)
        real = slots >= 0
        np.testing.assert_allclose(out[real], np.asarray(want)[real], atol=2e-5, rtol=1e-4)
        assert np.all(out[~real] == 0), "padding rows get o = 0"
        for got, ref in zip(pools, ref_pools):
            np.testing.assert_allclose(got, np.asarray(ref), atol=2e-5, rtol=1e-4)


def test_a_prompt_gives_the_same_bits_however_it_is_chunked():
    """Deterministic mode's rule: 6 tokens as segments of 4 then 2 (beside a padding decode row) or as 6 decode
    rows one step after another give the same o and state to the bit."""
    rng = np.random.default_rng(3)
    dims = (1, 2, 8, 8, 4)
    hk, hv, dk, dv, width = dims
    c = 2 * hk * dk + hv * dv
    qkv = rng.standard_normal((6, c)).astype(np.float32)
    b, a = (rng.standard_normal((6, hv)).astype(np.float32) for _ in range(2))
    conv = (rng.standard_normal((c, 1, width)) * 0.5).astype(np.float32)
    a_neg, dt_bias = -np.ones(hv, np.float32), -2 * np.ones(hv, np.float32)
    fresh = [np.zeros((2, width - 1, c), np.float32), np.zeros((2, hv, dk, dv), np.float32)]

    def run(cuts, decode):
        pools, outs, start = fresh, [], 0
        for cut in cuts:
            rows = slice(start, start + cut)
            slots = np.full(cut, 1, np.int32)
            positions = np.arange(start, start + cut, dtype=np.int32)
            layout = (1, 0, 0) if decode else (1, 1, cut)
            pad = lambda x: x if decode else np.concatenate([np.zeros_like(x[:1]), x])  # noqa: E731
            slots_in = slots if decode else np.concatenate([[-1], slots]).astype(np.int32)
            out, *pools = run_kernel(
                pad(qkv[rows]), pad(b[rows]), pad(a[rows]), conv, a_neg, dt_bias, slots_in,
                pad(positions).astype(np.int32), *pools, layout, dims,
            )  # fmt: skip
            outs.append(out if decode else out[1:])
            start += cut
        return np.concatenate(outs), pools

    whole, whole_pools = run([4, 2], decode=False)
    for got, pools in (run([1] * 6, decode=True),):
        np.testing.assert_array_equal(got, whole)
        for p, q in zip(pools, whole_pools):
            np.testing.assert_array_equal(p, q)
