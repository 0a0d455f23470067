"""compiler/kernels/norm/kernel.py on CPU: the functions a target would name are the references when not tracing
for a GPU; the launch plan's tile covers a row. The kernels themselves run in Triton's interpreter
(tests/kernels/norm/test_norm_interpret.py) and lower for sm_90 (tests/kernels/triton/test_triton_launch.py)."""

import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.kernels.norm import kernel as norm_gpu
from ember.compiler.kernels.norm import reference as norm


def test_off_the_gpu_they_are_the_references():
    rng = np.random.default_rng(0)
    x, y = (jnp.asarray(rng.standard_normal((2, 3, 64)), jnp.bfloat16) for _ in range(2))
    w = jnp.asarray(rng.uniform(0.5, 1.5, 64), jnp.bfloat16)
    np.testing.assert_array_equal(norm_gpu.rms_norm(x, w, eps=1e-6), norm.rms_norm(x, w, eps=1e-6))
    for got, want in zip(norm_gpu.add_rms_norm(x, y, w, eps=1e-6), norm.add_rms_norm(x, y, w, eps=1e-6)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n, block", [(40, 64), (1536, 2048), (4096, 4096), (5120, 8192), (65536, 65536)])
def test_launch_plan_tiles_a_row(n, block, kernel_overrides):
    from ember.compiler.targets.policy import KernelPolicy

    plan = norm_gpu.launch_plan(7, n)
    # the quantizing norms' warps: the same reduction tree, so the plain kernels' normed rows are bit-equal
    assert plan["grid"] == (7,) and plan["meta"] == {"N": n, "BLOCK": block}
    assert plan["num_warps"] == KernelPolicy().norms.quant_warps
    kernel_overrides({"norms.warps": 4})
    assert norm_gpu.launch_plan(7, n)["num_warps"] == 4


def test_launch_plan_rejects_rows_it_cannot_hold():
    with pytest.raises(ValueError, match="rows of"):
        norm_gpu.launch_plan(1, 65537)
