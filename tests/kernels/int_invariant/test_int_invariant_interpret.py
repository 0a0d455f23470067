"""The integer-sum invariant matmul's kernels (compiler/kernels/int_invariant/) in Triton's CPU interpreter: the
quantizer, the GEMV and the GEMM each give the jnp reference's bits, so the GEMV equals the GEMM bit for bit
(test_int_invariant_rows_interpret.py: at every row count from 1 to 20). The interpreter computes with numpy, one rounding per operation (ASM=False): what it proves is that both
kernels spell out the reference's operations in its order; that a GPU compiles them without changing an operation
is test_int_invariant_sass.py's and the GPU test's."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.gguf_gemm.gemm import plane_args
from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
from ember.compiler.kernels.int_invariant.config import (
    GemmLaunch,
    IntInvariantConfig,
    gemm_plan,
    gemv_plan,
    pick_gemv_launch,
)
from ember.compiler.kernels.int_invariant.gemm_kernel import int_gemm_kernel
from ember.compiler.kernels.int_invariant.gemv_kernel import int_gemv_kernel
from ember.compiler.kernels.int_invariant.quantize_kernel import quantize_kernel, quantize_plan
from ember.compiler.kernels.int_invariant.reference import matmul_quantized, pack_words, quantize_rows

pytestmark = pytest.mark.interpret

CONFIG = IntInvariantConfig(k_split=256)  # two splits of K = 512
SMALL_GEMM = GemmLaunch(block_m=16, block_n=32)  # small tiles: the interpreter is slow
ROWS = 20


def quantize(x):
    """The quantizer kernel's outputs for x [m, k]: (qa int32 [m, k/4], dx, sx float32 [m, k/32])."""
    m, k = x.shape
    plan = quantize_plan(m, k, asm=False)
    outs = [np.zeros((m, k // 4), np.int32), np.zeros((m, k // 32), np.float32), np.zeros((m, k // 32), np.float32)]
    buffers = [HostBuffer(a) for a in outs]
    with np.errstate(divide="ignore"):  # 127 / 0 in an all-zero block, which tl.where then drops
        quantize_kernel[plan["grid"]](HostBuffer(x), *buffers, **plan["meta"])
    return tuple(b.array for b in buffers)


def run_gemv(fmt, w, qa, dx, sx):
    rows, n, k = qa.shape[0], w.shape[0], w.shape[1]
    plan = gemv_plan(fmt, CONFIG, rows, n, k, pick_gemv_launch(rows), asm=False)
    out = HostBuffer(np.full(plan["out_shape"], np.nan, np.float32))
    planes = [HostBuffer(np.asarray(p)) for p in plane_args(w)]
    int_gemv_kernel[plan["grid"]](HostBuffer(qa), HostBuffer(dx), HostBuffer(sx), *planes, out, **plan["meta"])
    total = out.array[0]
    for split in range(1, out.array.shape[0]):  # fixed_order_partials_sum's order
        total = total + out.array[split]
    return total


def run_gemm(fmt, w, qa, dx, sx, launch=SMALL_GEMM):
    rows, n, k = qa.shape[0], w.shape[0], w.shape[1]
    plan = gemm_plan(fmt, CONFIG, rows, n, k, launch, asm=False)
    out = HostBuffer(np.full(plan["out_shape"], np.nan, np.float32))
    planes = [HostBuffer(np.asarray(p)) for p in plane_args(w)]
    xq = HostBuffer(np.ascontiguousarray(qa).view(np.int8))
    int_gemm_kernel[plan["grid"]](xq, HostBuffer(dx), HostBuffer(sx), *planes, out, **plan["meta"])
    return out.array


@pytest.fixture(scope="module")
def activations():
    """x [20, 512] fp32 with one all-zero block (dx = 0, q = 0)."""
    x = np.random.default_rng(4).standard_normal((ROWS, 512)).astype(np.float32)
    x[3, 64:96] = 0.0
    return x


def test_quantizer_gives_the_references_bits(activations):
    import ml_dtypes

    for x in (activations, activations.astype(ml_dtypes.bfloat16)):
        q, dx, sx = quantize_rows(jnp.asarray(x))
        qa, dx_k, sx_k = quantize(x)
        np.testing.assert_array_equal(qa, np.asarray(pack_words(q)))
        np.testing.assert_array_equal(dx_k, np.asarray(dx))
        np.testing.assert_array_equal(sx_k, np.asarray(sx))


def weight(fmt, n, k):
    """A random Q4_K / Q6_K weight [n, k] with realistic scales."""
    return pack(random_gguf_bytes(np.random.default_rng(n + k), fmt, (n, k), realistic=True), fmt, (n, k))


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_gemv_and_gemm_give_the_references_bits(fmt, activations):
    """20 rows, two splits of K, two column tiles of 32 (the second past N = 40), two GEMM tilings."""
    w = weight(fmt, 40, 512)
    qa, dx, sx = quantize(activations)
    want = np.asarray(matmul_quantized(quantize_rows(jnp.asarray(activations)), w, CONFIG))
    np.testing.assert_array_equal(run_gemv(fmt, w, qa, dx, sx), want)
    np.testing.assert_array_equal(run_gemm(fmt, w, qa, dx, sx), want)
    np.testing.assert_array_equal(run_gemm(fmt, w, qa, dx, sx, GemmLaunch(block_m=32, block_n=16)), want)
