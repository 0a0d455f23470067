"""The dense decode GEMV (compiler/kernels/dense_gemv/dispatch.py) on an NVIDIA GPU: the kernel on bf16 weights against the
float64 product and XLA's GEMM, its q/k/v parts and its silu(gate) * up epilogue, at the 8B shapes and at
masked ones. Skipped off the GPU; `tools/dev/h200_run.sh tests` runs it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.activation import gated_act_packed  # noqa: E402
from ember.compiler.kernels.dense_gemv.dispatch import dense_gemv, dense_gemv_gate_up, dense_gemv_parts  # noqa: E402

pytestmark = pytest.mark.gpu

CONFIGS = [
    {},
    {"block_n": 8, "block_k": 1024},
    {"block_n": 2, "block_k": 1024, "num_warps": 8},
    {"block_k": 256, "prefetch": 0},
    {"use_dot": 1, "block_n": 64, "block_k": 256, "num_stages": 3},
    {"use_dot": 1, "block_n": 32, "block_k": 128, "num_stages": 4, "split_k": 3},
]


def _operands(rng, out: int, inner: int):
    w = jnp.asarray(rng.standard_normal((out, inner)) * rng.uniform(0.01, 0.1, (out, 1)), jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((1, inner)), jnp.bfloat16)
    return x, w


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("out, inner", [(4096, 4096), (4096, 14336), (200, 420), (136, 1000)])
def test_the_gemv_matches_the_reference_and_xla(config, out, inner, kernel_overrides):
    kernel_overrides({"dense_gemv.config": config})
    rng = np.random.default_rng(out + inner)
    x, w = _operands(rng, out, inner)
    got = np.asarray(jax.jit(lambda x, w: dense_gemv(x, w))(x, w), np.float32)
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    # fp32 accumulation, then the bf16 output's rounding (2**-9 relative) at the largest outputs
    assert np.max(np.abs(got - exact)) <= 2.0**-7 * np.abs(exact).max()
    xla = np.asarray(
        jax.jit(lambda x, w: jnp.dot(x, w.T, preferred_element_type=jnp.float32).astype(x.dtype))(x, w), np.float32
    )
    assert np.mean(got == xla) > 0.9  # the same sums in another order: most outputs round alike


@pytest.mark.parametrize("sizes, inner", [((4096, 1024, 1024), 4096), ((64, 16, 24), 200)])
def test_the_parts_equal_the_packed_product(sizes, inner):
    x, w = _operands(np.random.default_rng(sum(sizes)), sum(sizes), inner)
    parts = jax.jit(lambda x, w: dense_gemv_parts(x, w, sizes))(x, w)
    assert [p.shape for p in parts] == [(1, size) for size in sizes]
    whole = np.asarray(jax.jit(lambda x, w: dense_gemv(x, w))(x, w), np.float32)
    np.testing.assert_array_equal(np.concatenate([np.asarray(p, np.float32) for p in parts], axis=1), whole)


@pytest.mark.parametrize("ffn, inner", [(14336, 4096), (36, 1000)])
def test_the_gate_up_epilogue_matches_the_gemv_then_the_activation(ffn, inner):
    x, w = _operands(np.random.default_rng(ffn), 2 * ffn, inner)
    got = np.asarray(jax.jit(lambda x, w: dense_gemv_gate_up(x, w))(x, w), np.float32)
    xla = np.asarray(jax.jit(lambda x, w: gated_act_packed(dense_gemv(x, w), act="silu"))(x, w), np.float32)
    # the epilogue rounds silu(gate) and the product once each (HF); XLA's fusion otherwise: within two ulps
    assert np.all(np.abs(got - xla) <= 2.0**-6 * np.abs(xla) + 1e-6)


def test_8b_decode_steps_with_the_dense_gemv_agree_with_xla_s():
    # the 8B shape (where DENSE_RULES takes the head, q/k/v, o and gate/up): 48 teacher-forced decode steps
    # traced with the GEMV and again with XLA's GEMMs (the policy's dense_gemv.enabled, read at trace time, so the jit caches go
    # between the two runs) on the same weights; only summation order and the epilogue's rounding differ
    from logit_agreement import agreement

    from ember.compiler.spec import spec_for_arch
    from ember.runtime.execution.sequence_runner import SequenceRunner
    from ember.runtime.loading import model as model_module
    from ember.runtime.loading.synthetic import synthetic_model
    from ember.tools.bench_models import SYNTHETIC_SHAPES

    arch, config = SYNTHETIC_SHAPES["llama3-8b"]
    model = synthetic_model(spec_for_arch(arch), config, target="h200")  # drawn on the device
    tokens = np.random.default_rng(11).integers(0, config["vocab_size"], 64).tolist()

    def decode_logits(dense: bool) -> np.ndarray:
        policy = model.policy.overridden({"dense_gemv.enabled": dense})
        model_module._JIT_CACHE.clear()
        jax.clear_caches()
        runner = SequenceRunner(dataclasses.replace(model, policy=policy), len(tokens) + 1)
        runner.prefill(tokens[:16])
        return np.stack([runner.decode(t) for t in tokens[16:]]).astype(np.float32)

    with_gemv, with_xla = decode_logits(True), decode_logits(False)
    result = agreement(with_xla, with_gemv)
    print("dense GEMV vs XLA, 48 decode steps of the 8B shape:", result)  # the figures, with pytest -s
    assert not np.array_equal(with_gemv, with_xla)  # the two runs did trace different kernels
    assert result["mean_kl"] <= 1e-3, result
    assert result["decisive_positions"] >= 16 and result["top1_agreement_where_decisive"] >= 0.99, result
