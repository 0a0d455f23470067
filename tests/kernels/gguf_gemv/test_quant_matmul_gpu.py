"""The Triton quantized GEMV kernels against the jnp reference, on an NVIDIA GPU.

Skipped as a whole where jax-triton or a GPU is missing (CI is CPU-only; the conftest pins
JAX_PLATFORMS=cpu unless the variable is set, so run with JAX_PLATFORMS=cuda on the GPU machine).
"""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.gguf_gemv import FORMATS, pack, pick_config, quant_matmul, random_gguf_bytes  # noqa: E402
from ember.compiler.kernels.gguf_gemv.act_quant import dp4a_matmul_ref  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [
    # Qwen2.5-1.5B: q/o, k/v, gate/up, down, LM head
    (1536, 1536),
    (256, 1536),
    (8960, 1536),
    (1536, 8960),
    (151936, 1536),
    # Llama-3-8B: q/o, gate/up, down
    (4096, 4096),
    (14336, 4096),
    (4096, 14336),
]
TOLERANCE = {jnp.bfloat16: 1e-2, jnp.float32: 1e-4}


@functools.lru_cache(maxsize=2)
def device_weight(fmt: str, shape: tuple[int, int]):
    raw = random_gguf_bytes(np.random.default_rng(zlib.crc32(f"{fmt}{shape}".encode())), fmt, shape, realistic=True)
    return jax.device_put(pack(raw, fmt, shape))


@functools.lru_cache(maxsize=1)
def reference_matmul():
    from ember.compiler.kernels.gguf_gemv import quant_matmul_ref

    return jax.jit(quant_matmul_ref)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_kernel_matches_reference(fmt: str, shape: tuple[int, int], m: int, dtype) -> None:
    w = device_weight(fmt, shape)
    x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(dtype)
    got = jax.jit(functools.partial(quant_matmul, backend="triton"))(x, w)
    assert got.shape == (m, shape[0]) and got.dtype == dtype
    # the reference in fp32 from the same (rounded) activations, so only the kernel's error is measured; the
    # dp4a variant's reference quantizes the activations to int8 as the kernel's caller does
    if pick_config(fmt, m, *shape).variant == "dp4a":
        expected = np.asarray(jax.jit(dp4a_matmul_ref)(x.astype(jnp.float32), w))
    else:
        expected = np.asarray(reference_matmul()(x.astype(jnp.float32), w))
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(
        np.asarray(got.astype(jnp.float32)), expected, rtol=tol, atol=tol * float(np.abs(expected).max())
    )


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shape", [(256, 1536), (1536, 8960), (151936, 1536)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 4])
def test_split_kernel_for_decode_still_matches(fmt: str, shape: tuple[int, int], m: int, kernel_overrides) -> None:
    """m <= 4 runs the rows kernels while quant_gemv.rows_for_decode (Q4_K: dp4a); the split kernels stay selectable."""

    kernel_overrides({"quant_gemv.rows_for_decode": False})
    kernel_overrides({"quant_gemv.dp4a_formats": []})
    test_kernel_matches_reference(fmt, shape, m, jnp.bfloat16)


ROWS_CONFIGS = [
    dict(block_n=4, split_k=8, sb_per_step=4, num_warps=1),
    dict(block_n=8, split_k=3, sb_per_step=1),
    dict(block_n=64, split_k=1, sb_per_step=2, num_warps=8, prefetch=False),
]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("kwargs", ROWS_CONFIGS, ids=lambda k: "-".join(f"{v}" for v in k.values()))
@pytest.mark.parametrize("m", [1, 3])
def test_rows_configs_match_reference(fmt: str, kwargs: dict, m: int) -> None:
    from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig, quant_matmul_ref

    shape = (1000, 2560)  # a masked last row tile for every block_n above; 10 super-blocks
    w = device_weight(fmt, shape)
    x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(jnp.bfloat16)
    config = QuantMatmulConfig(variant="rows", num_stages=1, **kwargs)
    got = jax.jit(functools.partial(quant_matmul, backend="triton", config=config))(x, w)
    expected = np.asarray(jax.jit(quant_matmul_ref)(x.astype(jnp.float32), w))
    np.testing.assert_allclose(
        np.asarray(got.astype(jnp.float32)), expected, rtol=1e-2, atol=1e-2 * float(np.abs(expected).max())
    )


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
@pytest.mark.parametrize("kwargs", ROWS_CONFIGS, ids=lambda k: "-".join(f"{v}" for v in k.values()))
@pytest.mark.parametrize("m", [1, 3, 8, 11, 16])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_dp4a_configs_match_their_reference(fmt: str, kwargs: dict, m: int, dtype) -> None:
    """The integer-dot kernel (inline PTX dp4a, quantizer included) against act_quant.dp4a_matmul_ref: the
    same int8 activations, exact integer sums, so only fp32 rounding differs (and bf16's on the output)."""
    from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig

    shape = (1000, 2560)
    w = device_weight(fmt, shape)
    x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(dtype)
    config = QuantMatmulConfig(variant="dp4a", num_stages=1, **kwargs)
    got = jax.jit(functools.partial(quant_matmul, backend="triton", config=config))(x, w)
    assert got.shape == (m, shape[0]) and got.dtype == dtype
    expected = np.asarray(jax.jit(dp4a_matmul_ref)(x.astype(jnp.float32), w))
    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(
        np.asarray(got.astype(jnp.float32)), expected, rtol=tol, atol=tol * float(np.abs(expected).max())
    )


