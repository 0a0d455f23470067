"""int8 activations for the integer-dot Q4_K GEMV (compiler/kernels/gguf_gemv/act_quant.py), its jnp reference, and the
"dp4a" variant's launch plans and config picks. The kernels themselves: in Triton's interpreter
test_dp4a_interpret.py and test_act_quant_interpret.py, on the H200 test_quant_matmul_gpu.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.compiler.kernels.gguf_gemv import (
    QuantMatmulConfig,
    launch_plan,
    pack,
    pick_config,
    quant_matmul_ref,
    random_gguf_bytes,
)
from ember.compiler.kernels.gguf_gemv.act_quant import (
    act_terms,
    dp4a_matmul_ref,
    packed_shapes,
    quantize_activations,
    quantize_blocks,
)

ELEMENT = {"q4_k": lambda h, q, j: q + 4 * h + 8 * j, "q6_k": lambda h, q, j: 16 * h + 4 * j + q}


def unpack(qa: np.ndarray, k: int, order: str = "q4_k") -> np.ndarray:
    """qa int32 [m, k/4] -> int8 [m, k] in element order, following the documented packings independently:
    byte j of word 8b + 4h + q of block b is element q + 4h + 8j (Q4_K) or 16h + 4j + q (Q6_K)."""
    m = qa.shape[0]
    lanes = qa.view(np.int8).reshape(m, k // 32, 2, 4, 4)  # [m, block, h, q, byte j]
    out = np.empty((m, k // 32, 32), np.int8)
    for h in range(2):
        for q in range(4):
            for j in range(4):
                out[:, :, ELEMENT[order](h, q, j)] = lanes[:, :, h, q, j]
    return out.reshape(m, k)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 5),
    blocks=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
    order=st.sampled_from(["q4_k", "q6_k"]),
)
def test_packing_and_rounding(m, blocks, seed, scale, order):
    rng = np.random.default_rng(seed)
    k = 32 * blocks
    x = (rng.standard_normal((m, k)) * scale).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    qa, da = (np.asarray(a) for a in quantize_activations(jnp.asarray(x), order, terms=1))
    assert qa.dtype == np.int32 and qa.shape == (m, k // 4) and da.shape == (m, k // 32, 4)
    q = unpack(qa, k, order).astype(np.float32).reshape(m, blocks, 32)
    dx, sx = da[..., 0], da[..., 1]
    np.testing.assert_array_equal(da[..., 2], q[..., :16].sum(-1))  # the halves' integer sums
    np.testing.assert_array_equal(da[..., 3], q[..., 16:].sum(-1))
    xb = x.reshape(m, blocks, 32)
    np.testing.assert_allclose(dx, np.abs(xb).max(-1) / 127, rtol=1e-6)
    np.testing.assert_allclose(sx, xb.sum(-1), rtol=1e-5, atol=1e-6 * scale)
    assert np.abs(q).max() <= 127
    assert (q[0, 0] == 0).all() and dx[0, 0] == 0
    # round to nearest: within half a step (plus fp32 slack), and the block's largest |x| lands on +-127
    assert (np.abs(q * dx[..., None] - xb) <= 0.5 * dx[..., None] * (1 + 1e-5) + 1e-30).all()
    big = np.abs(xb).argmax(-1)
    nonzero = dx > 0
    assert (np.abs(np.take_along_axis(q, big[..., None], -1)[..., 0])[nonzero] == 127).all()
    # element order agrees with quantize_blocks (what the reference uses)
    qb, _, _ = quantize_blocks(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(qb, np.float32), q)


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_dp4a_reference_is_exact_on_int8_representable_activations(fmt):
    """x = integers with +-127 in every block: the int8 rounding loses nothing, so the integer-dot
    formulation equals the float reference up to fp32 summation order."""
    rng = np.random.default_rng(0)
    shape = (96, 1024)
    w = pack(random_gguf_bytes(rng, fmt, shape, realistic=True), fmt, shape)
    x = rng.integers(-126, 127, (3, 1024)).astype(np.float32)
    x[:, ::32] = 127.0
    got = np.asarray(dp4a_matmul_ref(jnp.asarray(x), w, terms=1))
    expected = np.asarray(quant_matmul_ref(jnp.asarray(x), w))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_dp4a_reference_error_on_gaussian_activations(fmt):
    """The int8 rounding's cost on a projection: ~0.5% relative L2 with one term (bf16 activations alone:
    ~0.15%), below 1e-4 with two (the second term rounds the first one's residual)."""
    rng = np.random.default_rng(1)
    shape = (256, 1536)
    w = pack(random_gguf_bytes(rng, fmt, shape, realistic=True), fmt, shape)
    x = jnp.asarray(rng.standard_normal((4, 1536)).astype(np.float32))
    expected = np.asarray(quant_matmul_ref(x, w))
    rel = {
        terms: np.linalg.norm(np.asarray(dp4a_matmul_ref(x, w, terms=terms)) - expected) / np.linalg.norm(expected)
        for terms in (1, 2)
    }
    assert 1e-4 < rel[1] < 1e-2 and rel[2] < 1e-4 and rel[2] < rel[1] / 50


@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 3),
    blocks=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
    order=st.sampled_from(["q4_k", "q6_k"]),
)
def test_a_second_term_rounds_the_first_ones_residual(m, blocks, seed, scale, order):
    """terms=2: the first term's words and factors as with one term, then the residual's: its codes within
    half a step dx' <= dx / 254 of what the first left (so x within dx' / 2), its sx slot 0."""
    rng = np.random.default_rng(seed)
    k = 32 * blocks
    x = (rng.standard_normal((m, k)) * scale).astype(np.float32)
    x[0, :32] = 0.0
    one = [np.asarray(a) for a in quantize_activations(jnp.asarray(x), order, terms=1)]
    qa, da = (np.asarray(a) for a in quantize_activations(jnp.asarray(x), order, terms=2))
    assert (qa.shape, da.shape) == ((m, k // 2), (m, k // 32, 8))
    assert [s.shape for s in packed_shapes(m, k, 2)] == [qa.shape, da.shape]
    np.testing.assert_array_equal(qa[:, : k // 4], one[0])
    np.testing.assert_array_equal(da[..., :4], one[1])
    q1 = unpack(qa[:, : k // 4], k, order).astype(np.float32).reshape(m, blocks, 32)
    q2 = unpack(np.ascontiguousarray(qa[:, k // 4 :]), k, order).astype(np.float32).reshape(m, blocks, 32)
    dx, dx2 = da[..., 0], da[..., 4]
    assert (da[..., 5] == 0).all()
    np.testing.assert_array_equal(da[..., 6], q2[..., :16].sum(-1))
    np.testing.assert_array_equal(da[..., 7], q2[..., 16:].sum(-1))
    assert (dx2 <= dx / 254 * (1 + 1e-5) + 1e-30).all()
    xb = x.reshape(m, blocks, 32)
    approx = q1 * dx[..., None] + q2 * dx2[..., None]
    assert (np.abs(approx - xb) <= 0.5 * dx2[..., None] + 1e-6 * np.abs(xb) + 1e-30).all()


def test_the_number_of_terms_comes_from_the_kernel_policy(kernel_overrides):
    kernel_overrides({"quant_gemv.act_terms": 2})
    assert act_terms() == 2
    assert quantize_activations(jnp.ones((1, 64)), "q4_k")[1].shape == (1, 2, 8)
    kernel_overrides({"quant_gemv.act_terms": 3})
    with pytest.raises(ValueError, match="1 or 2"):
        act_terms()


def test_dp4a_reference_rejects_other_formats():
    w = pack(random_gguf_bytes(np.random.default_rng(2), "q8_0", (8, 256)), "q8_0", (8, 256))
    with pytest.raises(ValueError, match="Q4_K or Q6_K"):
        dp4a_matmul_ref(jnp.ones((1, 256)), w)


@pytest.mark.parametrize(
    "m, groups, rows", [(1, 1, 1), (4, 1, 4), (8, 1, 8), (9, 2, 5), (11, 2, 6), (16, 2, 8), (17, 3, 6)]
)
@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_dp4a_plan_row_groups(fmt, m, groups, rows):
    plan = launch_plan(fmt, m, 1536, 8960, QuantMatmulConfig(variant="dp4a", block_n=16, split_k=8))
    meta = plan["meta"]
    assert meta["Q6"] == (fmt == "q6_k") and meta["EXACT"] in (True, False)
    assert meta["R"] == rows and meta["M_PAD"] == groups * rows >= m
    assert meta["ASM"] and "M" not in meta
    rows_plan = launch_plan("q4_k", 1, 1536, 8960, QuantMatmulConfig(variant="rows", block_n=16, split_k=8))
    tiles, split_k, _ = rows_plan["grid"]
    assert plan["grid"] == (tiles * groups, split_k, 1) and meta["S"] == rows_plan["meta"]["S"]


def test_dp4a_plan_rejects_other_formats():
    with pytest.raises(ValueError, match="dp4a"):
        launch_plan("q8_0", 1, 256, 1536, QuantMatmulConfig(variant="dp4a"))


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_decode_picks_dp4a(m, kernel_overrides):
    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    for shape in [(1536, 1536), (17920, 1536), (1536, 8960), (28672, 4096), (151936, 1536)]:
        assert pick_config("q4_k", m, *shape).variant == "dp4a"
        assert pick_config("q6_k", m, *shape).variant == "dp4a"
        assert pick_config("q8_0", m, *shape).variant != "dp4a"
    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k"]})
    assert pick_config("q6_k", m, 1536, 8960).variant == ("rows" if m <= 4 else "split")
    kernel_overrides({"quant_gemv.dp4a_formats": []})
    assert pick_config("q4_k", m, 1536, 1536).variant == ("rows" if m <= 4 else "split")
