"""The int8 activation quantizer (compiler/kernels/gguf_gemv/act_quant_kernel.py, ASM=False) run by Triton's CPU
interpreter against act_quant.quantize_activations, for Q4_K and Q6_K packing and 1 and 2 terms (policy
quant_gemv.act_terms): packed words equal, (dx, sx, s0, s1) close; and its SILU_GATED variant. The jnp
quantizer itself: test_act_quant.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from interpreter import HostBuffer, activation_buffers, compare_activations

from ember.compiler.kernels.gguf_gemv.act_quant import FACTORS, quantize_activations

pytestmark = pytest.mark.interpret

ORDERS = ("q4_k", "q6_k")
# x [m, k] and its scale: k = 544 leaves a masked program
SHAPES = [(1, 1536, 1.0), (3, 8960, 30.0), (2, 544, 1e-3)]
GATED_SHAPES = [(1, 1536), (2, 8960)]


@pytest.fixture(params=[1, 2], ids=lambda terms: f"terms{terms}")
def terms(request, kernel_overrides) -> int:
    """How many int8 terms the quantizer writes (quant_gemv.act_terms) for the rest of the test."""
    kernel_overrides({"quant_gemv.act_terms": request.param})
    return request.param


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("m, k, scale", SHAPES, ids=[f"m{m}-k{k}" for m, k, _ in SHAPES])
def test_quantizer_matches_the_reference(m, k, scale, order, terms):
    from ember.compiler.kernels.gguf_gemv.act_quant_kernel import quantize_plan, quantize_rows_kernel

    x = (np.random.default_rng(k).standard_normal((m, k)) * scale).astype(np.float32)
    x[0, 64:96] = 0.0  # an all-zero block (dx = 0)
    x[-1, :32] = np.arange(32) - 15.5  # with max |x| = 127 (inv = 1) these are ties: rounded to even
    x[-1, 0] = 127.0
    qa_ref, da_ref = (np.asarray(a) for a in quantize_activations(jnp.asarray(x), order))
    plan = quantize_plan(m, k, order)
    qa, da = activation_buffers(m, k)  # qa int32 [m, T k/4], da float32 [m, k/32, 4 T]
    assert da.array.shape[-1] == FACTORS * terms
    quantize_rows_kernel[plan["grid"]](HostBuffer(x), qa, da, ASM=False, **plan["meta"])
    bad, note = compare_activations(qa.array, da.array, qa_ref, da_ref, tol=1e-6)
    assert not bad, f"quantize {order} m={m} k={k} terms={terms}: {note}"


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("m, k", GATED_SHAPES, ids=[f"m{m}-k{k}" for m, k in GATED_SHAPES])
def test_silu_gated_quantizer_matches_the_reference(m, k, order, terms):
    """SILU_GATED: the quantizer reads a gate/up output [m, 2k] and quantizes silu(gate) * up; against jnp's
    activation then quantize_activations (sigmoid's last-bit differences may move a rare code by one)."""
    from ember.compiler.kernels.activation import gated_act_packed
    from ember.compiler.kernels.gguf_gemv.act_quant_kernel import quantize_plan, quantize_rows_kernel

    gate_up = (np.random.default_rng(k).standard_normal((m, 2 * k)) * 3.0).astype(np.float32)
    activated = gated_act_packed(jnp.asarray(gate_up), act="silu")
    qa_ref, da_ref = (np.asarray(a) for a in quantize_activations(activated, order))
    plan = quantize_plan(m, k, order, silu_gated=True)
    qa, da = activation_buffers(m, k)
    assert da.array.shape[-1] == FACTORS * terms
    quantize_rows_kernel[plan["grid"]](HostBuffer(gate_up), qa, da, ASM=False, **plan["meta"])
    bad, note = compare_activations(qa.array, da.array, qa_ref, da_ref, code_slack=1, min_same=0.99)
    assert not bad, f"quantize silu-gated {order} m={m} k={k} terms={terms}: {note}"
