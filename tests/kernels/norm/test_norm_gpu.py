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


def test_the_deterministic_variants_are_the_fixed_order_references_off_the_gpu():
    rng = np.random.default_rng(1)
    x, y = (jnp.asarray(rng.standard_normal((5, 96)), jnp.bfloat16) for _ in range(2))
    w = jnp.asarray(rng.uniform(0.5, 1.5, 96), jnp.bfloat16)
    np.testing.assert_array_equal(norm_gpu.rms_norm_invariant(x, w, eps=1e-6), norm.rms_norm_invariant(x, w, eps=1e-6))
    for other in (y, None):
        got = norm_gpu.add_rms_norm_invariant(x, other, w, eps=1e-6)
        for g, want in zip(got, norm.add_rms_norm_invariant(x, other, w, eps=1e-6)):
            np.testing.assert_array_equal(g, want)


def test_on_a_gpu_the_deterministic_variants_launch_the_row_kernels(monkeypatch):
    # one program per row whose launch config follows the row's length alone: what makes them batch-invariant
    launched = []
    monkeypatch.setattr(norm_gpu, "use_kernel", lambda x: True)
    monkeypatch.setattr(norm_gpu, "rms_norm_triton", lambda x, w, eps: launched.append("norm") or x)
    monkeypatch.setattr(norm_gpu, "add_rms_norm_triton", lambda x, y, w, eps: launched.append("add") or (x, y))
    x = jnp.ones((3, 64), jnp.bfloat16)
    norm_gpu.rms_norm_invariant(x, x[0], eps=1e-6)
    norm_gpu.add_rms_norm_invariant(x, x, x[0], eps=1e-6)
    norm_gpu.add_rms_norm_invariant(x, None, x[0], eps=1e-6)
    assert launched == ["norm", "add", "norm"]
    one, many = norm_gpu.launch_plan(1, 1536), norm_gpu.launch_plan(4096, 1536)
    assert (one["num_warps"], one["meta"]) == (many["num_warps"], many["meta"])


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
