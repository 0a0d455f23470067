"""compiler/ops/l2_prefetch.py: the norms' L2 prefetch of the next projection's weight — what it prefetches
(plan), that the kernel then issues the bulk prefetch (lowered IR), and that it changes no value (Triton's
interpreter cannot run the PTX, so the values are checked with it off there and on the H200 with it on)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.ops.l2_prefetch import BYTES_ENV, ROWS_ENV, prefetch_plan
from ember.compiler.ops.quant.fp8 import Fp8Weight
from triton_calls import triton_calls

BF16 = jnp.bfloat16
PREFETCH = "cp.async.bulk.prefetch.L2.global"


def test_plan_is_off_by_default_and_for_larger_batches(monkeypatch):
    w = jnp.zeros((4096, 4096), BF16)
    monkeypatch.delenv(BYTES_ENV, raising=False)
    assert prefetch_plan(w, 1, 512) == (None, 0)
    monkeypatch.setenv(BYTES_ENV, str(8 << 20))
    array, size = prefetch_plan(w, 1, 512)
    assert array is w and size == 8 << 20
    assert prefetch_plan(w, 2, 512) == (None, 0)
    monkeypatch.setenv(ROWS_ENV, "4")
    assert prefetch_plan(w, 2, 512)[1] == 8 << 20
    assert prefetch_plan(None, 1, 512) == (None, 0)


def test_plan_takes_the_largest_array_capped_and_rounded_to_whole_chunks(monkeypatch):
    monkeypatch.setenv(BYTES_ENV, str(1 << 30))
    fp8 = Fp8Weight(jnp.zeros((256, 1000), jnp.float8_e4m3fn), jnp.ones((256,), jnp.float32))
    array, size = prefetch_plan(fp8, 1, 512)
    assert array is fp8.values and size == 256_000 // (512 * 16) * (512 * 16) and size % (512 * 16) == 0
    assert prefetch_plan(jnp.zeros((4, 8), BF16), 1, 512) == (None, 0)  # smaller than one 16-byte chunk a thread


@pytest.mark.parametrize("add", [False, True])
def test_the_norm_kernel_prefetches_the_readers_first_bytes(monkeypatch, add):
    from ember.compiler.ops.norm_gpu import add_rms_norm, rms_norm

    x, g, w = jnp.zeros((1, 4096), BF16), jnp.ones((4096,), BF16), jnp.zeros((6144, 4096), BF16)

    def traced():  # a new function each time: jax caches a function's trace, and the setting is read at trace time
        fn = ((lambda x, g, w: add_rms_norm(x, x, g, eps=1e-5, reader=w)) if add
              else (lambda x, g, w: rms_norm(x, g, eps=1e-5, reader=w)))
        (call,) = triton_calls(fn, x, g, w)
        return call

    monkeypatch.setenv("EMBER_TRITON_NORMS", "1")
    monkeypatch.setattr("ember.compiler.ops.norm_gpu.triton_available", lambda: True)
    monkeypatch.setenv(BYTES_ENV, "0")
    off = traced()
    monkeypatch.setenv(BYTES_ENV, str(4 << 20))
    on = traced()
    assert PREFETCH not in off["ir"] and PREFETCH in on["ir"]
    assert on["name"] == off["name"] and on["grid"] == off["grid"] == (1, 1, 1)


def test_the_quantizing_norm_prefetches_a_gguf_readers_packed_bytes(monkeypatch):
    from ember.compiler.ops.norm_quant_gpu import norm_quantize_triton
    from ember.compiler.ops.quant.layout import pack, random_gguf_bytes

    reader = pack(random_gguf_bytes(np.random.default_rng(0), "q4_k", (1536, 1536)), "q4_k", (1536, 1536))
    x, g = jnp.zeros((1, 1536), BF16), jnp.ones((1536,), BF16)
    monkeypatch.setenv(BYTES_ENV, str(1 << 20))
    (call,) = triton_calls(lambda x, g: norm_quantize_triton(x, x, g, eps=1e-6, order="q4_k", reader=reader), x, g)
    assert PREFETCH in call["ir"]
