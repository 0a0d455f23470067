"""The cpu target's int8-block weights (compiler/kernels/cpu_gemv/): the layout holds a GGUF weight's exact values,
the native kernel computes what its jnp form computes, close to the float product, and each row's result does
not depend on the other rows of the call (deterministic mode relies on it)."""

from __future__ import annotations

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
from gguf_test_data import FP16_SCALE_OFFSETS, random_tensor_bytes

from ember.compiler.kernels.cpu_gemv import native
from ember.compiler.kernels.cpu_gemv.layout import dequantize, from_quantized, take_rows, unpacked_codes
from ember.compiler.kernels.cpu_gemv.linear import embedding, linear_split
from ember.compiler.kernels.cpu_gemv.matmul import block_q8_matmul, block_q8_matmul_ref
from ember.compiler.kernels.gguf_gemv.layout import FORMATS, WeightGroup, pack
from ember.compiler.kernels.gguf_gemv.reference import dequantize as gguf_dequantize

Q = gguf.GGMLQuantizationType
TYPES = {"q4_k": Q.Q4_K, "q6_k": Q.Q6_K, "q8_0": Q.Q8_0, "q5_0": Q.Q5_0}


def random_weight(fmt: str, out: int, inner: int, seed: int = 0):
    """A packed GGUF weight of random codes with small, realistic fp16 scales."""
    rng = np.random.default_rng(seed)
    ggml_type = TYPES[fmt]
    block, block_bytes, _ = FORMATS[fmt]
    raw = random_tensor_bytes(rng, ggml_type, out * inner).reshape(-1, block_bytes)
    for offset in FP16_SCALE_OFFSETS[ggml_type]:
        raw[:, offset : offset + 2] = (
            rng.uniform(1e-4, 2e-3, raw.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
        )
    return pack(raw.reshape(out, -1), fmt, (out, inner))


@pytest.mark.parametrize("fmt", sorted(TYPES))
def test_layout_holds_the_exact_values_and_the_kernel_multiplies_them(fmt):
    w = random_weight(fmt, 200, 512)
    kept = from_quantized(w)
    assert kept.codes.dtype == jnp.int8 and kept.block == (16 if fmt == "q6_k" else 32)
    assert kept.nbytes < 1.3 * 200 * 512  # ~1.1-1.25 bytes per weight, against fp32's 4
    values = np.asarray(dequantize(kept))
    np.testing.assert_array_equal(values, np.asarray(gguf_dequantize(w)))

    assert native.available(), "g++ builds the kernel on this machine"
    x = jnp.asarray(np.random.default_rng(1).standard_normal((5, 512), np.float32))
    got = np.asarray(block_q8_matmul(x, kept))
    ref = np.asarray(block_q8_matmul_ref(x, kept))
    exact = np.asarray(x, np.float64) @ values.astype(np.float64).T
    scale = np.abs(exact).max()
    assert np.abs(got - ref).max() <= 1e-5 * scale  # the same arithmetic, sums in another order
    assert np.abs(got - exact).max() <= 1e-4 * scale  # int16 activations: 2^-16 of a chunk's largest value
    assert np.abs(got - exact).mean() <= 1e-5 * scale


def test_rows_do_not_depend_on_the_batch():
    kept = from_quantized(random_weight("q4_k", 130, 768, seed=3))
    x = jnp.asarray(np.random.default_rng(5).standard_normal((7, 768), np.float32))
    together = np.asarray(block_q8_matmul(x, kept))
    for i in range(7):
        alone = np.asarray(block_q8_matmul(x[i : i + 1], kept))
        np.testing.assert_array_equal(alone[0], together[i])
    np.testing.assert_array_equal(np.asarray(block_q8_matmul(x[2:6], kept)), together[2:6])


def test_groups_split_and_gathered_rows():
    qk = from_quantized(random_weight("q4_k", 96, 256, seed=1))
    v = from_quantized(random_weight("q6_k", 32, 256, seed=2))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 256), np.float32))
    q, k, vv = linear_split(x, WeightGroup((qk, v)), sizes=(64, 32, 32))
    np.testing.assert_array_equal(np.asarray(jnp.concatenate([q, k], -1)), np.asarray(block_q8_matmul(x, qk)))
    np.testing.assert_array_equal(np.asarray(vv), np.asarray(block_q8_matmul(x, v)))
    ids = jnp.asarray([5, 0, 95], jnp.int32)
    np.testing.assert_array_equal(np.asarray(embedding(ids, qk)), np.asarray(dequantize(qk))[[5, 0, 95]])


def test_nibble_pairs_hold_the_same_codes_and_give_the_int8_forms_bits():
    """Q4_K with its codes two per byte (kept_layout "nibble_blocks"): 0.75 bytes per weight, the same values,
    and the kernel's outputs bit for bit the int8 form's at 1 to 9 rows (both unpack to the same int16 codes)."""
    w = random_weight("q4_k", 70, 1280, seed=4)  # 70 rows: a partial block of 4; 40 blocks: a partial group of 8
    wide, packed = from_quantized(w), from_quantized(w, nibbles=True)
    assert packed.nibbles and packed.codes.dtype == jnp.uint8 and packed.codes.shape == (70, 640)
    assert packed.shape == wide.shape and packed.block == 32
    assert packed.nbytes <= 0.76 * 70 * 1280
    np.testing.assert_array_equal(np.asarray(unpacked_codes(packed)), np.asarray(wide.codes))
    np.testing.assert_array_equal(np.asarray(dequantize(packed)), np.asarray(gguf_dequantize(w)))
    x = jnp.asarray(np.random.default_rng(2).standard_normal((9, 1280), np.float32))
    for rows in (1, 2, 5, 9):
        np.testing.assert_array_equal(
            np.asarray(block_q8_matmul(x[:rows], packed)), np.asarray(block_q8_matmul(x[:rows], wide))
        )
    np.testing.assert_allclose(
        np.asarray(block_q8_matmul_ref(x, packed)), np.asarray(block_q8_matmul(x, wide)), rtol=1e-5, atol=1e-4
    )
    ids = jnp.asarray([69, 0, 3], jnp.int32)
    np.testing.assert_array_equal(np.asarray(embedding(ids, packed)), np.asarray(dequantize(wide))[[69, 0, 3]])
    assert take_rows(packed, ids).shape == (3, 1280)
