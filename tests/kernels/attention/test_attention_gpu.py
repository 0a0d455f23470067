"""The split-K Triton decode attention kernel (compiler/kernels/attention) against the reference, on an NVIDIA GPU.

Skipped as a whole where jax-triton or a GPU is missing (CI is CPU-only; the conftest pins JAX_PLATFORMS=cpu
unless the variable is set): JAX_PLATFORMS=cuda python -m pytest -q -m gpu tests/kernels/attention/test_attention_gpu.py
EMBER_ATTENTION_GPU_EXAMPLES=200 widens the property sweep.
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from test_attention_decode import _step_batch  # noqa: E402  (tests/ is on sys.path: conftest)

from ember.compiler.kernels.attention import (  # noqa: E402
    paged_attention as paged_attention_h200,
)
from ember.compiler.kernels.attention import (
    paged_decode_attention,
)
from ember.compiler.kernels.attention.reference import _attend, _gather, _table_slots, paged_attention  # noqa: E402
from ember.compiler.targets.policy import KernelPolicy, with_kernel_policy  # noqa: E402

pytestmark = pytest.mark.gpu

kernel = jax.jit(
    functools.partial(paged_decode_attention, backend="triton"), static_argnames=("scale", "config", "splits")
)


@functools.partial(jax.jit, static_argnames="scale")
def reference(q, k_pool, v_pool, tables, pos, window, *, scale):
    # fp32 math on the same (rounded) inputs, fp32 out: only the kernel's own error is measured. XLA GPU runs
    # fp32 matmuls in TF32 by default (~1e-3 relative); the reference must not
    slots = _table_slots(tables, k_pool.shape[1])
    with jax.default_matmul_precision("highest"):
        return _attend(
            q.astype(jnp.float32)[:, None], _gather(k_pool, slots), _gather(v_pool, slots), pos[:, None], window, scale
        )[:, 0]


TOLERANCE = {jnp.bfloat16: 2e-2, jnp.float32: 1e-4}


def device_case(seed: int, hq: int, hkv: int, dh: int, block_size: int, ctx: list[int], dtype):
    """Random q and pools on the device, scattered blocks (never block 0), ragged contexts."""
    key_q, key_pool, key_perm = jax.random.split(jax.random.key(seed), 3)
    b = len(ctx)
    width = -(-max(ctx) // block_size) + 1
    pools = jax.random.normal(key_pool, (2, 1 + b * width, block_size, hkv, dh), jnp.float32).astype(dtype)
    tables = np.asarray(1 + jax.random.permutation(key_perm, b * width)).reshape(b, width).astype(np.int32)
    q = jax.random.normal(key_q, (b, hq, dh), jnp.float32).astype(dtype)
    return q, pools, tables


def trim(tables: np.ndarray, ctx: list[int], window: int, block_size: int) -> np.ndarray:
    """A sliding kind's tables: block 0 where a block lies wholly before the window."""
    trimmed = tables.copy()
    if window:
        for r, n in enumerate(ctx):
            trimmed[r, : max(0, n - window) // block_size] = 0
    return trimmed


@settings(
    max_examples=int(os.environ.get("EMBER_ATTENTION_GPU_EXAMPLES", 30)),
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),
)
@given(
    st.sampled_from([(12, 2), (32, 8), (4, 1), (24, 4), (8, 1), (16, 16)]),  # GQA groups 6, 4, 4, 6, 8, 1
    st.sampled_from([64, 128, 256]),
    st.sampled_from([16, 32]),
    st.sampled_from([jnp.bfloat16, jnp.float32]),
    st.sampled_from([0, 1, 100, 4096]),
    st.lists(st.integers(1, 32768), min_size=1, max_size=6),
    st.none() | st.integers(1, 16),
    st.integers(0, 2**31 - 1),
)
@example((12, 2), 128, 16, jnp.bfloat16, 0, [32768, 1, 4097, 100], None, 0)  # Qwen2.5-1.5B shape, 32k
@example((32, 8), 128, 16, jnp.bfloat16, 4096, [32768, 5000, 17], 3, 1)  # Llama-3-8B shape, sliding
@example((12, 2), 128, 32, jnp.float32, 0, [30000, 2], 1, 2)  # fp32 pool, single-split kernel
def test_kernel_matches_reference(heads, dh, block_size, dtype, window, ctx, splits, seed):
    hq, hkv = heads
    q, pools, tables = device_case(seed, hq, hkv, dh, block_size, ctx, dtype)
    scale = 1.0 / math.sqrt(dh)
    ctx_lens = jnp.asarray(ctx, jnp.int32)
    pos = ctx_lens - 1
    pools = pools.at[:, 0].set(jnp.nan)  # only the trimmed tables name block 0: the kernel must skip it
    want = np.asarray(reference(q, *pools, jnp.asarray(tables), pos, jnp.int32(window), scale=scale))
    got = kernel(
        q,
        *pools,
        jnp.asarray(trim(tables, ctx, window, block_size)),
        ctx_lens,
        pos,
        jnp.int32(window),
        scale=scale,
        splits=splits,
    )
    assert got.shape == q.shape and got.dtype == q.dtype
    got = np.asarray(got.astype(jnp.float32))
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))


