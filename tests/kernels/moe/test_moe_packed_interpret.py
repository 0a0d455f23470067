"""moe/packed_kernels.py in Triton's CPU interpreter: the decode GEMVs over expert stacks kept packed in GGUF
formats against reference.experts on the same weights dequantized by the `gguf` package, given the same routing
(experts chosen twice across rows, experts left empty; gate, up and down in different formats)."""

from __future__ import annotations

import gguf
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.gguf_gemv.layout import FORMATS, random_gguf_bytes
from ember.compiler.kernels.moe import reference
from ember.compiler.kernels.moe.packed import dequantize_experts, pack_experts
from ember.compiler.kernels.moe.packed_kernels import (
    launch_plans,
    moe_packed_down_kernel,
    moe_packed_gate_up_kernel,
    plane_args,
)

pytestmark = pytest.mark.interpret


def random_stack(rng, fmt: str, shape: tuple[int, int, int]):
    """(GGUF bytes of an [E, out, in] stack with trained-like scales, the `gguf` package's float32 values)."""
    experts, out, inner = shape
    raw = random_gguf_bytes(rng, fmt, (experts * out, inner), realistic=True)
    block, block_bytes, ggml_type = FORMATS[fmt]
    values = gguf.quants.dequantize(raw.reshape(experts * out, inner // block * block_bytes), ggml_type)
    return raw, np.asarray(values, np.float32).reshape(shape)


def run_packed(x, weights, chosen, gate, up, down):
    n, d = x.shape
    top_k = chosen.shape[1]
    _, f, _ = gate.shape
    # wider tiles than the GPU's: fewer programs for the interpreter (the masks and offsets are the same code)
    plans = launch_plans(n, d, f, top_k, (gate.format, up.format, down.format), bf=128, bd=128)
    buffers = {id(w): tuple(HostBuffer(p) for p in plane_args(w.planes, w.format)) for w in (gate, up, down)}
    pairs = HostBuffer(chosen.reshape(-1).astype(np.int32))
    h = HostBuffer(np.zeros((n * top_k, f), np.float32))
    moe_packed_gate_up_kernel[plans["gate_up"]["grid"]](
        HostBuffer(x), pairs, *buffers[id(gate)], *buffers[id(up)], h, **plans["gate_up"]["meta"]
    )
    out = HostBuffer(np.zeros((n, d), x.dtype))
    moe_packed_down_kernel[plans["down"]["grid"]](
        h, pairs, HostBuffer(weights.reshape(-1)), *buffers[id(down)], out, **plans["down"]["meta"]
    )
    return out.array


@pytest.mark.parametrize(
    "formats, d, f, dtype",
    [
        (("q4_k", "q4_k", "q6_k"), 256, 256, "bfloat16"),  # Q4_K_M's usual expert mix
        (("q6_k", "q4_k", "q4_k"), 512, 256, "float32"),  # two super-blocks per row of gate / up
        (("q8_0", "q5_0", "q8_0"), 256, 96, "float32"),  # down rows of 3 blocks: a partial step of 8
    ],
)
def test_packed_expert_kernels_match_the_reference_on_gguf_values(formats, d, f, dtype):
    rng = np.random.default_rng(d + f)
    experts, rows, top_k = 4, 2, 2
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    x = (rng.standard_normal((rows, d)) * 0.02).astype(np_dtype)
    shapes = ((experts, f, d), (experts, f, d), (experts, d, f))
    stacks = [random_stack(rng, fmt, shape) for fmt, shape in zip(formats, shapes)]
    gate, up, down = (pack_experts(raw, fmt, shape) for (raw, _), fmt, shape in zip(stacks, formats, shapes))
    for packed, (_, values) in zip((gate, up, down), stacks):  # the layout's dequantizer is gguf's, bit for bit
        np.testing.assert_array_equal(np.asarray(dequantize_experts(packed)), values)
    chosen = np.array([[2, 0], [0, 3]], np.int32)  # expert 1 left empty, 0 chosen by both rows
    weights = rng.uniform(0.1, 1.0, (rows, top_k)).astype(np.float32)
    got = run_packed(x, weights, chosen, gate, up, down).astype(np.float32)
    g, u, dn = (jnp.asarray(values) for _, values in stacks)
    want = reference.experts(
        jnp.asarray(x), jnp.asarray(weights), jnp.asarray(chosen), jnp.concatenate([g, u], axis=1), dn
    )
    want = np.asarray(want, np.float32)
    tol = 1e-4 if dtype == "float32" else 2**-7
    scale = np.max(np.abs(want))
    assert scale > 0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale * 1e-2)
