"""The Gated DeltaNet kernels (gated_delta/recurrent_kernel.py, chunked_kernel.py, norm_kernel.py) against op.py's references on an
NVIDIA GPU at the hybrid checkpoints' shapes (16 key / 32 value heads of 128, conv width 4): a mixed step (decode
rows on their slots, one of them padding, then prefill segments of chunk-unaligned lengths), then a decode
step continuing every request from the pools the first left. Skipped off the GPU; `tools/dev/h200_run.sh tests`
runs it (the interpreter runs the same properties at small sizes: *_interpret.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from gated_delta_support import step_batch  # noqa: E402

from ember.compiler.kernels.gated_delta import gpu, op  # noqa: E402

pytestmark = pytest.mark.gpu

HK, HV, DK, DV, W = 16, 32, 128, 128, 4
C = 2 * HK * DK + HV * DV
SLOTS = 12


def _inputs(rng, n, dtype):
    qkv = jnp.asarray(rng.standard_normal((n, C)), dtype)
    b, a = (jnp.asarray(rng.standard_normal((n, HV)), dtype) for _ in range(2))
    return qkv, b, a


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("lengths", [(37, 100), (1, 64, 200)])
def test_kernels_match_the_reference_across_steps(dtype, lengths, form, kernel_overrides):
    """form: the prefill segments through the chunked kernel (the default at these lengths) or the recurrent one."""
    if form == "recurrent":
        kernel_overrides({"gated_delta.chunked_min_tokens": 10**9})
    rng = np.random.default_rng(len(lengths))
    decode_rows, seg_len = 3, max(lengths) + 5
    layout = (decode_rows, len(lengths), seg_len)
    conv = jnp.asarray(rng.standard_normal((C, 1, W)) * 0.5, dtype)
    a_neg = jnp.asarray(-rng.uniform(0.5, 2, HV), jnp.float32)
    dt_bias = jnp.asarray(rng.uniform(-3, -1, HV), jnp.float32)
    pools = (
        jnp.asarray(rng.standard_normal((SLOTS, W - 1, C)), dtype),
        jnp.asarray(rng.standard_normal((SLOTS, HV, DK, DV)) * 0.1, jnp.float32),
    )
    slots = [5, -1, 7]  # decode rows continuing at position 9
    positions = [9, 0, 9]
    for s, real in enumerate(lengths):  # segments starting fresh on slots 0, 1, ...
        slots += [s] * real + [-1] * (seg_len - real)
        positions += list(range(real)) + [0] * (seg_len - real)
    steps = [(np.asarray(slots), np.asarray(positions), layout)]
    # then one decode row per request, continuing
    cont = np.asarray([5, 7] + list(range(len(lengths))))
    steps.append((cont, np.asarray([10, 10] + list(lengths)), (len(cont), 0, 0)))
    ref_pools, ker_pools = pools, pools
    dims = dict(hk=HK, hv=HV, dk=DK, dv=DV, kernel=W)
    # a fresh function: the policy (read while tracing) differs between the forms
    kernel = jax.jit(
        lambda *args, **kw: gpu.gated_delta_triton(*args, **kw), static_argnames=("layout", "hk", "hv", "dk", "dv")
    )
    for slots, positions, layout in steps:
        qkv, b, a = _inputs(rng, len(slots), dtype)
        want, *ref_pools = op.gated_delta(
            qkv, b, a, 0, conv, a_neg, dt_bias, *ref_pools, step_batch(positions, slots, layout), **dims
        )
        got, *ker_pools = kernel(
            qkv, b, a, conv, a_neg, dt_bias, *ker_pools, jnp.asarray(slots), jnp.asarray(positions),
            layout=layout, hk=HK, hv=HV, dk=DK, dv=DV,
        )  # fmt: skip
        real = slots >= 0
        tol = 2e-4 if dtype == jnp.float32 else 2e-2
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        np.testing.assert_allclose(got[real], want[real], atol=tol, rtol=tol)
        assert np.all(got[~real] == 0)
        np.testing.assert_array_equal(np.asarray(ker_pools[0]), np.asarray(ref_pools[0]))  # the windows: copies
        np.testing.assert_allclose(np.asarray(ker_pools[1]), np.asarray(ref_pools[1]), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("rows", [1, 37, 256])
def test_gated_norm_kernel_matches_the_reference(rows):
    keys = jax.random.split(jax.random.key(rows), 3)
    x = (jax.random.normal(keys[0], (rows, HV * DV)) * 3).astype(jnp.bfloat16)
    z = jax.random.normal(keys[1], (rows, HV * DV)).astype(jnp.bfloat16)
    w = jax.random.uniform(keys[2], (DV,), minval=0.5, maxval=1.5).astype(jnp.bfloat16)
    got = jax.jit(lambda x, z, w: gpu.gated_rms_norm_triton(x, z, w, eps=1e-6, heads=HV))(x, z, w)
    want = op.gated_rms_norm_heads(x, z, w, eps=1e-6, heads=HV)
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    # both round one float32 result to bf16, from sums and sigmoids computed in other orders: up to two bf16
    # steps apart (measured on an H100: 0.0085, just over one step, 2**-7)
    assert np.max(np.abs(got - want) / (np.abs(want) + 1e-2)) <= 2**-6
