"""The RMSNorm kernels in Triton's CPU interpreter: norm/kernel.py's against norm/reference.py, and
norm/quant_kernel.py's (the norms writing a GEMV's int8 activations too) against norm/kernel.py's rows and
act_quant.quantize_activations of them, at both numbers of int8 terms (quant_gemv.act_terms 1 and 2)."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer, activation_buffers, compare_activations

from ember.compiler.kernels.gguf_gemv.act_quant import quantize_activations
from ember.compiler.kernels.norm import quant_kernel
from ember.compiler.kernels.norm import reference as norm
from ember.compiler.kernels.norm.kernel import add_rms_norm_kernel, launch_plan, rms_norm_kernel
from ember.compiler.kernels.norm.quant_kernel import add_rms_norm_quant_kernel, rms_norm_quant_kernel

pytestmark = pytest.mark.interpret

# (rows, n, dtype name, eps): n a power of two and not (a masked tile), one row and several, bf16 and f32,
# the hidden sizes of the benchmark shapes (1536, 4096)
CASES = [
    (1, 1536, "bfloat16", 1e-6),
    (3, 4096, "bfloat16", 1e-5),
    (5, 96, "float32", 1e-6),
    (2, 1536, "float32", 1e-5),
    (7, 40, "bfloat16", 1e-6),
]


def _dtype(name: str):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.float32


def _unequal(got: np.ndarray, want: np.ndarray) -> int:
    return int((got.astype(np.float32) != want.astype(np.float32)).sum())


@pytest.mark.parametrize(
    "seed, rows, n, dtype_name, eps",
    [(seed, *case) for seed, case in enumerate(CASES)],
    ids=[f"rows{rows}-n{n}-{dtype}-eps{eps:g}" for rows, n, dtype, eps in CASES],
)
def test_rms_norm_kernels_match_reference(seed, rows, n, dtype_name, eps):
    rng = np.random.default_rng(seed)
    dtype = _dtype(dtype_name)
    x = (rng.standard_normal((rows, n)) * rng.uniform(0.1, 4.0, (rows, 1))).astype(dtype)
    y = rng.standard_normal((rows, n)).astype(dtype)
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    plan = launch_plan(rows, n)
    want_s, want = (
        np.asarray(a).astype(np.float32)
        for a in norm.add_rms_norm(jnp.asarray(x), jnp.asarray(y), jnp.asarray(w), eps=eps)
    )
    want_alone = np.asarray(norm.rms_norm(jnp.asarray(x), jnp.asarray(w), eps=eps)).astype(np.float32)
    s, out, alone = (HostBuffer(np.zeros((rows, n), dtype)) for _ in range(3))
    add_rms_norm_kernel[plan["grid"]](HostBuffer(x), HostBuffer(y), HostBuffer(w), s, out, EPS=eps, **plan["meta"])
    rms_norm_kernel[plan["grid"]](HostBuffer(x), HostBuffer(w), alone, EPS=eps, **plan["meta"])
    # the sum is rounded as the reference rounds it: equal; the norm within one rounding of the dtype
    assert np.array_equal(s.array.astype(np.float32), want_s), (
        f"add_rms_norm's sum: {_unequal(s.array, want_s)} of {want_s.size} elements differ from the reference's"
    )
    tol = 1e-5 if dtype_name == "float32" else 2**-7
    for name, got, ref in (("add_rms_norm", out, want), ("rms_norm", alone, want_alone)):
        err = float(np.max(np.abs(got.array.astype(np.float32) - ref) / (np.abs(ref) + 1e-3)))
        assert err <= tol, f"{name}: rel_err {err:.1e} > {tol:.1e}"


# the quantizing norms: (rows, n, dtype name) x the GEMV's packing x the residual operand ("": none, "add": a
# tensor [rows, n], "partials": fp32 split-K partials [5, rows + 2, n]) x the number of int8 terms
QUANT_SHAPES = [(1, 1536, "bfloat16"), (3, 4096, "float32"), (2, 96, "bfloat16")]
QUANT_CASES = list(itertools.product(QUANT_SHAPES, ("q4_k", "q6_k"), ("", "add", "partials"), (1, 2)))


# tl.where(amax > 0, 127 / amax, 0) evaluates both sides in the interpreter: numpy warns on the blocks past n / 32
# of the NB tile (n = 1536: 48 of 64 blocks, n = 96: 3 of 4), which read zeros and are masked on store
@pytest.mark.filterwarnings("ignore:divide by zero encountered in divide:RuntimeWarning")
@pytest.mark.parametrize(
    "seed, shape, order, add, terms",
    [(seed, *case) for seed, case in enumerate(QUANT_CASES)],
    ids=[
        f"{order}-{add or 'alone'}-rows{rows}-n{n}-{dtype}-terms{terms}"
        for (rows, n, dtype), order, add, terms in QUANT_CASES
    ],
)
def test_quantizing_norm_kernels_match_norm_then_quantizer(kernel_overrides, seed, shape, order, add, terms):
    """Their normed rows (and sum) bit-equal to norm/kernel.py's kernels', their int8 activations equal to
    act_quant.quantize_activations of those rows (words equal, (dx, sx) close). "partials": the residual operand
    given as fp32 split-K partials [splits, rows_pad, n], which must equal the plain kernel given their sum (in
    split order, fp32, rounded once to the dtype)."""
    kernel_overrides({"quant_gemv.act_terms": terms})  # read by the launch plan, the buffers and the reference
    rows, n, dtype_name = shape
    rng = np.random.default_rng(seed)
    dtype = _dtype(dtype_name)
    x = (rng.standard_normal((rows, n)) * 3).astype(dtype)
    y = rng.standard_normal((rows, n)).astype(dtype)
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    plan = quant_kernel.launch_plan(rows, n, order)
    assert plan["meta"]["TERMS"] == terms
    base = {k: v for k, v in plan["meta"].items() if k in ("N", "BLOCK")}
    s, out, s_plain, out_plain = (HostBuffer(np.zeros((rows, n), dtype)) for _ in range(4))
    qa, da = activation_buffers(rows, n)
    if add:
        operand, extra = HostBuffer(y), {"SPLITS": 0, "ROWS_PAD": 0}
        if add == "partials":  # 5 splits, 2 padding rows past the row count
            parts = (rng.standard_normal((5, rows + 2, n)) * 0.5).astype(np.float32)
            y = parts[0, :rows]
            for k in range(1, 5):
                y = y + parts[k, :rows]
            y = y.astype(dtype)
            operand, extra = HostBuffer(parts), {"SPLITS": 5, "ROWS_PAD": rows + 2}
        add_rms_norm_quant_kernel[plan["grid"]](
            HostBuffer(x), operand, HostBuffer(w), s, out, qa, da, EPS=1e-6, ASM=False, **plan["meta"], **extra
        )
        add_rms_norm_kernel[plan["grid"]](
            HostBuffer(x), HostBuffer(y), HostBuffer(w), s_plain, out_plain, EPS=1e-6, **base
        )
        assert np.array_equal(s.array, s_plain.array), (
            f"the sum: {_unequal(s.array, s_plain.array)} of {s.array.size} elements differ from add_rms_norm_kernel's"
        )
    else:
        rms_norm_quant_kernel[plan["grid"]](
            HostBuffer(x), HostBuffer(w), out, qa, da, EPS=1e-6, ASM=False, **plan["meta"]
        )
        rms_norm_kernel[plan["grid"]](HostBuffer(x), HostBuffer(w), out_plain, EPS=1e-6, **base)
    assert np.array_equal(out.array, out_plain.array), (
        f"the normed rows: {_unequal(out.array, out_plain.array)} of {out.array.size} elements differ from the plain kernel's"
    )
    qa_ref, da_ref = (np.asarray(a) for a in quantize_activations(jnp.asarray(out.array.astype(np.float32)), order))
    mismatch, note = compare_activations(qa.array, da.array, qa_ref, da_ref)
    assert not mismatch, f"the int8 activations against quantize_activations: {note}"
