"""compiler/kernels/gguf_gemv/linear.py on CPU (reference backend): every path — GEMV rows, prefill rows,
weight groups, packed same-format weights, quantized embedding gathers — equals dequantize + the
reference ops, and packing concatenated GGUF rows equals concatenating the packed planes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.compiler.kernels import embedding as embedding_ref
from ember.compiler.kernels.dense_gemv import reference as linear_ref
from ember.compiler.kernels.gguf_gemv import FORMATS, WeightGroup, dequantize, pack, random_gguf_bytes
from ember.compiler.kernels.gguf_gemv import linear as linear_quant
from ember.compiler.kernels.gguf_gemv.linear import quant_backend
from ember.compiler.targets.policy import KernelPolicy, overriding

FORMAT_NAMES = list(FORMATS)
INNER = 512  # a multiple of every format's block


def _weight(rng: np.random.Generator, fmt: str, rows: int, inner: int = INNER):
    raw = random_gguf_bytes(rng, fmt, (rows, inner), realistic=True)
    return raw, pack(raw, fmt, (rows, inner))


_dequantize = jax.jit(dequantize)  # jitted references: one compile per shape, not one per eager op
_ref_linear = jax.jit(linear_ref.linear)


def _dense(w) -> jax.Array:
    """The float32 matrix a weight (QuantizedWeight, group or array) stands for."""
    if isinstance(w, WeightGroup):
        return jnp.concatenate([_dense(p) for p in w.parts], axis=0)
    return _dequantize(w) if hasattr(w, "planes") else jnp.asarray(w, jnp.float32)


def _close(got, want, tol: float = 2e-5) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))


@pytest.fixture(autouse=True)
def _reference_backend():
    with overriding({"quant_gemv.backend": "reference"}):
        yield


# Shapes are parametrized (one compile each); hypothesis draws the values.
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize(
    "rows", [1, KernelPolicy().quant_gemv.gemv_max_rows, KernelPolicy().quant_gemv.gemv_max_rows + 1]
)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_quantized_linear_equals_dequantize_then_reference(fmt, rows, seed):
    rng = np.random.default_rng(seed)
    _, w = _weight(rng, fmt, 24)
    x = jnp.asarray(rng.standard_normal((rows, INNER)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(24), jnp.float32)
    got = _linear(x, w, bias)
    _close(got, _ref_linear(x, _dequantize(w), bias))
    assert got.dtype == x.dtype
    _close(_linear(x, w, None), _ref_linear(x, _dequantize(w), None))


_linear = jax.jit(linear_quant.linear)
_linear_split = jax.jit(linear_quant.linear_split, static_argnames="sizes")


@pytest.mark.parametrize(
    "formats", [("q4_k", "q4_k", "q6_k"), ("q4_k", "float", "q6_k"), ("q8_0", "q4_k")], ids="+".join
)
@pytest.mark.parametrize("rows", [1, 33])
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_weight_group_runs_one_matmul_per_part(formats, rows, seed):
    """Parts of different formats (and float parts: a format the target does not keep)."""
    rng = np.random.default_rng(seed)
    sizes = (16, 8, 8)[: len(formats)]
    parts = tuple(
        rng.standard_normal((n, INNER)).astype(np.float32) if fmt == "float" else _weight(rng, fmt, n)[1]
        for fmt, n in zip(formats, sizes)
    )
    group = WeightGroup(parts)
    assert group.shape == (sum(sizes), INNER)
    x = jnp.asarray(rng.standard_normal((rows, INNER)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(sum(sizes)), jnp.float32)
    dense = _dense(group)
    _close(_linear(x, group, bias), _ref_linear(x, dense, bias))
    # sizes as the parts, a part holding two projections (q + k merged into one part beside v: each part's
    # projections come from its own product, the bias read at the part's offset), and sizes cutting across
    # parts (the packed product, then slices)
    for split_sizes in (sizes, (10, 6, *sizes[1:]), (4, sum(sizes) - 4 - sizes[-1] // 2, sizes[-1] // 2)):
        split = _linear_split(x, group, bias, sizes=split_sizes)
        want = linear_ref.linear_split(x, dense, bias, sizes=split_sizes)
        assert len(split) == len(split_sizes)
        for got_part, want_part in zip(split, want):
            _close(got_part, want_part)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_packed_rows_concatenate_along_the_out_axis_of_every_plane(fmt):
    """Packing the concatenated GGUF rows of q/k/v = concatenating their packed planes on axis 1."""
    rng = np.random.default_rng(7)
    sizes = (8, 3, 3)
    raws, weights = zip(*(_weight(rng, fmt, n) for n in sizes))
    whole = pack(np.concatenate(raws), fmt, (sum(sizes), INNER))
    for name, plane in whole.planes.items():
        np.testing.assert_array_equal(plane, np.concatenate([w.planes[name] for w in weights], axis=1))
    x = jnp.asarray(rng.standard_normal((2, INNER)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(sum(sizes)), jnp.float32)
    got = _linear_split(x, whole, bias, sizes=sizes)
    for got_part, w, b in zip(got, weights, jnp.split(bias, [8, 11])):
        _close(got_part, _ref_linear(x, _dequantize(w), b))


def test_plain_arrays_take_the_reference_ops_bit_for_bit():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((5, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((12, 64)), jnp.float32)
    b = jnp.asarray(rng.standard_normal(12), jnp.float32)
    np.testing.assert_array_equal(linear_quant.linear(x, w, b), linear_ref.linear(x, w, b))
    for got, want in zip(
        linear_quant.linear_split(x, w, b, sizes=(4, 8)), linear_ref.linear_split(x, w, b, sizes=(4, 8))
    ):
        np.testing.assert_array_equal(got, want)
    ids = jnp.asarray([3, 0, 11], jnp.int32)
    np.testing.assert_array_equal(linear_quant.embedding(ids, w), embedding_ref.embedding(ids, w))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantized_embedding_dequantizes_only_the_gathered_rows(fmt, dtype):
    rng = np.random.default_rng(11)
    _, table = _weight(rng, fmt, 40)
    table = table._replace(dtype=dtype)
    ids = jnp.asarray([5, 0, 39, 5, 17], jnp.int32)
    got = jax.jit(linear_quant.embedding)(ids, table)
    assert got.dtype == jnp.dtype(dtype) and got.shape == (5, INNER)
    # bit for bit what a dequantized table cast to the activation dtype gives (the dequantizing loader)
    want = embedding_ref.embedding(ids, dequantize(table).astype(dtype))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_bf16_activations_through_both_row_regimes():
    rng = np.random.default_rng(5)
    _, w = _weight(rng, "q4_k", 16)
    for rows in (1, KernelPolicy().quant_gemv.gemv_max_rows + 8):
        x = jnp.asarray(rng.standard_normal((rows, INNER)), jnp.bfloat16)
        got = linear_quant.linear(x, w)
        assert got.dtype == jnp.bfloat16
        want = linear_ref.linear(x.astype(jnp.float32), dequantize(w))
        _close(got.astype(jnp.float32), want, tol=2e-2)


def test_backend_choice():
    assert quant_backend() == "reference"  # CPU: no GPU, so never triton
    with overriding({"quant_gemv.backend": "triton"}):
        assert quant_backend() == "triton"  # the policy's choice beats the device's
    with overriding({"quant_gemv.backend": "cuda"}):
        with pytest.raises(ValueError, match="unknown quant backend"):
            quant_backend()


def test_gemv_row_bound_per_format(monkeypatch, kernel_overrides):
    """Formats the integer-dot kernel takes have its own bound while it is on; other formats the common one."""

    kernel_overrides({"quant_gemv.gemv_max_rows": 16})
    kernel_overrides({"quant_gemv.dp4a_gemv_max_rows": 64})
    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    assert linear_quant.gemv_max_rows("q4_k") == linear_quant.gemv_max_rows("q6_k") == 64
    assert linear_quant.gemv_max_rows("q8_0") == 16
    kernel_overrides({"quant_gemv.dp4a_formats": []})
    assert linear_quant.gemv_max_rows("q4_k") == 16
    # the bound decides the path: 40 rows of a Q4_K weight reach quant_matmul (the GEMV) only under 64
    calls = []
    monkeypatch.setattr(
        linear_quant, "quant_matmul", lambda x, w, backend, activations: calls.append(x.shape[0]) or x[:, :16] * 0
    )
    _, w = _weight(np.random.default_rng(6), "q4_k", 16)
    linear_quant.linear(jnp.zeros((40, INNER), jnp.float32), w)
    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    linear_quant.linear(jnp.zeros((40, INNER), jnp.float32), w)
    assert calls == [40]


def test_many_rows_take_the_gemm_only_where_the_policy_says(monkeypatch, kernel_overrides):
    """quant_gemv.many_rows "gemm" sends steps of more rows than the GEMV serves to the quantized GEMM (Triton
    backend only), up to gemm_max_rows; the default keeps dequantize + matmul; an unknown choice is an error."""
    calls = []
    monkeypatch.setattr(
        linear_quant, "quant_gemm", lambda x, w, config: calls.append((x.shape[0], config)) or x[:, :16]
    )
    _, w = _weight(np.random.default_rng(7), "q6_k", 16)
    x = jnp.zeros((40, INNER), jnp.float32)
    kernel_overrides({"quant_gemv.backend": "triton", "quant_gemv.gemv_max_rows": 16, "quant_gemv.dp4a_formats": []})
    linear_quant.linear(x, w)  # default: dequantize + matmul
    kernel_overrides({"quant_gemv.many_rows": "gemm", "quant_gemv.gemm_config": {"block_n": 32}})
    linear_quant.linear(x, w)
    assert [(rows, config.block_n) for rows, config in calls] == [(40, 32)]
    kernel_overrides({"quant_gemv.gemm_max_rows": 32})
    linear_quant.linear(x, w)  # 40 rows: above the GEMM's bound
    assert len(calls) == 1
    kernel_overrides({"quant_gemv.many_rows": "cublas"})
    with pytest.raises(ValueError, match="many_rows"):
        linear_quant.linear(x, w)
