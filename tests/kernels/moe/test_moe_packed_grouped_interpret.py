"""moe/packed_grouped_kernels.py (the grouped GEMM over expert stacks kept packed in GGUF formats) in Triton's CPU
interpreter against reference.experts on the same stacks dequantized by the `gguf` package, given the same
routing: every format, gate / up / down in different formats, a group longer than one tile and experts never
chosen, fp32 activations (ieee dots: tight) and bf16 (bounded in units of the row's RMS)."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer
from row_error import assert_rows_close
from test_moe_grouped_interpret import run_grouped_launches
from test_moe_packed_interpret import random_stack

from ember.compiler.kernels.moe import reference
from ember.compiler.kernels.moe.packed import pack_experts
from ember.compiler.kernels.moe.packed_grouped_kernels import (
    launch_plan,
    moe_packed_grouped_down_kernel,
    moe_packed_grouped_gate_up_kernel,
    stack_args,
)

pytestmark = pytest.mark.interpret


def run_packed_grouped(x, weights, chosen, gate, up, down):
    """gpu.experts_packed_grouped_triton's launches and combine, on host buffers."""
    experts, f, _ = gate.shape
    args = [stack_args(w) for w in (gate, up, down)]
    formats = (gate.format, up.format, down.format)
    plan = launch_plan(*x.shape, f, experts, chosen.shape[1], formats, x.dtype.name, tuple(s for _, s in args))
    g, u, dn = ([HostBuffer(np.asarray(p)) for p in planes] for planes, _ in args)
    gate_up = (moe_packed_grouped_gate_up_kernel, (*g, *u))
    return run_grouped_launches(x, weights, chosen, plan, experts, f, gate_up, (moe_packed_grouped_down_kernel, dn))


@pytest.mark.parametrize(
    "formats, d, f, rows, dtype",
    [
        (("q4_k", "q4_k", "q6_k"), 256, 256, 20, "float32"),  # Q4_K_M's usual expert mix
        (("q6_k", "q4_k", "q4_k"), 256, 256, 20, "bfloat16"),
        # the block formats; f 96: a half-masked column tile of gate / up, down's K tiles of one block
        (("q8_0", "q5_0", "q8_0"), 64, 96, 20, "float32"),
        (("q5_0", "q8_0", "q4_k"), 64, 256, 20, "bfloat16"),  # a K-quant down beside block gate / up
    ],
)
def test_packed_grouped_kernels_match_the_reference_on_gguf_values(formats, d, f, rows, dtype):
    """Skewed routing: every row takes expert 0 (a group of `rows` pairs, longer than one tile of 16), its second
    choice cycles over 1..4, experts 5.. are never chosen."""
    rng = np.random.default_rng(d + f + rows)
    experts, top_k = 8, 2
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    x = (rng.standard_normal((rows, d)) * 0.02).astype(np_dtype)
    shapes = ((experts, f, d), (experts, f, d), (experts, d, f))
    stacks = [random_stack(rng, fmt, shape) for fmt, shape in zip(formats, shapes)]
    gate, up, down = (pack_experts(raw, fmt, shape) for (raw, _), fmt, shape in zip(stacks, formats, shapes))
    chosen = np.stack([[0, 1 + (i % 4)] for i in range(rows)]).astype(np.int32)
    weights = rng.uniform(0.1, 1.0, (rows, top_k)).astype(np.float32)
    got = run_packed_grouped(x, weights, chosen, gate, up, down)
    g, u, dn = (jnp.asarray(values) for _, values in stacks)
    if dtype == "bfloat16":  # the float path's stacks: dequantized to the activation dtype
        g, u, dn = (w.astype(jnp.bfloat16) for w in (g, u, dn))
    want = reference.experts(
        jnp.asarray(x), jnp.asarray(weights), jnp.asarray(chosen), jnp.concatenate([g, u], axis=1), dn
    )
    want = np.asarray(want.astype(jnp.float32))
    assert np.all(np.isfinite(got))
    if dtype == "float32":
        scale = np.max(np.abs(want))
        assert scale > 0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
    else:
        assert_rows_close(got, want)