@pytest.mark.parametrize(
    "fmt, sizes",
    [("q4_k", (1536, 256, 256)), ("q4_k", (1536, 256)), ("q6_k", (256,))],
    ids=["q4_k-qkv", "q4_k-qk", "q6_k-v"],
)
def test_dp4a_parts_launch_equals_the_gemv_then_bias_and_slices(fmt: str, sizes) -> None:
    """The parts kernel (q / k / v written apart, bias added in its epilogue) against the plain dp4a GEMV's
    output plus the bias, sliced: the same sums, the same two roundings, so bit for bit (the 1.5B model's
    batch-1 q/k/v shapes, whose tuned configs take one split)."""
    from ember.compiler.kernels.gguf_gemv import config as quant_config
    from ember.compiler.kernels.gguf_gemv.matmul import quant_matmul_parts

    if not quant_config.dp4a_for(fmt):
        pytest.skip(f"{fmt} decode does not take the dp4a kernel here (quant_gemv.dp4a_formats)")
    out = sum(sizes)
    w = device_weight(fmt, (out, 1536))
    m = 1
    x = jax.random.normal(jax.random.key(m), (m, 1536), jnp.float32).astype(jnp.bfloat16)
    bias = (jax.random.normal(jax.random.key(7), (out + 64,), jnp.float32) * 0.1).astype(jnp.bfloat16)
    assert pick_config(fmt, m, out, 1536).split_k == 1  # the parts launch applies
    got = jax.jit(lambda x, w, b: quant_matmul_parts(x, w, b, sizes, bias_offset=64, backend="triton"))(x, w, bias)
    whole = jax.jit(lambda x, w, b: quant_matmul(x, w, backend="triton") + b[64:])(x, w, bias)
    want = np.split(np.asarray(whole.astype(jnp.float32)), np.cumsum(sizes)[:-1], axis=1)
    assert [g.shape for g in got] == [(m, n) for n in sizes]
    for got_part, want_part in zip(got, want):
        np.testing.assert_array_equal(np.asarray(got_part.astype(jnp.float32)), want_part)


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
@pytest.mark.parametrize("m", [1, 2, 5])
def test_dp4a_silu_gated_matches_the_activation_then_the_reference(fmt: str, m: int) -> None:
    """The down projection fed a gate/up output: silu(gate) * up made inside the quantizer (SILU_GATED) against
    activation.py's jnp activation, then act_quant.dp4a_matmul_ref (1.5B down shape)."""
    from ember.compiler.kernels.activation import gated_act_packed
    from ember.compiler.kernels.gguf_gemv import config as quant_config
    from ember.compiler.kernels.gguf_gemv.matmul import quant_matmul_silu_gated

    if not quant_config.dp4a_for(fmt):
        pytest.skip(f"{fmt} decode does not take the dp4a kernel here (quant_gemv.dp4a_formats)")
    w = device_weight(fmt, (1536, 8960))
    gate_up = (jax.random.normal(jax.random.key(m), (m, 2 * 8960), jnp.float32) * 2).astype(jnp.bfloat16)
    got = jax.jit(lambda g, w: quant_matmul_silu_gated(g, w, backend="triton"))(gate_up, w)
    assert got.shape == (m, 1536) and got.dtype == jnp.bfloat16
    hidden = jax.jit(lambda g: gated_act_packed(g, act="silu"))(gate_up)
    expected = np.asarray(jax.jit(dp4a_matmul_ref)(hidden.astype(jnp.float32), w))
    np.testing.assert_allclose(
        np.asarray(got.astype(jnp.float32)), expected, rtol=1e-2, atol=1e-2 * float(np.abs(expected).max())
    )


