"""The integer-sum invariant matmul (compiler/kernels/int_invariant/) on an NVIDIA GPU, at the 1.5B Q4_K_M's shapes:
the GEMV and the GEMM give a row the same bits at every row count from 1 to 1,024 (fp32 and bf16 outputs), also
when the output feeds another op inside one jit; the kernels give the jnp reference's bits computed on the CPU.
Skipped off the GPU (tools/dev/h200_run.sh gpu-suite runs the gpu tests). Not yet run on a GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes  # noqa: E402
from ember.compiler.kernels.int_invariant.config import pick_config  # noqa: E402
from ember.compiler.kernels.int_invariant.matmul import int_invariant_matmul, quantize_gpu  # noqa: E402
from ember.compiler.kernels.int_invariant.reference import int_invariant_reference, pack_words, quantize_rows  # noqa: E402

pytestmark = pytest.mark.gpu

# the 1.5B Q4_K_M's q/k/v (Q4_K), down (Q6_K) and head (Q6_K) projections
SHAPES = [("q4_k", 2048, 1536), ("q6_k", 1536, 8960), ("q6_k", 151936, 1536)]
ROWS = (1, 2, 3, 5, 8, 16, 17, 64, 257, 1024)  # each count a compile of its own: the list is short
BF16_ROWS = (1, 17, 257)


def weight(fmt: str, n: int, k: int):
    return jax.device_put(
        pack(random_gguf_bytes(np.random.default_rng(n + k), fmt, (n, k), realistic=True), fmt, (n, k))
    )


def activations(rows: int, k: int) -> jax.Array:
    return jax.random.normal(jax.random.key(k), (rows, k), jnp.float32).astype(jnp.bfloat16)


matmul = jax.jit(int_invariant_matmul, static_argnames=("out_dtype", "form"))


@pytest.mark.parametrize("fmt, n, k", SHAPES)
def test_gemv_and_gemm_give_a_row_the_same_bits_at_every_row_count(fmt, n, k):
    """Every row of every count against the GEMM over 1,024 rows: fp32 outputs (the sums themselves) at ROWS, bf16
    outputs (the GEMM's in-kernel rounding against XLA's of the GEMV's sum) at BF16_ROWS."""
    w = weight(fmt, n, k)
    x = activations(max(ROWS), k)
    for out_dtype, counts in ((jnp.float32, ROWS), (jnp.bfloat16, BF16_ROWS)):
        whole = np.asarray(matmul(x, w, out_dtype, form="gemm").astype(jnp.float32))
        assert np.isfinite(whole).all()
        for rows in counts:
            for form in ("gemv", "gemm"):
                got = np.asarray(matmul(x[:rows], w, out_dtype, form=form).astype(jnp.float32))
                np.testing.assert_array_equal(got, whole[:rows], err_msg=f"{form} at {rows} rows, {out_dtype}")


@pytest.mark.parametrize("fmt, n, k", SHAPES[:2])
def test_the_bits_hold_inside_a_consumers_jit(fmt, n, k):
    """The bf16 output feeding an fp32 add in one jit (XLA may fuse the GEMV's partial sum and cast into the
    consumer): the same bits from the GEMV and the GEMM."""
    w = weight(fmt, n, k)
    x = activations(64, k)
    residual = jax.random.normal(jax.random.key(1), (64, n), jnp.float32)

    @jax.jit
    def step(x, w, residual):
        gemv = int_invariant_matmul(x[:8], w, form="gemv").astype(jnp.float32) + residual[:8]
        gemm = int_invariant_matmul(x, w, form="gemm").astype(jnp.float32) + residual
        return gemv, gemm

    gemv, gemm = step(x, w, residual)
    np.testing.assert_array_equal(np.asarray(gemv), np.asarray(gemm)[:8])


@pytest.mark.parametrize("fmt, n, k", SHAPES[:2])
def test_kernels_give_the_cpu_references_bits(fmt, n, k):
    """The GPU quantizer, GEMV and GEMM against reference.py traced on the CPU (XLA:GPU's own division is not IEEE:
    -nvptx-prec-divf32=1, so the jnp form is only the kernels' twin on the CPU)."""
    w = weight(fmt, n, k)
    x = activations(17, k)
    cpu = jax.devices("cpu")[0]
    x_cpu, w_cpu = jax.device_put(x, cpu), jax.device_put(w, cpu)
    with jax.default_device(cpu):
        q, dx, sx = jax.jit(quantize_rows)(x_cpu)
        want = np.asarray(
            jax.jit(int_invariant_reference, static_argnums=(2, 3))(x_cpu, w_cpu, pick_config(n, k), jnp.float32)
        )
        qa_want = np.asarray(jax.jit(pack_words)(q))
    qa, dx_gpu, sx_gpu = (np.asarray(a) for a in jax.jit(quantize_gpu)(x))
    np.testing.assert_array_equal(qa, qa_want)
    np.testing.assert_array_equal(dx_gpu, np.asarray(dx))
    np.testing.assert_array_equal(sx_gpu, np.asarray(sx))
    for form in ("gemv", "gemm"):
        np.testing.assert_array_equal(np.asarray(matmul(x, w, jnp.float32, form=form)), want, err_msg=form)
