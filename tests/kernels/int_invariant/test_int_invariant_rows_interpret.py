"""The integer-sum invariant matmul's kernels in Triton's CPU interpreter, row counts 1..20: a row gets the reference's
bits (so the same bits) in the GEMV and in the GEMM at every count, each count with its own launch (the GEMV's rows
per program: 1, 2, 4, 8, then 2-3 groups of 8). One split and one column tile: the interpreter is slow, and splits
and tails are test_int_invariant_interpret.py's."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from test_int_invariant_interpret import CONFIG, ROWS, quantize, run_gemm, run_gemv, weight

from ember.compiler.kernels.int_invariant.reference import matmul_quantized, quantize_rows

pytestmark = pytest.mark.interpret


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_a_row_gets_the_same_bits_at_every_row_count(fmt):
    x = np.random.default_rng(5).standard_normal((ROWS, 256)).astype(np.float32)
    w = weight(fmt, 32, 256)
    qa, dx, sx = quantize(x)
    want = np.asarray(matmul_quantized(quantize_rows(jnp.asarray(x)), w, CONFIG))
    for rows in range(1, ROWS + 1):
        args = (w, qa[:rows], dx[:rows], sx[:rows])
        np.testing.assert_array_equal(run_gemv(fmt, *args), want[:rows], err_msg=f"gemv at {rows} rows")
        np.testing.assert_array_equal(run_gemm(fmt, *args), want[:rows], err_msg=f"gemm at {rows} rows")
