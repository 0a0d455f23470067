"""The native int8-block kernel (cpu_gemv/block_q8.cc) against a numpy model of its arithmetic, per GGUF format it
keeps (Q4_K: blocks of 32 with offsets; Q6_K: blocks of 16; Q8_0 and Q5_0: blocks of 32, no offsets), at every
row count from 1 to 40 (Q4_K; a sample for the others), with output counts that leave a partial block of 4 weight rows and K that leaves a
partial group of 8 blocks; and each row's result bit for bit the same alone as in any batch (deterministic mode)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from test_block_q8 import random_weight

from ember.compiler.kernels.cpu_gemv import native
from ember.compiler.kernels.cpu_gemv.layout import dequantize, from_quantized
from ember.compiler.kernels.cpu_gemv.matmul import block_q8_matmul

LEVELS = np.float32(32767.0)


def numpy_model(x: np.ndarray, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray):
    """The kernel's arithmetic in float64 from its exact integer parts: x quantized to int16 per 32 (float32, round
    half to even, as the kernel), exact integer block dots, then the block scales. Returns (y, sum of |terms|)."""
    n, k = x.shape
    out, nb = scale.shape
    block = k // nb
    chunks = x.reshape(n, k // 32, 32)
    amax = np.abs(chunks).max(-1)  # [N, K/32] float32
    inv = np.where(amax > 0, LEVELS / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    xq = np.rint(chunks * inv[..., None]).astype(np.int64).reshape(n, nb, block)
    xs = np.repeat((amax / LEVELS).astype(np.float32), 32 // block, axis=1).astype(np.float64)  # [N, nb]
    dots = np.einsum("nbk,obk->nob", xq, codes.reshape(out, nb, block).astype(np.int64))  # exact
    terms = dots * scale.astype(np.float64)[None] * xs[:, None, :]  # [N, O, nb]
    y, magnitude = terms.sum(-1), np.abs(terms).sum(-1)
    if offset.size:
        sums = x.astype(np.float64).reshape(n, nb, block).sum(-1)  # [N, nb]
        y = y - sums @ offset.astype(np.float64).T
        magnitude = magnitude + np.abs(sums) @ np.abs(offset.astype(np.float64)).T
    return y, magnitude


# (format, out, K): out % 4 != 0 leaves single weight rows; K / block % 8 != 0 a partial group
CASES = [("q4_k", 38, 1280), ("q6_k", 37, 768), ("q8_0", 39, 800), ("q5_0", 41, 992)]


@pytest.fixture(scope="module", params=CASES, ids=[case[0] for case in CASES])
def weight(request):
    fmt, out, inner = request.param
    return fmt, from_quantized(random_weight(fmt, out, inner, seed=out))


def test_every_row_count_matches_the_numpy_model(weight):
    fmt, w = weight
    assert native.available()
    codes, scale, offset = (np.asarray(a) for a in (w.codes, w.scale, w.offset))
    assert bool(offset.size) == (fmt == "q4_k")
    rng = np.random.default_rng(7)
    # activations with an outlier channel (as real residual streams have), one all-zero chunk
    x_all = rng.standard_normal((40, codes.shape[1])).astype(np.float32)
    x_all[:, 3] *= 300
    x_all[5, 64:96] = 0
    dense = np.asarray(dequantize(w), np.float64)
    # every count for Q4_K (the default model's main format); the other formats at the counts that change the
    # kernel's path (a partial block of 4 rows, the thread split from 2 rows up, prefill's 32) to keep CI fast
    for rows in range(1, 41) if fmt == "q4_k" else (1, 2, 3, 5, 8, 32, 40):
        x = x_all[:rows]
        got = np.asarray(block_q8_matmul(jnp.asarray(x), w), np.float64)
        ref, magnitude = numpy_model(x, codes, scale, offset)
        # float32 sums of nb + 2 terms: within a few units of float32 rounding of the terms' magnitude
        bound = (scale.shape[1] + 8) * 2.0**-24 * magnitude
        assert np.all(np.abs(got - ref) <= bound), (fmt, rows, np.abs(got - ref).max())
        # and close to the float product (int16 activations: ~2^-16 of each chunk's largest value)
        exact = x.astype(np.float64) @ dense.T
        assert np.abs(got - exact).max() <= 2e-4 * np.abs(exact).max()


def test_rows_are_bitwise_independent_of_the_batch_and_thread_split(weight):
    _, w = weight
    x = jnp.asarray(np.random.default_rng(11).standard_normal((40, w.shape[1]), np.float32))
    together = np.asarray(block_q8_matmul(x, w))  # 40 rows: outputs split across the pool's threads
    for rows in (1, 2, 3, 5, 17, 33):
        part = np.asarray(block_q8_matmul(x[rows - 1 : 2 * rows - 1], w))
        np.testing.assert_array_equal(part, together[rows - 1 : 2 * rows - 1])


def test_nibble_pairs_with_a_last_block_alone():
    """Nibble codes whose block count leaves one block in the last group: the VNNI form reads 32 code bytes (two
    blocks) per step, and there only the first 16 (17 blocks; GGUF's Q4_K always has 8 per 256, but the kernel
    takes any K / 32). The last weight row's tail is the buffer's end."""
    from ember.compiler.kernels.cpu_gemv.layout import BlockQ8Weight, _pack_nibbles

    rng = np.random.default_rng(3)
    out, inner = 9, 32 * 17
    codes = rng.integers(0, 16, (out, inner)).astype(np.int8)
    scale = rng.uniform(1e-3, 1e-2, (out, 17)).astype(np.float32)
    offset = rng.uniform(0, 0.05, (out, 17)).astype(np.float32)
    w = BlockQ8Weight(_pack_nibbles(jnp.asarray(codes)), jnp.asarray(scale), jnp.asarray(offset))
    x_all = rng.standard_normal((5, inner)).astype(np.float32)
    for rows in (1, 2, 5):
        got = np.asarray(block_q8_matmul(jnp.asarray(x_all[:rows]), w), np.float64)
        ref, magnitude = numpy_model(x_all[:rows], codes, scale, offset)
        assert np.all(np.abs(got - ref) <= (17 + 8) * 2.0**-24 * magnitude), rows
