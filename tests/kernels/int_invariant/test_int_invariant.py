"""The integer-sum invariant matmul's config, jnp form and launches (compiler/kernels/int_invariant/), on CPU: splits
follow the weight's shape only, the jnp form is within the int8 activations' error bound of a float64 product and
gives a row the same bits at every row count, and the GPU path lowers to its three kernels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from triton_calls import triton_calls

from ember.compiler.kernels.fixed_order import fixed_order_sum
from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
from ember.compiler.kernels.gguf_gemv.reference import dequantize, q4_k_parts
from ember.compiler.kernels.int_invariant.config import (
    GEMV_MAX_ROWS,
    IntInvariantConfig,
    gemm_plan,
    gemv_plan,
    pick_config,
    pick_gemm_launch,
    pick_gemv_launch,
)
from ember.compiler.kernels.int_invariant.matmul import gemm, gemv, int_invariant_matmul, quantize_gpu
from ember.compiler.kernels.int_invariant.reference import int_invariant_reference, pack_words, quantize_rows

# (format, n, k): the 1.5B Q4_K_M's projections (q/k/v, o, gate/up Q4_K; down and head Q6_K) and the 8B's down
SHAPES = [
    ("q4_k", 2048, 1536),
    ("q4_k", 1536, 1536),
    ("q4_k", 17920, 1536),
    ("q6_k", 1536, 8960),
    ("q6_k", 151936, 1536),
    ("q6_k", 4096, 14336),
]
ROWS = (1, 2, 3, 8, 16, 17, 64, 256, 257, 4096)


def weight(fmt: str, n: int, k: int, seed: int = 3):
    return pack(random_gguf_bytes(np.random.default_rng(seed), fmt, (n, k), realistic=True), fmt, (n, k))


@pytest.mark.parametrize("fmt, n, k", SHAPES)
def test_config_follows_the_weight_only(fmt, n, k):
    """k_split whole super-blocks from (n, k); every launch of every row count walks those splits (the GEMV as
    its grid's third axis, the GEMM inside a program), whatever its tiles."""
    config = pick_config(n, k)
    assert config.k_split % 256 == 0 and sum(b - a for a, b in config.bounds(k)) == k
    assert pick_config(n, k) == config
    for rows in ROWS:
        gemv_launch, gemm_launch = pick_gemv_launch(rows), pick_gemm_launch(rows)
        assert gemv_launch.rows_per_program in (1, 2, 4, 8) and gemv_launch.rows_per_program <= max(rows, 1) * 2
        g = gemv_plan(fmt, config, rows, n, k, gemv_launch, asm=True)
        m = gemm_plan(fmt, config, rows, n, k, gemm_launch, asm=True)
        assert g["grid"][2] == m["meta"]["SPLITS"] == config.splits(k)
        assert g["meta"]["K_SPLIT"] == m["meta"]["K_SPLIT"] == config.k_split


def test_config_gives_a_one_row_gemv_enough_programs():
    assert pick_config(2048, 1536) == IntInvariantConfig(256)  # 64 column tiles x 6 splits
    assert pick_config(1536, 8960) == IntInvariantConfig(1024)  # 48 x 9 (the last split 768)
    assert pick_config(151936, 1536) == IntInvariantConfig(1536)  # the head: enough columns, one split
    with pytest.raises(ValueError):
        pick_config(64, 1000)


def test_quantized_activations():
    """q dx within dx / 2 of x, sx the fixed-order sum of the block, and the packed words' layout: byte
    16 h + 4 c + j of a block is element 8 j + 4 h + c (the GEMM's tiles read these bytes, the GEMV the words)."""
    x = jax.random.normal(jax.random.key(0), (5, 512), jnp.float32).astype(jnp.bfloat16)
    q, dx, sx = quantize_rows(x)
    blocks = np.asarray(x, np.float32).reshape(5, 16, 32)
    assert np.all(np.abs(np.asarray(q, np.float32) * np.asarray(dx)[..., None] - blocks) <= np.asarray(dx)[..., None])
    np.testing.assert_array_equal(np.asarray(sx), np.asarray(fixed_order_sum(jnp.asarray(blocks), axis=-1)))
    as_bytes = np.asarray(pack_words(q)).view(np.int8).reshape(5, 16, 2, 4, 4)  # [row, block, h, c, j]
    h, c, j = np.meshgrid(np.arange(2), np.arange(4), np.arange(4), indexing="ij")
    np.testing.assert_array_equal(as_bytes, np.asarray(q)[:, :, 8 * j + 4 * h + c])


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_reference_is_within_the_int8_error_bound(fmt):
    """Against the float64 product of the dequantized weight: each output within sum_b (dx_b / 2) sum_j |a_j| (a_j
    the weight's part multiplied by the int8 codes: d sc c for Q4_K, whose minimums meet the exact sx, the whole
    weight for Q6_K) plus fp32 rounding."""
    n, k, rows = 48, 1024, 7
    w = weight(fmt, n, k)
    x = jax.random.normal(jax.random.key(1), (rows, k), jnp.float32)
    config = IntInvariantConfig(512)
    got = np.asarray(int_invariant_reference(x, w, config), np.float64)
    dense = np.asarray(dequantize(w), np.float64)  # [n, k]
    want = np.asarray(x, np.float64) @ dense.T
    _, dx, _ = quantize_rows(x)
    if fmt == "q4_k":
        codes, scale, minimum = (np.asarray(a, np.float64) for a in q4_k_parts(w))  # [sb, n, 8, 32], [sb, n, 8]
        scaled = np.swapaxes(scale[..., None] * codes, 0, 1).reshape(n, k)
        shift = np.repeat(np.swapaxes(minimum, 0, 1).reshape(n, k // 32), 32, axis=1)
    else:
        scaled, shift = dense, np.zeros_like(dense)
    half_step = np.repeat(np.asarray(dx, np.float64) / 2, 32, axis=1)  # [rows, k]
    bound = half_step @ np.abs(scaled).T
    rounding = (k // 32 + 8) * 2.0**-23 * (np.abs(np.asarray(x, np.float64)) @ (np.abs(scaled) + np.abs(shift)).T)
    err = np.abs(got - want)
    assert np.all(err <= bound + rounding), float((err / (bound + rounding)).max())
    # int8 activations: measured ~0.6% of the largest output
    assert np.abs(got - want).max() / np.abs(want).max() < 0.02


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_reference_gives_a_row_the_same_bits_at_every_row_count(fmt):
    n, k = 40, 768
    w = weight(fmt, n, k)
    x = jax.random.normal(jax.random.key(2), (33, k), jnp.float32).astype(jnp.bfloat16)
    config = IntInvariantConfig(256)
    f = jax.jit(int_invariant_reference, static_argnums=2)
    whole = np.asarray(f(x, w, config).astype(jnp.float32))
    for rows in (1, 2, 5, 16, 17):
        np.testing.assert_array_equal(np.asarray(f(x[:rows], w, config).astype(jnp.float32)), whole[:rows])


def test_matmul_off_the_gpu_is_the_reference():
    w = weight("q4_k", 40, 512)
    x = jax.random.normal(jax.random.key(3), (3, 512), jnp.float32).astype(jnp.bfloat16)
    got = int_invariant_matmul(x, w)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got), np.asarray(int_invariant_reference(x, w, pick_config(40, 512))))
    with pytest.raises(ValueError):
        int_invariant_matmul(x, weight("q8_0", 40, 512))


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
@pytest.mark.parametrize("rows", [1, GEMV_MAX_ROWS, 300])
def test_gpu_path_lowers_to_its_kernels(fmt, rows):
    """On a GPU trace: the quantizer, then the GEMV (grid: row groups x column tiles x splits) or the GEMM (row
    tiles x column tiles), as XLA Triton custom calls."""
    n, k = 2048, 1536
    w = weight(fmt, n, k)
    config = pick_config(n, k)
    x = jnp.zeros((rows, k), jnp.bfloat16)
    if rows <= GEMV_MAX_ROWS:
        calls = triton_calls(lambda x, w: gemv(quantize_gpu(x), w, config), x, w)
        plan = gemv_plan(fmt, config, rows, n, k, pick_gemv_launch(rows), asm=True)
    else:
        calls = triton_calls(lambda x, w: gemm(quantize_gpu(x), w, config, jnp.bfloat16), x, w)
        plan = gemm_plan(fmt, config, rows, n, k, pick_gemm_launch(rows), asm=True)
    assert [c["name"] for c in calls] == [
        "quantize_kernel",
        "int_gemv_kernel" if rows <= GEMV_MAX_ROWS else "int_gemm_kernel",
    ]
    assert calls[0]["grid"] == (rows, 3, 1)  # 48 blocks of 32, 16 per program
    assert calls[1]["grid"] == plan["grid"]