@pytest.mark.parametrize(
    "heads, ctx, splits", [((12, 2), [32768, 1, 4097, 100], None), ((32, 8), [5000, 17], 3), ((8, 1), [300], 1)]
)
def test_kernel_on_fp8_pools_matches_reference(heads, ctx, splits):
    # kv_cache_dtype="fp8": bf16 q over float8 e4m3 pools (single, split and long rows); the reference reads the
    # same pools widened to fp32
    hq, hkv = heads
    q, pools, tables = device_case(11, hq, hkv, 128, 16, ctx, jnp.bfloat16)
    pools = pools.astype(jnp.float8_e4m3fn)
    ctx_lens = jnp.asarray(ctx, jnp.int32)
    want = np.asarray(reference(q, *pools, jnp.asarray(tables), ctx_lens - 1, jnp.int32(0), scale=0.1))
    got = kernel(q, *pools, jnp.asarray(tables), ctx_lens, ctx_lens - 1, jnp.int32(0), scale=0.1, splits=splits)
    assert got.dtype == jnp.bfloat16
    got = np.asarray(got.astype(jnp.float32))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))


def test_block_offsets_past_2_31_elements():
    # a pool of 140000 blocks x 16 x 8 x 128 (2.3e9 elements per pool): rows read its last blocks
    hq, hkv, dh, bs, nb = 32, 8, 128, 16, 140_000
    rng = np.random.default_rng(0)
    small = jnp.asarray(rng.standard_normal((2, 9, bs, hkv, dh)), jnp.bfloat16)  # block 0 + 8 real blocks
    big = [jnp.zeros((nb, bs, hkv, dh), jnp.bfloat16).at[nb - 8 :].set(small[i, 1:]) for i in range(2)]
    tables_small = jnp.asarray([[1, 2, 3, 4], [8, 7, 6, 5]], jnp.int32)
    tables_big = tables_small + (nb - 9)
    ctx = jnp.asarray([64, 50], jnp.int32)
    q = jnp.asarray(rng.standard_normal((2, hq, dh)), jnp.bfloat16)
    want = np.asarray(reference(q, *small, tables_small, ctx - 1, jnp.int32(0), scale=0.1))
    for splits in (1, 4):
        got = kernel(q, *big, tables_big, ctx, ctx - 1, jnp.int32(0), scale=0.1, splits=splits)
        np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize(
    "dtype, pool_dtype",
    [(jnp.bfloat16, None), (jnp.float32, None), (jnp.bfloat16, jnp.float8_e4m3fn)],
    ids=["bf16", "f32", "bf16-fp8kv"],
)
@pytest.mark.parametrize("window", [0, 6])
def test_h200_entry_matches_reference_op(dtype, pool_dtype, window):
    # decode rows beside a prefill chunk in one jitted step; the layer's tables at kind row 1 of 2. An FP8 pool
    # (kv_cache_dtype="fp8"): the decode and prefill kernels widen its tiles to q's dtype
    hq, hkv, dh, block_size, width = 12, 2, 128, 16, 8
    rng = np.random.default_rng(window)
    batch, n, num_blocks = _step_batch(
        rng, [70, 1, 33, 128], (21, 9), block_size, width, kinds=2, state=1, window=window
    )
    q = jnp.asarray(rng.standard_normal((n, hq, dh)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((n, hkv, dh)), dtype) for _ in range(2))
    pools = [jnp.asarray(rng.standard_normal((num_blocks, block_size, hkv, dh)), pool_dtype or dtype) for _ in range(2)]
    args = (q, k, v, jnp.int32(window), jnp.float32(1), *pools, batch)
    got, got_k, got_v = jax.jit(paged_attention_h200, static_argnames="scale")(*args, scale=0.125)
    with jax.default_matmul_precision("highest"):  # XLA GPU's default fp32 matmul is TF32 (~1e-3 relative)
        want, want_k, want_v = jax.jit(paged_attention, static_argnames="scale")(*args, scale=0.125)
    assert got.shape == want.shape == (n, hq * dh) and got.dtype == dtype
    tol = TOLERANCE[dtype]
    want = np.asarray(want.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), want, rtol=tol, atol=tol * np.abs(want).max())
    for got_pool, want_pool in ((got_k, want_k), (got_v, want_v)):  # the reference's KV write, bit for bit
        assert np.array_equal(np.asarray(got_pool), np.asarray(want_pool))


