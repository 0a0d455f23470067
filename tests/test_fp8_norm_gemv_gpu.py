"""The norm-prologue FP8 GEMV (compiler/ops/quant/fp8_norm_gemv.py, through compiler/ops/norm_gemv.py's ops)
on an NVIDIA GPU against the two ops it replaces (the add + RMSNorm kernel, then the FP8 GEMV): the sum
bit-equal, the outputs within two bf16 ulps (the sum of squares is added in another order, so a normed
element may round the other way, rarely). Skipped off the GPU; `tools/h200_run.sh norm-gemv` runs it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.ops import norm_gemv  # noqa: E402
from ember.compiler.ops.quant.fp8 import quantize_fp8  # noqa: E402
from ember.compiler.ops.quant.fp8_norm_gemv import Fp8NormGemvConfig, fp8_norm_gemv  # noqa: E402

pytestmark = pytest.mark.gpu


def _row(d, seed):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((1, d)) * 3, jnp.bfloat16)
    y = jnp.asarray(rng.standard_normal((1, d)), jnp.bfloat16)
    w = jnp.asarray(rng.uniform(0.5, 1.5, d), jnp.bfloat16)
    return x, y, w


def _close(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.all(np.abs(got - want) <= 2.0 ** -7 * np.abs(want) + 1e-6)
    assert np.mean(got == want) > 0.99


def _both(fn, *args):
    """fn(*args) traced with the fused kernel and with EMBER_FUSED_NORM_GEMV=0 (a fresh trace each)."""
    import os
    fused = jax.jit(lambda *a: fn(*a))(*args)
    os.environ["EMBER_FUSED_NORM_GEMV"] = "0"
    try:
        unfused = jax.jit(lambda *a: fn(*a))(*args)
    finally:
        del os.environ["EMBER_FUSED_NORM_GEMV"]
    return fused, unfused


@pytest.mark.parametrize("sizes, d, add", [((4096, 1024, 1024), 4096, True), ((4096, 1024, 1024), 4096, False),
                                           ((64, 16, 24), 420, True)])
def test_the_qkv_form_matches_the_norm_then_the_parts_kernel(sizes, d, add):
    x, y, w = _row(d, sum(sizes))
    qkv = quantize_fp8((np.random.default_rng(d).standard_normal((sum(sizes), d)) * 0.05).astype(np.float32))
    fused, unfused = _both(lambda x, y: norm_gemv.add_rms_norm_linear_split(x, y, w, qkv, sizes=sizes, eps=1e-5),
                           x, y if add else None)
    np.testing.assert_array_equal(np.asarray(fused[0], np.float32), np.asarray(unfused[0], np.float32))
    assert [p.shape for p in fused[1:]] == [(1, n) for n in sizes]
    for a, b in zip(fused[1:], unfused[1:]):
        _close(a, b)


@pytest.mark.parametrize("ffn, d", [(14336, 4096), (36, 300)])
def test_the_gated_mlp_form_matches_the_norm_then_the_gate_up_epilogue(ffn, d):
    x, y, w = _row(d, ffn)
    rng = np.random.default_rng(ffn)
    gate_up = quantize_fp8((rng.standard_normal((2 * ffn, d)) * 0.05).astype(np.float32))
    down = quantize_fp8((rng.standard_normal((d, ffn)) * 0.05).astype(np.float32))
    fused, unfused = _both(lambda x, y: norm_gemv.add_rms_norm_gated_mlp(x, y, w, gate_up, down, act="silu",
                                                                          eps=1e-5), x, y)
    np.testing.assert_array_equal(np.asarray(fused[0], np.float32), np.asarray(unfused[0], np.float32))
    # the down projection of gated rows that may differ by an ulp in a few elements: compare as a projection
    got, want = np.asarray(fused[1], np.float32), np.asarray(unfused[1], np.float32)
    assert np.abs(got - want).max() <= 2.0 ** -6 * np.abs(want).max()


@pytest.mark.parametrize("config", [Fp8NormGemvConfig(), Fp8NormGemvConfig(block_n=2, num_warps=8),
                                    Fp8NormGemvConfig(block_n=8, programs_per_sm=1, num_sms=5)])
def test_every_tile_is_written_whatever_the_walk(config):
    x, y, w = _row(1000, 7)
    proj = quantize_fp8(np.random.default_rng(8).standard_normal((200, 1000)).astype(np.float32))
    s, (got,) = jax.jit(lambda x, y: fp8_norm_gemv(x, y, w, proj, eps=1e-5, form="plain", config=config))(x, y)
    ref_s = (np.asarray(x, np.float32) + np.asarray(y, np.float32)).astype(jnp.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(s, np.float32), ref_s)
    h = ref_s / np.sqrt(np.mean(ref_s ** 2) + 1e-5) * np.asarray(w, np.float32)
    want = h.astype(jnp.bfloat16).astype(np.float64) @ (np.asarray(proj.values, np.float64).T
                                                         * np.asarray(proj.scale, np.float64)[None, :])
    assert np.abs(np.asarray(got, np.float64) - want).max() <= 2.0 ** -7 * np.abs(want).max()
