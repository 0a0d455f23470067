"""The FP8 decode GEMV (compiler/kernels/dense_gemv/kernel.py) on an NVIDIA GPU against the float64 reference: every
inner loop (CUDA cores with and without the prefetch, the 4-byte word loop with its PTX conversion, tl.dot),
both scale layouts, split-K, masked rows and columns. Skipped off the GPU; `tools/dev/h200_run.sh tests` runs it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.dense_gemv.fp8 import fp8_reference_matmul, quantize_fp8  # noqa: E402
from ember.compiler.kernels.dense_gemv.kernel import Fp8GemvConfig, fp8_gemv  # noqa: E402

pytestmark = pytest.mark.gpu

CONFIGS = [
    None,  # the picked one
    Fp8GemvConfig(block_n=8, block_k=1024, step_reduce=True),
    Fp8GemvConfig(block_n=16, block_k=512, split_k=2, prefetch=False),
    Fp8GemvConfig(block_n=8, block_k=1024, words=True),
    Fp8GemvConfig(block_n=16, block_k=256, split_k=3, words=True),
    Fp8GemvConfig(block_n=8, block_k=64, words=True, prefetch=False),
    Fp8GemvConfig(block_n=4, block_k=128, words=True),
    Fp8GemvConfig(block_n=8, block_k=256, split_k=2, words=True),
    Fp8GemvConfig(block_n=32, block_k=256, split_k=2, use_dot=True, num_stages=3),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("out, inner", [(6144, 4096), (200, 420), (136, 1000)])
@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("m", [1, 2])
def test_the_gemv_matches_the_reference(config, out, inner, blocked, m):
    rng = np.random.default_rng(out + inner + m)
    w = rng.standard_normal((out, inner)) * rng.uniform(0.01, 3.0, (out, 1))
    weight = quantize_fp8(w.astype(np.float32), blocked=blocked)
    x = jnp.asarray(rng.standard_normal((m, inner)), jnp.bfloat16)
    got = np.asarray(jax.jit(lambda x: fp8_gemv(x, weight, config))(x), np.float32)
    exact = fp8_reference_matmul(np.asarray(x, np.float32), weight)
    # fp32 accumulation, then the bf16 output's rounding (2**-9 relative) at the largest outputs
    assert np.max(np.abs(got - exact)) <= 2.0**-7 * np.abs(exact).max()


def test_the_word_loop_takes_only_bf16_activations():
    rng = np.random.default_rng(3)
    weight = quantize_fp8(rng.standard_normal((256, 512)).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((1, 512)), jnp.float32)
    got = np.asarray(
        jax.jit(lambda x: fp8_gemv(x, weight, Fp8GemvConfig(block_n=8, block_k=256, words=True)))(x), np.float64
    )
    exact = fp8_reference_matmul(np.asarray(x), weight)
    assert np.max(np.abs(got - exact)) <= 1e-5 * np.abs(exact).max()  # f32: the CUDA-core loop, exact to fp32


@pytest.mark.parametrize("ffn, inner, m", [(14336, 4096, 1), (36, 1000, 2)])
@pytest.mark.parametrize(
    "config",
    [Fp8GemvConfig(block_n=8, block_k=1024, words=True), Fp8GemvConfig(block_n=4, block_k=256, step_reduce=True)],
)
def test_the_gate_up_epilogue_matches_the_gemv_then_the_activation(ffn, inner, m, config):
    from ember.compiler.kernels.activation import gated_act_packed
    from ember.compiler.kernels.dense_gemv.kernel import fp8_gemv_gate_up

    rng = np.random.default_rng(ffn + m)
    w = quantize_fp8((rng.standard_normal((2 * ffn, inner)) * 0.05).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((m, inner)), jnp.bfloat16)
    got = np.asarray(jax.jit(lambda x: fp8_gemv_gate_up(x, w, config))(x), np.float32)
    packed = np.asarray(jax.jit(lambda x: fp8_gemv(x, w, config))(x), np.float64)  # the same sums, rounded
    gate, up = packed[:, :ffn], packed[:, ffn:]
    # HF's rounding: silu(gate) rounded once, the product rounded once (Triton's sigmoid is fp32's, not exact:
    # an output may round the other way, rarely)
    silu = (gate / (1.0 + np.exp(-gate))).astype(ml_dtypes.bfloat16).astype(np.float64)
    hf = (silu * up).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.all(np.abs(got - hf) <= 2.0**-7 * np.abs(hf) + 1e-6) and np.mean(got == hf) > 0.99
    # XLA's fusion of the jnp activation (the path without the epilogue) rounds otherwise: within two ulps
    xla = np.asarray(jax.jit(lambda x: gated_act_packed(fp8_gemv(x, w, config), act="silu"))(x), np.float32)
    assert np.all(np.abs(got - xla) <= 2.0**-6 * np.abs(xla) + 1e-6)


@pytest.mark.parametrize("sizes, inner", [((4096, 1024, 1024), 4096), ((64, 16, 24), 200)])
def test_the_parts_kernel_writes_each_projection(sizes, inner):
    from ember.compiler.kernels.dense_gemv.kernel import fp8_gemv_parts

    rng = np.random.default_rng(sum(sizes))
    w = quantize_fp8(rng.standard_normal((sum(sizes), inner)).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((1, inner)), jnp.bfloat16)
    config = Fp8GemvConfig(block_n=8, block_k=1024, words=True)
    parts = jax.jit(lambda x: fp8_gemv_parts(x, w, sizes, config))(x)
    assert [p.shape for p in parts] == [(1, size) for size in sizes]
    whole = np.asarray(jax.jit(lambda x: fp8_gemv(x, w, config))(x), np.float32)
    np.testing.assert_array_equal(np.concatenate([np.asarray(p, np.float32) for p in parts], axis=1), whole)
