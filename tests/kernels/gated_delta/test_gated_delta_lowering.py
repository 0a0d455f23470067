"""compiler/kernels/gated_delta/gpu.py on CPU: off the GPU the ops are the references; the step layout read from a
batch; the fused recurrent and gated-norm kernels lower for sm_90 as one native kernel each, the delta pool
updated in place (the kernels' results: tests/kernels/gated_delta/*_interpret.py, *_gpu.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from gated_delta_support import step_batch
from triton_calls import triton_calls

from ember.compiler.kernels.gated_delta import gpu, op

BF16 = jnp.bfloat16


def _batch(n, decode_rows, segments, slots=None):
    return step_batch(np.zeros(n, np.int32), np.arange(n) % 3 if slots is None else slots, (decode_rows, segments, 0))


@pytest.mark.parametrize(
    "n, decode_rows, segments, want",
    [(4, 4, 0, (4, 0, 0)), (1, 1, 1, (1, 0, 0)), (20, 4, 2, (4, 2, 8)), (64, 0, 1, (0, 1, 64)), (7, 2, 2, None)],
)
def test_step_layout(n, decode_rows, segments, want):
    assert gpu.step_layout(_batch(n, decode_rows, segments), n) == want


def test_off_the_gpu_the_ops_are_the_references():
    hk, hv, dk, dv, w = 1, 2, 4, 4, 3
    c = 2 * hk * dk + hv * dv
    rng = np.random.default_rng(0)
    qkv = jnp.asarray(rng.standard_normal((5, c)), jnp.float32)
    ba = jnp.asarray(rng.standard_normal((5, hv)), jnp.float32)
    args = (qkv, ba, ba, 0, jnp.ones((c, w)), -jnp.ones(hv), jnp.zeros(hv), jnp.zeros((3, w - 1, c)))
    args += (jnp.zeros((3, hv, dk, dv)), _batch(5, 1, 1))
    dims = dict(hk=hk, hv=hv, dk=dk, dv=dv, kernel=w)
    for got, want in zip(gpu.gated_delta(*args, **dims), op.gated_delta(*args, **dims)):
        np.testing.assert_array_equal(got, want)
    x = qkv[:, :8]
    np.testing.assert_array_equal(
        gpu.gated_rms_norm_heads(x, x, jnp.ones(4), eps=1e-6, heads=2),
        op.gated_rms_norm_heads(x, x, jnp.ones(4), eps=1e-6, heads=2),
    )


@pytest.mark.parametrize(
    "layout, kernels",
    [
        ((1, 0, 0), ["recurrent"]),
        ((32, 0, 0), ["recurrent"]),
        ((2, 1, 62), ["recurrent"]),  # a segment shorter than gated_delta.chunked_min_tokens
        ((0, 4, 128), ["chunked"]),
        ((3, 2, 100), ["recurrent", "chunked"]),  # a mixed step: its decode rows, then its segments
    ],
)
def test_kernels_lower_to_native_kernels_updating_the_pool_in_place(layout, kernels):
    hk, hv, dk, dv, w = 16, 32, 128, 128, 4  # the hybrid checkpoints' linear attention
    c = 2 * hk * dk + hv * dv
    n = layout[0] + layout[1] * layout[2]
    ints = jnp.zeros(n, jnp.int32)

    def fn(qkv, ba, conv_w, vec, conv_pool, delta_pool):
        return gpu.gated_delta_triton(
            qkv, ba, ba, conv_w, vec, vec, conv_pool, delta_pool, ints, ints, layout, hk=hk, hv=hv, dk=dk, dv=dv
        )

    args = (jnp.zeros((n, c), BF16), jnp.zeros((n, hv), BF16), jnp.zeros((c, 1, w), BF16), jnp.zeros(hv, BF16))
    args += (jnp.zeros((4, w - 1, c), BF16), jnp.zeros((4, hv, dk, dv), jnp.float32))
    calls = triton_calls(fn, *args)
    assert [call["name"] for call in calls] == [f"gated_delta_{kernel}_kernel" for kernel in kernels]
    if kernels == ["recurrent"]:
        assert calls[0]["grid"] == (layout[0] + layout[1], hv, 4)
    if kernels[-1] == "chunked":
        assert calls[-1]["grid"] == (layout[1], hv, 4)
    import jax

    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "output_operand_aliases" in text


def test_gated_norm_kernel_lowers_to_one_native_kernel():
    x = jnp.zeros((3, 32 * 128), BF16)
    calls = triton_calls(lambda x, w: gpu.gated_rms_norm_triton(x, x, w, eps=1e-6, heads=32), x, jnp.ones(128, BF16))
    assert [call["name"] for call in calls] == ["gated_rms_norm_kernel"] and calls[0]["grid"] == (96, 1, 1)
