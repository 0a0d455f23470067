"""The RMSNorm kernels (compiler/kernels/norm/kernel.py) against norm.py's references, on an NVIDIA GPU: the residual
sum bit-equal, the norm within one rounding of the activation dtype. Skipped off the GPU (see
tests/kernels/gguf_gemv/test_quant_matmul_gpu.py); `tools/dev/h200_run.sh tests` runs it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.norm import reference as norm  # noqa: E402
from ember.compiler.kernels.norm.kernel import add_rms_norm_triton, rms_norm_triton  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows, n", [(1, 1536), (1, 4096), (37, 4096), (256, 1536), (5, 40)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernels_match_the_references(rows, n, dtype):
    keys = jax.random.split(jax.random.key(rows * n), 3)
    x = (jax.random.normal(keys[0], (rows, n)) * 3).astype(dtype)
    y = jax.random.normal(keys[1], (rows, n)).astype(dtype)
    w = jax.random.uniform(keys[2], (n,), minval=0.5, maxval=1.5).astype(dtype)
    tol = 1e-5 if dtype == jnp.float32 else 2**-7
    s, out = jax.jit(lambda x, y, w: add_rms_norm_triton(x, y, w, eps=1e-5))(x, y, w)
    want_s, want = norm.add_rms_norm(x, y, w, eps=1e-5)
    np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(want_s, np.float32))
    for got, ref in (
        (out, want),
        (jax.jit(lambda x, w: rms_norm_triton(x, w, eps=1e-5))(x, w), norm.rms_norm(x, w, eps=1e-5)),
    ):
        got, ref = np.asarray(got, np.float32), np.asarray(ref, np.float32)
        assert np.max(np.abs(got - ref) / (np.abs(ref) + 1e-3)) <= tol


@pytest.mark.parametrize("rows, n", [(1, 1536), (2, 4096), (1, 96)])
@pytest.mark.parametrize("order", ["q4_k", "q6_k"])
@pytest.mark.parametrize("add", [False, True], ids=["rms_norm", "add_rms_norm"])
def test_norms_writing_int8_activations_match_the_plain_kernels(rows, n, order, add):
    """norm/quant_kernel.py: the normed rows (and the sum) bit-equal to the plain kernels', the int8 activations
    bit-equal to the Triton quantizer's on those rows (the launch the fusion replaces), and within one code of
    act_quant.quantize_activations run by XLA (whose 127 / max|x| may round differently on the GPU: 0.25% of
    words differed by one code at e8eb845), its half-block sums off by no more than its codes are."""
    from ember.compiler.kernels.gguf_gemv.act_quant import quantize_activations
    from ember.compiler.kernels.gguf_gemv.dp4a import quantize_activations_gpu
    from ember.compiler.kernels.norm.quant_kernel import norm_quantize_triton

    keys = jax.random.split(jax.random.key(rows * n + add), 3)
    x = (jax.random.normal(keys[0], (rows, n)) * 3).astype(jnp.bfloat16)
    y = jax.random.normal(keys[1], (rows, n)).astype(jnp.bfloat16) if add else None
    w = jax.random.uniform(keys[2], (n,), minval=0.5, maxval=1.5).astype(jnp.bfloat16)
    got = jax.jit(lambda x, y, w: norm_quantize_triton(x, y, w, eps=1e-6, order=order))(x, y, w)
    plain = (
        jax.jit(lambda x, y, w: add_rms_norm_triton(x, y, w, eps=1e-6))(x, y, w)
        if add
        else (jax.jit(lambda x, w: rms_norm_triton(x, w, eps=1e-6))(x, w),)
    )
    for a, b in zip(got[: len(plain)], plain):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    qa, da = got[-2:]
    qa_kernel, da_kernel = jax.jit(lambda h: quantize_activations_gpu(h, order))(plain[-1])
    np.testing.assert_array_equal(np.asarray(qa), np.asarray(qa_kernel))
    np.testing.assert_array_equal(np.asarray(da), np.asarray(da_kernel))
    qa_ref, da_ref = quantize_activations(plain[-1], order)
    # the first int8 term (gguf_gemv/act_quant.py: a second one, quant_gemv.act_terms 2, rounds the first one's residual, which
    # XLA may fuse into an FMA here; the Triton quantizer it equals above is checked against the reference in
    # the interpreter, tests/kernels/gguf_gemv/test_dp4a_interpret.py)
    qa, qa_ref = np.asarray(qa)[:, : n // 4], np.asarray(qa_ref)[:, : n // 4]
    codes = lambda words: np.asarray(words).view(np.int8).astype(np.int32)  # noqa: E731
    off = np.abs(codes(qa) - codes(qa_ref))  # [rows, n] in packed order: a block's 32 codes stay in its 8 words
    assert off.max() <= 1
    da, da_ref = np.asarray(da)[..., :4], np.asarray(da_ref)[..., :4]  # [rows, n / 32, (dx, sx, s0, s1)]
    np.testing.assert_allclose(da[..., :2], da_ref[..., :2], rtol=1e-2, atol=1e-6)
    # each code one off moves its half-block's sum by at most one
    sums_off = np.abs(da[..., 2:] - da_ref[..., 2:]).sum(-1)
    assert np.all(sums_off <= off.reshape(rows, n // 32, 32).sum(-1))


@pytest.mark.parametrize("rows, rows_pad, splits", [(1, 1, 8), (3, 4, 4)])
@pytest.mark.parametrize("order", ["q4_k", "q6_k"])
def test_norm_summing_split_k_partials_equals_the_norm_of_their_sum(rows, rows_pad, splits, order):
    """split_k.SplitKPartials as the residual operand (carry_split_k_partials): every output bit-equal to the
    same kernel given the partials' sum in split order (fp32, rounded once to bf16)."""
    from ember.compiler.kernels.norm.quant_kernel import norm_quantize_triton
    from ember.compiler.kernels.split_k import SplitKPartials

    keys = jax.random.split(jax.random.key(rows * splits), 3)
    x = (jax.random.normal(keys[0], (rows, 1536)) * 3).astype(jnp.bfloat16)
    parts = jax.random.normal(keys[1], (splits, rows_pad, 1536), jnp.float32)
    w = jax.random.uniform(keys[2], (1536,), minval=0.5, maxval=1.5).astype(jnp.bfloat16)
    summed = parts[0, :rows]
    for k in range(1, splits):
        summed = summed + parts[k, :rows]
    got = jax.jit(lambda x, p, w: norm_quantize_triton(x, SplitKPartials(p, rows, x.dtype), w, eps=1e-6, order=order))(
        x, parts, w
    )
    want = jax.jit(lambda x, y, w: norm_quantize_triton(x, y, w, eps=1e-6, order=order))(
        x, summed.astype(jnp.bfloat16), w
    )
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