@pytest.mark.parametrize("heads, ctx", [((12, 2), [129]), ((32, 8), [4096, 17]), ((8, 1), [300, 2, 1000])])
@pytest.mark.parametrize("order", ["q4_k", "q6_k"])
def test_combine_writing_int8_activations_matches_the_plain_combine_and_quantizer(heads, ctx, order):
    """activations_for: the combine kernel's rows bit-equal to the plain combine's, its int8 activations
    bit-equal to the Triton quantizer's on those rows (the launch it replaces)."""
    from ember.compiler.kernels.gguf_gemv.dp4a import quantize_activations_gpu

    hq, hkv = heads
    q, pools, tables = device_case(7, hq, hkv, 128, 16, ctx, jnp.bfloat16)
    lens = jnp.asarray(ctx, jnp.int32)
    args = (q, *pools, jnp.asarray(tables), lens, lens - 1, jnp.int32(0))
    plain = kernel(*args, scale=0.1, splits=7)
    fused = jax.jit(
        functools.partial(paged_decode_attention, backend="triton", scale=0.1, splits=7, activations_for=order)
    )
    out, (qa, da) = fused(*args)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(plain, np.float32))
    qa_ref, da_ref = jax.jit(lambda h: quantize_activations_gpu(h, order))(out.reshape(len(ctx), -1))
    np.testing.assert_array_equal(np.asarray(qa), np.asarray(qa_ref))
    np.testing.assert_array_equal(np.asarray(da), np.asarray(da_ref))


@pytest.mark.parametrize(
    "style, window, heads, pool_dtype",
    [
        ("neox", 0, (12, 2), jnp.bfloat16),
        ("interleaved", 6, (32, 8), jnp.bfloat16),
        ("neox", 0, (12, 2), jnp.float8_e4m3fn),
    ],
)
def test_rope_inside_the_decode_partials_matches_rope_write_then_attention(style, window, heads, pool_dtype):
    """The default (a step of decode rows: RoPE and the K/V write inside the split partials kernel) against
    attention.fused_rope_decode off (rope_write then the partials): the pools bit-equal, the output to the last bf16
    bit or so (the own token's score and V row are summed outside the tensor-core dots)."""
    from ember.compiler.kernels.attention import paged
    from ember.compiler.kernels.rope.reference import inv_frequencies

    hq, hkv = heads
    dh, block_size, width = 128, 16, 64
    rng = np.random.default_rng(window)
    batch, n, num_blocks = _step_batch(
        rng, [700, 1, 33, 1024], None, block_size, width, kinds=2, state=1, window=window
    )
    q = jnp.asarray(rng.standard_normal((n, hq, dh)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((n, hkv, dh)), jnp.bfloat16) for _ in range(2))
    pools = [jnp.asarray(rng.standard_normal((num_blocks, block_size, hkv, dh)), pool_dtype) for _ in range(2)]
    inv_freq = jnp.asarray(inv_frequencies(theta=1e6, head_dim=dh))

    def run(flag):  # the switch is read at trace time: one trace each
        attend = functools.partial(paged.rope_paged_attention, style=style, scale=0.125)
        step = jax.jit(with_kernel_policy(KernelPolicy().overridden({"attention.fused_rope_decode": flag}), attend))
        return [
            np.asarray(a.astype(jnp.float32))
            for a in step(q, k, v, batch.positions, inv_freq, jnp.int32(window), jnp.int32(1), *pools, batch)
        ]

    (got, got_k, got_v), (want, want_k, want_v) = run(True), run(False)
    np.testing.assert_array_equal(got_k, want_k)
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    assert np.mean(got == want) > 0.9, np.mean(got == want)
