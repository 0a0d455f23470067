"""The MoE op over expert stacks kept packed in GGUF formats (moe/packed.py, packed_kernels.py through
moe/gpu.py) on an NVIDIA GPU at the MoE checkpoints' shapes (d 2048; 128 experts top-8 of ffn 768, 256 experts
top-8 of ffn 512), Q4_K_M's expert mix (Q4_K gate / up, Q6_K down) and the block formats: against the reference
on the same stacks dequantized (bit-equal to the `gguf` package), a row's output the same bits whatever other
rows the step holds, and steps of many rows (the packed grouped GEMM, packed_grouped_kernels.py). Skipped off the
GPU; `tools/dev/h200_run.sh tests` runs it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from row_error import assert_rows_close  # noqa: E402

from ember.compiler.kernels.gguf_gemv.layout import random_gguf_bytes  # noqa: E402
from ember.compiler.kernels.moe import gpu, op, reference  # noqa: E402
from ember.compiler.kernels.moe.packed import dequantize_experts, pack_experts  # noqa: E402

pytestmark = pytest.mark.gpu
D, TOP_K = 2048, 8


def _stacks(experts, f, formats, seed):
    """Packed gate, up [E, f, D] and down [E, D, f] on the device, and the router [E, D] bf16."""
    rng = np.random.default_rng(seed)
    shapes = ((experts, f, D), (experts, f, D), (experts, D, f))
    stacks = [
        jax.device_put(pack_experts(random_gguf_bytes(rng, fmt, (e * o, i), realistic=True), fmt, (e, o, i)))
        for fmt, (e, o, i) in zip(formats, shapes)
    ]
    router = jnp.asarray(rng.standard_normal((experts, D)) / np.sqrt(D), jnp.bfloat16)
    return router, stacks


@pytest.mark.parametrize(
    "experts, f, formats",
    [
        (128, 768, ("q4_k", "q4_k", "q6_k")),
        (256, 512, ("q4_k", "q4_k", "q4_k")),
        (128, 768, ("q6_k", "q8_0", "q5_0")),
    ],
)
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_packed_decode_matches_the_reference_on_dequantized_stacks(experts, f, formats, rows):
    router, stacks = _stacks(experts, f, formats, experts + rows)
    dense = [dequantize_experts(s) for s in stacks]
    x = (jax.random.normal(jax.random.key(rows), (rows, D)) * 0.05).astype(jnp.bfloat16)
    weights, chosen = reference.route(x, router, top_k=TOP_K, normalize=True)
    got = jax.jit(gpu.experts_packed_triton)(x, weights, chosen, *stacks)
    gate_up = jnp.concatenate(dense[:2], axis=1)
    want = reference.experts(x, weights, chosen, gate_up, dense[2])
    assert_rows_close(got, want)
    run = jax.jit(lambda *a: gpu.moe(*a, top_k=TOP_K, normalize=True))  # router kernel + packed GEMVs
    full = np.asarray(run(x, router, *stacks), np.float32)
    assert_rows_close(full, op.moe(x, router, *dense, top_k=TOP_K, normalize=True))
    alone = np.asarray(run(x[:1], router, *stacks), np.float32)  # batch invariance of the fixed-order combine
    np.testing.assert_array_equal(alone[0], full[0])


@pytest.mark.parametrize(
    "experts, f, formats",
    [(128, 768, ("q4_k", "q4_k", "q6_k")), (256, 512, ("q4_k", "q4_k", "q4_k")), (128, 768, ("q8_0", "q5_0", "q4_k"))],
)
@pytest.mark.parametrize("rows", [17, 300])
def test_many_rows_take_the_packed_grouped_gemm_and_match_the_reference(experts, f, formats, rows):
    router, stacks = _stacks(experts, f, formats, experts + rows)
    x = (jax.random.normal(jax.random.key(rows), (rows, D)) * 0.05).astype(jnp.bfloat16)
    dense = [dequantize_experts(s).astype(jnp.bfloat16) for s in stacks]  # the float path's stacks
    weights, chosen = reference.route(x, router, top_k=TOP_K, normalize=True)
    got = jax.jit(gpu.experts_packed_grouped_triton)(x, weights, chosen, *stacks)
    want = reference.experts(x, weights, chosen, jnp.concatenate(dense[:2], axis=1), dense[2])
    assert_rows_close(got, want)
    got = jax.jit(lambda *a: gpu.moe(*a, top_k=TOP_K, normalize=True))(x, router, *stacks)
    assert_rows_close(got, op.moe(x, router, *dense, top_k=TOP_K, normalize=True))
