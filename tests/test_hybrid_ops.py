"""The small ops and weight transforms the hybrid specs add: partial rotary RoPE, per-head query gates, the
per-head gated RMSNorm, and the row transforms that turn fused / reordered checkpoint projections flat."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.kernels.activation import sigmoid_gate, split_at
from ember.compiler.kernels.gated_delta.op import gated_rms_norm_heads
from ember.compiler.kernels.gated_delta.reference import gated_rms_norm
from ember.compiler.kernels.rope.reference import inv_frequencies, rope
from ember.compiler.weight_transforms import apply_transform, parse_transform


@pytest.mark.parametrize("rotary", [4, 8, 16])
def test_partial_rope_rotates_the_first_dims_only(rotary):
    rng = np.random.default_rng(rotary)
    tokens = 5
    dh = 32
    q, k = (rng.standard_normal((tokens, 2, dh)).astype(np.float32) for _ in range(2))
    positions = jnp.arange(tokens) + 3
    inv = inv_frequencies(theta=10000.0, head_dim=float(rotary))  # a factor times dh may come as a float
    assert inv.shape == (rotary // 2,)
    q2, k2 = rope(q, k, positions, inv, style="neox")
    full_q, full_k = rope(q[..., :rotary], k[..., :rotary], positions, inv, style="neox")
    np.testing.assert_array_equal(np.asarray(q2[..., rotary:]), q[..., rotary:])  # the rest passes through
    np.testing.assert_array_equal(np.asarray(k2[..., :rotary]), np.asarray(full_k))
    np.testing.assert_array_equal(np.asarray(q2[..., :rotary]), np.asarray(full_q))


def test_query_gate_per_head_and_gated_norm_per_head():
    rng = np.random.default_rng(0)
    qg = rng.standard_normal((3, 4, 16)).astype(np.float32)  # [N, heads, query + gate]
    q, g = split_at(qg, size=8)
    np.testing.assert_array_equal(q, qg[..., :8])
    np.testing.assert_array_equal(g, qg[..., 8:])
    attn = rng.standard_normal((3, 32)).astype(np.float32)  # [N, heads * dh] as attention returns it
    want = attn * (1 / (1 + np.exp(-g.reshape(3, 32))))
    np.testing.assert_allclose(np.asarray(sigmoid_gate(attn, g)), want, rtol=1e-6)
    one = rng.standard_normal((3, 1)).astype(np.float32)  # a shared expert's gate: one per row
    np.testing.assert_allclose(np.asarray(sigmoid_gate(attn, one)), attn / (1 + np.exp(-one)), rtol=1e-6)
    x, z = (rng.standard_normal((3, 4 * 8)).astype(np.float32) for _ in range(2))
    w = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    got = gated_rms_norm_heads(x, z, w, eps=1e-6, heads=4)
    want = gated_rms_norm(x.reshape(3, 4, 8), z.reshape(3, 4, 8), w, eps=1e-6).reshape(3, 32)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_ungroup_rows_takes_parts_of_a_grouped_projection():
    dims = {"g": 2, "a": 1, "b": 2}
    # per group: 1 row of part 0, 2 rows of part 1: rows g0p0, g0p1, g0p1, g1p0, g1p1, g1p1
    fused = np.array([[0], [10], [11], [1], [12], [13]], np.float32)
    np.testing.assert_array_equal(apply_transform("ungroup_rows(0, 1, g, a, b)", fused, dims)[:, 0], [0, 1])
    np.testing.assert_array_equal(apply_transform("ungroup_rows(1, 2, g, a, b)", fused, dims)[:, 0], [10, 11, 12, 13])
    np.testing.assert_array_equal(
        apply_transform("ungroup_rows(0, 2, g, a, b)", fused, dims)[:, 0], [0, 1, 10, 11, 12, 13]
    )


def test_untile_puts_value_heads_back_in_key_groups():
    dims = {"hk": 2, "dv": 2, "skip": 3}
    # 4 value heads over 2 key groups, stored tiled: head t * hk + g holds grouped head g * 2 + t
    grouped = np.arange(8, dtype=np.float32)  # 4 heads of 2 rows, in grouped order
    heads = grouped.reshape(4, 2)
    tiled = heads[[0, 2, 1, 3]].reshape(-1)
    np.testing.assert_array_equal(apply_transform("untile_rows(hk, dv, 0)", tiled, dims), grouped)
    with_prefix = np.concatenate([[-1, -2, -3], tiled]).astype(np.float32)  # q/k channels stay put
    np.testing.assert_array_equal(apply_transform("untile_rows(hk, dv, skip)", with_prefix, dims)[3:], grouped)
    cols = np.stack([tiled, tiled + 100])  # [out, heads * dv]: the output projection's columns
    np.testing.assert_array_equal(
        apply_transform("untile_columns(hk, dv)", cols, dims), np.stack([grouped, grouped + 100])
    )
    np.testing.assert_array_equal(
        apply_transform("untile_rows(hk, 1, 0)", np.array([0, 2, 1, 3.0]), dims), [0, 1, 2, 3]
    )


def test_neg_exp_and_squeeze_and_argument_checks():
    a_log = np.array([0.0, np.log(2.0)], np.float32)
    np.testing.assert_allclose(apply_transform("neg_exp", a_log, {}), [-1.0, -2.0])
    assert apply_transform("squeeze", np.zeros((6, 1, 4), np.float32), {}).shape == (6, 4)
    assert parse_transform("ungroup_rows(0, 3, g, a, b, c)") == ("ungroup_rows", ("0", "3", "g", "a", "b", "c"))
    with pytest.raises(ValueError, match="takes"):
        parse_transform("untile_rows(hk)")
