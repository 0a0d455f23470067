"""Quantized device layouts (compiler/kernels/gguf_gemv): repacking, jnp dequantization bit-equal to gguf, the
reference matmul, and the static launch plans of the GPU kernels (the kernels themselves:
tests/kernels/gguf_gemv/test_quant_matmul_gpu.py)."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf_test_data import assert_bitwise_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.compiler.kernels.gguf_gemv import (
    FORMATS,
    QuantMatmulConfig,
    dequantize,
    launch_plan,
    pack,
    pick_config,
    quant_matmul,
    quant_matmul_ref,
    random_gguf_bytes,
)

FORMAT_NAMES = list(FORMATS)


def gguf_reference(raw: np.ndarray, fmt: str, shape: tuple[int, int]) -> np.ndarray:
    _, _, ggml_type = FORMATS[fmt]
    return gguf.quants.dequantize(raw.reshape(shape[0], -1), gguf.GGMLQuantizationType(ggml_type))


@st.composite
def matrix_shapes(draw: st.DrawFn, fmt: str) -> tuple[int, int]:
    block = FORMATS[fmt][0]
    return draw(st.integers(1, 9)), draw(st.integers(1, 5 if block == 256 else 24)) * block


_dequantize = jax.jit(dequantize)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@settings(max_examples=30, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_jnp_dequantization_equals_gguf_bit_for_bit(fmt: str, data: st.DataObject, seed: int) -> None:
    shape = data.draw(matrix_shapes(fmt))
    raw = random_gguf_bytes(np.random.default_rng(seed), fmt, shape)  # any codes, finite fp16 scales
    packed = pack(raw, fmt, shape)
    ours = np.asarray(_dequantize(packed))
    assert not np.isnan(ours).any()
    assert_bitwise_equal(ours, gguf_reference(raw, fmt, shape))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_device_layout_keeps_ggufs_byte_count(fmt: str) -> None:
    shape = (6, 2 * 256)
    raw = random_gguf_bytes(np.random.default_rng(1), fmt, shape)
    packed = pack(raw, fmt, shape)
    assert packed.nbytes == raw.size
    for plane in packed.planes.values():  # block-major: [in / block, out, ...]
        assert plane.shape[:2] == (shape[1] // FORMATS[fmt][0], shape[0])
        assert plane.flags.c_contiguous


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_pack_by_ggml_type_id_and_errors(fmt: str) -> None:
    shape = (2, 256)
    raw = random_gguf_bytes(np.random.default_rng(2), fmt, shape)
    by_id = pack(raw, FORMATS[fmt][2], shape)
    by_name = pack(raw, fmt, shape)
    assert by_id.format == by_name.format == fmt
    for name in by_name.planes:
        np.testing.assert_array_equal(by_id.planes[name], by_name.planes[name])
    with pytest.raises(ValueError, match="expected"):
        pack(raw[:-1], fmt, shape)
    with pytest.raises(ValueError, match="multiple of the block size"):
        pack(raw, fmt, (1, 100))
    with pytest.raises(ValueError, match="no device layout"):
        pack(raw, 2, shape)  # Q4_0


def test_quantized_weight_is_a_pytree_of_planes() -> None:
    packed = pack(random_gguf_bytes(np.random.default_rng(3), "q4_k", (4, 256)), "q4_k", (4, 256))
    leaves, treedef = jax.tree.flatten(packed)
    assert len(leaves) == len(packed.planes) and all(isinstance(leaf, np.ndarray) for leaf in leaves)
    on_device = jax.device_put(packed)
    assert on_device.format == "q4_k" and on_device.shape == (4, 256)
    assert jax.tree.structure(on_device) == treedef


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@settings(max_examples=10, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), m=st.integers(1, 17))
def test_reference_matmul_is_x_times_dequantized_transpose(fmt: str, data: st.DataObject, seed: int, m: int) -> None:
    shape = data.draw(matrix_shapes(fmt))
    rng = np.random.default_rng(seed)
    raw = random_gguf_bytes(rng, fmt, shape, realistic=True)
    packed = pack(raw, fmt, shape)
    x = rng.standard_normal((m, shape[1])).astype(np.float32)
    expected = x.astype(np.float64) @ gguf_reference(raw, fmt, shape).astype(np.float64).T
    y = jax.jit(quant_matmul_ref)(jnp.asarray(x), packed)
    assert y.shape == (m, shape[0]) and y.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    y16 = quant_matmul(jnp.asarray(x, jnp.bfloat16), packed, backend="reference")
    assert y16.dtype == jnp.bfloat16


def test_quant_matmul_backends() -> None:
    packed = pack(random_gguf_bytes(np.random.default_rng(4), "q8_0", (4, 64)), "q8_0", (4, 64))
    x = jnp.ones((2, 64), jnp.float32)
    with pytest.raises(ValueError, match="unknown backend"):
        quant_matmul(x, packed, backend="cuda")
    with pytest.raises(NotImplementedError, match="Mosaic"):
        quant_matmul(x, packed, backend="mosaic")
    with pytest.raises(ValueError, match="does not match"):
        quant_matmul(jnp.ones((2, 32)), packed)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("m", [1, 4, 16, 40])
@pytest.mark.parametrize("shape", [(256, 1536), (1536, 8960), (151936, 1536), (4096, 14336)])
def test_launch_plans_cover_the_matrix_exactly_once(fmt: str, m: int, shape: tuple[int, int], kernel_overrides) -> None:
    # the split kernels' plans (m <= 4 picks the rows kernels unless quant_gemv.rows_for_decode is off: test_quant_rows_plan.py)
    kernel_overrides({"quant_gemv.rows_for_decode": False})
    kernel_overrides({"quant_gemv.dp4a_formats": []})
    out, inner = shape
    config = pick_config(fmt, m, out, inner)
    assert config.variant == "split"
    plan = launch_plan(fmt, m, out, inner, config)
    meta = plan["meta"]
    grid_n, split_k, grid_m = plan["grid"]
    assert grid_n * meta["BLOCK_N"] >= out > (grid_n - 1) * meta["BLOCK_N"]
    assert grid_m * meta["BLOCK_M"] >= m > (grid_m - 1) * meta["BLOCK_M"]
    steps = inner // FORMATS[fmt][0] // meta.get("BLOCKS_PER_STEP", 1)
    assert steps * FORMATS[fmt][0] * meta.get("BLOCKS_PER_STEP", 1) == inner
    # every split owns at least one step, and the splits tile all the steps
    assert (split_k - 1) * meta["STEPS_PER_SPLIT"] < steps <= split_k * meta["STEPS_PER_SPLIT"]
    # tensor cores from 2 rows, up to 64 rows in one row block (each row block reads the weights once)
    assert meta["USE_DOT"] == (m > 1) and meta["BLOCK_M"] == {1: 1, 4: 16, 16: 16, 40: 64}[m]


def test_launch_plan_rejects_bad_configs() -> None:
    with pytest.raises(ValueError, match="power of two"):
        launch_plan("q4_k", 1, 64, 256, QuantMatmulConfig(block_n=24))
    with pytest.raises(ValueError, match="one activation row"):
        launch_plan("q4_k", 4, 64, 256, QuantMatmulConfig(use_dot=False))