@pytest.mark.parametrize("m, parts", [(1, True), (1, False), (3, False)])
def test_dp4a_q6_k_reads_q4_k_packed_activations_bit_for_bit(m: int, parts: bool) -> None:
    """A Q6_K GEMV given Q4_K-packed int8 activations (ACT_Q4: a norm that wrote them for a Q4_K q+k beside a
    Q6_K v) permutes their bytes into its packing: the same integer sums, so the output equals the one from
    Q6_K-packed activations bit for bit (the plain kernel, split-K included, and the parts kernel)."""
    from ember.compiler.kernels.gguf_gemv import config as quant_config
    from ember.compiler.kernels.gguf_gemv.dp4a import quantize_activations_gpu
    from ember.compiler.kernels.gguf_gemv.matmul import quant_matmul_parts

    if not quant_config.dp4a_for("q6_k"):
        pytest.skip("q6_k decode does not take the dp4a kernel here (quant_gemv.dp4a_formats)")
    shape = (256, 1536) if parts else (1536, 8960)
    w = device_weight("q6_k", shape)
    x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(jnp.bfloat16)

    def run(x, w, order):
        qa, da = quantize_activations_gpu(x, order)
        if parts:
            return quant_matmul_parts(x, w, None, (shape[0],), backend="triton", activations=(qa, da, order))[0]
        return quant_matmul(x, w, backend="triton", activations=(qa, da, order))

    got = jax.jit(lambda x, w: run(x, w, "q4_k"))(x, w)
    want = jax.jit(lambda x, w: run(x, w, "q6_k"))(x, w)
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)))


def test_dp4a_pair_launch_equals_a_launch_per_part() -> None:
    """A Q4_K q+k beside a Q6_K v (1.5B Q4_K_M shapes) at batch 1 in one pair launch against a parts launch
    per part on the same Q4_K-packed activations: q and k bit for bit (same kernel body and warps), v within
    a bf16 rounding (the launch's warp count may order its sums differently). At 3 rows the v part's tile
    splits K, so no pair launch applies (None: a launch per part)."""
    from ember.compiler.kernels.gguf_gemv import config as quant_config
    from ember.compiler.kernels.gguf_gemv.dp4a import quantize_activations_gpu
    from ember.compiler.kernels.gguf_gemv.matmul import quant_matmul_pair_parts, quant_matmul_parts

    if not quant_config.dp4a_for("q6_k"):
        pytest.skip("q6_k decode does not take the dp4a kernel here (quant_gemv.dp4a_formats)")
    wa, wb = device_weight("q4_k", (1792, 1536)), device_weight("q6_k", (256, 1536))
    x3 = jnp.zeros((3, 1536), jnp.bfloat16)
    assert quant_matmul_pair_parts(x3, (wa, wb), None, ((1536, 256), (256,)), backend="triton") is None
    m = 1
    x = jax.random.normal(jax.random.key(m), (m, 1536), jnp.float32).astype(jnp.bfloat16)
    bias = (jax.random.normal(jax.random.key(9), (2048,), jnp.float32) * 0.1).astype(jnp.bfloat16)
    got = jax.jit(
        lambda x, wa, wb, b: quant_matmul_pair_parts(x, (wa, wb), b, ((1536, 256), (256,)), backend="triton")
    )(x, wa, wb, bias)
    assert got is not None and [g.shape for g in got] == [(m, 1536), (m, 256), (m, 256)]

    def apart(x, wa, wb, b):
        qa, da = quantize_activations_gpu(x, "q4_k")
        return (
            *quant_matmul_parts(x, wa, b, (1536, 256), backend="triton", activations=(qa, da, "q4_k")),
            *quant_matmul_parts(x, wb, b, (256,), bias_offset=1792, backend="triton", activations=(qa, da, "q4_k")),
        )

    want = jax.jit(apart)(x, wa, wb, bias)
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g.astype(jnp.float32)), np.asarray(w.astype(jnp.float32))
        if i < 2:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=2**-7, atol=2**-7 * float(np.abs(w).max()))
