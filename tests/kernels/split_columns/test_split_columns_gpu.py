"""The q/k/v split kernel (compiler/kernels/split_columns/kernel.py) on an NVIDIA GPU: every output bit-equal to
XLA's slices. Skipped off the GPU (see tests/kernels/gguf_gemv/test_quant_matmul_gpu.py); `tools/dev/h200_run.sh tests` runs it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.split_columns.kernel import split_three  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows, sizes", [(1, (4096, 1024, 1024)), (32, (1536, 256, 256)), (3, (7, 1030, 5))])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_split_matches_the_slices(rows, sizes, dtype):
    y = jax.random.normal(jax.random.key(rows), (rows, sum(sizes))).astype(dtype)
    got = jax.jit(lambda y: split_three(y, sizes))(y)
    for part, want in zip(got, np.split(np.asarray(y), np.cumsum(sizes)[:-1], axis=1)):
        np.testing.assert_array_equal(np.asarray(part), want)
